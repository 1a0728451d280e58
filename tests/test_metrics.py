"""Prometheus metrics: the shared parts, and each role exporting only its own families."""

from __future__ import annotations

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter

from gentorrent.metrics import CounterSync, exported_families, metrics_route, serve_app
from model_node.metrics import ModelMetrics
from user_client.metrics import UserMetrics
from verifier.metrics import VerifierMetrics

USER = {"gentorrent_asks", "gentorrent_ask_seconds", "gentorrent_ask_ttft_seconds", "gentorrent_ask_stage_seconds",
        "gentorrent_cloves_relayed", "gentorrent_cloves_dropped", "gentorrent_cloves_redundant", "gentorrent_paths"}
MODEL = {"gentorrent_requests_served", "gentorrent_forwards", "gentorrent_prefix_cache", "gentorrent_load",
         "gentorrent_scoring"}
VERIFIER = {"gentorrent_consensus_height", "gentorrent_consensus_round", "gentorrent_block_time_seconds",
            "gentorrent_peers", "gentorrent_epoch", "gentorrent_epochs", "gentorrent_reputation", "gentorrent_trusted"}


def _value(text: bytes, line_prefix: str) -> float:
    for line in text.decode().splitlines():
        if line.startswith(line_prefix):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{line_prefix} not in metrics")


def _user_status(forwarded: int, drops: dict) -> dict:
    return {"asking": {"asked": 3, "answered": 2, "drops": {"bad_tag": 1, "late": 4}},
            "relay": {"table": {"forwarded": forwarded, "returned": 7, "paths": 5, "as_proxy": 2}, "drops": drops},
            "paths": {"usable": 4}}


def test_each_role_exports_its_own_families_only():
    user, model, verifier = UserMetrics(), ModelMetrics(), VerifierMetrics()
    user.update(_user_status(1, {}))
    model.update({"served": 1, "load": {}})
    verifier.update_chain(height=5, round_=0, block_time_ms=1_700_000_000_000, peers=3)
    assert exported_families(user.render()) == USER == user.families()
    assert exported_families(model.render()) == MODEL == model.families()
    assert exported_families(verifier.render()) == VERIFIER == verifier.families()
    assert not USER & MODEL and not USER & VERIFIER and not MODEL & VERIFIER


def test_model_scoring_counters_follow_status_totals():
    """A reference engine shows how many scoring calls it answered and how many passes they took."""
    view = ModelMetrics()
    view.update({"scoring": {"requests": 4, "passes": 1}})
    text = view.update({"scoring": {"requests": 9, "passes": 3}})
    assert _value(text, 'gentorrent_scoring_total{kind="requests"}') == 9
    assert _value(text, 'gentorrent_scoring_total{kind="passes"}') == 3


def test_user_counters_follow_status_totals_and_spare_cloves_are_not_loss():
    view = UserMetrics()
    view.update(_user_status(10, {"unknown_peer": 2}))
    text = view.update(_user_status(15, {"unknown_peer": 5, "replay": 1, "late": 2}))
    assert _value(text, 'gentorrent_cloves_relayed_total{direction="forward"}') == 15
    assert _value(text, 'gentorrent_cloves_dropped_total{reason="unknown_peer"}') == 5
    assert _value(text, 'gentorrent_cloves_dropped_total{reason="replay"}') == 1
    assert _value(text, 'gentorrent_cloves_dropped_total{reason="bad_tag"}') == 1
    assert _value(text, "gentorrent_cloves_redundant_total") == 6  # the asker's 4 and the relay's 2
    assert b'reason="late"' not in text
    assert _value(text, 'gentorrent_asks_total{outcome="answered"}') == 2
    assert _value(text, 'gentorrent_paths{kind="usable"}') == 4


def test_ask_latency_histograms_are_filled():
    view = UserMetrics()
    view.observe_ask("answered", 0.3, 0.1, {"seal_split_ms": 1.0, "send_ms": 4.0, "first_chunk_ms": 90.0,
                                             "total_ms": 290.0})
    view.observe_ask("no_model_node_answered", 10.0)
    text = view.render()
    assert _value(text, 'gentorrent_ask_seconds_count{outcome="answered"}') == 1
    assert _value(text, 'gentorrent_ask_seconds_count{outcome="no_model_node_answered"}') == 1
    assert _value(text, "gentorrent_ask_ttft_seconds_sum") == 0.1
    assert _value(text, 'gentorrent_ask_stage_seconds_sum{stage="send"}') == 0.004


def test_counter_sync_takes_a_lower_total_as_a_restart():
    c = Counter("x", "x", registry=CollectorRegistry())
    sync = CounterSync()
    for total in (5, 8, 2, 3):
        sync.set_total(c, total)
    assert c._value.get() == 5 + 3 + 2 + 1


def test_model_metrics_show_load_and_prefix_cache():
    status = {"served": 4, "capacity": 5, "refused_busy": 0,
              "load": {"active": 2, "queued": 1, "kv_cache_usage": 0.25, "prefix_queries": 100, "prefix_hits": 60}}
    text = ModelMetrics().update(status)
    assert _value(text, 'gentorrent_requests_served_total{via="any"}') == 4
    assert _value(text, 'gentorrent_load{kind="active"}') == 2
    assert _value(text, 'gentorrent_prefix_cache{kind="hits"}') == 60


async def test_metrics_route_serves_prometheus_text_and_nodes_do_not_share_counters():
    a, b = UserMetrics(), UserMetrics()
    a.asks.labels(outcome="ok").inc()
    app = web.Application()
    app.router.add_routes([metrics_route(a.render)])
    runner, port = await serve_app(app, "127.0.0.1", 0)
    try:
        async with aiohttp.ClientSession() as session:
            async with session.get(f"http://127.0.0.1:{port}/metrics") as resp:
                assert resp.status == 200 and resp.content_type == "text/plain"
                assert 'gentorrent_asks_total{outcome="ok"} 1.0' in await resp.text()
    finally:
        await runner.cleanup()
    assert b'outcome="ok"' not in b.render()
