"""Vote keeper: the votes of one height, counted by voting power.

Votes reach the keeper already signature-checked (the driver does that); the keeper only
counts. Counting follows the paper: "2f+1 PREVOTE(h, r, id(v))" means signed messages for
id(v) from distinct validators, so a validator that equivocates counts for *each* value it
signed that matters (that is safe: two quorums still share an honest validator, and honest
validators sign one value per step). It must be so for liveness: if a node counted only the
first of a Byzantine validator's votes, a polka that some honest node locked on could stay
invisible to it forever. The validator counts once towards "any value" power (timeouts,
round skipping).

Memory without hiding a vote: a validator's *first* vote of a (round, type) is always kept
and counted. A further, different vote (equivocation) is kept and counted when its value
already has more than a third of the power behind it (f + 1), and dropped otherwise; one
piece of evidence per validator and step is recorded either way. A value can reach a quorum
only if its honest votes alone exceed a third (a quorum minus at most a third of Byzantine
power), and honest validators vote once per step. Support can only be reached through first
votes (further ones are counted only for values already supported), and first votes add up to
the total power, so at most two values per (round, type) are ever supported: a validator has
at most three votes stored per step, whatever it signs. A
vote dropped because it arrived before the support for its value is not lost for good: the
peers that counted it relay it again while this node lacks it (gossip.py), and by then the
support is there. This replaces a fixed cap of values per validator, which let four junk
votes sent first crowd out the real one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from gentorrent.ledger.chain import NIL, DuplicateVoteEvidence, ValidatorSet, Vote, VoteType


class AddOutcome(Enum):
    ADDED = "added"
    DUPLICATE = "duplicate"  # the very same vote again: harmless
    EQUIVOCATION = "equivocation"  # a conflicting vote: evidence recorded; counted if supported


@dataclass
class _Tally:
    """Votes of one (round, type)."""

    by_validator: dict[int, dict[bytes, Vote]] = field(default_factory=dict)
    power_by_value: dict[bytes, int] = field(default_factory=dict)
    power: int = 0
    equivocators: set[int] = field(default_factory=set)  # evidence already recorded


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
        if not mine:
            tally.power += power
            self._count(tally, mine, vote, power)
            self.note_sender(vote.round, vote.validator)
            return AddOutcome.ADDED
        if vote.validator not in tally.equivocators:
            tally.equivocators.add(vote.validator)
            self.evidence.append(DuplicateVoteEvidence(next(iter(mine.values())), vote).canonical())
        if self._supported(tally, vote.block_hash):
            self._count(tally, mine, vote, power)
        return AddOutcome.EQUIVOCATION

    def would_change(self, vote: Vote) -> bool:
        """Whether add(vote) would change anything (count it, or record new evidence): the
        driver writes ahead, and checks signatures of, only such votes."""
        t = self._tallies.get((vote.round, vote.type))
        mine = t.by_validator.get(vote.validator) if t else None
        if not mine:
            return True
        if vote.block_hash in mine:
            return False
        return vote.validator not in t.equivocators or self._supported(t, vote.block_hash)

    def _supported(self, tally: _Tally, value: bytes) -> bool:
        return tally.power_by_value.get(value, 0) >= self.validators.one_third_plus()

    @staticmethod
    def _count(tally: _Tally, mine: dict[bytes, Vote], vote: Vote, power: int) -> None:
        mine[vote.block_hash] = vote
        tally.power_by_value[vote.block_hash] = tally.power_by_value.get(vote.block_hash, 0) + power

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

    def values(self, round_: int, type_: VoteType) -> list[tuple[bytes, int]]:
        """(value, power) counted in (round, type), the most power first."""
        t = self._tallies.get((round_, type_))
        return sorted(t.power_by_value.items(), key=lambda vp: (-vp[1], vp[0])) if t else []

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
