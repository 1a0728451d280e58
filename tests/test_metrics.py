"""Prometheus text endpoint of a node."""

from __future__ import annotations

import aiohttp

from gentorrent.metrics import NodeMetrics, serve_metrics


async def test_metrics_endpoint_serves_counts():
    metrics = NodeMetrics("user")
    metrics.cloves_dropped.labels(reason="unknown_link").inc(3)
    metrics.consensus_height.set(42)
    runner, port = await serve_metrics(metrics, "127.0.0.1", 0)
    try:
        async with aiohttp.ClientSession() as session:
            async with session.get(f"http://127.0.0.1:{port}/metrics") as resp:
                assert resp.status == 200
                text = await resp.text()
        assert 'gentorrent_cloves_dropped_total{reason="unknown_link"} 3.0' in text
        assert "gentorrent_consensus_height 42.0" in text
    finally:
        await runner.cleanup()


def test_two_nodes_in_one_process_do_not_share_counters():
    a, b = NodeMetrics("user"), NodeMetrics("user")
    a.asks.labels(outcome="ok").inc()
    assert b'gentorrent_asks_total{outcome="ok"} 1.0' in a.render()
    assert b'outcome="ok"' not in b.render()
