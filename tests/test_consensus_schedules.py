"""Schedule exploration in the test suite: a seeded sample of every family of adversarial
schedules (testkit/schedules.py FAMILIES: network faults, crashes, crashes inside durable
writes, skewed and stepping clocks, Byzantine validators and Twins, far-future proposals and
false proof-of-lock rounds, replayed old messages, committees that change through the chain,
all at once) for committees of 4, 7, 10 and
31 validators, through the real driver (with its timeliness check), state machine, vote keeper,
signer, write-ahead log and boot counter; safety checked always, liveness after GST. And every
schedule a campaign (fuzz/consensus_schedules.py) ever found failing, replayed. The files in
tests/data/consensus_schedules/ so far were found by campaigns against the engine with one fix
reverted each (their "found_with"): each fails again if that fix goes."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from gentorrent.ledger.chain import VoteType
from conftest import CHECK_TIER
from testkit.schedules import (FAMILIES, Plan, agreement, judge, load_failure, lock_discipline, run_plan,
                               save_failure)
from testkit.simnet import FixedDelay, Network

#: per family: (committee size, seeds) of the sample make test runs (~1 CPU-s per family on 4-10);
#: make check runs the 4-validator part
SAMPLE = ((4, range(0, 2)),) if CHECK_TIER else ((4, range(0, 5)), (7, range(0, 3)), (10, range(0, 1)))
LARGE = ("mixed",)  # families also sampled with 31 validators (one schedule each; the campaign runs more)
ROOT = Path(__file__).resolve().parents[1]
SAVED = sorted((Path(__file__).parent / "data" / "consensus_schedules").glob("*.json"))


@pytest.fixture(autouse=True)
def _quiet():
    logging.disable(logging.WARNING)
    yield
    logging.disable(logging.NOTSET)


def _judge_all(units) -> None:
    failures = []
    for family, n, seed in units:
        verdict = judge(Plan.random(seed, n, family))
        if not verdict.ok:
            path = save_failure(verdict, Path(tempfile.gettempdir()) / "gt-consensus-schedules")
            failures.append(f"{family} n={n} seed={seed}: {verdict.violations[:3]} (replayable: {path}; "
                            f"copy it to tests/data/consensus_schedules/)")
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_seeded_sample_of_every_family_keeps_safety_and_liveness(family):
    _judge_all([(family, n, seed) for n, seeds in SAMPLE for seed in seeds])


@pytest.mark.parametrize("family", LARGE)
def test_thirty_one_validators_with_unequal_powers_keep_safety_and_liveness(family):
    _judge_all([(family, 31, 0)])


@pytest.mark.timeout(60)
@pytest.mark.parametrize("seed", [705, 749])
def test_a_committee_changed_down_to_one_member_runs_in_virtual_time_and_the_others_follow(seed):
    """Found by the campaign (indices 6352 and 6748): the plan removes members until one is left.
    With the fast timeouts (commit_s 0) it decided every height in one virtual instant, so virtual
    time never moved and the event queue grew to 8 GB (it never ended). And the removed members,
    following by one block per ask, fell ever further behind it: seed 705 failed liveness (at GST
    the lone member was at height 1,301, they at 419) once time ran. simnet now spends at least
    MIN_HEIGHT_S on a height and streams up to BLOCKS_PER_SYNC_CALL blocks per ask, as the node."""
    plan = Plan.random(seed, 4, "membership")
    final: dict[int, int] = dict(enumerate(plan.powers or [1] * plan.n))
    for change in plan.changes:
        final.update({k: p for k, p in change["updates"]})
    assert sum(1 for p in final.values() if p) == 1, final  # (what the schedule is about)
    verdict = judge(plan)
    assert verdict.violations == []


def test_every_family_draws_what_it_names():
    """The sample is not vacuous: each family's plans really hold its faults."""
    plans = {f: [Plan.random(s, 7, f) for s in range(20)] for f in FAMILIES}
    assert all(p.heights >= 3 for ps in plans.values() for p in ps)
    assert any(c["point"] == "in_sign_state" for p in plans["torn"] for c in p.crashes if c["kind"] == "sign")
    assert {c.get("what") for p in plans["torn"] for c in p.crashes} >= {"rotate", "boot"}
    assert any(p.clock_step[0] < 0 and len(set(p.clocks.values())) > 1 for p in plans["clock"])
    assert any(p.skewed for p in plans["clock"])
    assert {"future", "falsepol"} <= {b for p in plans["future"] for kinds in p.byzantine.values() for b in kinds}
    assert all(p.replay_rate > 0 for p in plans["replay"])
    changes = [u for p in plans["membership"] for c in p.changes for u in c["updates"]]
    assert any(k >= 7 for k, _ in changes) and any(power == 0 for _, power in changes)  # joins and leaves
    assert any(len(c["updates"]) == 2 for p in plans["membership"] for c in p.changes)  # a key rotation
    assert any(p.powers and len(set(p.powers)) > 1 for p in plans["mixed"])


@pytest.mark.parametrize("path", SAVED, ids=[p.stem for p in SAVED])
def test_schedules_found_failing_once_replay_clean(path):
    plan, once = load_failure(path)
    verdict = run_plan(plan)
    assert verdict.ok, f"{path.name} fails again: {verdict.violations} (first found: {once})"


def test_plans_are_files_and_replay_identically():
    plan = Plan.random(123, 7)
    assert Plan.from_json(plan.to_json()) == plan
    a, b = run_plan(plan), run_plan(Plan.from_json(plan.to_json()))
    assert (a.violations, a.heights, a.virtual_s) == (b.violations, b.heights, b.virtual_s)
    path = save_failure(a, Path(tempfile.mkdtemp()))
    assert load_failure(path)[0] == plan


def test_the_oracle_sees_a_fork_and_a_broken_lock():
    """The checks are not vacuous: fed a fork and a lock broken without a polka, they say so."""
    with Network(4, seed=1, policy=FixedDelay(0.01)) as net:
        net.run(0.5)
        assert agreement(net) == [] and lock_discipline(net) == []
        obs = net.observer
        obs.decisions[0][1] = {b"\x01" * 32, b"\x02" * 32}
        obs.honest_votes[0].add((1, 5, int(VoteType.PRECOMMIT), b"\x03" * 32))
        obs.honest_votes[0].add((1, 6, int(VoteType.PREVOTE), b"\x04" * 32))
        assert agreement(net) and any("at height 1" in v for v in agreement(net))
        broken = lock_discipline(net)
        assert any("without a polka" in v for v in broken) and any("prevoted 04040404" in v for v in broken)


def test_a_schedule_that_never_ends_is_an_overrun_the_campaign_saves_and_goes_past(tmp_path, monkeypatch):
    """A campaign once sat at 8 GB on one schedule for good (a lone member deciding every height in
    one virtual instant). A schedule past its wall time is now a finding of its own, saved as a
    replayable file, and the campaign moves on to the next index."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("campaign", ROOT / "fuzz" / "consensus_schedules.py")
    campaign = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(campaign)

    def never_ends(plan):
        while True:
            pass

    monkeypatch.setattr(campaign, "judge", never_ends)
    out = campaign._run(5, "membership", 4, 0, limit_s=0.3)
    assert out["violations"] and out["violations"][0].startswith("overrun: no verdict within 0.3 s"), out
    assert campaign.Plan.from_json(out["plan"]) == campaign.Plan.random(0, 4, "membership")
    monkeypatch.undo()
    ledger = tmp_path / "ledger.jsonl"  # and the driver itself, as operators run it: two real schedules
    run = subprocess.run([sys.executable, str(ROOT / "fuzz" / "consensus_schedules.py"), "--schedules", "2",
                          "--jobs", "1", "--validators", "4", "--weights", "1", "--ledger", str(ledger),
                          "--save-dir", str(tmp_path / "found")], capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stderr[-2000:]
    result = json.loads(run.stdout.splitlines()[-1])
    assert result["schedules"] == 2 and result["violations"] == 0 and result["indices"] == [0, 1], result
    assert json.loads(ledger.read_text())["schedules"] == 2 and not (tmp_path / "found").exists()
