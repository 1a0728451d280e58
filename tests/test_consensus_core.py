"""The pure consensus core: encodings, proposer rotation, vote keeper and the locking rules."""

from __future__ import annotations

import hashlib
from collections import Counter

import pytest

from gentorrent.crypto.keys import Identity
from verifier.consensus.state_machine import (CastVote, Decision, HeightStateMachine, ProposeValue,
                                              ScheduleTimeout)
from gentorrent.ledger.chain import (NIL, Block, Commit, CommitError, CommitSig, DecodeError,
                                      Proposal, Step, Validator, ValidatorSet, Vote, VoteType,
                                      decode_message, encode_message, make_block, verify_commit)
from verifier.consensus.votes import AddOutcome, VoteKeeper

CHAIN = "core-test"
IDS = [Identity.from_seed(hashlib.sha256(f"core-{i}".encode()).digest()) for i in range(4)]
VALS = ValidatorSet([Validator(i.public_key, 1) for i in IDS])


def block(height: int = 1, t: int = 1, txs: tuple[bytes, ...] = ()) -> Block:
    return make_block(CHAIN, height, t, IDS[0].public_key, b"", None, txs, VALS, b"\x00" * 32)


def vote(type_: VoteType, r: int, value: Block | None, who: int, height: int = 1) -> Vote:
    v = Vote(type_, height, r, value.hash() if value else NIL, who)
    return Vote(v.type, v.height, v.round, v.block_hash, who, IDS[who].sign(v.sign_bytes(CHAIN)))


def proposal(r: int, value: Block, pol: int = -1, height: int = 1) -> Proposal:
    who = VALS.proposer(height, r)
    p = Proposal(height, r, pol, value, who)
    return Proposal(height, r, pol, value, who, IDS[who].sign(p.sign_bytes(CHAIN)))


# --------------------------------------------------------------------------- encodings


def test_messages_round_trip_and_reject_garbage():
    b = block(txs=(b"a=1", b"b=2"))
    for msg in (vote(VoteType.PREVOTE, 3, b, 2), vote(VoteType.PRECOMMIT, 0, None, 1), proposal(0, b)):
        data = encode_message(msg)
        assert decode_message(data) == msg
        with pytest.raises(DecodeError):
            decode_message(data + b"\x00")
        with pytest.raises(DecodeError):
            decode_message(data[:-1])
    assert Block.decode(b.encode()) == b and Block.decode(b.encode()).hash() == b.hash()
    with pytest.raises(DecodeError):
        decode_message(b"\x09junk")
    huge = b"\x02" + Vote.TAG + b"\x02" + b"\x00" * 12 + b"\xff\xff\xff\xff"
    with pytest.raises(DecodeError):
        decode_message(huge)


def test_sign_bytes_bind_every_field():
    b = block()
    base = vote(VoteType.PREVOTE, 1, b, 0)
    variants = [Vote(VoteType.PRECOMMIT, 1, 1, base.block_hash, 0), Vote(VoteType.PREVOTE, 2, 1, base.block_hash, 0),
                Vote(VoteType.PREVOTE, 1, 2, base.block_hash, 0), Vote(VoteType.PREVOTE, 1, 1, NIL, 0)]
    assert len({v.sign_bytes(CHAIN) for v in variants + [base]}) == 5
    assert base.signed_by(CHAIN, IDS[0].public_key)
    assert not base.signed_by("other-chain", IDS[0].public_key)
    assert not base.signed_by(CHAIN, IDS[1].public_key)


def test_verify_commit_counts_power_and_rejects_forgeries():
    b = block()
    sigs = tuple(CommitSig(IDS[i].public_key, vote(VoteType.PRECOMMIT, 0, b, i).signature) for i in range(3))
    c = Commit(1, 0, b.hash(), sigs)
    assert verify_commit(Commit.decode(c.encode()), CHAIN, VALS, 1, b.hash()) == 3
    with pytest.raises(CommitError, match="too few"):
        verify_commit(Commit(1, 0, b.hash(), sigs[:2]), CHAIN, VALS, 1, b.hash())
    with pytest.raises(CommitError, match="signed twice"):
        verify_commit(Commit(1, 0, b.hash(), sigs[:2] + sigs[:1]), CHAIN, VALS, 1, b.hash())
    with pytest.raises(CommitError, match="unknown key"):
        stranger = Identity.from_seed(b"\x07" * 32).public_key
        verify_commit(Commit(1, 0, b.hash(), sigs + (CommitSig(stranger, sigs[0].signature),)), CHAIN, VALS, 1, b.hash())
    forged = sigs[:2] + (CommitSig(IDS[3].public_key, sigs[2].signature),)
    with pytest.raises(CommitError, match="bad precommit signature"):
        verify_commit(Commit(1, 0, b.hash(), forged), CHAIN, VALS, 1, b.hash())
    with pytest.raises(CommitError, match="another block"):
        verify_commit(c, CHAIN, VALS, 1, block(t=2).hash())


# --------------------------------------------------------------------------- proposer rotation


def test_proposer_rotation_is_weighted_by_power_and_fair_in_every_window():
    keys = [Identity.from_seed(bytes([i]) * 32).public_key for i in range(3)]
    vs = ValidatorSet([Validator(k, p) for k, p in zip(keys, (1, 2, 3))])
    counts = Counter(vs.proposer(h, 0) for h in range(1, 601))
    assert counts == {0: 100, 1: 200, 2: 300}
    for start in range(1, 600, 6):  # every window of total-power heights is exact
        assert Counter(vs.proposer(h, 0) for h in range(start, start + 6)) == {0: 1, 1: 2, 2: 3}
    # rounds rotate too, and the function is pure in (height, round)
    assert len({vs.proposer(5, r) for r in range(6)}) == 3
    assert vs.proposer(9, 2) == ValidatorSet(vs.validators).proposer(9, 2)


def test_equal_powers_round_robin():
    assert sorted(VALS.proposer(h, 0) for h in range(1, 5)) == [0, 1, 2, 3]
    assert sorted(VALS.proposer(1, r) for r in range(4)) == [0, 1, 2, 3]


# --------------------------------------------------------------------------- vote keeper


def test_vote_keeper_counts_power_and_keeps_equivocation_as_evidence():
    vs = ValidatorSet([Validator(i.public_key, p) for i, p in zip(IDS, (1, 1, 1, 3))])
    k = VoteKeeper(vs, 1)
    a, b = block(t=1), block(t=2)
    assert k.add(vote(VoteType.PREVOTE, 0, a, 3)) is AddOutcome.ADDED
    assert k.add(vote(VoteType.PREVOTE, 0, a, 3)) is AddOutcome.DUPLICATE
    assert k.power_for(0, VoteType.PREVOTE, a.hash()) == 3
    assert not k.has_quorum_for(0, VoteType.PREVOTE, a.hash())  # quorum of 6 is 5
    assert k.add(vote(VoteType.PREVOTE, 0, b, 3)) is AddOutcome.EQUIVOCATION
    assert len(k.evidence) == 1 and k.evidence[0].vote_a.validator == 3
    k.evidence[0].check(CHAIN, vs)
    assert k.power_any(0, VoteType.PREVOTE) == 3  # the equivocator counts once towards "any"
    k.add(vote(VoteType.PREVOTE, 0, a, 0))
    k.add(vote(VoteType.PREVOTE, 0, a, 1))
    assert k.has_quorum_for(0, VoteType.PREVOTE, a.hash())
    assert k.quorum_value(0, VoteType.PREVOTE) == a.hash()
    assert k.round_power(0) == 5


def test_junk_votes_neither_hide_a_real_vote_nor_grow_the_keeper():
    """A Byzantine validator signs 100 junk values before its real prevote: the real one is
    counted once its value has f+1 support, and the keeper stores at most three of its votes."""
    k = VoteKeeper(VALS, 1)
    real = block(t=7)
    for j in range(100):
        junk = vote(VoteType.PREVOTE, 0, block(t=100 + j), 3)
        assert k.add(junk) in (AddOutcome.ADDED, AddOutcome.EQUIVOCATION)
    assert len(k.votes(0, VoteType.PREVOTE)) == 1 and len(k.evidence) == 1
    late = vote(VoteType.PREVOTE, 0, real, 3)
    assert k.would_change(late) is False  # no support yet: dropped, not even signature-checked
    assert k.add(late) is AddOutcome.EQUIVOCATION and not k.has_vote(late)
    k.add(vote(VoteType.PREVOTE, 0, real, 0))
    k.add(vote(VoteType.PREVOTE, 0, real, 1))  # f + 1 = 2 honest votes: the value is supported
    assert k.would_change(late) is True
    assert k.add(late) is AddOutcome.EQUIVOCATION and k.has_vote(late)
    assert k.has_quorum_for(0, VoteType.PREVOTE, real.hash())  # the polka others locked on
    assert k.power_any(0, VoteType.PREVOTE) == 3  # the equivocator still counts once towards "any"
    assert len([v for v in k.votes(0, VoteType.PREVOTE) if v.validator == 3]) == 2
    assert len(k.evidence) == 1  # one piece of evidence per validator and step is enough


# --------------------------------------------------------------------------- locking rules


def observer_at(me: int) -> HeightStateMachine:
    sm = HeightStateMachine(1, VALS, me)
    sm.start()
    return sm


def non_proposer(rounds: range) -> int:
    proposers = {VALS.proposer(1, r) for r in rounds}
    return next(i for i in range(4) if i not in proposers)


def others(me: int) -> list[int]:
    return [i for i in range(4) if i != me]


def casts(outputs) -> list[CastVote]:
    return [o for o in outputs if isinstance(o, CastVote)]


def feed_votes(sm, type_, r, value, who) -> list:
    out = []
    for w in who:
        out += sm.on_vote(vote(type_, r, value, w))[1]
    return out


def test_lock_on_a_polka_then_prevote_nil_for_another_value():
    me = non_proposer(range(2))
    sm = observer_at(me)
    v, w = block(t=1), block(t=2)
    out = sm.on_proposal(proposal(0, v), valid=True)
    assert casts(out) == [CastVote(VoteType.PREVOTE, 1, 0, v.hash())]
    sm.on_vote(vote(VoteType.PREVOTE, 0, v, me))
    out = feed_votes(sm, VoteType.PREVOTE, 0, v, others(me)[:2])
    assert casts(out) == [CastVote(VoteType.PRECOMMIT, 1, 0, v.hash())]
    assert sm.locked_value == v and sm.locked_round == 0 and sm.valid_round == 0
    # round 0 fails to commit; round 1 proposes another value: a locked node prevotes nil
    sm.on_vote(vote(VoteType.PRECOMMIT, 0, v, me))
    out = feed_votes(sm, VoteType.PRECOMMIT, 0, None, others(me))
    assert ScheduleTimeout(Step.PRECOMMIT, 1, 0) in out
    sm.on_timeout(Step.PRECOMMIT, 1, 0)
    assert sm.round == 1
    out = sm.on_proposal(proposal(1, w), valid=True)
    assert casts(out) == [CastVote(VoteType.PREVOTE, 1, 1, NIL)]
    assert sm.locked_value == v


def test_unlock_on_a_later_polka():
    me = non_proposer(range(3))
    sm = observer_at(me)
    v, w = block(t=1), block(t=2)
    sm.on_proposal(proposal(0, v), valid=True)
    feed_votes(sm, VoteType.PREVOTE, 0, v, range(4))
    assert sm.locked_round == 0
    feed_votes(sm, VoteType.PRECOMMIT, 0, None, others(me))
    sm.on_timeout(Step.PRECOMMIT, 1, 0)
    # round 1: we saw no proposal in time and prevote nil; the others form a polka on w
    out = sm.on_timeout(Step.PROPOSE, 1, 1)
    assert casts(out) == [CastVote(VoteType.PREVOTE, 1, 1, NIL)]
    feed_votes(sm, VoteType.PREVOTE, 1, None, [me])
    feed_votes(sm, VoteType.PRECOMMIT, 1, None, range(4))
    sm.on_timeout(Step.PRECOMMIT, 1, 1)
    feed_votes(sm, VoteType.PREVOTE, 1, w, others(me))  # the polka on w arrives late
    assert sm.round == 2 and sm.locked_value == v
    # round 2 re-proposes w with proof-of-lock round 1 > our locked round 0: we prevote w
    out = sm.on_proposal(proposal(2, w, pol=1), valid=True)
    assert casts(out) == [CastVote(VoteType.PREVOTE, 1, 2, w.hash())]
    out = feed_votes(sm, VoteType.PREVOTE, 2, w, range(4))
    assert casts(out) == [CastVote(VoteType.PRECOMMIT, 1, 2, w.hash())]
    assert sm.locked_value == w and sm.locked_round == 2


def test_a_lock_is_kept_against_a_proof_of_lock_from_an_older_round():
    me = non_proposer(range(3))
    sm = observer_at(me)
    v, w = block(t=1), block(t=2)
    sm.on_proposal(proposal(0, w), valid=True)  # polka for w at round 0 (seen late by us)
    sm.on_timeout(Step.PROPOSE, 1, 0)
    sm.on_timeout(Step.PREVOTE, 1, 0)
    feed_votes(sm, VoteType.PRECOMMIT, 0, None, range(4))
    sm.on_timeout(Step.PRECOMMIT, 1, 0)
    sm.on_proposal(proposal(1, v), valid=True)
    feed_votes(sm, VoteType.PREVOTE, 1, v, range(4))
    assert sm.locked_value == v and sm.locked_round == 1
    feed_votes(sm, VoteType.PRECOMMIT, 1, None, others(me))
    sm.on_timeout(Step.PRECOMMIT, 1, 1)
    feed_votes(sm, VoteType.PREVOTE, 0, w, others(me))
    out = sm.on_proposal(proposal(2, w, pol=0), valid=True)  # pol 0 < locked round 1
    assert casts(out) == [CastVote(VoteType.PREVOTE, 1, 2, NIL)]


def test_commit_from_a_previous_round():
    me = non_proposer(range(2))
    sm = observer_at(me)
    v = block(t=1)
    sm.on_proposal(proposal(0, v), valid=True)
    sm.on_timeout(Step.PREVOTE, 1, 0)  # ignored: not in prevote step... we prevoted v already
    feed_votes(sm, VoteType.PRECOMMIT, 1, None, others(me)[:2])  # f+1 in round 1: skip ahead
    assert sm.round == 1 and sm.decision is None
    out = feed_votes(sm, VoteType.PRECOMMIT, 0, v, others(me))  # round-0 precommits arrive late
    decisions = [o for o in out if isinstance(o, Decision)]
    assert decisions == [Decision(1, 0, v)]


def test_invalid_proposal_gets_a_nil_prevote_and_is_never_decided():
    me = non_proposer(range(1))
    sm = observer_at(me)
    v = block(t=1)
    out = sm.on_proposal(proposal(0, v), valid=False)
    assert casts(out) == [CastVote(VoteType.PREVOTE, 1, 0, NIL)]
    feed_votes(sm, VoteType.PREVOTE, 0, v, others(me))
    out = feed_votes(sm, VoteType.PRECOMMIT, 0, v, others(me))
    assert sm.decision is None and not [o for o in out if isinstance(o, Decision)]


def test_proposer_proposes_its_valid_value_with_its_round():
    proposer1 = VALS.proposer(1, 1)
    sm = HeightStateMachine(1, VALS, proposer1)
    sm.start()
    v = block(t=1)
    sm.on_proposal(proposal(0, v), valid=True)
    feed_votes(sm, VoteType.PREVOTE, 0, v, range(4))
    feed_votes(sm, VoteType.PRECOMMIT, 0, None, [i for i in range(4) if i != proposer1])
    out = sm.on_timeout(Step.PRECOMMIT, 1, 0)
    assert ProposeValue(1, 1, v, 0) in out
