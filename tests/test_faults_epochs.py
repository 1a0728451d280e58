"""The committee's judgement under faults (testkit/scenarios/epochs.py, shared with
bench/reliability.py): a leader that drops, alters or forges the honest node's reply, or leaves the node out of its
plan, is blamed
and its epoch aborts without touching any reputation (a dropped reply: the leader's report is
disputed, the dropped node unscored, the rest of the epoch stands); a model node that goes down or cheats is
penalised in every epoch that probes it until it is untrusted. The honest node stays at 1.0
throughout. Real committee (4 verifier nodes over gRPC/TLS), scripted model replies and scores."""

from __future__ import annotations

import pytest

from gentorrent.config import REPUTATION
from gentorrent.ledger.epoch_txs import Phase
from testkit import scenarios
from testkit.epochs import EPOCH_TEST_TIMEOUT_S

pytestmark = [pytest.mark.network, pytest.mark.timeout(EPOCH_TEST_TIMEOUT_S)]


@pytest.mark.parametrize("mode", scenarios.EPOCH_MODES)
async def test_the_committee_judges_every_probed_epoch_right(tmp_path, mode):
    out = await scenarios.epoch_faults(tmp_path, mode, seed=3, quick=True)
    assert out["requests_sent"] >= 2 and out["lost"] == 0 and out["answered"] == out["requests_sent"], out
    assert out["recover_s"] is not None, out
    final, trace = out["extra"]["final"], out["extra"]["trace"]
    assert final["honest"] == 1.0, out
    if mode == "leader-drop":  # disputed, not aborted: the other node is scored, the dropped one is not
        assert out["extra"]["leader_faults_charged"] == out["requests_sent"], out
        disputed = [t for t in trace if "disputed" in t["reason"]]
        assert disputed and all(not t["faulty_leader"] and len(t["scores"]) == 1 for t in disputed), trace
    elif mode.startswith("leader"):
        assert out["extra"]["leader_faults_charged"] == out["requests_sent"], out
        assert all(t["faulty_leader"] and not t["scores"] for t in trace), trace  # aborted: nobody scored
    else:
        assert not final["target_trusted"] and final["target"] < REPUTATION.untrusted_below, out
        probed = [t for t in trace if t["phase"] == Phase.DONE]
        assert all(min(t["scores"].values()) < REPUTATION.abnormal_threshold for t in probed), trace
