"""The committee's read-only status page: a pure renderer plus a small aiohttp shell.

`render_html` turns a `DashboardData` snapshot into one self-contained HTML page (inline CSS
and SVG, no scripts, no external assets) so it renders the same from any verifier, offline,
and can be checked in a headless browser. It shows the committee (height, last block time,
peers heard from, the epoch and its phase, the members) and every model node (id, address,
model, reputation over epochs, trusted or not, the last challenge it answered). The page
refreshes itself every few seconds; the history it draws is recorded by the verifier as
blocks commit (verifier.history), not when the page is loaded.
"""

from __future__ import annotations

import datetime as dt
import html
import json
from dataclasses import asdict, dataclass, field
from typing import Awaitable, Callable

from aiohttp import web
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from gentorrent.config import REPUTATION

REFRESH_S = 5
# colours the page uses for what a screenshot check looks for (tests/test_dashboard.py)
TRUSTED_RGB = (46, 125, 50)
UNTRUSTED_RGB = (198, 40, 40)
CURVE_RGB = (51, 102, 204)


def _hex(rgb: tuple[int, int, int]) -> str:
    return "#%02x%02x%02x" % rgb


@dataclass(frozen=True)
class MemberRow:
    node_id: str
    address: str
    power: int
    is_self: bool = False
    name: str = ""


@dataclass(frozen=True)
class ModelRow:
    node_id: str
    address: str
    model: str
    capacity: int
    trusted: bool
    reputation: tuple[float, ...]  # one value per closed epoch, oldest first
    load: str = ""  # e.g. "2 active / 0 queued", from gossip when known
    answered: dict | None = None  # last answered challenge: {"epoch", "score", "height"}
    probation: int = 0  # clean epochs an untrusted node still needs (verifier/epochs/reputation.py)


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
    block_time_ms: int = 0  # header time of the last committed block
    peers: tuple[int, int] = (0, 0)  # members heard from lately, other members
    epoch: int = 0
    epoch_phase: str = ""
    removed: tuple[dict, ...] = ()  # members removed: {"name", "public_key", "height", "reason"}
    halted: str | None = None  # why consensus halted on this member (None while it runs)


def render_html(data: DashboardData) -> str:
    esc = html.escape
    members = "".join(
        f"<tr><td>{esc(m.name)}</td><td class=mono>{esc(m.node_id[:16])}…{' (this node)' if m.is_self else ''}</td>"
        f"<td>{esc(m.address)}</td><td>{m.power}</td></tr>" for m in data.members
    )
    models = "".join(_model_row(m) for m in data.models) or "<tr><td colspan=7>no model nodes registered</td></tr>"
    removed = "".join(
        f"<tr><td>{esc(r['name'])}</td><td class=mono>{esc(r['public_key'][:16])}…</td><td>{r['height']}</td>"
        f"<td>{esc(r['reason'])}</td></tr>" for r in data.removed) or "<tr><td colspan=4>none</td></tr>"
    return f"""<!doctype html>
<html lang=en><head><meta charset=utf-8>
<meta http-equiv=refresh content="{REFRESH_S}">
<title>GenTorrent committee · {esc(data.chain_id)}</title>
<style>
body{{font-family:system-ui,sans-serif;margin:2em;color:#222}} h1{{font-size:1.4em}}
table{{border-collapse:collapse;margin:0.5em 0 1.5em}} td,th{{border:1px solid #ccc;padding:4px 8px;text-align:left}}
th{{background:#f3f3f3}} .mono{{font-family:monospace}}
.badge{{display:inline-block;padding:3px 10px;border-radius:3px;color:#fff;font-weight:bold}}
.ok{{background:{_hex(TRUSTED_RGB)}}} .bad{{background:{_hex(UNTRUSTED_RGB)}}}
.facts{{display:flex;gap:1.5em;flex-wrap:wrap}} .fact{{border:1px solid #ccc;padding:6px 12px}}
.fact b{{display:block;font-size:1.3em}} .halted{{background:{_hex(UNTRUSTED_RGB)};color:#fff;padding:8px 12px}}
</style></head><body>
<h1>GenTorrent committee <span class=mono>{esc(data.chain_id)}</span></h1>
{_halted_banner(data.halted)}
<div class=facts id=committee>{_committee_facts(data)}</div>
<h2>Model nodes</h2>
<table id=models><tr><th>node</th><th>address</th><th>model</th><th>load</th>
<th>reputation over epochs</th><th>trusted</th><th>last answered challenge</th></tr>{models}</table>
<h2>Committee members</h2>
<table id=members><tr><th>name</th><th>member</th><th>address</th><th>power</th></tr>{members}</table>
<h2>Members removed</h2>
<table id=removed><tr><th>name</th><th>member</th><th>at block</th><th>why</th></tr>{removed}</table>
<h2>Last epoch</h2>
<div id=epoch>{_epoch_summary(data.last_epoch)}</div>
<p class=mono>app hash {esc(data.app_hash[:16])}…</p>
</body></html>"""


def _halted_banner(reason: str | None) -> str:
    """A halted member says so first, in red: its last block only grows older."""
    if not reason:
        return ""
    return (f"<div class=halted id=halted><b>CONSENSUS HALTED</b> on this member: {html.escape(reason)} "
            "(the process exits for its supervisor to restart it; its log has the details)</div>")


def _committee_facts(data: DashboardData) -> str:
    block = "–"
    if data.block_time_ms:
        block = dt.datetime.fromtimestamp(data.block_time_ms / 1000, dt.timezone.utc).strftime("%H:%M:%S UTC")
    age = "" if data.last_commit_age_s is None else f" ({data.last_commit_age_s:.1f} s ago)"
    phase = f"{data.epoch} · {data.epoch_phase or '–'}" if data.epoch else "none yet"
    facts = (("height", str(data.height), "height"), ("last block", block + age, "block-time"),
             ("peers", f"{data.peers[0]} of {data.peers[1]}", "peers"), ("epoch · phase", phase, "epoch-phase"),
             ("user nodes", str(data.users), "users"))
    bad = {"block-time"} if data.halted else set()
    return "".join(f"<div class='fact{' halted' if key in bad else ''}' id={key}>{html.escape(label)}"
                   f"<b>{html.escape(value)}</b></div>" for label, value, key in facts)


def _model_row(m: ModelRow) -> str:
    esc = html.escape
    current = f"{m.reputation[-1]:.3f}" if m.reputation else "–"
    trusted = "<span class='badge ok'>trusted</span>" if m.trusted else "<span class='badge bad'>untrusted</span>"
    if not m.trusted and m.probation:
        trusted += f" probation: {m.probation} clean epoch{'s' if m.probation > 1 else ''} to go"
    answered = "–"
    if m.answered:
        answered = (f"epoch {m.answered['epoch']}: score {m.answered['score']:.3f} "
                    f"(height {m.answered['height']})")
    return (f"<tr class=model><td class=mono>{esc(m.node_id[:16])}…</td><td>{esc(m.address)}</td>"
            f"<td>{esc(m.model)}</td><td>{esc(m.load) or '–'}</td>"
            f"<td>{sparkline(m.reputation)} {current}</td><td>{trusted}</td><td>{esc(answered)}</td></tr>")


def sparkline(values: tuple[float, ...] | list[float], width: int = 160, height: int = 32) -> str:
    """An inline SVG chart of reputation in [0, 1], with the untrusted threshold dashed (a
    few pixels of margin, so a line at 1.0 or 0.0 is drawn whole)."""
    pad = 3.0

    def y(v: float) -> float:
        return pad + (height - 2 * pad) * (1 - min(max(v, 0.0), 1.0))

    threshold_y = y(REPUTATION.untrusted_below)
    parts = [f'<svg class=spark width={width} height={height} viewBox="0 0 {width} {height}">',
             f'<rect width={width} height={height} fill="#fafafa" stroke="#ddd"/>',
             f'<line x1=0 x2={width} y1={threshold_y:.1f} y2={threshold_y:.1f} stroke="#d88" stroke-dasharray="3,3"/>']
    if values:
        step = width / max(len(values) - 1, 1)
        points = " ".join(f"{i * step:.1f},{y(v):.1f}" for i, v in enumerate(values))
        parts.append(f'<polyline fill=none stroke="{_hex(CURVE_RGB)}" stroke-width=3 points="{points}"/>')
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
