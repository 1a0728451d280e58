"""Prometheus metrics of a node, served as text on a loopback HTTP port.

One `NodeMetrics` per node process, with its own registry (several nodes may share a
process in tests, so nothing goes to prometheus_client's global registry). The metric names
are fixed here, in one place, so dashboards and alerts do not chase renames across modules.
Pure cores never touch this: shells count what the cores return (e.g. a relay's drop reason).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST


@dataclass
class NodeMetrics:
    role: str
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        r = self.registry
        self.asks = Counter("gentorrent_asks", "asks by outcome", ["outcome"], registry=r)
        self.ask_seconds = Histogram("gentorrent_ask_seconds", "end-to-end ask latency", registry=r,
                                     buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60))
        self.cloves_relayed = Counter("gentorrent_cloves_relayed", "cloves relayed", ["direction"], registry=r)
        self.cloves_dropped = Counter("gentorrent_cloves_dropped", "cloves dropped by reason", ["reason"], registry=r)
        self.paths = Gauge("gentorrent_paths", "proxy paths held (user) or relayed (relay)", ["kind"], registry=r)
        self.requests_served = Counter("gentorrent_requests_served", "requests served by this model node",
                                       ["via"], registry=r)
        self.forwards = Counter("gentorrent_forwards", "forwarding decisions", ["decision"], registry=r)
        self.prefix_cache = Gauge("gentorrent_prefix_cache", "engine prefix-cache counters", ["kind"], registry=r)
        self.load = Gauge("gentorrent_load", "model node load", ["kind"], registry=r)
        self.consensus_height = Gauge("gentorrent_consensus_height", "last committed height", registry=r)
        self.consensus_round = Gauge("gentorrent_consensus_round", "current round", registry=r)
        self.epochs = Counter("gentorrent_epochs", "verification epochs by result", ["result"], registry=r)
        self.reputation = Gauge("gentorrent_reputation", "reputation of model nodes", ["node"], registry=r)

    def render(self) -> bytes:
        return generate_latest(self.registry)


async def serve_metrics(metrics: NodeMetrics, host: str, port: int) -> tuple[web.AppRunner, int]:
    """Serve GET /metrics; returns the runner (to clean up) and the bound port."""
    async def handle(_request: web.Request) -> web.Response:
        return web.Response(body=metrics.render(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application()
    app.router.add_get("/metrics", handle)
    return await serve_app(app, host, port)


async def serve_app(app: web.Application, host: str, port: int) -> tuple[web.AppRunner, int]:
    """Serve an aiohttp app on host:port (0 picks a free port); returns runner and port."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = site._server.sockets[0].getsockname()[1]  # aiohttp has no public accessor for port 0
    return runner, bound
