"""Schedule exploration in the test suite: seeded adversarial schedules for committees of 4 and 7
validators through the real driver, state machine, vote keeper, signer and write-ahead log
(testkit/schedules.py), safety checked always and liveness after GST; and every
schedule a campaign (fuzz/consensus_schedules.py) ever found failing, replayed. The files in
tests/data/consensus_schedules/ so far were found by campaigns against the engine with one fix
reverted each (their "found_with"): each fails again if that fix goes."""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path

import pytest

from gentorrent.ledger.chain import VoteType
from testkit.schedules import (Plan, agreement, judge, load_failure, lock_discipline, run_plan,
                               save_failure)
from testkit.simnet import FixedDelay, Network

BATCH = 25
SEEDS = {4: 300, 7: 100}  # schedules per committee size in make test
SAVED = sorted((Path(__file__).parent / "data" / "consensus_schedules").glob("*.json"))


@pytest.fixture(autouse=True)
def _quiet():
    logging.disable(logging.WARNING)
    yield
    logging.disable(logging.NOTSET)


@pytest.mark.parametrize("n,first", [(n, k) for n, count in SEEDS.items() for k in range(0, count, BATCH)])
def test_random_schedules_keep_safety_and_liveness(n, first):
    failures = []
    for seed in range(first, first + BATCH):
        verdict = judge(Plan.random(seed, n))
        if not verdict.ok:
            path = save_failure(verdict, Path(tempfile.gettempdir()) / "gt-consensus-schedules")
            failures.append(f"n={n} seed={seed}: {verdict.violations[:3]} (replayable: {path}; "
                            f"copy it to tests/data/consensus_schedules/)")
    assert not failures, "\n".join(failures)


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
