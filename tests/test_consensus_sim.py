"""Seeded simulations of 4 validators through the pure consensus core (tests/consensus_simnet)."""

from __future__ import annotations

import logging

import pytest

from consensus_simnet import Faults, SimNet


@pytest.fixture(autouse=True)
def _quiet():
    logging.disable(logging.WARNING)
    yield
    logging.disable(logging.NOTSET)


def _same_state(net: SimNet) -> None:
    h = net.min_honest_height()
    hashes = {n.store[h][0].hash() for n in net.honest_nodes()}
    assert len(hashes) == 1


def test_fault_free_network_decides_a_block_per_height_and_agrees():
    net = SimNet(seed=7, faults=Faults())
    net.run(until=3.0)
    net.assert_agreement()
    assert net.min_honest_height() >= 20
    net.assert_every_height_decided(net.min_honest_height())
    _same_state(net)
    # every transaction of every mempool got committed, identically everywhere
    kvs = [n.host.kv for n in net.nodes]
    assert len(kvs[0]) == 4 * 6 and all(kv == kvs[0] for kv in kvs)
    app_hashes = {n.host.app_hash for n in net.nodes if n.host.height == net.min_honest_height()}
    assert len(app_hashes) == 1


@pytest.mark.parametrize("seed", range(8))
def test_faulty_network_never_forks_and_recovers_after_healing(seed):
    faults = Faults(drop=0.25, duplicate=0.2, delay=(0.001, 0.2), heal_at=6.0, byzantine={3},
                    crashes=[(0.7, seed % 3, 1.3), (4.1, (seed + 1) % 3, 0.8)],
                    partitions=[(2.0, 3.8, [{0, 1}, {2, 3}])])
    net = SimNet(seed=seed, faults=faults)
    net.run(until=6.0)
    net.assert_agreement()
    net.assert_no_double_sign()
    at_heal = max(n.host.height for n in net.honest_nodes())
    net.run(until=30.0, stop_height=at_heal + 5)
    net.assert_agreement()
    net.assert_no_double_sign()
    assert net.min_honest_height() >= at_heal + 5, "the healed network stopped deciding"
    net.assert_every_height_decided(net.min_honest_height())
    _same_state(net)


def test_equivocation_is_detected_and_committed_as_evidence():
    net = SimNet(seed=3, faults=Faults(byzantine={2}))
    net.run(until=8.0, stop_height=12)
    net.assert_agreement()
    assert net.evidence_seen, "no equivocation evidence made it into a block"
    assert {ev.vote_a.validator for ev in net.evidence_seen} == {2}


def test_crash_restarts_without_network_faults_never_double_sign():
    crashes = [(0.05 * k, k % 4, 0.2) for k in range(1, 40)]
    net = SimNet(seed=11, faults=Faults(crashes=crashes, delay=(0.001, 0.05)))
    net.run(until=8.0)
    net.assert_agreement()
    net.assert_no_double_sign()
    assert net.min_honest_height() >= 5


def test_unequal_voting_power_one_heavy_validator_cannot_stop_the_rest():
    # powers 1,1,1,2 : total 5, quorum 4; node 3 crashed = 3 of 5 left, below quorum: halts
    net = SimNet(seed=5, faults=Faults(crashes=[(1.0, 3, 2.0)]), powers=[1, 1, 1, 2])
    net.run(until=1.0)
    before = net.min_honest_height()
    net.run(until=2.5)
    stalled = [n.host.height for n in net.nodes[:3]]
    assert max(stalled) <= before + 1  # at most the height in flight completes
    net.run(until=8.0)
    net.assert_agreement()
    assert net.min_honest_height() > max(stalled)
