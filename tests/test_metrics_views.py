"""Prometheus views of user and model node status reports."""

from __future__ import annotations

from gentorrent.metrics_views import CounterSync, ModelNodeMetrics, UserNodeMetrics


def _value(text: bytes, line_prefix: str) -> float:
    for line in text.decode().splitlines():
        if line.startswith(line_prefix):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{line_prefix} not in metrics")


def _user_status(forwarded: int, drops: dict) -> dict:
    return {"asking": {"asked": 3, "answered": 2, "drops": {"bad_tag": 1}},
            "relay": {"table": {"forwarded": forwarded, "returned": 7, "paths": 5, "as_proxy": 2}, "drops": drops},
            "paths": {"usable": 4}}


def test_user_metrics_follow_status_totals_and_name_drop_reasons():
    view = UserNodeMetrics()
    view.render(_user_status(10, {"unknown_peer": 2}))
    text = view.render(_user_status(15, {"unknown_peer": 5, "replay": 1}))
    assert _value(text, 'gentorrent_cloves_relayed_total{direction="forward"}') == 15
    assert _value(text, 'gentorrent_cloves_dropped_total{reason="unknown_peer"}') == 5
    assert _value(text, 'gentorrent_cloves_dropped_total{reason="replay"}') == 1
    assert _value(text, 'gentorrent_cloves_dropped_total{reason="bad_tag"}') == 1
    assert _value(text, 'gentorrent_asks_total{outcome="answered"}') == 2
    assert _value(text, 'gentorrent_paths{kind="usable"}') == 4


def test_counter_sync_takes_a_lower_total_as_a_restart():
    from prometheus_client import CollectorRegistry, Counter

    c = Counter("x", "x", registry=CollectorRegistry())
    sync = CounterSync()
    for total in (5, 8, 2, 3):
        sync.set_total(c, total)
    assert c._value.get() == 5 + 3 + 2 + 1


def test_model_metrics_show_load_and_prefix_cache():
    status = {"served": 4, "capacity": 5, "refused_busy": 0,
              "load": {"active": 2, "queued": 1, "kv_cache_usage": 0.25, "prefix_queries": 100, "prefix_hits": 60}}
    text = ModelNodeMetrics().render(status)
    assert _value(text, 'gentorrent_requests_served_total{via="any"}') == 4
    assert _value(text, 'gentorrent_load{kind="active"}') == 2
    assert _value(text, 'gentorrent_prefix_cache{kind="hits"}') == 60
