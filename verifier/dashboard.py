"""The committee's read-only status page: a pure renderer plus a small aiohttp shell.

`render_html` turns a `DashboardData` snapshot into one self-contained HTML page (inline CSS
and SVG, no scripts, no external assets) so it renders the same from any verifier, offline,
and can be checked in a headless browser. The page refreshes itself every few seconds.
"""

from __future__ import annotations

import html
import json
from dataclasses import asdict, dataclass, field
from typing import Awaitable, Callable

from aiohttp import web
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from gentorrent.config import REPUTATION
from gentorrent.metrics import serve_app as serve  # noqa: F401  (re-exported for shells)

REFRESH_S = 5


@dataclass(frozen=True)
class MemberRow:
    node_id: str
    address: str
    power: int
    is_self: bool = False


@dataclass(frozen=True)
class ModelRow:
    node_id: str
    address: str
    model: str
    capacity: int
    trusted: bool
    reputation: tuple[float, ...]  # one value per epoch, oldest first
    load: str = ""  # e.g. "2 active / 0 queued", from gossip when known


@dataclass(frozen=True)
class DashboardData:
    chain_id: str
    height: int
    app_hash: str
    members: tuple[MemberRow, ...]
    models: tuple[ModelRow, ...]
    users: int
    last_epoch: dict = field(default_factory=dict)
    last_commit_age_s: float | None = None


def render_html(data: DashboardData) -> str:
    esc = html.escape
    members = "".join(
        f"<tr><td class=mono>{esc(m.node_id[:16])}…{' (this node)' if m.is_self else ''}</td>"
        f"<td>{esc(m.address)}</td><td>{m.power}</td></tr>" for m in data.members
    )
    models = "".join(_model_row(m) for m in data.models) or "<tr><td colspan=7>no model nodes registered</td></tr>"
    epoch = _epoch_summary(data.last_epoch)
    age = "" if data.last_commit_age_s is None else f" · last commit {data.last_commit_age_s:.1f}s ago"
    return f"""<!doctype html>
<html lang=en><head><meta charset=utf-8>
<meta http-equiv=refresh content="{REFRESH_S}">
<title>GenTorrent committee · {esc(data.chain_id)}</title>
<style>
body{{font-family:system-ui,sans-serif;margin:2em;color:#222}} h1{{font-size:1.4em}}
table{{border-collapse:collapse;margin:0.5em 0 1.5em}} td,th{{border:1px solid #ccc;padding:4px 8px;text-align:left}}
th{{background:#f3f3f3}} .mono{{font-family:monospace}} .bad{{color:#b00;font-weight:bold}} .ok{{color:#070}}
</style></head><body>
<h1>GenTorrent committee <span class=mono>{esc(data.chain_id)}</span></h1>
<p id=height>height <b>{data.height}</b> · app hash <span class=mono>{esc(data.app_hash[:16])}…</span>{age}
 · <span id=users>{data.users}</span> user nodes</p>
<h2>Committee</h2>
<table id=members><tr><th>member</th><th>address</th><th>power</th></tr>{members}</table>
<h2>Model nodes</h2>
<table id=models><tr><th>node</th><th>address</th><th>model</th><th>capacity</th><th>load</th>
<th>reputation over epochs</th><th>trusted</th></tr>{models}</table>
<h2>Last epoch</h2>
<div id=epoch>{epoch}</div>
</body></html>"""


def _model_row(m: ModelRow) -> str:
    esc = html.escape
    current = f"{m.reputation[-1]:.3f}" if m.reputation else "–"
    trusted = "<span class=ok>trusted</span>" if m.trusted else "<span class=bad>untrusted</span>"
    return (f"<tr class=model><td class=mono>{esc(m.node_id[:16])}…</td><td>{esc(m.address)}</td>"
            f"<td>{esc(m.model)}</td><td>{m.capacity}</td><td>{esc(m.load) or '–'}</td>"
            f"<td>{sparkline(m.reputation)} {current}</td><td>{trusted}</td></tr>")


def sparkline(values: tuple[float, ...] | list[float], width: int = 160, height: int = 32) -> str:
    """An inline SVG chart of reputation in [0, 1], with the untrusted threshold dashed."""
    threshold_y = height * (1 - REPUTATION.untrusted_below)
    parts = [f'<svg class=spark width={width} height={height} viewBox="0 0 {width} {height}">',
             f'<rect width={width} height={height} fill="#fafafa" stroke="#ddd"/>',
             f'<line x1=0 x2={width} y1={threshold_y:.1f} y2={threshold_y:.1f} stroke="#d88" stroke-dasharray="3,3"/>']
    if values:
        step = width / max(len(values) - 1, 1)
        points = " ".join(f"{i * step:.1f},{height * (1 - min(max(v, 0.0), 1.0)):.1f}" for i, v in enumerate(values))
        parts.append(f'<polyline fill=none stroke="#36c" stroke-width=2 points="{points}"/>')
    parts.append("</svg>")
    return "".join(parts)


def _epoch_summary(epoch: dict) -> str:
    if not epoch:
        return "<p>no epoch has finished yet</p>"
    rows = "".join(f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(str(v))}</td></tr>" for k, v in epoch.items())
    return f"<table>{rows}</table>"


def make_app(snapshot: Callable[[], Awaitable[DashboardData]],
             metrics: Callable[[], bytes] | None = None) -> web.Application:
    """GET / (HTML), /api/status (JSON), /metrics (Prometheus text, when given)."""
    async def page(_request: web.Request) -> web.Response:
        return web.Response(text=render_html(await snapshot()), content_type="text/html")

    async def status(_request: web.Request) -> web.Response:
        return web.Response(text=json.dumps(asdict(await snapshot())), content_type="application/json")

    app = web.Application()
    app.router.add_get("/", page)
    app.router.add_get("/api/status", status)
    if metrics is not None:
        async def prom(_request: web.Request) -> web.Response:
            return web.Response(body=metrics(), headers={"Content-Type": CONTENT_TYPE_LATEST})
        app.router.add_get("/metrics", prom)
    return app

