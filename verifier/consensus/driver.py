"""Driver: pure glue between the network's events and the height state machine.

It authenticates messages (signature, proposer of the round), decides the validity of a
proposed block through the host, turns the machine's outputs into effects the shell performs
(broadcast, send to one peer, schedule a timeout, decide), signs this node's own votes and
proposals through a `Signer` (which, in the node, persists its sign state before returning) and
feeds them back to the machine, buffers messages of the next height that arrive early, relays
to peers what they lack when they say where they are (gossip.py), and asks for blocks it is
missing (catch-up). No I/O, no clock: the host answers `make_block`/`validate_block`
synchronously and deterministically, the shell owns time.

A signed step is never signed twice with different content: own messages of the height are
remembered (they are also replayed from the write-ahead log after a restart), and a conflicting
request is dropped with a `Refused` effect instead of being signed.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass
from typing import Callable, Protocol

from gentorrent.config import WIRE, ConsensusTimeouts
from verifier.consensus import gossip
from verifier.consensus.gossip import RoundState
from verifier.consensus.state_machine import (CastVote, Decision, HeightStateMachine, Output,
                                              ProposeValue, ScheduleTimeout)
from gentorrent.ledger.chain import (Block, Commit, CommitError, CommitSig, DuplicateProposalEvidence, Evidence,
                                     Proposal, SignedProposal, Step, ValidatorSet, Vote, VoteType, encode_message,
                                     verify_commit)
from verifier.consensus.votes import AddOutcome

log = logging.getLogger(__name__)

# Early messages of height + 1, kept until we get there. Only authentic ones (signature, and
# the round's proposer for a proposal) are kept, within a budget per validator: a proposal can
# carry a 4 MiB block, so 4096 unchecked messages could have pinned ~16 GiB. Worst case now
# n * MAX_FUTURE_BYTES_PER_VALIDATOR; an honest validator needs one proposal and a few votes.
MAX_BUFFERED_FUTURE = 4096
MAX_FUTURE_PER_VALIDATOR = 64
MAX_FUTURE_BYTES_PER_VALIDATOR = 2 * WIRE.max_message_bytes
MAX_PENDING_EVIDENCE = 1000
MAX_PEER_KEYS = 1000  # round-state numbers are kept for at most 4x this many keys (then pruned)
EVIDENCE_MAX_AGE = 10_000  # heights after which equivocation is no longer reported


class DoubleSignError(RuntimeError):
    """A request to sign a step already signed with other content (or an older step)."""


class Signer(Protocol):
    def sign(self, step: Step, height: int, round_: int, sign_bytes: bytes) -> bytes:
        """Signature of `sign_bytes`; raises DoubleSignError for a conflicting step."""


class Host(Protocol):
    def make_block(self, height: int, round_: int, evidence: tuple[Evidence, ...]) -> Block:
        """A new block for this node to propose at (height, round)."""

    def validate_block(self, block: Block) -> bool:
        """valid(v): header links, last commit, app's ProcessProposal."""

    # optional: validators_at(height) -> ValidatorSet | None, the committee of a height (a host
    # without it runs a fixed committee). Known for every executed height and the two after
    # (valsets.py): the driver asks it for its height and the next one when it starts a height.


def within_drift(block_time_ms: int, now_ms: int, max_drift_ms: int) -> bool:
    """Whether a new proposal's time is acceptable to a validator whose clock reads `now_ms`:
    at most `max_drift_ms` ahead (CometBFT PBTS's PRECISION + MSGDELAY, upper side only).

    No lower bound: a proposer whose clock is behind proposes last block time + 1 ms, which
    is harmless (block time only lags), whereas rejecting old times would stall a committee
    with slow clocks. Applies to live proposals only, never to a block that comes with a
    commit (catch-up): that block was already decided."""
    if max_drift_ms < 0:
        raise ValueError(f"max_drift_ms must be >= 0, not {max_drift_ms}")
    return block_time_ms <= now_ms + max_drift_ms


# --------------------------------------------------------------------------- effects


@dataclass(frozen=True)
class Broadcast:
    message: Proposal | Vote | RoundState


@dataclass(frozen=True)
class SendTo:
    """A message for one validator's node only (a relay, or this node's round state)."""

    peer: int
    message: Proposal | Vote | RoundState


@dataclass(frozen=True)
class TimeoutFired:
    """A timer the shell started has expired (an input event, recorded in the WAL)."""

    step: Step
    height: int
    round: int


@dataclass(frozen=True)
class Timeliness:
    """Whether a live proposal's time was within the clock-drift bound when it arrived: an input
    from the shell's clock, journaled (the WAL) before anything depends on it, so that a replay
    after a restart takes the same verdict instead of asking a clock that has moved or stepped
    back since, which would make the node want to prevote otherwise than it signed."""

    height: int
    round: int
    block_hash: bytes
    timely: bool


@dataclass(frozen=True)
class StartTimer:
    step: Step
    height: int
    round: int
    seconds: float


@dataclass(frozen=True)
class Decide:
    block: Block
    commit: Commit


@dataclass(frozen=True)
class NeedBlock:
    """We lack decided block `height` (peers moved on, or we saw a commit without the block)."""

    height: int
    peer: int | None  # a validator that has it, if known (its index in the current committee)


@dataclass(frozen=True)
class Refused:
    """A signature this node refused to give (it would have been a double sign)."""

    step: Step
    height: int
    round: int
    reason: str


Effect = Broadcast | SendTo | StartTimer | Decide | NeedBlock | Refused


class Driver:
    def __init__(self, chain_id: str, validators: ValidatorSet, me: int | None, signer: Signer | None,
                 host: Host, timeouts: ConsensusTimeouts,
                 journal: Callable[["Proposal | Vote | Timeliness"], None] | None = None,
                 timely: Callable[[Block], bool] | None = None,
                 state_signer: Callable[[bytes], bytes] | None = None, state_seq: int = 0,
                 my_key: bytes | None = None) -> None:
        self.chain_id = chain_id
        #: signs this node's RoundState (the node's identity key; a RoundState has its own
        #: domain tag, so this is no vote signature); None: this node asks for no relays
        self.state_signer = state_signer
        #: sequence numbers of this node's RoundStates start here and only grow: the shell
        #: passes its boot counter's base (boots.py), above any number of an earlier boot
        self._state_seq = state_seq
        self._peer_seq: dict[bytes, int] = {}  # validator's key -> last RoundState seq accepted
        #: whether a received new proposal's block time is within the clock-drift bound (the
        #: shell asks its clock with `within_drift`); None: every proposal is timely
        self.timely = timely
        #: called with every own message right after it is signed, before anything else
        #: happens, and with every timeliness verdict before the machine hears of it: the node
        #: appends them to the WAL, which the next signature syncs
        self.journal = journal
        self._verdicts: dict[tuple[int, bytes], bool] = {}  # (round, block hash) -> timely
        self.validators = validators  # the committee of the current height
        self.next_validators = validators  # and of the next one (early messages are checked by it)
        self.me = me  # this node's index in `validators` (None: not a member at this height)
        #: this node's key (`my_key`, or the key of validator `me`): its index changes with the
        #: committee, and a node outside the first committee may join a later one
        self.my_key = my_key if my_key is not None else (validators[me].public_key if me is not None else None)
        self.signer = signer
        self.host = host
        self.timeouts = timeouts
        self.sm: HeightStateMachine | None = None
        self.height = 0
        self._future: dict[tuple, Proposal | Vote] = {}  # early messages of height + 1
        self._future_use: dict[int, tuple[int, int]] = {}  # validator -> (messages, bytes) buffered
        self._own: dict[tuple[int, Step], Proposal | Vote] = {}  # (round, step) -> signed msg
        self._validity: dict[bytes, bool] = {}
        self._checked: Proposal | Vote | None = None  # the last message found authentic
        self._proposal_evidence: set[int] = set()  # rounds whose proposer was caught signing two
        self.pending_evidence: list[Evidence] = []
        self.committed_evidence: set[Evidence] = set()
        self.decided: Decide | None = None

    # -- events

    def start_height(self, height: int,
                     replay: list["Proposal | Vote | TimeoutFired | Timeliness"] = ()) -> list[Effect]:
        """Enter `height` (after the previous block was applied by the host).

        `replay` are the inputs from the write-ahead log of a node that restarted (`replay_from`
        of the WAL): those of this height, and messages of the next height that arrived early,
        in the order they were handled. The machine sees exactly the inputs the node processed
        before the crash, in the same order: the early messages go back into the next-height
        buffer (and are handed to the machine first when that height starts, as they were), so
        a second restart replays what this incarnation really processed. Own signed messages
        and the timeliness verdicts are known *before* the machine starts, so it re-proposes
        and re-votes exactly what it signed before the crash, whatever the clock reads now.
        """
        carried = list(self._future.values())  # early messages of this height (no restart)
        self._future, self._future_use = {}, {}
        self.height = height
        self.validators = self.validators_at(height)
        self.next_validators = self.validators_at(height + 1)
        self.me = self.validators.index_of(self.my_key) if self.my_key is not None else None
        self.sm = HeightStateMachine(height, self.validators, self.me)
        self._own = {}
        self._validity = {}
        self._proposal_evidence = set()
        self.decided = None
        current = [ev for ev in replay if ev.height == height]
        self._verdicts = {(ev.round, ev.block_hash): ev.timely for ev in current if isinstance(ev, Timeliness)}
        for ev in current:  # (the WAL also holds received messages: check it is really ours)
            if (isinstance(ev, (Proposal, Vote)) and ev.validator == self.me
                    and ev.signed_by(self.chain_id, self.validators[self.me].public_key)):
                self._own.setdefault((ev.round, Step.PROPOSE if isinstance(ev, Proposal) else ev.step), ev)
        for ev in current:
            if (isinstance(ev, Proposal) and ev.validator == self.me and not ev.signature
                    and (ev.round, Step.PROPOSE) not in self._own):
                self._recover_proposal(ev)
        effects = self._run(self.sm.start())
        for msg in carried:
            effects += self.on_message(msg)
        for ev in replay:
            if isinstance(ev, Timeliness):
                continue  # (taken above)
            if ev.height == height + 1 and not isinstance(ev, TimeoutFired):
                effects += self.on_message(ev)  # back into the next-height buffer
            elif ev.height != height or self.decided:
                continue  # (inputs after the decision changed nothing then either)
            elif isinstance(ev, TimeoutFired):
                effects += self.on_timeout(ev.step, ev.height, ev.round)
            else:
                effects += self.on_message(ev)
        return effects

    def validators_at(self, height: int) -> ValidatorSet:
        """The committee of `height`, as the host knows it (the fixed one, for a host that does
        not change committees; the current one for a height the host cannot tell yet)."""
        ask = getattr(self.host, "validators_at", None)
        try:
            found = ask(height) if ask is not None else None
        except ValueError:  # (a height before the first: a peer's forged round state, say)
            found = None
        return found if found is not None else self.validators

    def _peer_index(self, height: int, index: int) -> int | None:
        """Validator `index` of height `height`'s committee, as an index in this height's (the
        one effects name peers by), if it is a member of both."""
        vs = self.validators_at(height)
        return self.validators.index_of(vs[index].public_key) if 0 <= index < len(vs) else None

    def on_message(self, msg: Proposal | Vote) -> list[Effect]:
        if self.sm is None:
            return []
        if msg.height == self.height + 1:
            if _message_key(msg) not in self._future:  # (a key holds the signature: a known one was checked)
                if not self._future_candidate(msg):
                    return []
                self._buffer_future(msg)
            # peers are ahead; if we are still here a little later, we fetch the block
            return [NeedBlock(self.height, self._peer_index(msg.height, msg.validator))]
        if msg.height > self.height + 1:
            return [NeedBlock(self.height, self._peer_index(msg.height, msg.validator))]
        if msg.height < self.height or self.decided:
            return []
        if msg.round > max(self.sm.round, 0) + self.timeouts.max_rounds_ahead:
            log.debug("message for round %d, far beyond round %d: ignored", msg.round, self.sm.round)
            return []
        if isinstance(msg, Proposal):
            return self._on_proposal(msg)
        return self._on_vote(msg)

    def admits(self, msg: Proposal | Vote) -> bool:
        """Whether on_message(msg) would change this driver's state: exactly the received
        messages the node must write ahead (replay is the same without the others), so an
        unauthenticated peer, or a validator repeating itself, cannot grow the log."""
        if self.sm is None:
            return False
        if msg.height == self.height + 1:
            return self._future_candidate(msg) and self._future_room(msg) is not None
        if msg.height != self.height or self.decided or self._far_round(msg):
            return False
        if isinstance(msg, Proposal):
            return msg.round not in self.sm.proposals and self._authentic(msg)
        return (0 <= msg.validator < len(self.validators) and self.sm.votes.would_change(msg)
                and self._authentic(msg))

    def buffered_future(self) -> tuple[int, int]:
        """(messages, bytes) of the next height held now."""
        return len(self._future), sum(b for _, b in self._future_use.values())

    def _far_round(self, msg: Proposal | Vote) -> bool:
        current = max(self.sm.round, 0) if self.sm and msg.height == self.height else 0
        return msg.round > current + self.timeouts.max_rounds_ahead

    def _authentic(self, msg: Proposal | Vote) -> bool:
        """Signed by the validator it names; a proposal also by that round's proposer (the
        caller bounded the round: proposer selection costs O(round)), and with a block whose
        body hashes to its header. A proposal signs only the header hash, and blocks are known
        by that hash (validity cache, the machine's blocks): a header with a foreign body must
        be dropped before anything about it is remembered, or it poisons the honest block for
        the rest of the height. The last message found authentic is remembered (by identity):
        the shell asks `admits` and then hands the same object to `on_message`."""
        if msg is self._checked:
            return True
        vs = self.next_validators if msg.height == self.height + 1 else self.validators
        if not 0 <= msg.validator < len(vs):
            return False
        if not msg.signed_by(self.chain_id, vs[msg.validator].public_key):
            log.debug("badly signed %s from %d", type(msg).__name__, msg.validator)
            return False
        if isinstance(msg, Proposal):
            if msg.validator != vs.proposer(msg.height, msg.round):
                log.debug("proposal from a non-proposer %d at %d/%d", msg.validator, msg.height, msg.round)
                return False
            try:
                msg.block.check_internal()
            except ValueError as exc:
                log.warning("proposal of %d at %d/%d: %s (dropped)", msg.validator, msg.height, msg.round, exc)
                return False
        self._checked = msg
        return True

    def _future_candidate(self, msg: Proposal | Vote) -> bool:
        return not self._far_round(msg) and _message_key(msg) not in self._future and self._authentic(msg)

    def _future_room(self, msg: Proposal | Vote) -> int | None:
        """The message's size if the next-height buffer has room for it from its sender."""
        count, used = self._future_use.get(msg.validator, (0, 0))
        size = len(encode_message(msg))
        if (len(self._future) >= MAX_BUFFERED_FUTURE or count >= MAX_FUTURE_PER_VALIDATOR
                or used + size > MAX_FUTURE_BYTES_PER_VALIDATOR):
            return None
        return size

    def _buffer_future(self, msg: Proposal | Vote) -> None:
        size = self._future_room(msg)
        if size is None:
            log.debug("next-height buffer full for validator %d: message dropped", msg.validator)
            return
        count, used = self._future_use.get(msg.validator, (0, 0))
        self._future[_message_key(msg)] = msg
        self._future_use[msg.validator] = (count + 1, used + size)

    def on_timeout(self, step: Step, height: int, round_: int) -> list[Effect]:
        if self.sm is None or height != self.height or self.decided:
            return []
        return self._run(self.sm.on_timeout(step, height, round_))

    def on_decided_block(self, block: Block, commit: Commit) -> list[Effect]:
        """A block of the current height with its commit, fetched from a peer (catch-up)."""
        if self.sm is None or block.height != self.height or self.decided:
            return []
        try:
            block.check_internal()
            verify_commit(commit, self.chain_id, self.validators, block.height, block.hash())
        except (ValueError, CommitError) as exc:
            log.warning("rejecting caught-up block %d: %s", block.height, exc)
            return []
        self.decided = Decide(block, commit)
        return [self.decided]

    def gossip_tick(self) -> list[Effect]:
        """The height makes no progress (the shell calls this every `gossip_s` then): tell the
        peers where this node is and what it holds, so they relay what it lacks (gossip.py),
        and ask for a decided block it lacks."""
        if self.sm is None or self.decided is not None:
            return []
        effects: list[Effect] = []
        state = self.round_state()
        if state is not None:
            effects.append(Broadcast(state))
        if self.sm.missing_block is not None:
            effects.append(NeedBlock(self.height, None))
        return effects

    def round_state(self) -> RoundState | None:
        """This node's signed RoundState (None for an observer or without a state signer)."""
        if self.sm is None or self.me is None or self.state_signer is None:
            return None
        self._state_seq += 1
        return gossip.signed(gossip.describe(self.sm, self.me, self._state_seq), self.chain_id, self.state_signer)

    def on_round_state(self, state: RoundState) -> list[Effect]:
        """A peer's RoundState: relay what it lacks at our height, fetch what we lack at its
        (later) one, or tell it where we are if it is behind."""
        if self.sm is None or not self._fresh_state(state):
            return []
        peer = self.validators.index_of(self.validators_at(state.height)[state.validator].public_key)
        if peer is None:  # (a former member, behind: nothing to relay; a later one: fetch blocks)
            return [NeedBlock(self.height, None)] if state.height > self.height else []
        if state.height > self.height:
            return [NeedBlock(self.height, peer)]
        if state.height < self.height:
            mine = self.round_state()
            return [SendTo(peer, mine)] if mine is not None else []
        self._compare_proposals(state)
        return [SendTo(peer, m) for m in gossip.relay(self.sm, state)]

    def _compare_proposals(self, state: RoundState) -> None:
        """A peer's state names the proposal it holds per round: one that differs from ours,
        validly signed by the round's proposer, is evidence (the proposer signed two)."""
        for e in state.rounds:
            mine = self.sm.proposals.get(e.round)
            if mine is None or e.proposal is None or e.round in self._proposal_evidence:
                continue
            other = SignedProposal(mine.height, e.round, e.proposal.pol_round, e.proposal.block_hash,
                                   mine.validator, e.proposal.signature)
            if (other.pol_round, other.block_hash) == (mine.pol_round, mine.block.hash()):
                continue
            if other.pol_round >= other.round:  # (not a proposal a decoder would take)
                continue
            ev = DuplicateProposalEvidence(SignedProposal.of(mine), other)
            try:
                ev.check(self.chain_id, self.validators)
            except ValueError:
                continue  # (a peer's state cannot frame a proposer: the signature must be its)
            self._proposal_evidence.add(e.round)
            self._note_evidence(ev.canonical(), f"proposer {mine.validator} signed two proposals at "
                                                f"{mine.height}/{e.round} (seen in a peer's round state)")

    def peer_state_seq(self, validator: int) -> int:
        """The sequence number of the last RoundState accepted from `validator` (an index in
        the current committee; -1: none)."""
        if not 0 <= validator < len(self.validators):
            return -1
        return self._peer_seq.get(self.validators[validator].public_key, -1)

    def _fresh_state(self, state: RoundState) -> bool:
        """Signed by a validator other than this node, newer than its last, well formed. The
        state's validator index is one of the committee of its height when this node knows
        that committee (its own height, the next, the past ones the host keeps), else of this
        height's; numbers are kept by key, since a member's index changes with the committee."""
        vs = self.validators_at(state.height) if state.height != self.height else self.validators
        v = state.validator
        if not 0 <= v < len(vs) or vs[v].public_key == self.my_key:
            return False
        key = vs[v].public_key
        if state.seq <= self._peer_seq.get(key, -1) or not gossip.well_formed(state, len(vs)):
            return False
        if not gossip.verify(state, self.chain_id, key):
            return False
        if len(self._peer_seq) >= 4 * MAX_PEER_KEYS and key not in self._peer_seq:
            self._peer_seq = {k: s for k, s in self._peer_seq.items() if self._known_key(k)}
        self._peer_seq[key] = state.seq
        return True

    def _known_key(self, key: bytes) -> bool:
        return self.validators.index_of(key) is not None or self.next_validators.index_of(key) is not None

    # -- internals

    def _on_proposal(self, p: Proposal) -> list[Effect]:
        assert self.sm is not None
        first = self.sm.proposals.get(p.round)
        if first is not None:
            self._conflicting_proposal(first, p)
            return []
        if not self._authentic(p):
            return []
        if p.validator == self.me:
            self._own[(p.round, Step.PROPOSE)] = p
        on_time = p.validator == self.me or p.pol_round >= 0 or self._timely(p)
        return self._run(self.sm.on_proposal(p, self._valid(p.block), on_time))

    def _timely(self, p: Proposal) -> bool:
        """The shell's verdict on a new proposal's time: the journaled one if this proposal was
        judged before a restart, else the clock's now (journaled before it is used)."""
        if self.timely is None:
            return True
        key = (p.round, p.block.hash())
        verdict = self._verdicts.get(key)
        if verdict is None:
            verdict = self._verdicts[key] = bool(self.timely(p.block))
            if self.journal:
                self.journal(Timeliness(p.height, p.round, key[1], verdict))
        return verdict

    def _valid(self, block: Block) -> bool:
        h = block.hash()
        if h not in self._validity:
            try:  # (the body matches the header: _authentic checked it)
                for ev in block.evidence:
                    ev.check(self.chain_id, self.validators_at(ev.height))
                    if not block.height - EVIDENCE_MAX_AGE < ev.height <= block.height:
                        raise ValueError(f"evidence of height {ev.height} is out of range")
                ok = self.host.validate_block(block)
            except ValueError as exc:
                log.info("invalid block %s at %d: %s", h.hex()[:12], block.height, exc)
                ok = False
            self._validity[h] = ok
        return self._validity[h]

    def _on_vote(self, v: Vote) -> list[Effect]:
        assert self.sm is not None
        if v.validator >= len(self.validators):
            return []
        if not self.sm.votes.would_change(v):
            return []  # a duplicate, or an unsupported extra value: skip the signature check
        if not self._authentic(v):
            return []
        if v.validator == self.me:
            self._own.setdefault((v.round, v.step), v)
        outcome, outputs = self.sm.on_vote(v)
        if outcome is AddOutcome.EQUIVOCATION:
            for ev in self.sm.votes.evidence:
                self._note_evidence(ev, f"validator {v.validator} equivocated at {v.height}/{v.round}")
        return self._run(outputs)

    def _conflicting_proposal(self, first: Proposal, p: Proposal) -> None:
        """A second proposal of a round's proposer (the machine keeps the first, state_machine.py
        note 4): if it signed another one, that is evidence, recorded once per round (further
        ones cost no signature check)."""
        if p.sign_bytes(self.chain_id) == first.sign_bytes(self.chain_id) or p.round in self._proposal_evidence:
            return
        if not p.signed_by(self.chain_id, self.validators[first.validator].public_key) or p.validator != first.validator:
            return
        self._proposal_evidence.add(p.round)
        ev = DuplicateProposalEvidence(SignedProposal.of(first), SignedProposal.of(p)).canonical()
        self._note_evidence(ev, f"proposer {p.validator} signed two proposals at {p.height}/{p.round}")

    def _note_evidence(self, ev: Evidence, what: str) -> None:
        if (ev not in self.pending_evidence and ev not in self.committed_evidence
                and len(self.pending_evidence) < MAX_PENDING_EVIDENCE):
            log.warning("%s", what)
            self.pending_evidence.append(ev)

    def _run(self, outputs: list[Output]) -> list[Effect]:
        """Perform the machine's outputs; own signed messages go back into the machine."""
        effects: list[Effect] = []
        queue = deque(outputs)
        while queue:
            o = queue.popleft()
            if isinstance(o, CastVote):
                vote = self._sign_vote(o, effects)
                if vote is not None:
                    effects.append(Broadcast(vote))
                    _, more = self.sm.on_vote(vote)
                    queue.extend(more)
            elif isinstance(o, ProposeValue):
                p = self._sign_proposal(o, effects)
                if p is not None:
                    effects.append(Broadcast(p))
                    effects += [Broadcast(v) for v in self._pol_votes(p)]
                    queue.extend(self.sm.on_proposal(p, True))
                else:  # refused (it would double-sign): leave the round by its timeout, as a
                    # non-proposer does, instead of waiting in the propose step for nothing
                    queue.append(ScheduleTimeout(Step.PROPOSE, o.height, o.round))
            elif isinstance(o, ScheduleTimeout):
                effects.append(StartTimer(o.step, o.height, o.round, self._duration(o)))
            elif isinstance(o, Decision):
                self.decided = Decide(o.block, self._commit(o))
                effects.append(self.decided)
                return effects
        if self.sm.missing_block is not None and not self.decided:
            effects.append(NeedBlock(self.height, None))
        return effects

    def _duration(self, o: ScheduleTimeout) -> float:
        if o.step is Step.PROPOSE:
            return self.timeouts.propose(o.round)
        if o.step is Step.PREVOTE:
            return self.timeouts.prevote(o.round)
        return self.timeouts.precommit(o.round)

    def _sign(self, step: Step, round_: int, unsigned, effects: list[Effect]):
        """The signed message for (round, step), reusing one already signed if identical."""
        previous = self._own.get((round_, step))
        if previous is not None:
            if previous.sign_bytes(self.chain_id) == unsigned.sign_bytes(self.chain_id):
                return previous
            effects.append(Refused(step, self.height, round_, "conflicts with an earlier signature"))
            return None
        try:
            sig = self.signer.sign(step, self.height, round_, unsigned.sign_bytes(self.chain_id))
        except DoubleSignError as exc:
            log.error("refused to sign %s at %d/%d: %s", step.name, self.height, round_, exc)
            effects.append(Refused(step, self.height, round_, str(exc)))
            return None
        signed = _with_signature(unsigned, sig)
        self._own[(round_, step)] = signed
        if self.journal:
            self.journal(signed)
        return signed

    def _sign_vote(self, o: CastVote, effects: list[Effect]) -> Vote | None:
        unsigned = Vote(o.type, o.height, o.round, o.block_hash, self.me)
        return self._sign(Step(int(o.type)), o.round, unsigned, effects)

    def _sign_proposal(self, o: ProposeValue, effects: list[Effect]) -> Proposal | None:
        previous = self._own.get((o.round, Step.PROPOSE))
        if isinstance(previous, Proposal):
            return previous  # replayed from the WAL: propose exactly what was signed
        if o.valid_value is not None:
            block, pol = o.valid_value, o.valid_round
        else:
            evidence = tuple(self.pending_evidence[:16])
            block, pol = self.host.make_block(o.height, o.round, evidence), -1
            self._validity[block.hash()] = True
        unsigned = Proposal(o.height, o.round, pol, block, self.me)
        if self.journal and pol < 0:
            self.journal(unsigned)  # see _recover_proposal
        return self._sign(Step.PROPOSE, o.round, unsigned, effects)

    def _recover_proposal(self, unsigned: Proposal) -> None:
        """A new block this node logged just before signing its proposal (the signed message is
        logged only after the signer has made its state durable). If a crash fell in between,
        the signer holds a signature for exactly this block and would refuse any other one for
        the round: propose this one again. (Had it not signed yet, it signs it now: nothing
        else was ever signed for that step.)"""
        if self.signer is None:
            return
        try:
            sig = self.signer.sign(Step.PROPOSE, unsigned.height, unsigned.round, unsigned.sign_bytes(self.chain_id))
        except DoubleSignError:
            return
        signed = _with_signature(unsigned, sig)
        self._own[(unsigned.round, Step.PROPOSE)] = signed
        if self.journal:
            self.journal(signed)
        log.info("own proposal at %d/%d recovered from the write-ahead log", unsigned.height, unsigned.round)

    def _pol_votes(self, p: Proposal) -> list[Vote]:
        """The prevotes proving the polka a re-proposal refers to."""
        if p.pol_round < 0:
            return []
        return self.sm.votes.votes_for(p.pol_round, VoteType.PREVOTE, p.block.hash())

    def _commit(self, d: Decision) -> Commit:
        votes = self.sm.votes.votes_for(d.round, VoteType.PRECOMMIT, d.block.hash())
        sigs = tuple(CommitSig(self.validators[v.validator].public_key, v.signature)
                     for v in sorted(votes, key=lambda v: v.validator))
        return Commit(d.height, d.round, d.block.hash(), sigs)

    def block_applied(self, block: Block) -> None:
        """The host applied `block`: its evidence is committed, no longer pending."""
        for ev in block.evidence:
            self.committed_evidence.add(ev.canonical())
        horizon = block.height - EVIDENCE_MAX_AGE
        self.committed_evidence = {e for e in self.committed_evidence if e.height > horizon}
        self.pending_evidence = [e for e in self.pending_evidence
                                 if e not in self.committed_evidence and e.height > horizon]


def _message_key(msg: Proposal | Vote) -> tuple:
    if isinstance(msg, Proposal):
        return (Step.PROPOSE, msg.validator, msg.round, msg.signature)
    return (msg.step, msg.validator, msg.round, msg.block_hash, msg.signature)


def _with_signature(msg, sig: bytes):
    from dataclasses import replace
    return replace(msg, signature=sig)
