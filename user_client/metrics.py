"""The user node's Prometheus families (served at its API's /metrics).

Counters follow the node's own status totals (`update`, at each scrape); latency histograms
are observed by the API as each ask ends (`observe_ask`): the whole ask by outcome, the stages
of the overlay (sealing and splitting, sending the cloves, the first reply chunk back, the
whole attempt; ARCHITECTURE.md §2), and for answered asks vLLM's request families as the
asker sees them (gentorrent.metrics.REQUEST_FAMILIES: prompt and generation tokens, time to the
first token the client got, time per output token, end to end).

Redundancy is not loss: with n cloves sent and k needed, the n - k cloves that arrive after a
message was rebuilt are expected, and are counted as `gentorrent_cloves_redundant`, never as
dropped.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from gentorrent.metrics import LATENCY_BUCKETS, CounterSync, RequestMetrics, RoleMetrics

#: a drop reason that means "one of the n - k spare cloves", not a loss
REDUNDANT = "late"
STAGES = ("seal_split", "send", "first_chunk", "total")


class UserMetrics(RoleMetrics):
    role = "user"

    def __init__(self) -> None:
        super().__init__()
        r = self.registry
        self.asks = Counter("gentorrent_asks", "asks by outcome", ["outcome"], registry=r)
        self.ask_seconds = Histogram("gentorrent_ask_seconds", "asks through the local API, end to end",
                                     ["outcome"], buckets=LATENCY_BUCKETS, registry=r)
        self.requests = RequestMetrics(r, "answered asks, as this node saw them")
        self.stage_seconds = Histogram("gentorrent_ask_stage_seconds", "time of each stage of an answered ask",
                                       ["stage"], buckets=LATENCY_BUCKETS, registry=r)
        self.cloves_relayed = Counter("gentorrent_cloves_relayed", "cloves relayed", ["direction"], registry=r)
        self.cloves_dropped = Counter("gentorrent_cloves_dropped", "cloves lost or refused, by reason", ["reason"],
                                      registry=r)
        self.cloves_redundant = Counter("gentorrent_cloves_redundant",
                                        "spare cloves that arrived after their message was rebuilt", registry=r)
        self.paths = Gauge("gentorrent_paths", "proxy paths held (usable) or relayed for others", ["kind"],
                           registry=r)
        self.sync = CounterSync()

    def update(self, status: dict) -> bytes:
        """Bring the counters up to the node's status totals; the Prometheus text."""
        asking, relay, paths = status.get("asking", {}), status.get("relay", {}), status.get("paths", {})
        s = self.sync
        s.set_total(self.asks, asking.get("asked", 0), outcome="asked")
        s.set_total(self.asks, asking.get("answered", 0), outcome="answered")
        table = relay.get("table", {})
        s.set_total(self.cloves_relayed, table.get("forwarded", 0), direction="forward")
        s.set_total(self.cloves_relayed, table.get("returned", 0), direction="return")
        drops: dict[str, float] = {}
        for source in (relay.get("drops") or {}, asking.get("drops") or {}):
            for reason, count in source.items():
                drops[reason] = drops.get(reason, 0) + count
        s.set_total(self.cloves_redundant, drops.pop(REDUNDANT, 0))
        for reason, count in drops.items():
            s.set_total(self.cloves_dropped, count, reason=reason)
        self.paths.labels(kind="usable").set(paths.get("usable", 0))
        self.paths.labels(kind="relayed").set(table.get("paths", 0))
        self.paths.labels(kind="as_proxy").set(table.get("as_proxy", 0))
        return self.render()

    def observe_ask(self, outcome: str, seconds: float, ttft_s: float | None = None,
                    timings_ms: dict | None = None, prompt_tokens: int = 0, output_tokens: int = 0) -> None:
        """One ask through the API ended (outcome "answered" or the error code)."""
        self.ask_seconds.labels(outcome=outcome).observe(seconds)
        if outcome == "answered":
            self.requests.observe(prompt_tokens, output_tokens, ttft_s, seconds)
        for stage in STAGES:
            value = (timings_ms or {}).get(f"{stage}_ms")
            if value is not None:
                self.stage_seconds.labels(stage=stage).observe(value / 1000)
