"""The model node's Prometheus families (`gt-model serve --metrics HOST:PORT`).

Read from the node's status report at each scrape: requests served, forwarding decisions,
load, the engine's prefix cache and its scoring passes. Only what a model node measures: no
consensus, no relayed cloves (those are other roles' families, gentorrent.metrics).
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge

from gentorrent.metrics import CounterSync, RoleMetrics


class ModelMetrics(RoleMetrics):
    role = "model"

    def __init__(self) -> None:
        super().__init__()
        r = self.registry
        self.requests_served = Counter("gentorrent_requests_served", "requests served by this model node",
                                       ["via"], registry=r)
        self.forwards = Counter("gentorrent_forwards", "forwarding decisions", ["decision"], registry=r)
        self.prefix_cache = Gauge("gentorrent_prefix_cache", "engine prefix-cache token counters", ["kind"],
                                  registry=r)
        self.load = Gauge("gentorrent_load", "model node load", ["kind"], registry=r)
        self.scoring = Counter("gentorrent_scoring", "scoring calls and the engine passes they took",
                               ["kind"], registry=r)
        self.sync = CounterSync()

    def update(self, status: dict) -> bytes:
        """Bring the families up to the node's status report; the Prometheus text."""
        s, load = self.sync, status.get("load", {})
        s.set_total(self.requests_served, status.get("served", 0), via="any")
        s.set_total(self.forwards, status.get("refused_busy", 0), decision="refused_busy")
        for kind, count in (status.get("scoring") or {}).items():
            s.set_total(self.scoring, count, kind=kind)
        for kind in ("active", "queued", "kv_cache_usage"):
            self.load.labels(kind=kind).set(load.get(kind, 0))
        self.load.labels(kind="capacity").set(status.get("capacity", 0))
        self.prefix_cache.labels(kind="queries").set(load.get("prefix_queries", 0))
        self.prefix_cache.labels(kind="hits").set(load.get("prefix_hits", 0))
        routing = status.get("routing", {})  # routing: decisions by reason, and fallbacks
        for decision, count in (routing.get("decisions") or {}).items():
            s.set_total(self.forwards, count, decision=decision)
        s.set_total(self.forwards, routing.get("fallbacks", 0), decision="fallback")
        return self.render()
