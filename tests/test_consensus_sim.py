"""Seeded simulations of validators made of the real consensus parts (testkit/simnet.py):
throughput without faults, evidence of equivocation, crashes without double signing, unequal
power. Adversarial schedules are in test_consensus_schedules.py."""

from __future__ import annotations

import logging
from dataclasses import replace

import pytest

from testkit.schedules import Byzantine, double_signing, lock_discipline, safety
from testkit.simnet import CHAIN, FixedDelay, Network


@pytest.fixture(autouse=True)
def _quiet():
    logging.disable(logging.WARNING)
    yield
    logging.disable(logging.NOTSET)


def test_fault_free_network_decides_a_block_per_height_and_agrees():
    with Network(4, seed=7, policy=FixedDelay(0.005)) as net:
        net.run(3.0)
        assert safety(net) == []
        h = net.min_honest_height()
        assert h >= 20
        assert len({i.store[h][0].hash() for i in net.honest()}) == 1
        # every transaction of every mempool got committed, identically everywhere
        kvs = [i.host.kv for i in net.instances]
        assert len(kvs[0]) == 4 * 6 and all(kv == kvs[0] for kv in kvs)
        assert len({i.host.app_hash for i in net.instances if i.host.height == h}) == 1


def test_equivocation_is_detected_and_committed_as_evidence():
    with Network(4, seed=3, byzantine={2: Byzantine(["equivocate"], p=0.5)}) as net:
        net.run(8.0, stop=lambda n: n.min_honest_height() >= 12)
        assert safety(net) == []
        evidence = {ev for (h, _), (block, _) in net.observer.decided_blocks.items() for ev in block.evidence}
        assert evidence, "no equivocation evidence made it into a block"
        assert {ev.validator for ev in evidence} == {2}
        kinds = {type(ev).__name__ for ev in evidence}
        # votes and proposals: another peer relays the other proposal, and the two are evidence
        assert kinds == {"DuplicateVoteEvidence", "DuplicateProposalEvidence"}, kinds
        for ev in evidence:
            ev.check(CHAIN, net.validators)
            forged = replace(ev, **{f: replace(getattr(ev, f), validator=1) for f in ev.__dataclass_fields__})
            with pytest.raises(ValueError):  # the same signatures named for another validator
                forged.check(CHAIN, net.validators)


def test_crash_restarts_without_network_faults_never_double_sign():
    with Network(4, seed=11, policy=FixedDelay(0.02)) as net:
        for k in range(1, 40):
            net.crash_at(0.05 * k, k % 4, down_for=0.2)
        net.run(8.0)
        assert double_signing(net) == [] and lock_discipline(net) == [] and safety(net) == []
        assert sum(i.restarts for i in net.instances) >= 20
        assert net.min_honest_height() >= 5


def test_unequal_voting_power_one_heavy_validator_cannot_stop_the_rest_for_good():
    # powers 1,1,1,2 : total 5, quorum 4; node 3 crashed = 3 of 5 left, below quorum: halts
    with Network(4, seed=5, powers=[1, 1, 1, 2]) as net:
        net.crash_at(1.0, 3, down_for=2.0)
        net.run(1.0)
        before = net.min_honest_height()
        net.run(2.5)
        stalled = [i.host.height for i in net.instances[:3]]
        assert max(stalled) <= before + 1  # at most the height in flight completes
        net.run(8.0)
        assert safety(net) == []
        assert net.min_honest_height() > max(stalled)
