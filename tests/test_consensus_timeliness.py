"""The clock-drift bound on proposals (CometBFT PBTS, upper side): the pure rule, the state
machine (only a *new* proposal's prevote depends on it) and the driver (asks the shell's
clock for live proposals only, never for a caught-up block that carries a commit)."""

from __future__ import annotations

import hashlib

import pytest

from gentorrent.config import CONSENSUS, CONSENSUS_FAST
from gentorrent.crypto.keys import Identity
from verifier.consensus.driver import Broadcast, Decide, Driver, within_drift
from verifier.consensus.state_machine import CastVote, Decision, HeightStateMachine
from gentorrent.ledger.chain import (NIL, Block, Commit, CommitSig, Proposal, Validator, ValidatorSet, Vote,
                                      VoteType, make_block)

CHAIN = "timely-test"
IDS = [Identity.from_seed(hashlib.sha256(f"timely-{i}".encode()).digest()) for i in range(4)]
VALS = ValidatorSet([Validator(i.public_key, 1) for i in IDS])
ME = next(i for i in range(4) if i not in {VALS.proposer(1, r) for r in range(3)})
NOW_MS = 1_800_000_000_000
DRIFT = CONSENSUS.max_clock_drift_ms


def block(t: int) -> Block:
    return make_block(CHAIN, 1, t, IDS[0].public_key, b"", None, (), VALS, b"\x00" * 32)


def vote(type_: VoteType, r: int, value: Block | None, who: int) -> Vote:
    v = Vote(type_, 1, r, value.hash() if value else NIL, who)
    return Vote(v.type, 1, r, v.block_hash, who, IDS[who].sign(v.sign_bytes(CHAIN)))


def proposal(r: int, value: Block, pol: int = -1) -> Proposal:
    who = VALS.proposer(1, r)
    p = Proposal(1, r, pol, value, who)
    return Proposal(1, r, pol, value, who, IDS[who].sign(p.sign_bytes(CHAIN)))


def prevotes(outputs) -> list[bytes]:
    return [o.block_hash for o in outputs if isinstance(o, CastVote) and o.type is VoteType.PREVOTE]


# --------------------------------------------------------------------------- the rule


def test_rule_bounds_the_future_only():
    assert within_drift(NOW_MS + DRIFT, NOW_MS, DRIFT)  # exactly at the bound: accepted
    assert not within_drift(NOW_MS + DRIFT + 1, NOW_MS, DRIFT)
    assert not within_drift(NOW_MS + 3_600_000, NOW_MS, DRIFT)  # a clock 1 h fast
    assert within_drift(NOW_MS - 3_600_000, NOW_MS, DRIFT)  # a proposer 1 h behind: harmless
    assert within_drift(NOW_MS, NOW_MS, 0)
    with pytest.raises(ValueError, match="max_drift_ms"):
        within_drift(NOW_MS, NOW_MS, -1)


def test_default_bound_is_the_same_for_fast_test_timeouts_and_below_the_election_timeout():
    from gentorrent.config import EpochParams

    assert CONSENSUS_FAST.max_clock_drift_ms == CONSENSUS.max_clock_drift_ms == 10_000
    assert CONSENSUS.max_clock_drift_ms < EpochParams().election_timeout_ms


# --------------------------------------------------------------------------- state machine


def test_untimely_new_proposal_gets_a_nil_prevote_timely_one_the_block():
    v = block(NOW_MS)
    for timely, expect in ((False, NIL), (True, v.hash())):
        sm = HeightStateMachine(1, VALS, ME)
        sm.start()
        out = sm.on_proposal(proposal(0, v), valid=True, timely=timely)
        assert prevotes(out) == [expect]


def test_untimely_proposal_can_still_be_locked_and_decided_when_the_others_agree():
    """A node with a slow clock prevotes nil, but follows the polka and the commit."""
    sm = HeightStateMachine(1, VALS, ME)
    sm.start()
    v = block(NOW_MS)
    assert prevotes(sm.on_proposal(proposal(0, v), valid=True, timely=False)) == [NIL]
    out = []
    for w in (i for i in range(4) if i != ME):
        out += sm.on_vote(vote(VoteType.PREVOTE, 0, v, w))[1]
    assert [o.block_hash for o in out if isinstance(o, CastVote)] == [v.hash()]  # precommit v
    assert sm.locked_value == v
    for w in (i for i in range(4) if i != ME):
        out += sm.on_vote(vote(VoteType.PRECOMMIT, 0, v, w))[1]
    assert any(isinstance(o, Decision) and o.block == v for o in out)


def test_a_reproposal_with_a_polka_ignores_timeliness():
    sm = HeightStateMachine(1, VALS, ME)
    sm.start()
    v = block(NOW_MS)
    for w in (i for i in range(4) if i != ME):  # a polka for v in round 0 (we missed the proposal)
        sm.on_vote(vote(VoteType.PREVOTE, 0, v, w))
    for w in (i for i in range(4) if i != ME):  # everyone moved to round 1
        sm.on_vote(vote(VoteType.PRECOMMIT, 0, None, w))
    sm.on_timeout(sm.step.PRECOMMIT, 1, 0)
    assert sm.round == 1
    out = sm.on_proposal(proposal(1, v, pol=0), valid=True, timely=False)
    assert prevotes(out) == [v.hash()]


# --------------------------------------------------------------------------- driver


class _Host:
    def make_block(self, height, round_, evidence):
        raise AssertionError("not the proposer in these tests")

    def validate_block(self, block):
        return True


class _Signer:
    def sign(self, step, height, round_, sign_bytes):
        return IDS[ME].sign(sign_bytes)


def _driver(now_ms: int, asked: list) -> Driver:
    def timely(b: Block) -> bool:
        asked.append(b.hash())
        return within_drift(b.header.time_ms, now_ms, DRIFT)
    d = Driver(CHAIN, VALS, ME, _Signer(), _Host(), CONSENSUS_FAST, timely=timely)
    d.start_height(1)
    return d


def _own_prevotes(effects) -> list[bytes]:
    return [e.message.block_hash for e in effects if isinstance(e, Broadcast) and isinstance(e.message, Vote)
            and e.message.validator == ME and e.message.type is VoteType.PREVOTE]


def test_driver_prevotes_nil_for_a_proposal_beyond_its_clock_and_the_block_within():
    asked: list = []
    far = block(NOW_MS + 3_600_000)
    assert _own_prevotes(_driver(NOW_MS, asked).on_message(proposal(0, far))) == [NIL]
    near = block(NOW_MS + DRIFT // 2)
    assert _own_prevotes(_driver(NOW_MS, asked).on_message(proposal(0, near))) == [near.hash()]
    assert asked == [far.hash(), near.hash()]


def test_driver_never_asks_the_clock_about_a_caught_up_block():
    asked: list = []
    d = _driver(NOW_MS, asked)
    future = block(NOW_MS + 3_600_000)  # decided by the others (their clocks are ahead)
    sigs = tuple(CommitSig(IDS[i].public_key, vote(VoteType.PRECOMMIT, 0, future, i).signature)
                 for i in range(4) if i != ME)
    effects = d.on_decided_block(future, Commit(1, 0, future.hash(), sigs))
    assert effects == [Decide(future, Commit(1, 0, future.hash(), sigs))]
    assert asked == []
