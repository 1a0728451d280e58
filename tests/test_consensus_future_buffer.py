"""The driver's next-height buffer and its write-ahead filter: forgeries are neither held nor
logged, and one validator (however authentic) cannot make a node hold more than its budget
or crowd out the others."""

from __future__ import annotations

import hashlib

from gentorrent.config import CONSENSUS_FAST
from gentorrent.crypto.keys import Identity
from verifier.consensus.driver import (MAX_FUTURE_BYTES_PER_VALIDATOR, MAX_FUTURE_PER_VALIDATOR, Driver, NeedBlock)
from gentorrent.ledger.chain import Block, Proposal, Validator, ValidatorSet, Vote, VoteType, make_block

CHAIN = "future-test"
IDS = [Identity.from_seed(hashlib.sha256(f"future-{i}".encode()).digest()) for i in range(4)]
VALS = ValidatorSet([Validator(i.public_key, 1) for i in IDS])
STRANGER = Identity.from_seed(b"\x05" * 32)
MIB = 1024 * 1024


class _Host:
    def make_block(self, height, round_, evidence):
        return make_block(CHAIN, height, 1, IDS[0].public_key, b"", None, (), VALS, b"")

    def validate_block(self, block):
        return True


class _Signer:
    def sign(self, step, height, round_, sign_bytes):
        return IDS[0].sign(sign_bytes)


def driver() -> Driver:
    d = Driver(CHAIN, VALS, 0, _Signer(), _Host(), CONSENSUS_FAST)
    d.start_height(1)
    return d


def big_block(height: int, tag: int, size: int = MIB) -> Block:
    return make_block(CHAIN, height, 1, IDS[0].public_key, b"", None, (bytes([tag % 256]) * size,), VALS, b"")


def proposal(height: int, r: int, block: Block, key: Identity | None = None) -> Proposal:
    who = VALS.proposer(height, r)
    p = Proposal(height, r, -1, block, who)
    return Proposal(height, r, -1, block, who, (key or IDS[who]).sign(p.sign_bytes(CHAIN)))


def vote(height: int, r: int, who: int, key: Identity | None = None, block_hash: bytes = b"") -> Vote:
    v = Vote(VoteType.PREVOTE, height, r, block_hash, who)
    return Vote(v.type, height, r, block_hash, who, (key or IDS[who]).sign(v.sign_bytes(CHAIN)))


def test_forged_next_height_proposals_are_neither_held_nor_logged():
    d = driver()
    for r in range(12):  # 12 MiB of blocks under a stranger's signature
        p = proposal(2, r, big_block(2, r), key=STRANGER)
        assert not d.admits(p)
        assert d.on_message(p) == []
    assert d.buffered_future() == (0, 0)
    forged_vote = vote(2, 0, 1, key=STRANGER)
    assert not d.admits(forged_vote) and d.on_message(forged_vote) == []


def test_one_proposer_cannot_pin_more_than_its_byte_budget_nor_crowd_out_others():
    d = driver()
    byz = VALS.proposer(2, 0)
    rounds = [r for r in range(60) if VALS.proposer(2, r) == byz][:12]  # 12 authentic 1 MiB proposals
    admitted = 0
    for r in rounds:
        p = proposal(2, r, big_block(2, r))
        admitted += d.admits(p)
        assert d.on_message(p) == [NeedBlock(1, byz)]  # authentic: peers are ahead, we may fetch
    count, used = d.buffered_future()
    assert used <= MAX_FUTURE_BYTES_PER_VALIDATOR and count == admitted
    assert 1 <= count < len(rounds)  # the budget cut it off
    honest = [i for i in range(1, 4) if i != byz]
    for i in honest:
        v = vote(2, 0, i)
        assert d.admits(v)
        d.on_message(v)
    assert d.buffered_future()[0] == count + len(honest)


def test_one_validator_cannot_fill_the_buffer_with_small_votes():
    d = driver()
    for r in range(3 * MAX_FUTURE_PER_VALIDATOR):
        d.on_message(vote(2, r, 1))
    assert d.buffered_future()[0] == MAX_FUTURE_PER_VALIDATOR
    assert d.admits(vote(2, 0, 2)) and not d.admits(vote(2, 500, 1))


def test_buffered_messages_are_delivered_when_the_height_starts():
    d = driver()
    b = big_block(2, 1, size=10)
    for i in (1, 2, 3):
        d.on_message(vote(2, 0, i, block_hash=b.hash()))
    d.start_height(2)
    assert d.buffered_future() == (0, 0)
    assert d.sm.votes.has_quorum_for(0, VoteType.PREVOTE, b.hash())


def test_write_ahead_filter_for_the_current_height():
    d = driver()
    v = vote(1, 0, 2)
    assert d.admits(v)
    d.on_message(v)
    assert not d.admits(v)  # a repeat changes nothing: not logged again
    assert not d.admits(vote(1, 0, 3, key=STRANGER))
    assert not d.admits(vote(1, CONSENSUS_FAST.max_rounds_ahead + 1, 3))
    assert not d.admits(vote(0, 0, 3)) and not d.admits(vote(3, 0, 3))  # past height; two ahead
    p = proposal(1, 1, big_block(1, 1, size=10))
    assert d.admits(p)
    d.on_message(p)
    assert not d.admits(proposal(1, 1, big_block(1, 2, size=10)))  # a second proposal for the round


def test_a_header_with_a_foreign_body_is_neither_logged_nor_remembered():
    """A proposal signs only the header hash: a proposer of a later round re-sending the honest
    block's header with another body must leave no trace, or the honest block (known by that
    hash) would be taken for invalid for the rest of the height."""
    d = driver()
    honest = big_block(1, 1, size=10)
    poisoned = Block(honest.header, (b"other body",), honest.last_commit, honest.evidence)
    later = proposal(1, 1, poisoned)
    for msg in (later, proposal(2, 0, Block(big_block(2, 3, size=10).header, (b"x",)))):
        assert not d.admits(msg)
        assert d.on_message(msg) == [] and d.buffered_future() == (0, 0)
    assert 1 not in d.sm.proposals and honest.hash() not in d.sm.blocks
    d.on_message(proposal(1, 0, honest))
    assert d.sm.blocks[honest.hash()] == (honest, True)
