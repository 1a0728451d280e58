"""Prometheus metrics: the shared parts, and each role exporting only its own families."""

from __future__ import annotations

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter

from gentorrent.metrics import REQUEST_FAMILIES, CounterSync, exported_families, metrics_route, serve_app
from model_node.metrics import ModelMetrics
from user_client.metrics import UserMetrics
from verifier.metrics import VerifierMetrics

USER = {"gentorrent_asks", "gentorrent_ask_seconds", "gentorrent_ask_stage_seconds", "gentorrent_cloves_relayed",
        "gentorrent_cloves_dropped", "gentorrent_cloves_redundant", "gentorrent_paths"} | REQUEST_FAMILIES
MODEL = {"gentorrent_requests_served", "gentorrent_forwards", "gentorrent_prefix_cache_queries",
         "gentorrent_prefix_cache_hits", "gentorrent_requests_running", "gentorrent_requests_waiting",
         "gentorrent_kv_cache_usage_ratio", "gentorrent_capacity", "gentorrent_scoring"} | REQUEST_FAMILIES
VERIFIER = {"gentorrent_consensus_height", "gentorrent_consensus_round", "gentorrent_block_time_seconds",
            "gentorrent_peers", "gentorrent_epoch", "gentorrent_epochs", "gentorrent_reputation", "gentorrent_trusted",
            "gentorrent_committee_members", "gentorrent_member_removed", "gentorrent_consensus_halted"}


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
    assert USER & MODEL == REQUEST_FAMILIES  # vLLM's request families, as each role measures them
    assert not USER & VERIFIER and not MODEL & VERIFIER


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
    assert _value(text, "gentorrent_time_to_first_token_seconds_sum") == 0.1  # answered asks only
    assert _value(text, "gentorrent_e2e_request_latency_seconds_count") == 1
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
    view = ModelMetrics()
    text = view.update(status)
    assert _value(text, 'gentorrent_requests_served_total{via="any"}') == 4
    assert _value(text, "gentorrent_requests_running") == 2 and _value(text, "gentorrent_requests_waiting") == 1
    assert _value(text, "gentorrent_kv_cache_usage_ratio") == 0.25 and _value(text, "gentorrent_capacity") == 5
    assert _value(text, "gentorrent_prefix_cache_hits_total") == 60  # running totals are counters
    text = view.update({**status, "load": {**status["load"], "prefix_queries": 150, "prefix_hits": 90}})
    assert _value(text, "gentorrent_prefix_cache_queries_total") == 150 and _value(text, "gentorrent_prefix_cache_hits_total") == 90


def test_request_families_are_vllms_counters_and_histograms_one_unit_each():
    """Tokens are counters, latencies histograms in seconds; time per output token is what
    follows the first token, spread over the tokens after it (as vLLM computes it)."""
    from prometheus_client.parser import text_string_to_metric_families

    view = ModelMetrics()
    view.observe_request(prompt_tokens=12, output_tokens=5, ttft_s=0.2, e2e_s=1.0)
    view.observe_request(prompt_tokens=3, output_tokens=1, ttft_s=0.1, e2e_s=0.1)
    text = view.render()
    assert _value(text, "gentorrent_prompt_tokens_total") == 15
    assert _value(text, "gentorrent_generation_tokens_total") == 6
    assert _value(text, "gentorrent_time_per_output_token_seconds_count") == 1  # one token: no time per token
    assert abs(_value(text, "gentorrent_time_per_output_token_seconds_sum") - 0.2) < 1e-9
    assert _value(text, "gentorrent_time_to_first_token_seconds_count") == 2
    kinds = {f.name: f.type for f in text_string_to_metric_families(text.decode())}
    assert kinds["gentorrent_prompt_tokens"] == kinds["gentorrent_generation_tokens"] == "counter"
    assert {kinds[n] for n in REQUEST_FAMILIES - {"gentorrent_prompt_tokens", "gentorrent_generation_tokens"}} == \
        {"histogram"}
    # one unit per family: load was one family of counts, a ratio and a score (gentorrent_load{kind})
    families = {f.name for f in text_string_to_metric_families(view.update({"load": {}}).decode())}
    assert "gentorrent_load" not in families and "gentorrent_prefix_cache" not in families


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


def test_a_removed_member_is_named_in_the_verifiers_metrics():
    from verifier.metrics import VerifierMetrics

    m = VerifierMetrics()
    m.set_committee(3, [{"name": "v3", "public_key": "ab" * 32, "height": 12,
                         "reason": "double-signed: evidence in block 12"}])
    text = m.render().decode()
    assert 'gentorrent_member_removed{member="v3",reason="double-signed"} 1.0' in text
    assert "gentorrent_committee_members 3.0" in text
