"""Prometheus views of the nodes' own status reports (user nodes, model nodes).

The nodes already count what matters in their `status()` dicts (relay tables, drops by
reason, asks, engine load); rather than thread metric objects through every pure core, a
scrape reads the status and brings a `NodeMetrics` up to date. Counters only go up: each
view remembers the totals it last saw and adds the difference (a total that went down, e.g.
a restarted component, is taken as a fresh start).
"""

from __future__ import annotations

from aiohttp import web
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from gentorrent.metrics import NodeMetrics


class CounterSync:
    """Turns running totals into Counter increments."""

    def __init__(self) -> None:
        self._seen: dict[tuple, float] = {}

    def set_total(self, counter, total: float, **labels: str) -> None:
        key = (id(counter), tuple(sorted(labels.items())))
        last = self._seen.get(key, 0.0)
        delta = total - last if total >= last else total
        if delta > 0:
            (counter.labels(**labels) if labels else counter).inc(delta)
        self._seen[key] = total


class UserNodeMetrics:
    def __init__(self) -> None:
        self.metrics = NodeMetrics("user")
        self.sync = CounterSync()

    def render(self, status: dict) -> bytes:
        m, s = self.metrics, self.sync
        asking, relay, paths = status.get("asking", {}), status.get("relay", {}), status.get("paths", {})
        s.set_total(m.asks, asking.get("asked", 0), outcome="asked")
        s.set_total(m.asks, asking.get("answered", 0), outcome="answered")
        table = relay.get("table", {})
        s.set_total(m.cloves_relayed, table.get("forwarded", 0), direction="forward")
        s.set_total(m.cloves_relayed, table.get("returned", 0), direction="return")
        drops: dict[str, float] = {}
        for source in (relay.get("drops") or {}, asking.get("drops") or {}):
            for reason, count in source.items():
                drops[reason] = drops.get(reason, 0) + count
        for reason, count in drops.items():
            s.set_total(m.cloves_dropped, count, reason=reason)
        m.paths.labels(kind="usable").set(paths.get("usable", 0))
        m.paths.labels(kind="relayed").set(table.get("paths", 0))
        m.paths.labels(kind="as_proxy").set(table.get("as_proxy", 0))
        return m.render()


class ModelNodeMetrics:
    def __init__(self) -> None:
        self.metrics = NodeMetrics("model")
        self.sync = CounterSync()

    def render(self, status: dict) -> bytes:
        m, s = self.metrics, self.sync
        load = status.get("load", {})
        s.set_total(m.requests_served, status.get("served", 0), via="any")
        s.set_total(m.forwards, status.get("refused_busy", 0), decision="refused_busy")
        for kind in ("active", "queued", "kv_cache_usage"):
            m.load.labels(kind=kind).set(load.get(kind, 0))
        m.load.labels(kind="capacity").set(status.get("capacity", 0))
        m.prefix_cache.labels(kind="queries").set(load.get("prefix_queries", 0))
        m.prefix_cache.labels(kind="hits").set(load.get("prefix_hits", 0))
        routing = status.get("routing", {})  # routing: decisions by reason, and fallbacks
        for decision, count in (routing.get("decisions") or {}).items():
            s.set_total(m.forwards, count, decision=decision)
        s.set_total(m.forwards, routing.get("fallbacks", 0), decision="fallback")
        return m.render()


def metrics_route(render) -> web.RouteDef:
    """GET /metrics answering render() (a callable returning Prometheus text)."""
    async def handle(_request: web.Request) -> web.Response:
        return web.Response(body=render(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    return web.get("/metrics", handle)
