"""Committees that change through the chain (verifier/consensus/valsets.py, ValidatorSet.updated):
the updates of block H apply from H + 2, as in CometBFT; proposer priorities carry over; the
driver, the vote keeper and gossip follow each height's committee; a node outside the first
committee joins a later one; a removed member's key signs nothing that counts after it left."""

from __future__ import annotations

import logging
from dataclasses import replace

import pytest

from gentorrent.ledger.chain import CommitError, CommitSig, Validator, ValidatorSet, verify_commit
from testkit.schedules import safety
from testkit.simnet import CHAIN, FixedDelay, Network, identities, net_updates, val_tx
from verifier.consensus.blockstore import BlockStore
from verifier.consensus.valsets import ValidatorHistory

IDS = identities(6, seed=5)


@pytest.fixture(autouse=True)
def _quiet():
    logging.disable(logging.WARNING)
    yield
    logging.disable(logging.NOTSET)


def vs(*powers: int) -> ValidatorSet:
    return ValidatorSet([Validator(IDS[k].public_key, p) for k, p in enumerate(powers)])


def test_an_update_keeps_members_places_and_turns_and_a_newcomer_waits():
    base = vs(1, 1, 1, 1)
    new = base.updated([(IDS[4].public_key, 1), (IDS[1].public_key, 0), (IDS[2].public_key, 3)], 10)
    assert [v.public_key for v in new] == [IDS[k].public_key for k in (0, 2, 3, 4)]
    assert [v.power for v in new] == [1, 3, 1, 1] and new.start_height == 10
    # the newcomer starts at -1.125 x the total: nobody's next turn is taken by it
    assert new.proposer(10, 0) != 3 and new.proposer(11, 0) != 3
    seen = [new.proposer(h, 0) for h in range(10, 40)]
    assert set(seen) == {0, 1, 2, 3} and seen.count(1) > seen.count(0)  # by power, everyone in turn
    with pytest.raises(ValueError):
        new.proposer(9, 0)  # not this set's height
    for bad in ([(IDS[5].public_key, 0)], [(IDS[0].public_key, 1), (IDS[0].public_key, 2)],
                [(IDS[k].public_key, 0) for k in range(4)]):
        with pytest.raises(ValueError):
            base.updated(bad, 5)


def test_updates_of_a_block_apply_two_heights_later_and_replay_identically():
    history = ValidatorHistory(vs(1, 1, 1, 1))
    add = ((IDS[4].public_key, 2),)
    assert history.record(7, add).start_height == 9
    assert history.at(8) == history.at(1) and history.at(9).index_of(IDS[4].public_key) == 4
    assert history.record(7, add) is None  # the same block executed again after a crash: the same
    with pytest.raises(ValueError, match="not deterministic"):
        history.record(7, ((IDS[4].public_key, 3),))
    with pytest.raises(ValueError):  # older than the last recorded
        history.record(6, ((IDS[5].public_key, 1),))


def test_the_block_store_keeps_updates_and_a_restart_rebuilds_the_same_committees(tmp_path):
    store = BlockStore(tmp_path / "blocks.sqlite")
    store.save_updates(3, ((IDS[4].public_key, 1),))
    store.save_updates(4, ())  # (nothing stored for a block without updates)
    store.save_updates(9, ((IDS[0].public_key, 0), (IDS[5].public_key, 2)))
    store.close()
    again = BlockStore(tmp_path / "blocks.sqlite")
    stored = again.all_updates()
    again.close()
    assert [h for h, _ in stored] == [3, 9]
    rebuilt = ValidatorHistory.load(vs(1, 1, 1, 1), stored)
    assert [(h, len(s)) for h, s in rebuilt.changes()] == [(1, 4), (5, 5), (11, 5)]
    assert rebuilt.at(11).index_of(IDS[0].public_key) is None


def test_a_node_joins_a_member_leaves_and_the_chain_goes_on_with_every_commit_by_its_committee():
    """Four validators and one node outside the committee, all real drivers, signers and WALs.
    The joiner is added, then validator 0 removed, through transactions; each takes effect two
    heights after its block: from then on the joiner signs commits and validator 0 does not."""
    with Network(4, seed=5, policy=FixedDelay(0.01), joiners=1) as net:
        joiner = net.instances[4]
        net.submit_at(0.2, val_tx([(joiner.identity.public_key, 1)], 0))
        net.submit_at(0.8, val_tx([(net.identities[0].public_key, 0)], 1))
        net.run(4.0)
        assert safety(net) == []
        assert min(net.heights().values()) >= 12, net.heights()
        starts = [h for h, _ in net.history.changes()]
        assert len(starts) == 3, net.history.changes()
        added, removed = starts[1], starts[2]
        key0, key4 = net.identities[0].public_key, joiner.identity.public_key
        ref = net.instances[1]
        for h in range(1, min(net.heights().values()) + 1):
            block, commit = ref.store[h]
            committee = net.history.at(h)
            verify_commit(commit, CHAIN, committee, h, block.hash())
            signers = {s.public_key for s in commit.signatures}
            assert (committee.index_of(key4) is not None) == (h >= added)
            assert (committee.index_of(key0) is not None) == (h < removed)
            if h >= removed:
                assert key0 not in signers  # a removed member signs no commit that counts
                precommit = commit.precommit(commit.signatures[0], 0)
                forged = CommitSig(key0, net.identities[0].sign(precommit.sign_bytes(CHAIN)))
                with pytest.raises(CommitError, match="unknown key"):  # nor is its signature counted
                    verify_commit(replace(commit, signatures=commit.signatures + (forged,)), CHAIN, committee, h,
                                  block.hash())
            assert block.header.validators_hash == committee.hash()
            assert block.header.next_validators_hash == net.history.at(h + 1).hash()
        assert any(key4 in {s.public_key for s in ref.store[h][1].signatures} for h in range(added, added + 5))
        assert joiner.driver.me is not None and net.instances[0].driver.me is None


def test_a_change_that_no_longer_applies_is_left_out_and_a_block_with_it_refused():
    base = vs(1, 1, 1, 1)
    assert net_updates(base, [val_tx([(IDS[4].public_key, 2)], 0)]) == [(IDS[4].public_key, 2)]
    add_then_remove = [val_tx([(IDS[4].public_key, 2)], 0), val_tx([(IDS[4].public_key, 0)], 1)]
    assert net_updates(base, add_then_remove) == []  # in order: nothing changes
    assert net_updates(base, [val_tx([(IDS[5].public_key, 0)], 0)]) is None  # removes a non-member


def test_a_round_state_of_a_height_before_any_committee_gets_an_answer_not_an_exception():
    """A peer's state names any height, also one before the first committee (the history has
    no set for it): the state is judged by this height's committee, and a node behind is told
    where this one is, as for any old height."""
    from verifier.consensus import gossip
    from verifier.consensus.driver import SendTo
    with Network(4, seed=5, policy=FixedDelay(0.01)) as net:
        net.run(0.3)
        inst, peer = net.instances[0], net.instances[1]
        state = gossip.signed(gossip.RoundState(1, 10**12, 0, 0, 1, ()), CHAIN, peer.identity.sign)
        effects = inst.driver.on_round_state(state)
        assert [type(e.message).__name__ for e in effects if isinstance(e, SendTo)] == ["RoundState"]
