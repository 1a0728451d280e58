"""Vote keeper: the votes of one height, counted by voting power.

Votes reach the keeper already signature-checked (the driver does that); the keeper only
counts. Counting follows the paper: "2f+1 PREVOTE(h, r, id(v))" means signed messages for
id(v) from distinct validators, so a validator that equivocates counts for *each* value it
signed (that is safe: two quorums still share an honest validator, and honest validators
sign one value per step). It must be so for liveness: if each honest node counted only the
first of a Byzantine validator's twin votes, a polka that some honest node locked on could
stay invisible to the others forever. The validator counts once towards "any value" power
(timeouts, round skipping). A second value is equivocation and is kept as evidence; at most
MAX_VALUES_PER_VALIDATOR values per validator and step are stored, bounding memory.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from gentorrent.ledger.chain import DuplicateVoteEvidence, NIL, ValidatorSet, Vote, VoteType


class AddOutcome(Enum):
    ADDED = "added"
    DUPLICATE = "duplicate"  # the very same vote again: harmless
    EQUIVOCATION = "equivocation"  # a conflicting vote: evidence recorded, not counted


MAX_VALUES_PER_VALIDATOR = 4


@dataclass
class _Tally:
    """Votes of one (round, type)."""

    by_validator: dict[int, dict[bytes, Vote]] = field(default_factory=dict)
    power_by_value: dict[bytes, int] = field(default_factory=dict)
    power: int = 0


class VoteKeeper:
    def __init__(self, validators: ValidatorSet, height: int) -> None:
        self.validators = validators
        self.height = height
        self._tallies: dict[tuple[int, VoteType], _Tally] = {}
        self._round_senders: dict[int, set[int]] = {}
        self.evidence: list[DuplicateVoteEvidence] = []

    def add(self, vote: Vote) -> AddOutcome:
        if vote.height != self.height:
            raise ValueError(f"vote for height {vote.height} given to the keeper of {self.height}")
        if vote.validator >= len(self.validators):
            raise ValueError(f"unknown validator index {vote.validator}")
        tally = self._tallies.setdefault((vote.round, vote.type), _Tally())
        mine = tally.by_validator.setdefault(vote.validator, {})
        if vote.block_hash in mine:
            return AddOutcome.DUPLICATE
        power = self.validators[vote.validator].power
        outcome = AddOutcome.ADDED
        if mine:
            first = next(iter(mine.values()))
            ev = DuplicateVoteEvidence(first, vote).canonical()
            if ev not in self.evidence:
                self.evidence.append(ev)
            if len(mine) >= MAX_VALUES_PER_VALIDATOR:
                return AddOutcome.EQUIVOCATION
            outcome = AddOutcome.EQUIVOCATION
        else:
            tally.power += power
        mine[vote.block_hash] = vote
        tally.power_by_value[vote.block_hash] = tally.power_by_value.get(vote.block_hash, 0) + power
        self.note_sender(vote.round, vote.validator)
        return outcome

    def has_vote(self, vote: Vote) -> bool:
        t = self._tallies.get((vote.round, vote.type))
        known = t.by_validator.get(vote.validator, {}).get(vote.block_hash) if t else None
        return known is not None and known.signature == vote.signature

    def note_sender(self, round_: int, validator: int) -> None:
        """Count `validator` as active in `round_` (for the round-skip rule)."""
        self._round_senders.setdefault(round_, set()).add(validator)

    def power_for(self, round_: int, type_: VoteType, block_hash: bytes) -> int:
        t = self._tallies.get((round_, type_))
        return t.power_by_value.get(block_hash, 0) if t else 0

    def power_any(self, round_: int, type_: VoteType) -> int:
        t = self._tallies.get((round_, type_))
        return t.power if t else 0

    def has_quorum_for(self, round_: int, type_: VoteType, block_hash: bytes) -> bool:
        return self.power_for(round_, type_, block_hash) >= self.validators.quorum()

    def has_quorum_nil(self, round_: int, type_: VoteType) -> bool:
        return self.has_quorum_for(round_, type_, NIL)

    def has_quorum_any(self, round_: int, type_: VoteType) -> bool:
        return self.power_any(round_, type_) >= self.validators.quorum()

    def quorum_value(self, round_: int, type_: VoteType) -> bytes | None:
        """The non-nil value with > 2/3 of the power in (round, type), if any."""
        t = self._tallies.get((round_, type_))
        if not t:
            return None
        q = self.validators.quorum()
        for value, power in t.power_by_value.items():
            if value != NIL and power >= q:
                return value
        return None

    def round_power(self, round_: int) -> int:
        senders = self._round_senders.get(round_, ())
        return sum(self.validators[i].power for i in senders)

    def rounds(self) -> list[int]:
        return sorted(self._round_senders)

    def votes(self, round_: int, type_: VoteType) -> list[Vote]:
        t = self._tallies.get((round_, type_))
        return [v for mine in t.by_validator.values() for v in mine.values()] if t else []

    def votes_for(self, round_: int, type_: VoteType, block_hash: bytes) -> list[Vote]:
        return [v for v in self.votes(round_, type_) if v.block_hash == block_hash]
