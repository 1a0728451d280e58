"""The committee dashboard: the pure history and renderer, a live committee nobody looks at,
and the page in headless Chromium (DOM and a screenshot checked for its elements)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest

from gentorrent.config import REPUTATION
from gentorrent.ledger.epoch_txs import Phase
from gentorrent.metrics import exported_families, serve_app
from testkit import browser
from testkit.dashboard import watched_committee
from verifier.dashboard import (CURVE_RGB, TRUSTED_RGB, UNTRUSTED_RGB, DashboardData, MemberRow, ModelRow,
                                make_app, render_html, sparkline)
from verifier.dashboard_live import LiveDashboard
from verifier.history import MAX_POINTS, ClosedEpoch, ReputationHistory



def _data() -> DashboardData:
    return DashboardData(
        chain_id="gt-test", height=123, app_hash="ab" * 32,
        members=tuple(MemberRow(f"{i:02x}" * 32, f"127.0.0.1:{7000 + i}", 10, i == 0, f"v{i}") for i in range(4)),
        models=(
            ModelRow("aa" * 32, "127.0.0.1:8000", "smollm2-135m", 5, True, (1.0, 0.95, 0.93), "1 active / 0 queued",
                     {"epoch": 3, "score": 0.97, "height": 120}),
            ModelRow("bb" * 32, "127.0.0.1:8001", "smollm2-135m", 5, False, (1.0, 0.6, 0.3, 0.12), probation=3),
        ),
        users=12, last_epoch={"epoch": 4, "leader": "cc" * 8, "result": "accepted"},
        block_time_ms=1_700_000_000_000, peers=(3, 3), epoch=5, epoch_phase=Phase.PROBING,
    )


# --------------------------------------------------------------------------- history (pure)


def _closed(epoch: int, *scores: tuple[str, float]) -> ClosedEpoch:
    return ClosedEpoch(epoch, Phase.DONE, tuple(scores), 10 * epoch)


def test_history_records_a_point_per_closed_epoch_and_the_last_answered_challenge():
    h = ReputationHistory()
    assert h.observe(1, [("a", 1.0)], []) == []
    h.observe(2, [("a", 1.0)], [])  # no epoch closed: no new point
    new = h.observe(10, [("a", 0.6), ("b", 1.0)], [_closed(1, ("a", 0.3))])
    assert [e.epoch for e in new] == [1]
    h.observe(9, [("a", 0.1)], [_closed(1, ("a", 0.3)), _closed(2, ("a", 0.0))])  # an older state: ignored
    h.observe(20, [("a", 0.36), ("b", 1.0)], [_closed(1, ("a", 0.3)), _closed(2, ("b", 0.99))])
    assert h.reputations("a") == (1.0, 0.6, 0.36) and h.reputations("b") == (1.0, 1.0)
    assert h.answered["a"].epoch == 1 and h.answered["b"].epoch == 2 and h.answered["b"].score == 0.99
    assert ReputationHistory.from_json(h.to_json()) == h


def test_history_is_bounded_and_a_bad_saved_file_is_refused():
    h = ReputationHistory()
    for epoch in range(1, MAX_POINTS + 20):
        h.observe(epoch, [("a", 0.5)], [_closed(e) for e in range(1, epoch + 1)])
    assert len(h.points["a"]) == MAX_POINTS and h.points["a"][-1].epoch == MAX_POINTS + 19
    with pytest.raises(ValueError):
        ReputationHistory.from_json({"points": {"a": [{"epoch": "x"}]}})


# --------------------------------------------------------------------------- page (pure)


def test_page_shows_every_node_and_the_committee():
    page = render_html(_data())
    assert page.count("<tr class=model>") == 2
    assert "untrusted" in page and "0.120" in page and "epoch 3: score 0.970 (height 120)" in page
    assert page.count("probation: 3 clean epochs to go") == 1  # the untrusted node only
    for key, text in (("height", "123"), ("peers", "3 of 3"), ("epoch-phase", "5 · probing"),
                      ("block-time", "22:13:20 UTC")):
        assert f"id={key}>" in page and text in page, key
    assert "<script" not in page


def test_sparkline_scales_reputation_and_draws_threshold():
    svg = sparkline([1.0, 0.0], width=100, height=50)
    assert 'points="0.0,3.0 100.0,47.0"' in svg  # 1.0 at the top, 0.0 at the bottom, 3 px margins
    assert f"y1={3 + 44 * (1 - REPUTATION.untrusted_below):.1f}" in svg


def test_hostile_names_are_escaped():
    data = _data()
    evil = ModelRow("<script>x</script>", "<b>", "<img src=x>", 1, True, ())
    page = render_html(DashboardData(**{**data.__dict__, "models": (evil,)}))
    assert "<script>x" not in page and "&lt;img src=x&gt;" in page


async def test_http_shell_serves_page_json_and_metrics():
    data = _data()

    async def snapshot():
        return data

    runner, port = await serve_app(make_app(snapshot, lambda: b"gentorrent_consensus_height 123\n"), "127.0.0.1", 0)
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


# --------------------------------------------------------------------------- a live committee


@pytest.mark.network
@pytest.mark.timeout(300)
async def test_history_fills_without_page_views_and_the_page_shows_it(tmp_path):
    async with watched_committee(tmp_path / "committee") as w:
        live = w.live
        # nothing has loaded the page or /metrics yet
        bad, good = w.cheat.node_id_hex, w.honest.node_id_hex
        assert len(live.history.reputations(bad)) >= 3
        assert live.history.reputations(bad)[-1] < REPUTATION.untrusted_below < live.history.reputations(bad)[0]
        assert live.history.reputations(good)[-1] > 0.9
        assert live.history.answered[good].score > 0.9 and live.history.answered[bad].score < 0.1
        assert (Path(w.committee.homes[0]) / "data" / "dashboard_history.json").exists()
        text = live.metrics.render().decode()
        assert f'gentorrent_trusted{{node="{bad[:16]}"}} 0.0' in text
        assert f'gentorrent_trusted{{node="{good[:16]}"}} 1.0' in text
        assert 'gentorrent_epochs_total{result="done"}' in text
        async with aiohttp.ClientSession() as s:
            async with s.get(w.url + "metrics") as r:
                families = exported_families(await r.text())
        assert "gentorrent_consensus_height" in families and "gentorrent_asks" not in families
        dom = await asyncio.to_thread(browser.dump_dom, w.url)
        png = await asyncio.to_thread(browser.screenshot, w.url, tmp_path / "dashboard.png")
    assert dom.count('class="model"') == 2 and dom.count("<svg") == 2
    assert "untrusted" in dom and "last answered challenge" in dom and "3 of 3" in dom
    assert "probation: 1 clean epoch to go" in dom  # the committee's memory of the cheater, read live
    # what the browser drew: two reputation curves, one trusted and one untrusted badge
    assert browser.colour_pixels(png, CURVE_RGB) > 200
    trusted, untrusted = browser.colour_rows(png, TRUSTED_RGB), browser.colour_rows(png, UNTRUSTED_RGB)
    assert len(trusted) == 1 and len(untrusted) == 1, (trusted, untrusted)


def test_a_restarted_verifier_keeps_its_history(tmp_path):
    class Node:  # what LiveDashboard reads at construction
        home = tmp_path

    h = ReputationHistory()
    h.observe(5, [("a", 0.7)], [_closed(1, ("a", 0.5))])
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "dashboard_history.json").write_text(__import__("json").dumps(h.to_json()))
    assert LiveDashboard(Node()).history == h
    (tmp_path / "data" / "dashboard_history.json").write_text("{broken")
    assert LiveDashboard(Node()).history == ReputationHistory()
