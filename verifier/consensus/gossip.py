"""Gossip of votes and proposals: each node relays to a peer what the peer lacks.

Algorithm 1 is correct only over gossip: every message a correct process receives reaches every
correct process by max(t, GST) + Δ. Sending one's own messages is not enough: a node that leaves
a round on 2f+1 precommits, one of them from a validator that crashed right after sending it to
that node only, is alone in the next round forever unless it passes that precommit on.

As CometBFT's consensus reactor does with its peer round states, a node that makes no progress
tells its peers where it is and what it has: a `RoundState` (height, round, step and, for up to
`MAX_ROUNDS` rounds, whether it holds the round's proposal and which validators' prevotes and
precommits it holds, for every value it holds votes for). Every value: the vote keeper holds at
most one first vote per validator, and a further one only for a value that already has first
votes (votes.py), so a node never holds votes for more values per (round, type) than there are
validators; a state that listed only some (four, once) made its peers resend, every period,
the votes of the values it left out, and with ten or more validators voting apart those could
crowd the relay budget. At MAX_VALIDATORS a state stays below the message limit. A peer at the same height answers with
what it has and the sender lacks (`relay`), in order of use: the precommits and block of a
decision, the sender's round (proposal, the proof-of-lock prevotes that proposal refers to,
prevotes, precommits), then later rounds the sender would move to (this node's round, and any
round with more than a third of the power). A peer at a later height answers with its own state
(the sender then fetches the blocks it lacks); a peer at an earlier height is told the same way.

Bounded memory and bandwidth: no per-peer state is kept beyond the last sequence number seen
from each validator; an answer is computed from the state received and capped at
`MAX_RELAY_MESSAGES` messages and `MAX_RELAY_BYTES` bytes (and the node answers each validator
at most twice per gossip period). The state is signed with the node's identity key under
its own domain tag (it can never pass for a vote or a proposal), so a third party can neither
forge nor replay one to stop relays to a node: sequence numbers only grow, across restarts
and whatever the clocks do (boot counter in the high half, a counter in the low: boots.py).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from gentorrent.config import WIRE
from gentorrent.crypto.keys import SIGNATURE_BYTES, is_valid_signature
from gentorrent.ledger.chain import (HASH_BYTES, MAX_VALIDATORS, DecodeError, Proposal, Reader,
                                     Vote, VoteType, Writer, decode_message, encode_message)
from verifier.consensus.state_machine import HeightStateMachine

KIND_ROUND_STATE = 3  # payload kind of a ConsensusMessage (types.py has 1: proposal, 2: vote)
MAX_ROUNDS = 8  # rounds described in one RoundState
MAX_VALUES = MAX_VALIDATORS  # values per (round, vote type) in one RoundState (see above)
MAX_RELAY_MESSAGES = 256  # messages sent in answer to one RoundState
MAX_RELAY_BYTES = WIRE.max_message_bytes  # (one proposal of the largest size; the shell also
# answers one validator at most twice per gossip period: a peer that lies that it lacks
# everything gets at most this much that often)
_MAX_BITS_BYTES = (MAX_VALIDATORS + 7) // 8
_MAX_REF_BYTES = 8 + 4 + HASH_BYTES + 4 + SIGNATURE_BYTES


@dataclass(frozen=True)
class VoteBits:
    """The validators whose vote for `value` (NIL: nil) a node holds, as a bitmap by index."""

    value: bytes
    bits: bytes

    def has(self, validator: int) -> bool:
        byte = validator // 8
        return byte < len(self.bits) and bool(self.bits[byte] >> (validator % 8) & 1)


@dataclass(frozen=True)
class ProposalRef:
    """Which proposal a node holds for a round: what its proposer signed (pol round, block
    hash) and the signature. A peer holding another one of that round learns from this alone
    that the proposer signed two (DuplicateProposalEvidence), without a block being sent."""

    pol_round: int
    block_hash: bytes
    signature: bytes

    def encode(self) -> bytes:
        return Writer().i64(self.pol_round).blob(self.block_hash).blob(self.signature).done()

    @classmethod
    def decode(cls, data: bytes) -> "ProposalRef":
        r = Reader(data)
        ref = cls(r.i64(), r.fixed_or_empty(HASH_BYTES), r.blob(SIGNATURE_BYTES))
        r.end()
        if len(ref.block_hash) != HASH_BYTES or ref.pol_round < -1:
            raise DecodeError("malformed proposal reference")
        return ref


@dataclass(frozen=True)
class RoundEntry:
    round: int
    has_proposal: bool
    prevotes: tuple[VoteBits, ...]
    precommits: tuple[VoteBits, ...]
    proposal: ProposalRef | None = None  # the proposal held (with has_proposal)

    def of(self, type_: VoteType) -> tuple[VoteBits, ...]:
        return self.prevotes if type_ is VoteType.PREVOTE else self.precommits


@dataclass(frozen=True)
class RoundState:
    """Where a validator is in a height and which proposals and votes it holds (signed)."""

    validator: int
    seq: int
    height: int
    round: int
    step: int
    rounds: tuple[RoundEntry, ...]
    signature: bytes = b""

    TAG = b"gt/roundstate/v1"

    def _fields(self, w: Writer) -> Writer:
        w.u32(self.validator).u64(self.seq).u64(self.height).u32(self.round).u8(self.step).u32(len(self.rounds))
        for e in self.rounds:
            w.u32(e.round).u8(int(e.has_proposal)).blob(e.proposal.encode() if e.proposal else b"")
            for bits in (e.prevotes, e.precommits):
                w.u32(len(bits))
                for b in bits:
                    w.blob(b.value).blob(b.bits)
        return w

    def sign_bytes(self, chain_id: str) -> bytes:
        return self._fields(Writer(b"gt/sign/roundstate/v1").text(chain_id)).done()

    def encode(self) -> bytes:
        return self._fields(Writer(self.TAG)).blob(self.signature).done()

    @classmethod
    def decode(cls, data: bytes) -> "RoundState":
        r = Reader(data, cls.TAG)
        head = (r.u32(), r.u64(), r.u64(), r.u32(), r.u8())
        entries = []
        for _ in range(r.count(MAX_ROUNDS)):
            round_, has, ref = r.u32(), r.u8(), r.blob(_MAX_REF_BYTES)
            if has > 1 or (ref and not has):
                raise DecodeError("has_proposal must be 0 or 1 (and 1 with a proposal reference)")
            proposal = ProposalRef.decode(ref) if ref else None
            lists = [tuple(VoteBits(r.fixed_or_empty(HASH_BYTES), r.blob(_MAX_BITS_BYTES))
                           for _ in range(r.count(MAX_VALUES))) for _ in range(2)]
            entries.append(RoundEntry(round_, bool(has), lists[0], lists[1], proposal))
        state = cls(*head, tuple(entries), r.blob(SIGNATURE_BYTES))
        r.end()
        return state

    def entry(self, round_: int) -> RoundEntry | None:
        return next((e for e in self.rounds if e.round == round_), None)


Message = Proposal | Vote | RoundState


def encode_payload(msg: Message) -> bytes:
    """The payload of a ConsensusMessage for any consensus message, a RoundState included."""
    if isinstance(msg, RoundState):
        return bytes([KIND_ROUND_STATE]) + msg.encode()
    return encode_message(msg)


def decode_payload(data: bytes) -> Message:
    if data[:1] == bytes([KIND_ROUND_STATE]):
        return RoundState.decode(data[1:])
    return decode_message(data)


# --------------------------------------------------------------------------- describing


def describe(sm: HeightStateMachine, me: int, seq: int) -> RoundState:
    """This node's RoundState (unsigned): the rounds a peer can help with, most useful first."""
    n = len(sm.validators)
    entries = tuple(RoundEntry(r, r in sm.proposals, _bits(sm, r, VoteType.PREVOTE, n),
                               _bits(sm, r, VoteType.PRECOMMIT, n), _ref(sm.proposals.get(r)))
                    for r in _rounds_to_describe(sm))
    return RoundState(me, seq, sm.height, max(sm.round, 0), int(sm.step), entries)


def _ref(p: Proposal | None) -> ProposalRef | None:
    return ProposalRef(p.pol_round, p.block.hash(), p.signature) if p is not None else None


def _rounds_to_describe(sm: HeightStateMachine) -> list[int]:
    current = max(sm.round, 0)
    held = sm.votes.rounds()
    proposal = sm.proposals.get(current)
    order = ([current] + [r for r in held if r > current]
             + [sm.valid_round, sm.locked_round, proposal.pol_round if proposal else -1, current - 1]
             + sorted((r for r in held if r < current), reverse=True))
    out: list[int] = []
    for r in order:
        if r >= 0 and r not in out:
            out.append(r)
    return out[:MAX_ROUNDS]


def _bits(sm: HeightStateMachine, round_: int, type_: VoteType, n: int) -> tuple[VoteBits, ...]:
    out = []
    for value, _ in sm.votes.values(round_, type_):  # (at most n: see the module docstring)
        bits = bytearray((n + 7) // 8)
        for v in sm.votes.votes_for(round_, type_, value):
            bits[v.validator // 8] |= 1 << (v.validator % 8)
        out.append(VoteBits(value, bytes(bits)))
    return tuple(out)


def well_formed(state: RoundState, n: int) -> bool:
    """Bitmaps sized for the committee, at most one entry per round, at most n distinct values
    per (round, type) (what an honest keeper can hold)."""
    size = (n + 7) // 8
    rounds = [e.round for e in state.rounds]
    if len(set(rounds)) != len(rounds):
        return False
    for e in state.rounds:
        for listed in (e.prevotes, e.precommits):
            if len(listed) > n or len({b.value for b in listed}) != len(listed):
                return False
            if any(len(b.bits) != size for b in listed):
                return False
    return True


def verify(state: RoundState, chain_id: str, public_key: bytes) -> bool:
    return is_valid_signature(public_key, state.signature, state.sign_bytes(chain_id))


def signed(state: RoundState, chain_id: str, sign) -> RoundState:
    return replace(state, signature=sign(state.sign_bytes(chain_id)))


# --------------------------------------------------------------------------- relaying


class _Lacks:
    """Whether the peer that sent `state` lacks a proposal or a vote this node holds."""

    def __init__(self, state: RoundState) -> None:
        self.state = state

    def proposal(self, p: Proposal) -> bool:
        e = self.state.entry(p.round)
        return e is None or not e.has_proposal

    def vote(self, v: Vote) -> bool:
        e = self.state.entry(v.round)
        if e is None:
            return True
        listed = e.of(v.type)
        for b in listed:
            if b.value == v.block_hash:
                return not b.has(v.validator)
        # a value it does not list: useful unless that validator already has a vote there, in
        # which case this one is an equivocation the peer counts only once its value has f+1
        # (votes.py), which a listed value would show
        return not any(b.has(v.validator) for b in listed)


def relay(sm: HeightStateMachine, state: RoundState) -> list[Proposal | Vote]:
    """What this node holds at the peer's height that the peer (per `state`) lacks, most useful
    first, within MAX_RELAY_MESSAGES and MAX_RELAY_BYTES."""
    vs = sm.validators
    lacks = _Lacks(state)
    picked: list[Proposal | Vote] = []
    seen: set[int] = set()

    def offer(msgs) -> None:
        for m in msgs:
            if id(m) not in seen and (lacks.proposal(m) if isinstance(m, Proposal) else lacks.vote(m)):
                seen.add(id(m))
                picked.append(m)

    for r in sm.votes.rounds():  # a decision: its precommits and its block
        value = sm.votes.quorum_value(r, VoteType.PRECOMMIT)
        if value is not None:
            offer(sm.votes.votes_for(r, VoteType.PRECOMMIT, value))
            offer(_proposal_of(sm, value, r))
    peer_round = state.round
    proposal = sm.proposals.get(peer_round)
    if proposal is not None:
        offer([proposal])
        if proposal.pol_round >= 0:
            offer(sm.votes.votes_for(proposal.pol_round, VoteType.PREVOTE, proposal.block.hash()))
    offer(_round_votes(sm, peer_round))
    for r in sm.votes.rounds():  # rounds the peer should move to
        if r > peer_round and (r == sm.round or sm.votes.round_power(r) >= vs.one_third_plus()):
            offer([sm.proposals[r]] if r in sm.proposals else [])
            offer(_round_votes(sm, r))
    return _within_budget(picked)


def _round_votes(sm: HeightStateMachine, round_: int) -> list[Vote]:
    return sm.votes.votes(round_, VoteType.PREVOTE) + sm.votes.votes(round_, VoteType.PRECOMMIT)


def _proposal_of(sm: HeightStateMachine, block_hash: bytes, prefer: int) -> list[Proposal]:
    """A proposal carrying the block with this hash, the one of round `prefer` if it does."""
    rounds = [prefer] + sorted(sm.proposals)
    for r in rounds:
        p = sm.proposals.get(r)
        if p is not None and p.block.hash() == block_hash:
            return [p]
    return []


def _within_budget(msgs: list[Proposal | Vote]) -> list[Proposal | Vote]:
    out, used = [], 0
    for m in msgs[:MAX_RELAY_MESSAGES]:
        size = len(encode_message(m)) if isinstance(m, Proposal) else 256
        if used + size > MAX_RELAY_BYTES:
            continue
        used += size
        out.append(m)
    return out
