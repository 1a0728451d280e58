"""Verifying a later block header from a trusted one while the committee changes (pure).

CometBFT's light client verification (spec/light-client/verification), on this chain's headers
and commits. A client trusts one `LightBlock`: a header, the commit that certified it and the
committee that signed it (genesis is the first: height 0, the genesis committee, the genesis
time). It accepts a later header H only if

  - the trusted block is within the trusting period (its time + `trusting_period_ms` > now):
    past that, members who left may have nothing to lose, so their old keys vouch for nothing;
  - H's time is after the trusted one's and not more than `max_drift_ms` ahead of this clock;
  - the committee given with H hashes to H's `validators_hash`, and signed H's commit with more
    than 2/3 of its power;
  - adjacent (H = trusted + 1): H's committee is the one the trusted header named next
    (`next_validators_hash`); skipping (H > trusted + 1): the keys the client trusts signed H's
    commit with more than `trust_level` (1/3) of the trusted committee's power, so at least one
    honest member of the trusted committee (which has at most a third faulty) vouched for H.

When a skip fails for lack of trust, `bisect` verifies a header half-way first and tries again
from there (each step needs only the headers and committees a verifier serves, `Fetch`), so a
client that was offline for a week catches up in O(log) headers over any sequence of changes
that keeps a third of each trusted committee on. Two verified headers of one height that differ
are a fork: `conflict` turns them into `LightClientAttackEvidence` and the client must stop
(CometBFT's detector): each of the two was certified by more than 2/3 of a committee, so more
than a third of some trusted committee signed two histories.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Generator

from gentorrent.config import WIRE
from gentorrent.crypto.keys import PUBLIC_KEY_BYTES, is_valid_signature
from gentorrent.ledger.chain import (HEADER_BYTES, MAX_VALIDATORS, BlockHeader, Commit, CommitError, Reader, Validator, ValidatorSet,
                                    Vote, VoteType, Writer, verify_commit)

#: a skip needs signatures of more than this fraction of the trusted committee's power (CometBFT's default)
TRUST_LEVEL = (1, 3)
MAX_BISECTION_STEPS = 64


class VerificationError(ValueError):
    """A header that the trusted block does not vouch for."""


class Expired(VerificationError):
    """The trusted block is older than the trusting period: start again from a trusted source."""


class NotEnoughTrust(VerificationError):
    """Too little of the trusted committee signed a skipped-to header (bisect: a nearer one first)."""


class InvalidHeader(VerificationError):
    """The header, its commit or its committee do not prove what they claim."""


class ForkDetected(VerificationError):
    """Two verifiers served conflicting certified headers: stop, and hand the evidence in."""

    def __init__(self, message: str, evidence: "LightClientAttackEvidence") -> None:
        super().__init__(message)
        self.evidence = evidence


@dataclass(frozen=True)
class LightBlock:
    """A header, the commit that certified it, and the committee that signed it (the committee
    that signs the next height is the one the header names in `next_validators_hash`)."""

    header: BlockHeader
    commit: Commit | None  # None only for the genesis block (height 0)
    validators: ValidatorSet

    @property
    def height(self) -> int:
        return self.header.height if self.commit is not None else 0

    @property
    def time_ms(self) -> int:
        return self.header.time_ms


class LightBlockCodec:
    """Bytes of a LightBlock, as a verifier serves it (`/light_block/<height>`): the header, its
    commit and the committee's keys and powers (what `ValidatorSet.hash` covers; proposer
    priorities are the committee's business, not a light client's)."""

    TAG = b"gt/lightblock/v1"

    @staticmethod
    def encode(block: LightBlock) -> bytes:
        if block.commit is None:
            raise ValueError("the genesis block is not served: every client has it")
        w = Writer(LightBlockCodec.TAG).blob(block.header.encode()).blob(block.commit.encode())
        w.u32(len(block.validators))
        for v in block.validators.validators:
            w.blob(v.public_key).u64(v.power)
        return w.done()

    @staticmethod
    def decode(data: bytes) -> LightBlock:
        """Raises DecodeError (or ValueError for an impossible committee) for anything else."""
        r = Reader(data, LightBlockCodec.TAG)
        header = BlockHeader.decode(r.blob(HEADER_BYTES))
        commit = Commit.decode(r.blob(WIRE.max_message_bytes))
        members = [Validator(r.blob(PUBLIC_KEY_BYTES), r.u64()) for _ in range(r.count(MAX_VALIDATORS))]
        r.end()
        return LightBlock(header, commit, ValidatorSet(members, max(1, header.height)))


def genesis_block(chain_id: str, genesis_time_ms: int, validators: ValidatorSet) -> LightBlock:
    """The root of trust: the genesis committee at height 0 (it signs height 1)."""
    vh = validators.hash()
    header = BlockHeader(chain_id, 0, genesis_time_ms, validators[0].public_key, b"", b"", b"\0" * 32, b"\0" * 32,
                         vh, b"", vh)
    return LightBlock(header, None, validators)


@dataclass(frozen=True)
class LightClientAttackEvidence:
    """Two certified headers of one height that differ, and who signed both (the members that
    signed the conflicting commit and were in the committee the client trusted)."""

    height: int
    header_a: BlockHeader
    commit_a: Commit
    header_b: BlockHeader
    commit_b: Commit
    double_signers: tuple[bytes, ...]  # keys on both commits


def verify(trusted: LightBlock, untrusted: LightBlock, chain_id: str, now_ms: int, trusting_period_ms: int,
           max_drift_ms: int, trust_level: tuple[int, int] = TRUST_LEVEL) -> None:
    """Raise a VerificationError unless `trusted` vouches for `untrusted` (see the module)."""
    h, t = untrusted.header, trusted.header
    if trusted.time_ms + trusting_period_ms <= now_ms:
        raise Expired(f"the trusted header of height {trusted.height} is {(now_ms - trusted.time_ms) / 3.6e6:.1f} h "
                      f"old, beyond the trusting period of {trusting_period_ms / 3.6e6:.1f} h: verify a recent "
                      f"header against a source you trust (the genesis file, or a friend's node)")
    if untrusted.commit is None or h.height <= trusted.height:
        raise InvalidHeader(f"header {h.height} is not after the trusted height {trusted.height}")
    if h.chain_id != chain_id:
        raise InvalidHeader(f"header is for chain {h.chain_id!r}, not {chain_id!r}")
    if h.time_ms <= t.time_ms:
        raise InvalidHeader(f"header {h.height} is not later than the trusted header ({h.time_ms} <= {t.time_ms} ms)")
    if h.time_ms > now_ms + max_drift_ms:
        raise InvalidHeader(f"header {h.height} is {(h.time_ms - now_ms) / 1000:.0f} s in the future")
    if untrusted.validators.hash() != h.validators_hash:
        raise InvalidHeader(f"the committee served with header {h.height} is not the one it names")
    if h.height == trusted.height + 1:
        if h.validators_hash != t.next_validators_hash:
            raise InvalidHeader(f"header {h.height} names another committee than the trusted header said is next")
    else:
        signed = trusted_power(untrusted.commit, chain_id, trusted.validators, h)
        num, den = trust_level
        if signed * den <= trusted.validators.total_power * num:
            raise NotEnoughTrust(f"header {h.height}: only {signed} of the trusted committee's "
                                 f"{trusted.validators.total_power} voting power (height {trusted.height}) signed it, "
                                 f"more than {num}/{den} needed")
    try:
        verify_commit(untrusted.commit, chain_id, untrusted.validators, h.height, h.hash())
    except CommitError as exc:
        raise InvalidHeader(f"header {h.height}: {exc}") from exc


def trusted_power(commit: Commit, chain_id: str, trusted: ValidatorSet, header: BlockHeader) -> int:
    """The power of `trusted` whose valid precommits for `header` the commit holds (keys the
    trusted committee does not know are skipped: they vouch for nothing here)."""
    if commit.height != header.height or commit.block_hash != header.hash():
        return 0
    power, seen = 0, set()
    for sig in commit.signatures:
        index = trusted.index_of(sig.public_key)
        if index is None or index in seen:
            continue
        vote = Vote(VoteType.PRECOMMIT, commit.height, commit.round, commit.block_hash, index)
        if is_valid_signature(sig.public_key, sig.signature, vote.sign_bytes(chain_id)):
            seen.add(index)
            power += trusted[index].power
    return power


Fetch = Callable[[int], LightBlock]  # the light block of a height, from some verifier (may raise)
#: the steps of a bisection: it yields the heights whose light blocks it needs, is sent each one,
#: and returns the blocks verified on the way (the target last)
Bisection = Generator[int, LightBlock, list[LightBlock]]


def bisection(trusted: LightBlock, target: LightBlock, chain_id: str, now_ms: int, trusting_period_ms: int,
              max_drift_ms: int) -> Bisection:
    """Verify `target` from `trusted`, through headers half-way when a skip lacks trust
    (CometBFT's bisection), as a generator: the caller fetches each height it yields (a
    synchronous call in `bisect`, an RPC to a verifier in light_client.CommitteeReader), so the
    rule is written once and runs without I/O."""
    path: list[LightBlock] = []
    pending = [target]
    current = trusted
    for _ in range(MAX_BISECTION_STEPS):
        if not pending:
            return path
        candidate = pending[-1]
        try:
            verify(current, candidate, chain_id, now_ms, trusting_period_ms, max_drift_ms)
        except NotEnoughTrust:
            if candidate.height - current.height < 2:
                raise
            middle = (current.height + candidate.height) // 2
            pivot = yield middle
            if pivot.height != middle:
                raise InvalidHeader(f"asked for header {middle}, got {pivot.height}")
            pending.append(pivot)
            continue
        pending.pop()
        path.append(candidate)
        current = candidate
    raise VerificationError(f"no verified path to header {target.height} in {MAX_BISECTION_STEPS} steps")


def bisect(trusted: LightBlock, target: LightBlock, fetch: Fetch, chain_id: str, now_ms: int,
           trusting_period_ms: int, max_drift_ms: int) -> list[LightBlock]:
    """`bisection` with `fetch` answering its heights. Returns the blocks verified on the way, `target` last."""
    steps = bisection(trusted, target, chain_id, now_ms, trusting_period_ms, max_drift_ms)
    try:
        height = next(steps)
        while True:
            height = steps.send(fetch(height))
    except StopIteration as done:
        return done.value


def conflict(a: LightBlock, b: LightBlock) -> LightClientAttackEvidence | None:
    """Evidence if two verified light blocks of one height are different blocks."""
    if a.height != b.height or a.header.hash() == b.header.hash():
        return None
    keys_a = {s.public_key for s in a.commit.signatures}
    both = tuple(sorted(keys_a & {s.public_key for s in b.commit.signatures}))
    return LightClientAttackEvidence(a.height, a.header, a.commit, b.header, b.commit, both)
