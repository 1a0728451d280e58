"""Gossip of votes and proposals (verifier/consensus/gossip.py): round states, what is relayed,
and what a forged, replayed or malformed round state gets (nothing)."""

from __future__ import annotations

import hashlib
from dataclasses import replace

import pytest

from gentorrent.config import CONSENSUS_FAST
from gentorrent.crypto.keys import Identity
from gentorrent.ledger.chain import (NIL, DecodeError, Proposal, Validator, ValidatorSet, Vote, VoteType,
                                     make_block)
from verifier.consensus import gossip
from verifier.consensus.driver import Broadcast, Driver, NeedBlock, SendTo
from verifier.consensus.gossip import RoundState, decode_payload, encode_payload

CHAIN = "gossip-test"
IDS = [Identity.from_seed(hashlib.sha256(f"gossip-{i}".encode()).digest()) for i in range(4)]
VALS = ValidatorSet([Validator(i.public_key, 1) for i in IDS])
PROPOSER = VALS.proposer(1, 0)
A, B = [i for i in range(4) if i != PROPOSER][:2]  # A relays to B


class _Host:
    def make_block(self, height, round_, evidence):
        return make_block(CHAIN, height, 5, IDS[PROPOSER].public_key, b"", None, (), VALS, b"")

    def validate_block(self, block):
        return True


class _Signer:
    def __init__(self, me: int) -> None:
        self.me = me

    def sign(self, step, height, round_, sign_bytes):
        return IDS[self.me].sign(sign_bytes)


def driver(me: int, height: int = 1) -> Driver:
    d = Driver(CHAIN, VALS, me, _Signer(me), _Host(), CONSENSUS_FAST, state_signer=IDS[me].sign,
               state_seq=1_000)
    d.start_height(height)
    return d


def vote(type_: VoteType, r: int, value: bytes, who: int, height: int = 1) -> Vote:
    v = Vote(type_, height, r, value, who)
    return replace(v, signature=IDS[who].sign(v.sign_bytes(CHAIN)))


def proposal(block, r: int = 0) -> Proposal:
    p = Proposal(1, r, -1, block, VALS.proposer(1, r))
    return replace(p, signature=IDS[p.validator].sign(p.sign_bytes(CHAIN)))


def state_of(d: Driver) -> RoundState:
    effects = d.gossip_tick()
    states = [e.message for e in effects if isinstance(e, Broadcast)]
    assert len(states) == 1
    return states[0]


def relayed(effects) -> list:
    return [e.message for e in effects if isinstance(e, SendTo)]


def test_round_states_round_trip_and_reject_garbage():
    a = driver(A)
    block = _Host().make_block(1, 0, ())
    a.on_message(proposal(block))
    state = state_of(a)
    assert state.validator == A and state.height == 1 and state.seq == 1_001
    assert decode_payload(encode_payload(state)) == state
    data = encode_payload(state)
    for bad in (data + b"\x00", data[:-1], data[:1] + b"gt/roundstate/v9" + data[17:]):
        with pytest.raises(DecodeError):
            decode_payload(bad)
    too_many = replace(state, rounds=tuple(replace(state.rounds[0], round=r) for r in range(gossip.MAX_ROUNDS + 1)))
    with pytest.raises(DecodeError):
        decode_payload(encode_payload(too_many))
    assert gossip.verify(state, CHAIN, IDS[A].public_key)
    assert not gossip.verify(state, "other-chain", IDS[A].public_key)  # bound to the chain


def test_a_peer_relays_the_votes_and_proposal_the_other_lacks_and_nothing_it_has():
    a, b = driver(A), driver(B)
    block = _Host().make_block(1, 0, ())
    p = proposal(block)
    prevotes = [vote(VoteType.PREVOTE, 0, block.hash(), i) for i in range(4)]
    for m in [p] + prevotes:
        a.on_message(m)
    b.on_message(prevotes[PROPOSER])  # B has one prevote already
    sent = relayed(a.on_round_state(state_of(b)))
    assert p in sent
    lacking = {m.validator for m in sent if isinstance(m, Vote) and m.type == VoteType.PREVOTE}
    assert lacking == {i for i in range(4) if i != PROPOSER}  # not the one B has
    for m in sent:
        b.on_message(m)
    assert b.sm.votes.has_quorum_for(0, VoteType.PREVOTE, block.hash())
    assert (VoteType.PRECOMMIT, A) in {(m.type, m.validator) for m in sent if isinstance(m, Vote)}
    assert relayed(a.on_round_state(state_of(b))) == []  # B now holds all A has: nothing again


def test_the_precommit_of_a_crashed_validator_reaches_a_node_still_in_the_round():
    """The halt this fixes: B holds two precommits of round 0 and waits for a third that only A
    received (its sender crashed). A, already in round 1, relays it when B says where it is."""
    a, b = driver(A), driver(B)
    crashed = next(i for i in range(4) if i not in (A, B))
    last = vote(VoteType.PRECOMMIT, 0, NIL, crashed)
    for i in (A, B):
        m = vote(VoteType.PRECOMMIT, 0, NIL, i)
        a.on_message(m)
        b.on_message(m)
    a.on_message(last)
    assert b.sm.votes.power_any(0, VoteType.PRECOMMIT) == 2
    sent = relayed(a.on_round_state(state_of(b)))
    assert last in sent
    b.on_message(last)
    assert b.sm.votes.has_quorum_any(0, VoteType.PRECOMMIT)  # B's precommit timeout now starts


def test_forged_replayed_and_malformed_round_states_get_nothing():
    a, b = driver(A), driver(B)
    a.on_message(vote(VoteType.PREVOTE, 0, NIL, A))
    state = state_of(b)
    forged = replace(state, signature=IDS[A].sign(state.sign_bytes(CHAIN)))  # B's state, A's key
    assert a.on_round_state(forged) == []
    assert relayed(a.on_round_state(state))  # the genuine one is answered
    assert a.on_round_state(state) == []  # the same one again (replayed): not
    older = gossip.signed(replace(state, seq=state.seq - 1), CHAIN, IDS[B].sign)
    assert a.on_round_state(older) == []
    bad_bits = gossip.signed(replace(state, seq=state.seq + 1, rounds=(gossip.RoundEntry(
        0, False, (gossip.VoteBits(NIL, b"\xff\xff"),), ()),)), CHAIN, IDS[B].sign)
    assert a.on_round_state(bad_bits) == []  # a bitmap sized for another committee
    mine = gossip.signed(replace(state, validator=A, seq=state.seq + 2), CHAIN, IDS[A].sign)
    assert a.on_round_state(mine) == []


def test_heights_apart_a_node_behind_fetches_blocks_a_node_ahead_says_where_it_is():
    behind, ahead = driver(A, height=1), driver(B, height=3)
    effects = behind.on_round_state(state_of(ahead))
    assert effects == [NeedBlock(1, B)]
    back = ahead.on_round_state(state_of(behind))
    assert len(back) == 1 and isinstance(back[0], SendTo) and back[0].peer == A
    assert isinstance(back[0].message, RoundState) and back[0].message.height == 3


def test_round_states_are_bounded_and_an_observer_sends_none():
    a = driver(A)
    for r in range(3 * gossip.MAX_ROUNDS):
        for i in range(4):
            a.on_message(vote(VoteType.PREVOTE, r, bytes([r + 1]) * 32, i))
    state = state_of(a)
    assert len(state.rounds) == gossip.MAX_ROUNDS
    assert state.rounds[0].round == a.sm.round  # the current round first
    observer = Driver(CHAIN, VALS, None, None, _Host(), CONSENSUS_FAST)
    observer.start_height(1)
    assert observer.gossip_tick() == [] and observer.round_state() is None


def test_a_round_state_of_a_large_committee_lists_every_value_so_nothing_held_is_resent():
    """31 validators voting for 12 values in one round (Byzantine ones for junk): a state used
    to list only the 4 values with the most power, so a peer resent the votes of the other 8
    every gossip period although the node held them, within one relay budget shared with the
    votes it really lacked. Now every value is listed, and a peer that holds it all sends nothing."""
    ids = [Identity.from_seed(hashlib.sha256(f"big-{i}".encode()).digest()) for i in range(31)]
    vals = ValidatorSet([Validator(key.public_key, 1 + k % 3) for k, key in enumerate(ids)])

    def big(me: int) -> Driver:
        d = Driver(CHAIN, vals, me, None, _Host(), CONSENSUS_FAST, state_signer=ids[me].sign, state_seq=7)
        d.start_height(1)
        return d

    def v(i: int) -> Vote:
        value = bytes([i % 12 + 1]) * 32 if i % 12 else NIL
        unsigned = Vote(VoteType.PREVOTE, 1, 0, value, i)
        return replace(unsigned, signature=ids[i].sign(unsigned.sign_bytes(CHAIN)))

    a, b = big(0), big(1)
    for i in range(31):
        a.on_message(v(i))
        b.on_message(v(i))
    state = b.round_state()
    assert len(state.entry(0).prevotes) == 12
    assert decode_payload(encode_payload(state)) == state and gossip.well_formed(state, 31)
    assert relayed(a.on_round_state(state)) == []
    too_many = replace(state, seq=state.seq + 1, rounds=(replace(state.rounds[0], prevotes=tuple(
        gossip.VoteBits(bytes([k]) * 32, state.rounds[0].prevotes[0].bits) for k in range(1, 33))),))
    assert not gossip.well_formed(too_many, 31)  # more values than 31 validators can have given
