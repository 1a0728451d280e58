"""Relay faults on a real overlay (14 user nodes relaying over pinned TLS on 127.0.0.1, the
echo model node with the real clove intake): one relay (first or second hop) of n - k = 2 of the n = 4 paths
is killed, hangs, drops, corrupts or replays the cloves it forwards. Every ask is still
answered; killed relays leave the repaired path pool; corruptions and replays are dropped
with a counted reason. Scenario code shared with bench/reliability.py."""

from __future__ import annotations

import pytest

from gentorrent.testing import scenarios

pytestmark = [pytest.mark.network, pytest.mark.timeout(240)]


@pytest.mark.parametrize("mode", scenarios.RELAY_MODES)
async def test_asks_survive_n_minus_k_faulty_relays(tmp_path, mode):
    out = await scenarios.relay_faults(tmp_path, mode, seed=11, quick=True)
    extra = out["extra"]
    assert extra["victims"] == scenarios.RELAY_CLOVES_N - scenarios.RELAY_CLOVES_K, out
    assert out["answered"] == out["requests_sent"], out
    assert extra["paths_repaired"], out
    if mode != "kill":
        # the fault really hit (a path whose relay times out is replaced, so maybe only once)
        assert extra["fault_hits"].get(mode, 0) >= extra["victims"], out
    if mode in ("kill", "hang", "corrupt"):  # a failed send marks the path failed: it is replaced
        assert extra["paths_rebuilt"] >= 1, out
    if mode == "corrupt":  # the next relay cannot open the layer: counted, skipped
        assert extra["relay_drops"].get("bad_layer", 0) >= 1, out
    if mode == "replay":
        assert extra["fault_hits"]["replay_refused"] == extra["fault_hits"]["replay"], out
        assert extra["relay_drops"].get("replay", 0) >= extra["fault_hits"]["replay"], out
