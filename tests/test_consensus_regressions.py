"""Four schedules that once broke the committee's consensus, replayed through the real driver,
state machine, vote keeper, signer and write-ahead log (testkit/simnet.py).

Each is the shortest schedule found for one cause: a fork from a write-ahead log replayed in
another order than it was processed, a halt from one crash when votes are not relayed, a halt
from a block header re-sent with another body, and a halt from junk votes crowding out a
validator's real vote. Roles are fixed by seed 0 of the simulator's committee: the proposers of
height 1 are validators 1, 2, 0, 3 for rounds 0..3, of height 2 validators 2, 0, 3, 1.
"""

from __future__ import annotations

import logging
from dataclasses import replace

import pytest

from gentorrent.ledger.chain import NIL, Block, Proposal, Step, Vote, VoteType
from testkit.schedules import safety
from testkit.simnet import CHAIN, BlockReply, FixedDelay, Network, SignCrash, validator_set

SEED = 0
VALS = validator_set(4, SEED)
assert [VALS.proposer(1, r) for r in range(4)] == [1, 2, 0, 3]
assert [VALS.proposer(2, r) for r in range(4)] == [2, 0, 3, 1]
GST = 1.5


@pytest.fixture(autouse=True)
def _quiet():
    logging.disable(logging.WARNING)
    yield
    logging.disable(logging.NOTSET)


def signed(inst, msg):
    """`msg` signed with the (Byzantine) instance's raw key, bypassing its signer."""
    return replace(msg, signature=inst.identity.sign(replace(msg, signature=b"").sign_bytes(CHAIN)))


def is_vote(msg, type_: VoteType, height: int, round_: int | None = None) -> bool:
    return (isinstance(msg, Vote) and msg.type == type_ and msg.height == height
            and (round_ is None or msg.round == round_))


def is_proposal(msg, height: int, round_: int) -> bool:
    return isinstance(msg, Proposal) and (msg.height, msg.round) == (height, round_)


def decided_heights(net: Network) -> dict[int, int]:
    return {i.id: i.host.height for i in net.honest() if i.alive}


# --------------------------------------------------------------------------- 4: the vote cap


class JunkPrevotesFirst:
    """Validator 3 sends only its real round-0 prevote, preceded at the victim by junk prevotes of
    the same step (four used to fill the keeper's per-validator cap). Then it is silent."""

    def __init__(self, victim: int, junk: int = 4) -> None:
        self.victim, self.junk = victim, junk

    def outgoing(self, net, inst, dst, msg, fate):
        if not (is_vote(msg, VoteType.PREVOTE, 1, 0) and msg.validator == inst.validator):
            return []
        if dst.validator != self.victim:
            return [msg]
        junk = [signed(inst, replace(msg, block_hash=bytes([k + 1]) * 32)) for k in range(self.junk)]
        return junk + [msg]


@pytest.mark.parametrize("junk", [pytest.param(4, id="attack"), pytest.param(0, id="control")])
def test_junk_votes_do_not_hide_a_byzantine_validators_real_prevote(junk):
    """0 misses the round-0 proposal and prevotes nil; 1 and 2 lock on the block with 3's real
    prevote. 0 must count that prevote to accept the block again with its proof of lock.
    (Control: the same schedule without the junk votes.)"""
    victim = 0
    policy = FixedDelay(0.01, drop=lambda net, src, dst, msg: net.now < GST and dst.validator == victim
                        and is_proposal(msg, 1, 0))
    with Network(4, SEED, policy=policy, byzantine={3: JunkPrevotesFirst(victim, junk)}) as net:
        net.run(30.0, stop=lambda n: min(decided_heights(n).values()) >= 2)
        assert safety(net) == []
        assert min(decided_heights(net).values()) >= 2, f"halted: {decided_heights(net)}"


# --------------------------------------------------------------------------- 3: the poisoned hash


class PoisonedHeader:
    """Validator 2, proposer of round 1, sends the victim (before the honest proposal gets there)
    a round-1 proposal with the honest round-0 block's header and another body; to the others it
    sends its real round-0 prevote. Nothing else."""

    def __init__(self, victim: int, poison: bool = True) -> None:
        self.victim, self.poison = victim, poison

    def outgoing(self, net, inst, dst, msg, fate):
        if not (is_vote(msg, VoteType.PREVOTE, 1, 0) and msg.validator == inst.validator and msg.block_hash):
            return []
        if dst.validator != self.victim or not self.poison:
            return [msg]
        honest = inst.driver.sm.proposals[0].block
        body = Block(honest.header, (b"poison=1",), honest.last_commit, honest.evidence)
        return [signed(inst, Proposal(1, 1, -1, body, inst.validator))]


@pytest.mark.parametrize("poison", [pytest.param(True, id="attack"), pytest.param(False, id="control")])
def test_a_header_with_a_foreign_body_does_not_poison_the_honest_block(poison):
    """(Control: 2 sends the victim its real prevote instead of the poisoned proposal.)"""
    victim = 0

    class Late(FixedDelay):  # the honest proposal reaches the victim after the poisoned one
        def delays(self, net, src, dst, msg, fate):
            if dst.validator == victim and is_proposal(msg, 1, 0) and net.now < GST:
                return [0.05]
            return [0.01]

    with Network(4, SEED, policy=Late(), byzantine={2: PoisonedHeader(victim, poison)}) as net:
        net.run(30.0, stop=lambda n: min(decided_heights(n).values()) >= 2)
        assert safety(net) == []
        assert min(decided_heights(net).values()) >= 2, f"halted: {decided_heights(net)}"


# --------------------------------------------------------------------------- 2: one crash


@pytest.mark.parametrize("crash", [pytest.param(True, id="attack"), pytest.param(False, id="control")])
def test_one_crash_cannot_strand_a_validator_in_a_later_round(crash):
    """All honest. 0 misses the round-0 proposal and every round-0 prevote; 3 never sees 1's
    prevote (no polka, it precommits nil); 1 (the proposer) precommits the block and crashes
    for good, its precommit having reached 0 only. 0 leaves round 0 on three precommits; 2 and
    3 hold two. Only 0 can tell them what 1 precommitted. (Control: 1 does not crash.)"""
    a, d, c = 0, 1, 3

    def drop(net, src, dst, msg) -> bool:
        if net.now >= GST:
            return False
        if dst.validator == a and (is_proposal(msg, 1, 0) or is_vote(msg, VoteType.PREVOTE, 1, 0)):
            return True
        if dst.validator == c and is_vote(msg, VoteType.PREVOTE, 1, 0) and msg.validator == d:
            return True
        return src.validator == d and dst.validator != a and is_vote(msg, VoteType.PRECOMMIT, 1, 0)

    with Network(4, SEED, policy=FixedDelay(0.01, drop=drop)) as net:
        if crash:
            net.crash_at(0.1, d, down_for=None)
        net.run(30.0, stop=lambda n: min(decided_heights(n).values()) >= 2)
        assert safety(net) == []
        assert min(decided_heights(net).values()) >= 2, f"halted: {decided_heights(net)}"


# --------------------------------------------------------------------------- 1: the fork


class SplitVotes:
    """Validator 1 at height 2: round 0, a nil prevote to 0 and the real one (the block) to the
    others; its precommit for the block to 2 only, nil to 0. Round 1: prevote and precommit for
    0's new block to 0 and 3 whatever its honest code says."""

    def __init__(self, y: int, w: int, x: int) -> None:
        self.y, self.w, self.x = y, w, x

    def outgoing(self, net, inst, dst, msg, fate):
        if not isinstance(msg, Vote) or msg.validator != inst.validator or msg.height != 2:
            return [msg]
        if msg.round == 0 and msg.type == VoteType.PREVOTE:
            return [signed(inst, replace(msg, block_hash=NIL))] if dst.validator == self.w else [msg]
        if msg.round == 0 and msg.type == VoteType.PRECOMMIT:
            value = inst.driver.sm.proposals[0].block.hash()
            if dst.validator == self.y:
                return [signed(inst, replace(msg, block_hash=value))]
            return [signed(inst, replace(msg, block_hash=NIL))] if dst.validator == self.w else []
        if msg.round == 1 and dst.validator in (self.w, self.x):
            p = inst.driver.sm.proposals.get(1)
            if p is None:
                return [msg]
            return [signed(inst, replace(msg, type=t, block_hash=p.block.hash()))
                    for t in (VoteType.PREVOTE, VoteType.PRECOMMIT)]
        return [msg]


@pytest.mark.parametrize("second_crash", [pytest.param(True, id="attack"), pytest.param(False, id="control")])
def test_a_validator_restarted_twice_keeps_its_lock(second_crash):
    """Honest 3 (X) is cut off at height 1 while the others reach height 2, round 1; the
    round-1 messages of 2 (Y) and Byzantine 1 (Z) reach X early and are logged. X restarts,
    decides height 1, runs height 2 from round 0 and precommits the round-0 block v (locks it),
    then restarts again. Its replay must re-lock v; if it skips round 0 instead, X prevotes
    round 1's block v', 0 (W) decides v' while Y decides v. (Control: X restarts only once.)
    Drops are by signer and content, not by link, so that gossip cannot route around them."""
    x, y, w, z = 3, 2, 0, 1
    restart1, down = 0.8, 0.05

    def drop(net, src, dst, msg) -> bool:
        if net.now >= 20.0:
            return False
        t = net.now
        crash2 = net.instances[x].restarts >= 2
        h, r = getattr(msg, "height", 0), getattr(msg, "round", 0)
        if dst.validator == x:
            if is_vote(msg, VoteType.PRECOMMIT, 2, 0):
                return True
            if t < restart1:
                return h == 1 or (h == 2 and r == 0)
            if not crash2:
                return h == 2 and r >= 1
        if dst.validator == w and h == 2:  # (by signer, so that relays are held back too)
            if isinstance(msg, BlockReply):
                return True  # W decides height 2 by itself, not by fetching Y's block
            signer = getattr(msg, "validator", None)
            if signer == y and r >= 1:
                return True  # W waits in round 1 for X
            if signer == z and r == 0 and isinstance(msg, Vote) and msg.block_hash:
                return True  # W sees no polka for v in round 0, nor three precommits for it
        return False

    with Network(4, SEED, policy=FixedDelay(0.01, drop=drop), byzantine={z: SplitVotes(y, w, x)},
                 wal_loss="none") as net:
        net.crash_at(restart1 - down, x, down_for=down)
        if second_crash:
            net.sign_crashes.append(SignCrash(x, lambda step, h, r: (step, h, r) == (Step.PRECOMMIT, 2, 0),
                                              point="after_send", down_for=down))
        net.run(25.0, stop=lambda n: min(decided_heights(n).values()) >= 4)
        assert safety(net) == []
        assert min(decided_heights(net).values()) >= 4, f"halted: {decided_heights(net)}"
