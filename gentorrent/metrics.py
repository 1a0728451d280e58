"""Prometheus metrics: what every role's metrics share (registry, counter sync, HTTP route).

Each role declares its own families in its own package (`user_client.metrics`,
`model_node.metrics`, `verifier.metrics`) on a `RoleMetrics`, so a node exports only what it
measures: a model node has no consensus height to report, a verifier no relayed cloves.
Every family name starts with `gentorrent_` and is written once, in its role's module, so
dashboards and alerts do not chase renames. Each node has its own registry (several nodes may
share a process in tests), never prometheus_client's global one. Pure cores never touch
metrics: shells count what the cores report (a relay's drop reasons, a node's status totals).
"""

from __future__ import annotations

from typing import Callable

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.parser import text_string_to_metric_families

# no `_created` series: a start time per counter doubles every scrape and no dashboard reads it
disable_created_metrics()

#: latency buckets (seconds) of every histogram: loopback asks take tens of ms, CPU engines seconds
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120)
#: time per output token (seconds): vLLM's buckets, and the slower steps of a CPU engine
TOKEN_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
#: what a model node and a user node both measure of every finished request, as vLLM's
#: families (vllm:prompt_tokens_total, vllm:generation_tokens_total, vllm:time_to_first_token_seconds,
#: vllm:time_per_output_token_seconds, vllm:e2e_request_latency_seconds): the model node as it
#: serves, the user node as its asker sees it through the overlay
REQUEST_FAMILIES = frozenset({"gentorrent_prompt_tokens", "gentorrent_generation_tokens",
                              "gentorrent_time_to_first_token_seconds", "gentorrent_time_per_output_token_seconds",
                              "gentorrent_e2e_request_latency_seconds"})


class RoleMetrics:
    """The metric families of one role, in a registry of their own."""

    role = "node"

    def __init__(self) -> None:
        self.registry = CollectorRegistry()

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def families(self) -> set[str]:
        """Names of the families this role exports (without _total/_bucket suffixes)."""
        return {m.name for m in self.registry.collect()}


class RequestMetrics:
    """REQUEST_FAMILIES in a role's registry: counters of tokens, histograms of latency (one
    unit per family: tokens, or seconds)."""

    def __init__(self, registry: CollectorRegistry, where: str) -> None:
        self.prompt_tokens = Counter("gentorrent_prompt_tokens", f"prompt tokens of finished requests ({where})",
                                     registry=registry)
        self.generation_tokens = Counter("gentorrent_generation_tokens",
                                         f"tokens generated for finished requests ({where})", registry=registry)
        self.ttft = Histogram("gentorrent_time_to_first_token_seconds", f"time to the first output token ({where})",
                              buckets=LATENCY_BUCKETS, registry=registry)
        self.tpot = Histogram("gentorrent_time_per_output_token_seconds",
                              f"time per output token after the first ({where})", buckets=TOKEN_BUCKETS,
                              registry=registry)
        self.e2e = Histogram("gentorrent_e2e_request_latency_seconds", f"finished requests, end to end ({where})",
                             buckets=LATENCY_BUCKETS, registry=registry)

    def observe(self, prompt_tokens: int, output_tokens: int, ttft_s: float | None, e2e_s: float) -> None:
        """One finished request (ttft None: no token came out)."""
        self.prompt_tokens.inc(prompt_tokens)
        self.generation_tokens.inc(output_tokens)
        self.e2e.observe(e2e_s)
        if ttft_s is not None:
            self.ttft.observe(ttft_s)
            if output_tokens > 1:
                self.tpot.observe(max(0.0, e2e_s - ttft_s) / (output_tokens - 1))


def exported_families(text: bytes | str) -> set[str]:
    """The family names a /metrics text exports (what tests check per role)."""
    raw = text.decode() if isinstance(text, bytes) else text
    return {f.name for f in text_string_to_metric_families(raw)}


class CounterSync:
    """Turns running totals (from a node's status report) into Counter increments.

    Counters only go up: it remembers the totals it last saw and adds the difference; a total
    that went down (a restarted component) is taken as a fresh start.
    """

    def __init__(self) -> None:
        self._seen: dict[tuple, float] = {}

    def set_total(self, counter, total: float, **labels: str) -> None:
        key = (id(counter), tuple(sorted(labels.items())))
        last = self._seen.get(key, 0.0)
        delta = total - last if total >= last else total
        if delta > 0:
            (counter.labels(**labels) if labels else counter).inc(delta)
        self._seen[key] = total


def metrics_route(render: Callable[[], bytes]) -> web.RouteDef:
    """GET /metrics answering render() (Prometheus text)."""
    async def handle(_request: web.Request) -> web.Response:
        return web.Response(body=render(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    return web.get("/metrics", handle)


async def serve_app(app: web.Application, host: str, port: int) -> tuple[web.AppRunner, int]:
    """Serve an aiohttp app on host:port (0 picks a free port); returns runner and port."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    try:
        await site.start()
    except OSError:  # a taken port: release what setup holds, so the caller's error is all that shows
        await runner.cleanup()
        raise
    bound = site._server.sockets[0].getsockname()[1]  # aiohttp has no public accessor for port 0
    return runner, bound
