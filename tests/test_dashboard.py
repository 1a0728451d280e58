"""The committee dashboard: pure rendering, HTTP shell, and headless Chromium."""

from __future__ import annotations

import shutil
import subprocess
import tempfile

import aiohttp
import pytest

from gentorrent.config import REPUTATION
from verifier.dashboard import DashboardData, MemberRow, ModelRow, make_app, render_html, serve, sparkline


def _data() -> DashboardData:
    return DashboardData(
        chain_id="gt-test", height=123, app_hash="ab" * 32,
        members=tuple(MemberRow(f"{i:02x}" * 32, f"127.0.0.1:{7000 + i}", 10, i == 0) for i in range(4)),
        models=(
            ModelRow("aa" * 32, "127.0.0.1:8000", "smollm2-135m", 5, True, (1.0, 0.95, 0.93), "1 active / 0 queued"),
            ModelRow("bb" * 32, "127.0.0.1:8001", "smollm2-135m", 5, False, (1.0, 0.6, 0.3, 0.12)),
        ),
        users=12, last_epoch={"epoch": 4, "leader": "cc" * 8, "result": "accepted"},
    )


def test_page_shows_every_node_and_flags_untrusted():
    page = render_html(_data())
    assert page.count("<tr class=model>") == 2
    assert "untrusted" in page and "0.120" in page and "12</span> user nodes" in page
    assert "<script" not in page


def test_sparkline_scales_reputation_and_draws_threshold():
    svg = sparkline([1.0, 0.0], width=100, height=50)
    assert 'points="0.0,0.0 100.0,50.0"' in svg
    assert f"y1={50 * (1 - REPUTATION.untrusted_below):.1f}" in svg


def test_hostile_names_are_escaped():
    data = _data()
    evil = ModelRow("<script>x</script>", "<b>", "<img src=x>", 1, True, ())
    page = render_html(DashboardData(**{**data.__dict__, "models": (evil,)}))
    assert "<script>x" not in page and "&lt;img src=x&gt;" in page


async def _serve_fixture():
    data = _data()

    async def snapshot():
        return data

    return await serve(make_app(snapshot, lambda: b"gentorrent_consensus_height 123\n"), "127.0.0.1", 0)


async def test_http_shell_serves_page_json_and_metrics():
    runner, port = await _serve_fixture()
    try:
        async with aiohttp.ClientSession() as s:
            async with s.get(f"http://127.0.0.1:{port}/") as r:
                assert "GenTorrent committee" in await r.text()
            async with s.get(f"http://127.0.0.1:{port}/api/status") as r:
                assert (await r.json())["height"] == 123
            async with s.get(f"http://127.0.0.1:{port}/metrics") as r:
                assert b"gentorrent_consensus_height 123" in await r.read()
    finally:
        await runner.cleanup()


def chromium_dump_dom(url: str) -> str:
    """The DOM that headless Chromium renders for `url` (background networking off)."""
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        pytest.fail("Debian chromium is not installed; `make setup` installs it (deploy/install_system.sh)")
    out = subprocess.run(
        [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic",
         f"--user-data-dir={tempfile.mkdtemp(prefix='gt-chromium-')}", "--dump-dom", url],
        capture_output=True, timeout=90, text=True,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


async def test_page_renders_in_headless_chromium():
    import asyncio

    runner, port = await _serve_fixture()
    try:
        dom = await asyncio.to_thread(chromium_dump_dom, f"http://127.0.0.1:{port}/")
    finally:
        await runner.cleanup()
    assert dom.count('class="model"') == 2
    assert "<svg" in dom and "untrusted" in dom
