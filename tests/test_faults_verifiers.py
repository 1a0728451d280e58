"""Verifier faults on a real 4-process committee (gt-verifier, fast timeouts, 127.0.0.1) with a
fault proxy on every validator-to-validator link: seeded kill -9 / restart and SIGSTOP,
2-2 and 3-1 partitions then heal, one Byzantine member. Scenario code is shared with
bench/reliability.py (gentorrent.testing.scenarios)."""

from __future__ import annotations

import pytest

from gentorrent.testing import scenarios

pytestmark = [pytest.mark.network, pytest.mark.timeout(420)]


def _safe(out: dict) -> None:
    assert out["forks"] == 0, out
    assert out["committed_txs_lost"] == 0, out
    assert out["extra"]["app_hashes_equal"], out
    assert out["answered"] > 0, out  # registrations really went in


async def test_kill9_restart_and_pause_lose_nothing_and_never_fork(tmp_path):
    out = await scenarios.verifier_kills(tmp_path, seed=7, quick=True)
    _safe(out)
    assert out["extra"]["evidence_against"] == {}, out  # honest nodes never double sign
    assert out["extra"]["secret_hits_in_logs"] == [], out


async def test_partition_2_2_stalls_3_1_progresses_heal_converges(tmp_path):
    out = await scenarios.verifier_partitions(tmp_path, seed=3, quick=True)
    _safe(out)
    assert out["extra"]["heights_gained_in_2_2"] <= 1, out  # at most the height already in flight
    assert out["extra"]["evidence_against"] == {}, out


async def test_byzantine_member_forged_votes_ignored_equivocation_only_blames_it(tmp_path):
    out = await scenarios.verifier_byzantine(tmp_path, seed=5, quick=True)
    _safe(out)
    assert out["extra"]["evidence_against_honest"] == 0, out
    assert set(out["extra"]["evidence_against"]) <= {3}, out
    assert out["extra"]["evidence_against"].get(3, 0) >= 1, out  # the equivocation was caught
