"""The model node's Prometheus families (`gt-model serve`, on 127.0.0.1 by default: --metrics).

vLLM's request families (gentorrent.metrics.REQUEST_FAMILIES: prompt and generation tokens,
time to first token, time per output token, end-to-end latency) are observed as each request
finishes (`observe_request`, called by LocalGenerator). The rest is read from the node's
status report at each scrape: requests served, forwarding decisions, load (running and waiting
requests, KV cache usage, capacity: one family each, one unit each), the engine's prefix cache
and its scoring passes; running totals are counters. Only what a model node measures: no
consensus, no relayed cloves.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge

from gentorrent.metrics import CounterSync, RequestMetrics, RoleMetrics


class ModelMetrics(RoleMetrics):
    role = "model"

    def __init__(self) -> None:
        super().__init__()
        r = self.registry
        self.requests = RequestMetrics(r, "served here")
        self.requests_served = Counter("gentorrent_requests_served", "requests served by this model node",
                                       ["via"], registry=r)
        self.forwards = Counter("gentorrent_forwards", "forwarding decisions", ["decision"], registry=r)
        self.prefix_cache_queries = Counter("gentorrent_prefix_cache_queries",
                                            "prompt tokens looked up in the engine's prefix cache", registry=r)
        self.prefix_cache_hits = Counter("gentorrent_prefix_cache_hits",
                                         "prompt tokens found in the engine's prefix cache", registry=r)
        self.running = Gauge("gentorrent_requests_running", "requests the engine decodes now", registry=r)
        self.waiting = Gauge("gentorrent_requests_waiting", "requests waiting for the engine", registry=r)
        self.kv_cache = Gauge("gentorrent_kv_cache_usage_ratio", "share of the KV cache in use (0 to 1)", registry=r)
        self.capacity = Gauge("gentorrent_capacity", "the capacity score this node registered (1 to 10)", registry=r)
        self.scoring = Counter("gentorrent_scoring", "scoring calls and the engine passes they took",
                               ["kind"], registry=r)
        self.sync = CounterSync()

    def observe_request(self, prompt_tokens: int, output_tokens: int, ttft_s: float | None, e2e_s: float) -> None:
        self.requests.observe(prompt_tokens, output_tokens, ttft_s, e2e_s)

    def update(self, status: dict) -> bytes:
        """Bring the families up to the node's status report; the Prometheus text."""
        s, load = self.sync, status.get("load", {})
        s.set_total(self.requests_served, status.get("served", 0), via="any")
        s.set_total(self.forwards, status.get("refused_busy", 0), decision="refused_busy")
        for kind, count in (status.get("scoring") or {}).items():
            s.set_total(self.scoring, count, kind=kind)
        self.running.set(load.get("active", 0))
        self.waiting.set(load.get("queued", 0))
        self.kv_cache.set(load.get("kv_cache_usage", 0))
        self.capacity.set(status.get("capacity", 0))
        s.set_total(self.prefix_cache_queries, load.get("prefix_queries", 0))
        s.set_total(self.prefix_cache_hits, load.get("prefix_hits", 0))
        routing = status.get("routing", {})  # routing: decisions by reason, and fallbacks
        for decision, count in (routing.get("decisions") or {}).items():
            s.set_total(self.forwards, count, decision=decision)
        s.set_total(self.forwards, routing.get("fallbacks", 0), decision="fallback")
        return self.render()
