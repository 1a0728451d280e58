"""The Tendermint algorithm of one height, as in "The latest gossip on BFT consensus".

Buchman, Kwon and Milosevic, arXiv:1807.04938, Algorithm 1. Line numbers in comments
refer to that listing. The machine is sans-I/O: inputs are proposals (already authenticated
and with their validity decided), votes (already authenticated) and timeouts; outputs are
requests to propose, votes to cast, timeouts to schedule and the decision. It never signs,
sends or sleeps; the driver does that around it (driver.py), and gossip.py provides the
gossip the paper assumes. Every upon-rule is re-checked after every input (`_evaluate`), so a
rule fires as soon as its condition holds, whatever the order in which its messages came.

Algorithm 1, line by line
-------------------------

=======  ===========================================  ==============================================
lines    paper                                        here
=======  ===========================================  ==============================================
1-9      h_p, round_p, step_p, decision_p,            `HeightStateMachine.__init__`: one machine per
         lockedValue/Round, validValue/Round          height (a new one is line 53's reset)
10       upon start: StartRound(0)                    `start`
11-21    StartRound: the proposer broadcasts          `_start_round` -> `ProposeValue(valid_value,
         validValue with validRound, else             valid_round)`; `Driver._sign_proposal` (getValue
         getValue(); others schedule                  is `Host.make_block`); else `ScheduleTimeout`
         OnTimeoutPropose                             (PROPOSE)
22-27    PROPOSAL(v, -1), step = propose: prevote     `_rule_proposal`
         id(v) iff valid(v) and (lockedRound = -1
         or lockedValue = v), else nil
28-33    PROPOSAL(v, vr) and 2f+1 PREVOTE(vr, id(v)), `_rule_proposal_pol`
         0 <= vr < round_p, step = propose: prevote
         id(v) iff valid(v) and (lockedRound <= vr
         or lockedValue = v), else nil
34-35    2f+1 PREVOTE(round_p, *), step = prevote,    `_rule_prevote_any` (`_prevote_timeout`)
         first time: schedule OnTimeoutPrevote
36-43    PROPOSAL(v) and 2f+1 PREVOTE(round_p,        `_rule_polka` (`_polka_seen`)
         id(v)), valid(v), step >= prevote, first
         time: if step = prevote lock v, precommit
         id(v); validValue/validRound := v, round_p
44-46    2f+1 PREVOTE(round_p, nil), step = prevote:  `_rule_polka_nil`
         precommit nil
47-48    2f+1 PRECOMMIT(round_p, *), first time:      `_rule_precommit_any` (`_precommit_timeout`)
         schedule OnTimeoutPrecommit
49-54    PROPOSAL(r, v) and 2f+1 PRECOMMIT(r, id(v)), `_rule_decide` -> `Decision`; the driver builds
         valid(v), not decided: decide v, next       the commit (`Driver._commit`), the shell applies
         height, reset, StartRound(0)                 the block, then `Driver.start_height(h + 1)`
55-56    f+1 messages (any type) of a round >         `_rule_skip_round`; `VoteKeeper.round_power`
         round_p: StartRound(round)                   counts the power of senders of votes and proposals
57-60    OnTimeoutPropose(h, r)                       `on_timeout(PROPOSE)`
61-64    OnTimeoutPrevote(h, r)                       `on_timeout(PREVOTE)`
65-67    OnTimeoutPrecommit(h, r)                     `on_timeout(PRECOMMIT)`
=======  ===========================================  ==============================================

Deliberate differences, and why each is safe
--------------------------------------------

1. Decision with the block from any round (line 49 asks for PROPOSAL(h, r, v) of the round r
   of the precommits): here any known block with the committed hash decides, from a proposal
   of any round or fetched with a commit (`Driver.on_decided_block`). The value is identified
   by its hash, as CometBFT does: 2f+1 precommits for id(v) in one round is the paper's
   condition, and the driver keeps a block only if its body hashes to its header
   (`Driver._authentic`), so one hash is one block. A node that saw the block in round 0
   decides on a commit of round 1 without the round-1 proposal: liveness only gains.
2. Catch-up decides a fetched block whose commit verifies (> 2/3 of the power precommitted it,
   `verify_commit`) without valid(v): some honest validator checked valid(v) at line 36 before
   precommitting, and valid() is deterministic (the app's ProcessProposal).
3. Timeliness (CometBFT's proposer-based timestamps): line 22 also prevotes nil for a new
   proposal whose time is too far ahead of this node's clock (`untimely`). A nil prevote is
   always safe; lines 28, 36 and 49 use valid(v) alone, so a node with a slow clock still
   locks, precommits and decides what the others agreed on.
4. One proposal per round: the proposer's first proposal of a round is kept, a second one
   (an equivocating proposer) ignored. Ignoring a message is what a delay does, which the
   algorithm tolerates; liveness after GST rests on honest proposers, who send one, and the
   decision does not need the round's proposal (1).
5. An equivocating validator's first vote per (round, type) always counts; further values
   count once they have f+1 power (votes.py), to bound memory. The others are treated as
   delayed: a value that can reach 2f+1 has f+1 honest votes, and once they are in, gossip
   delivers the equivocator's vote again and it counts.
6. Line 55 starts the highest round that has f+1 (the paper: any such round); messages more
   than `max_rounds_ahead` rounds ahead are ignored (treated as delayed: honest rounds advance
   only by timeouts, so an honest validator is never that far ahead of one that follows).
7. Rule order: `_evaluate` tries the decision first, then round skipping, then the others;
   the paper lets any enabled rule fire.
8. If the signer refuses a proposal (it would double-sign, possible only after a crash that
   lost the log), the driver schedules OnTimeoutPropose as a non-proposer does, instead of
   waiting in the propose step: nothing is signed, the round ends by its timeout.
9. The message log of line 53 is per height: messages of the next height that arrive early
   are buffered and handed to its machine first when it starts (`Driver.start_height`, also
   after a restart, from the write-ahead log); messages of decided heights are dropped.
10. A restarted node replays its write-ahead log through a fresh machine (wal.py): it takes
   the same steps, and the signer returns the same signatures for them (privval.py) and
   refuses any other message for a signed step.
"""

from __future__ import annotations

from dataclasses import dataclass

from gentorrent.ledger.chain import NIL, Block, Proposal, Step, ValidatorSet, Vote, VoteType
from verifier.consensus.votes import AddOutcome, VoteKeeper

# --------------------------------------------------------------------------- outputs


@dataclass(frozen=True)
class ProposeValue:
    """This node is the proposer of (height, round): propose `valid_value` or a new block."""

    height: int
    round: int
    valid_value: Block | None
    valid_round: int


@dataclass(frozen=True)
class CastVote:
    type: VoteType
    height: int
    round: int
    block_hash: bytes  # NIL for nil


@dataclass(frozen=True)
class ScheduleTimeout:
    step: Step
    height: int
    round: int


@dataclass(frozen=True)
class Decision:
    height: int
    round: int  # round of the precommits that decided
    block: Block


Output = ProposeValue | CastVote | ScheduleTimeout | Decision


# --------------------------------------------------------------------------- the machine


class HeightStateMachine:
    """p's state for one height h_p (Algorithm 1, lines 1-9) and its upon-rules."""

    def __init__(self, height: int, validators: ValidatorSet, me: int | None) -> None:
        self.height = height
        self.validators = validators
        self.me = me  # None: a non-validating observer
        self.round = -1
        self.step = Step.PROPOSE
        self.locked_value: Block | None = None
        self.locked_round = -1
        self.valid_value: Block | None = None
        self.valid_round = -1
        self.decision: Decision | None = None
        self.votes = VoteKeeper(validators, height)
        self.proposals: dict[int, Proposal] = {}  # the proposer's first proposal per round
        self.untimely: set[int] = set()  # rounds whose proposal was too far in the future
        self.blocks: dict[bytes, tuple[Block, bool]] = {}  # hash -> (block, valid)
        self._prevote_timeout: set[int] = set()  # line 34 "for the first time"
        self._precommit_timeout: set[int] = set()  # line 47
        self._polka_seen: set[int] = set()  # line 36
        self.missing_block: bytes | None = None  # a committed hash whose block we lack

    # -- inputs

    def start(self) -> list[Output]:
        out: list[Output] = []
        self._start_round(0, out)
        self._evaluate(out)
        return out

    def on_proposal(self, proposal: Proposal, valid: bool, timely: bool = True) -> list[Output]:
        """An authenticated proposal from proposer(h, r); `valid` is valid(v) of the paper,
        `timely` whether its time was within the clock-drift bound when it arrived."""
        if proposal.height != self.height or self.decision:
            return []
        if proposal.round in self.proposals:
            return []  # a second proposal for a round is ignored (the first one counts)
        self.proposals[proposal.round] = proposal
        if not timely:
            self.untimely.add(proposal.round)
        block_hash = proposal.block.hash()
        if block_hash not in self.blocks:
            self.blocks[block_hash] = (proposal.block, valid)
        self.votes.note_sender(proposal.round, proposal.validator)
        out: list[Output] = []
        self._evaluate(out)
        return out

    def on_vote(self, vote: Vote) -> tuple[AddOutcome, list[Output]]:
        if vote.height != self.height or self.decision:
            return AddOutcome.DUPLICATE, []
        outcome = self.votes.add(vote)
        out: list[Output] = []
        if outcome is not AddOutcome.DUPLICATE:
            self._evaluate(out)
        return outcome, out

    def on_timeout(self, step: Step, height: int, round_: int) -> list[Output]:
        out: list[Output] = []
        if height != self.height or round_ != self.round or self.decision:
            return out
        if step is Step.PROPOSE and self.step is Step.PROPOSE:  # line 57
            self._vote(VoteType.PREVOTE, NIL, out)
            self.step = Step.PREVOTE
        elif step is Step.PREVOTE and self.step is Step.PREVOTE:  # line 61
            self._vote(VoteType.PRECOMMIT, NIL, out)
            self.step = Step.PRECOMMIT
        elif step is Step.PRECOMMIT:  # line 65
            self._start_round(self.round + 1, out)
        else:
            return out
        self._evaluate(out)
        return out

    # -- rules

    def _start_round(self, round_: int, out: list[Output]) -> None:  # line 11
        self.round = round_
        self.step = Step.PROPOSE
        if self.me is not None and self.validators.proposer(self.height, round_) == self.me:
            out.append(ProposeValue(self.height, round_, self.valid_value, self.valid_round))
        else:
            out.append(ScheduleTimeout(Step.PROPOSE, self.height, round_))

    def _vote(self, type_: VoteType, block_hash: bytes, out: list[Output]) -> None:
        if self.me is not None:
            out.append(CastVote(type_, self.height, self.round, block_hash))

    def _evaluate(self, out: list[Output]) -> None:
        """Apply upon-rules until none fires (each firing changes state, so this ends)."""
        rules = (self._rule_decide, self._rule_skip_round, self._rule_proposal,
                 self._rule_proposal_pol, self._rule_prevote_any, self._rule_polka,
                 self._rule_polka_nil, self._rule_precommit_any)
        while self.decision is None and any(rule(out) for rule in rules):
            pass

    def _rule_decide(self, out: list[Output]) -> bool:  # line 49
        for r in self.votes.rounds():
            value = self.votes.quorum_value(r, VoteType.PRECOMMIT)
            if value is None:
                continue
            known = self.blocks.get(value)
            if known is None:
                self.missing_block = value
                continue
            block, valid = known
            if valid:
                self.decision = Decision(self.height, r, block)
                out.append(self.decision)
                return True
        return False

    def _rule_skip_round(self, out: list[Output]) -> bool:  # line 55
        later = [r for r in self.votes.rounds()
                 if r > self.round and self.votes.round_power(r) >= self.validators.one_third_plus()]
        if not later:
            return False
        self._start_round(max(later), out)
        return True

    def _current_proposal(self) -> tuple[Proposal, Block, bool] | None:
        p = self.proposals.get(self.round)
        if p is None:
            return None
        block, valid = self.blocks[p.block.hash()]
        return p, block, valid

    def _rule_proposal(self, out: list[Output]) -> bool:  # line 22
        cur = self._current_proposal()
        if self.step is not Step.PROPOSE or cur is None or cur[0].pol_round != -1:
            return False
        _, block, valid = cur
        timely = self.round not in self.untimely
        ok = valid and timely and (self.locked_round == -1 or self._same(self.locked_value, block))
        self._vote(VoteType.PREVOTE, block.hash() if ok else NIL, out)
        self.step = Step.PREVOTE
        return True

    def _rule_proposal_pol(self, out: list[Output]) -> bool:  # line 28
        cur = self._current_proposal()
        if self.step is not Step.PROPOSE or cur is None:
            return False
        p, block, valid = cur
        vr = p.pol_round
        if not (0 <= vr < self.round and self.votes.has_quorum_for(vr, VoteType.PREVOTE, block.hash())):
            return False
        ok = valid and (self.locked_round <= vr or self._same(self.locked_value, block))
        self._vote(VoteType.PREVOTE, block.hash() if ok else NIL, out)
        self.step = Step.PREVOTE
        return True

    def _rule_prevote_any(self, out: list[Output]) -> bool:  # line 34
        r = self.round
        if (self.step is Step.PREVOTE and r not in self._prevote_timeout
                and self.votes.has_quorum_any(r, VoteType.PREVOTE)):
            self._prevote_timeout.add(r)
            out.append(ScheduleTimeout(Step.PREVOTE, self.height, r))
            return True
        return False

    def _rule_polka(self, out: list[Output]) -> bool:  # line 36
        cur = self._current_proposal()
        r = self.round
        if cur is None or self.step < Step.PREVOTE or r in self._polka_seen:
            return False
        _, block, valid = cur
        if not (valid and self.votes.has_quorum_for(r, VoteType.PREVOTE, block.hash())):
            return False
        self._polka_seen.add(r)
        if self.step is Step.PREVOTE:
            self.locked_value, self.locked_round = block, r
            self._vote(VoteType.PRECOMMIT, block.hash(), out)
            self.step = Step.PRECOMMIT
        self.valid_value, self.valid_round = block, r
        return True

    def _rule_polka_nil(self, out: list[Output]) -> bool:  # line 44
        if self.step is Step.PREVOTE and self.votes.has_quorum_nil(self.round, VoteType.PREVOTE):
            self._vote(VoteType.PRECOMMIT, NIL, out)
            self.step = Step.PRECOMMIT
            return True
        return False

    def _rule_precommit_any(self, out: list[Output]) -> bool:  # line 47
        r = self.round
        if r not in self._precommit_timeout and self.votes.has_quorum_any(r, VoteType.PRECOMMIT):
            self._precommit_timeout.add(r)
            out.append(ScheduleTimeout(Step.PRECOMMIT, self.height, r))
            return True
        return False

    @staticmethod
    def _same(a: Block | None, b: Block) -> bool:
        return a is not None and a.hash() == b.hash()
