"""Verifier faults on a real 4-process committee (gt-verifier, fast timeouts, 127.0.0.1) with a
fault proxy on every validator-to-validator link: seeded kill -9 / restart and SIGSTOP,
kill -9 at exact crash points (failpoints), 2-2 and 3-1 partitions then heal, a quorum that
needs relayed votes, one Byzantine member, clock skew (libfaketime). Scenario code is shared with
bench/reliability.py (testkit.scenarios)."""

from __future__ import annotations

import pytest

from testkit import faketime, scenarios

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


async def test_a_quorum_that_needs_relayed_votes_keeps_committing(tmp_path):
    """Real processes, real gRPC: 2 is down, 3 cannot reach 1; 1 gets 3's votes relayed."""
    out = await scenarios.verifier_gossip(tmp_path, seed=11, quick=True)
    _safe(out)
    assert out["extra"]["evidence_against"] == {}, out
    relayed = out["extra"]["gossip"]
    assert relayed["v1"]["states_sent"] > 0 and relayed["v0"]["relayed"] + relayed["v3"]["relayed"] > 0, out


async def test_byzantine_member_forged_votes_ignored_equivocation_blames_it_and_removes_it(tmp_path):
    out = await scenarios.verifier_byzantine(tmp_path, seed=5, quick=True)
    _safe(out)
    assert out["extra"]["evidence_against_honest"] == 0, out
    assert set(out["extra"]["evidence_against"]) <= {3}, out
    assert out["extra"]["evidence_against"].get(3, 0) >= 1, out  # the equivocation was caught
    # and it cost the equivocator its seat: removed by the application, named on the status page
    assert out["extra"]["committee_size"] == 3, out
    assert [(r["name"], r["reason"].split(":")[0]) for r in out["extra"]["removed"]] == [("v3", "double-signed")], out


async def test_kill9_at_exact_crash_points_loses_nothing_and_never_double_signs(tmp_path):
    out = await scenarios.verifier_crash_points(tmp_path, seed=11, quick=True)
    _safe(out)
    crashes = out["extra"]["crashes"]
    assert [x["point"] for x in crashes] == list(scenarios.QUICK_CRASH_POINTS), out
    for x in crashes:  # each node died by SIGKILL at the armed point, not somewhere else
        assert x["fired"] and x["exit"] == -9, x
    assert out["extra"]["evidence_against"] == {}, out  # no double sign after any restart
    # killed between signing a proposal and logging it: it proposes that block again, not a new one
    assert out["extra"]["proposals_recovered"] >= 1 and out["extra"]["refused_to_sign"] == 0, out


@pytest.mark.skipif(faketime.library() is None, reason=faketime.MISSING)
async def test_clock_skew_one_hour_either_way_bounded_block_time_tls_still_works(tmp_path):
    out = await scenarios.verifier_clock_skew(tmp_path, seed=0, quick=True)
    _safe(out)
    x = out["extra"]
    offsets = x["node_clock_offsets_s"]  # node clock at its last commit - ours: the skew was real
    assert abs(offsets["fast"] - 3600) < 60 and abs(offsets["slow"] + 3600) < 60, out
    assert x["increasing"], out
    assert x["max_block_time_ahead_ms"] <= x["bound_ms"], out  # never pushed into the future
    assert x["blocks_by_fast"] == 0, out  # its +1 h blocks got nil prevotes
    assert x["blocks_by_slow"] > 0 and x["slow_node_peers_reached"] == 3, out  # its TLS dials work
    assert x["evidence_against"] == {}, out
    assert out["recover_s"] is not None, out
