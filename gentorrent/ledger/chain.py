"""Consensus data types and their canonical, signed encodings.

Everything a validator signs or hashes has exactly one byte encoding, produced here and
nowhere else: a domain tag, then fixed-width big-endian integers and u32-length-prefixed byte
strings in a fixed field order. Decoders bound every length before allocating and reject
trailing bytes, so a message has one encoding and a decoder never guesses.

Votes carry no timestamp: the sign bytes of a vote are a pure function of (chain, type,
height, round, block hash), so re-signing after a crash reproduces the same signature and
the signer can tell "same vote again" from "a different vote for the same step".
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass
from enum import IntEnum

from gentorrent.config import WIRE
from gentorrent.crypto.keys import PUBLIC_KEY_BYTES, SIGNATURE_BYTES, is_valid_signature

HASH_BYTES = 32
NIL = b""  # the block hash of a vote for nil
MAX_TXS_PER_BLOCK = 10_000
MAX_VALIDATORS = 1_000
HEADER_BYTES = 4096  # bound on an encoded block header where one travels alone (proofs, light blocks)
MAX_EVIDENCE_PER_BLOCK = 100
MAX_CHAIN_ID = 64


class DecodeError(ValueError):
    """Bytes that are not a canonical encoding of the expected message."""


class Step(IntEnum):
    """Steps of a round; the numbers order the sign state (propose < prevote < precommit)."""

    PROPOSE = 1
    PREVOTE = 2
    PRECOMMIT = 3


class VoteType(IntEnum):
    PREVOTE = 2
    PRECOMMIT = 3


def sha256(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


# --------------------------------------------------------------------------- codec


class Writer:
    """Appends canonical fields."""

    def __init__(self, tag: bytes = b"") -> None:
        self._parts: list[bytes] = [tag] if tag else []

    def u8(self, v: int) -> "Writer":
        self._parts.append(struct.pack(">B", v))
        return self

    def u32(self, v: int) -> "Writer":
        self._parts.append(struct.pack(">I", v))
        return self

    def u64(self, v: int) -> "Writer":
        self._parts.append(struct.pack(">Q", v))
        return self

    def i64(self, v: int) -> "Writer":
        self._parts.append(struct.pack(">q", v))
        return self

    def raw(self, b: bytes) -> "Writer":
        self._parts.append(b)
        return self

    def blob(self, b: bytes) -> "Writer":
        self._parts.append(struct.pack(">I", len(b)))
        self._parts.append(b)
        return self

    def text(self, s: str) -> "Writer":
        return self.blob(s.encode())

    def done(self) -> bytes:
        return b"".join(self._parts)


class Reader:
    """Reads canonical fields, bounding every length against the remaining input."""

    def __init__(self, data: bytes, tag: bytes = b"") -> None:
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise DecodeError("expected bytes")
        self._b = bytes(data)
        self._i = 0
        if tag and self.take(len(tag)) != tag:
            raise DecodeError(f"not a {tag.decode(errors='replace')!r} message")

    def take(self, n: int) -> bytes:
        if n < 0 or self._i + n > len(self._b):
            raise DecodeError("truncated message")
        out = self._b[self._i:self._i + n]
        self._i += n
        return out

    def u8(self) -> int:
        return self.take(1)[0]

    def u32(self) -> int:
        return struct.unpack(">I", self.take(4))[0]

    def u64(self) -> int:
        return struct.unpack(">Q", self.take(8))[0]

    def i64(self) -> int:
        return struct.unpack(">q", self.take(8))[0]

    def blob(self, max_len: int) -> bytes:
        n = self.u32()
        if n > max_len:
            raise DecodeError(f"field of {n} bytes exceeds the bound of {max_len}")
        return self.take(n)

    def fixed_or_empty(self, n: int) -> bytes:
        b = self.blob(n)
        if len(b) not in (0, n):
            raise DecodeError(f"expected 0 or {n} bytes, got {len(b)}")
        return b

    def text(self, max_len: int) -> str:
        try:
            return self.blob(max_len).decode()
        except UnicodeDecodeError as exc:
            raise DecodeError("invalid UTF-8") from exc

    def count(self, max_n: int) -> int:
        n = self.u32()
        if n > max_n:
            raise DecodeError(f"{n} items exceed the bound of {max_n}")
        return n

    def end(self) -> None:
        if self._i != len(self._b):
            raise DecodeError(f"{len(self._b) - self._i} trailing bytes")


def _exact(b: bytes, n: int, what: str) -> bytes:
    if len(b) != n:
        raise DecodeError(f"{what} must be {n} bytes, got {len(b)}")
    return b


# --------------------------------------------------------------------------- validators


@dataclass(frozen=True)
class Validator:
    public_key: bytes  # Ed25519, 32 bytes
    power: int

    @property
    def address(self) -> bytes:
        """CometBFT's validator address: the first 20 bytes of SHA-256 of the public key."""
        return sha256(self.public_key)[:20]


class ValidatorSet:
    """The committee of the heights from `start_height` on (until the next change), with
    CometBFT's weighted round-robin proposer selection.

    proposer(h, r) is a pure function of (h, r): the priorities at `start_height` - 1 (zero at
    genesis; carried over from the previous set by `updated`) are advanced once per height
    (CometBFT's `IncrementProposerPriority(1)` after every block, the first at genesis) and then
    r times at once for round r, exactly as CometBFT does for a static set.
    """

    PRIORITY_WINDOW_FACTOR = 2

    def __init__(self, validators: list[Validator] | tuple[Validator, ...], start_height: int = 1,
                 priorities: "tuple[int, ...] | list[int] | None" = None) -> None:
        vals = tuple(validators)
        if not vals or len(vals) > MAX_VALIDATORS:
            raise ValueError(f"a validator set has 1..{MAX_VALIDATORS} members")
        keys = [v.public_key for v in vals]
        if len(set(keys)) != len(keys):
            raise ValueError("duplicate validator key")
        for v in vals:
            _exact(v.public_key, PUBLIC_KEY_BYTES, "validator public key")
            if not 0 < v.power < 2**50:
                raise ValueError("validator power must be positive and < 2^50")
        self.validators = vals
        self.total_power = sum(v.power for v in vals)
        self._index = {v.public_key: i for i, v in enumerate(vals)}
        order = sorted(range(len(vals)), key=lambda i: vals[i].address)
        self._addr_rank = {i: rank for rank, i in enumerate(order)}
        if start_height < 1 or (priorities is not None and len(priorities) != len(vals)):
            raise ValueError("start_height >= 1, and one priority per validator")
        self.start_height = start_height
        self._start = (start_height - 1, tuple(priorities) if priorities is not None else (0,) * len(vals))
        self._height_cache: tuple[int, list[int], int] = (self._start[0], list(self._start[1]), -1)

    def __len__(self) -> int:
        return len(self.validators)

    def __getitem__(self, i: int) -> Validator:
        return self.validators[i]

    def index_of(self, public_key: bytes) -> int | None:
        return self._index.get(public_key)

    def quorum(self) -> int:
        """Smallest power that is more than 2/3 of the total."""
        return self.total_power * 2 // 3 + 1

    def one_third_plus(self) -> int:
        """Smallest power that is more than 1/3 of the total (f + 1)."""
        return self.total_power // 3 + 1

    def hash(self) -> bytes:
        w = Writer(b"gt/valset/v1").u32(len(self.validators))
        for v in self.validators:
            w.raw(v.public_key).u64(v.power)
        return sha256(w.done())

    # -- proposer selection (CometBFT types/validator_set.go)

    def proposer(self, height: int, round_: int) -> int:
        """Index of the proposer of (height, round)."""
        if height < self.start_height or round_ < 0:
            raise ValueError(f"height >= {self.start_height} (this set's first) and round >= 0")
        prios, proposer = self._at_height(height)
        if round_ == 0:
            return proposer
        return self._increment(list(prios), round_)

    def updated(self, changes: "list[tuple[bytes, int]] | tuple[tuple[bytes, int], ...]",
                height: int) -> "ValidatorSet":
        """The committee from `height` on after `changes` ((public key, power); power 0 removes,
        CometBFT's ValidatorUpdate). Members keep their places and their proposer priorities;
        new members go last (by key) and start at -1.125 x the new total power, as in CometBFT's
        updateWithChangeSet, so a change neither skips a member's turn nor gives a newcomer the
        next one. Raises ValueError for a change that removes a non-member, names a key twice,
        or leaves the committee empty."""
        if height <= self.start_height:
            raise ValueError(f"a change takes effect after this set's first height {self.start_height}")
        keys = [k for k, _ in changes]
        if len(set(keys)) != len(keys):
            raise ValueError("a validator update names a key twice")
        prios = self._at_height(height - 1)[0] if height - 1 >= self.start_height else list(self._start[1])
        power = {v.public_key: v.power for v in self.validators}
        prio = {v.public_key: p for v, p in zip(self.validators, prios)}
        for key, p in changes:
            _exact(key, PUBLIC_KEY_BYTES, "validator public key")
            if p < 0 or p >= 2**50:
                raise ValueError("validator power must be in 0..2^50")
            if p == 0 and key not in power:
                raise ValueError(f"cannot remove {key.hex()[:16]}…: not a validator")
        order = [v.public_key for v in self.validators] + sorted(k for k, p in changes if p and k not in power)
        for key, p in changes:
            power[key] = p
        kept = [k for k in order if power[k] > 0]
        if not kept:
            raise ValueError("a validator update may not remove every validator")
        total = sum(power[k] for k in kept)
        start = [prio.get(k, -(total + total // 8)) for k in kept]
        return ValidatorSet([Validator(k, power[k]) for k in kept], height, start)

    def _at_height(self, height: int) -> tuple[list[int], int]:
        h, prios, proposer = self._height_cache
        if h > height:
            h, prios, proposer = self._start[0], list(self._start[1]), -1
        prios = list(prios)
        while h < height:
            proposer = self._increment(prios, 1)
            h += 1
        self._height_cache = (h, prios, proposer)
        return prios, proposer

    def _increment(self, prios: list[int], times: int) -> int:
        total = self.total_power
        self._rescale(prios, self.PRIORITY_WINDOW_FACTOR * total)
        avg = sum(prios) // len(prios)  # Go big.Int Div: Euclidean == floor for n > 0
        for i in range(len(prios)):
            prios[i] -= avg
        proposer = 0
        for _ in range(times):
            for i, v in enumerate(self.validators):
                prios[i] += v.power
            # most priority wins; ties go to the smaller address
            proposer = max(range(len(prios)), key=lambda i: (prios[i], -self._addr_rank[i]))
            prios[proposer] -= total
        return proposer

    @staticmethod
    def _rescale(prios: list[int], diff_max: int) -> None:
        diff = max(prios) - min(prios)
        if diff > diff_max:
            ratio = (diff + diff_max - 1) // diff_max
            for i, p in enumerate(prios):
                q = abs(p) // ratio  # Go int64 division truncates towards zero
                prios[i] = q if p >= 0 else -q


# --------------------------------------------------------------------------- votes


@dataclass(frozen=True)
class Vote:
    type: VoteType
    height: int
    round: int
    block_hash: bytes  # NIL (b"") for a vote for nil
    validator: int  # index in the validator set
    signature: bytes = b""

    TAG = b"gt/vote/v1"

    def sign_bytes(self, chain_id: str) -> bytes:
        cached = self.__dict__.get("_sign_bytes")  # (checked by every receiver, relay and commit)
        if cached is not None and cached[0] == chain_id:
            return cached[1]
        out = (Writer(b"gt/sign/vote/v1").text(chain_id).u8(self.type).u64(self.height)
               .u32(self.round).blob(self.block_hash).done())
        object.__setattr__(self, "_sign_bytes", (chain_id, out))
        return out

    def encode(self) -> bytes:
        return (Writer(self.TAG).u8(self.type).u64(self.height).u32(self.round)
                .blob(self.block_hash).u32(self.validator).blob(self.signature).done())

    @classmethod
    def read(cls, r: Reader) -> "Vote":
        t = r.u8()
        if t not in (VoteType.PREVOTE, VoteType.PRECOMMIT):
            raise DecodeError(f"unknown vote type {t}")
        return cls(VoteType(t), r.u64(), r.u32(), r.fixed_or_empty(HASH_BYTES), r.u32(),
                   r.blob(SIGNATURE_BYTES))

    @classmethod
    def decode(cls, data: bytes) -> "Vote":
        r = Reader(data, cls.TAG)
        v = cls.read(r)
        r.end()
        return v

    def signed_by(self, chain_id: str, public_key: bytes) -> bool:
        return is_valid_signature(public_key, self.signature, self.sign_bytes(chain_id))

    @property
    def step(self) -> Step:
        return Step(int(self.type))


@dataclass(frozen=True)
class CommitSig:
    """One precommit signature of a commit, named by the signer's public key so a light
    client can tell "a key outside the committee" from "a bad signature"."""

    public_key: bytes
    signature: bytes


@dataclass(frozen=True)
class Commit:
    """> 2/3 of the voting power precommitting one block at one (height, round)."""

    height: int
    round: int
    block_hash: bytes
    signatures: tuple[CommitSig, ...]

    TAG = b"gt/commit/v1"

    def encode(self) -> bytes:
        w = (Writer(self.TAG).u64(self.height).u32(self.round).blob(self.block_hash)
             .u32(len(self.signatures)))
        for s in self.signatures:
            w.blob(s.public_key).blob(s.signature)
        return w.done()

    @classmethod
    def read(cls, r: Reader) -> "Commit":
        h, rnd, bh = r.u64(), r.u32(), r.blob(HASH_BYTES)
        _exact(bh, HASH_BYTES, "commit block hash")
        n = r.count(MAX_VALIDATORS)
        return cls(h, rnd, bh, tuple(CommitSig(_exact(r.blob(PUBLIC_KEY_BYTES), PUBLIC_KEY_BYTES, "signer key"),
                                               r.blob(SIGNATURE_BYTES)) for _ in range(n)))

    @classmethod
    def decode(cls, data: bytes) -> "Commit":
        r = Reader(data, cls.TAG)
        c = cls.read(r)
        r.end()
        return c

    def hash(self) -> bytes:
        return sha256(self.encode())

    def precommit(self, sig: CommitSig, index: int) -> Vote:
        return Vote(VoteType.PRECOMMIT, self.height, self.round, self.block_hash, index, sig.signature)


class CommitError(ValueError):
    """A commit does not prove what it claims."""


def verify_commit(commit: Commit, chain_id: str, validators: ValidatorSet, height: int,
                  block_hash: bytes) -> int:
    """Raise CommitError unless `commit` holds > 2/3 valid precommits for `block_hash`.

    Returns the power that signed. Signatures of unknown validators, repeated validators and
    bad signatures are errors (a commit is built by honest nodes from verified votes only).
    """
    if commit.height != height:
        raise CommitError(f"commit is for height {commit.height}, expected {height}")
    if commit.block_hash != block_hash:
        raise CommitError("commit is for another block")
    seen: set[int] = set()
    power = 0
    for sig in commit.signatures:
        index = validators.index_of(sig.public_key)
        if index is None:
            raise CommitError(f"unknown key: {sig.public_key.hex()[:16]}… is not in the committee")
        if index in seen:
            raise CommitError(f"validator {index} signed twice")
        seen.add(index)
        if not commit.precommit(sig, index).signed_by(chain_id, sig.public_key):
            raise CommitError(f"bad precommit signature of validator {index}")
        power += validators[index].power
    if power < validators.quorum():
        raise CommitError(f"too few signatures: {power} of {validators.total_power} voting power "
                          f"signed, more than 2/3 ({validators.quorum()}) needed")
    return power


# --------------------------------------------------------------------------- evidence


@dataclass(frozen=True)
class DuplicateVoteEvidence:
    """Two different votes of one validator for one (height, round, type)."""

    vote_a: Vote
    vote_b: Vote

    def check(self, chain_id: str, validators: ValidatorSet) -> None:
        a, b = self.vote_a, self.vote_b
        if (a.type, a.height, a.round, a.validator) != (b.type, b.height, b.round, b.validator):
            raise ValueError("evidence votes are not for the same step and validator")
        if a.block_hash == b.block_hash:
            raise ValueError("evidence votes are identical")
        if a.validator >= len(validators):
            raise ValueError("evidence names an unknown validator")
        key = validators[a.validator].public_key
        if not (a.signed_by(chain_id, key) and b.signed_by(chain_id, key)):
            raise ValueError("evidence signature does not verify")

    def canonical(self) -> "DuplicateVoteEvidence":
        a, b = sorted((self.vote_a, self.vote_b), key=lambda v: v.block_hash)
        return DuplicateVoteEvidence(a, b)

    @property
    def height(self) -> int:
        return self.vote_a.height

    @property
    def validator(self) -> int:
        """The equivocator's index in the committee of `height`."""
        return self.vote_a.validator

    def encode(self) -> bytes:
        return Writer().u8(EVIDENCE_VOTES).blob(self.vote_a.encode()).blob(self.vote_b.encode()).done()


@dataclass(frozen=True)
class SignedProposal:
    """What a proposer signed, without the block (a proposal signs the block's hash): enough to
    prove that it signed two different proposals for one round."""

    height: int
    round: int
    pol_round: int
    block_hash: bytes
    validator: int
    signature: bytes

    TAG = b"gt/signedproposal/v1"

    @classmethod
    def of(cls, p: "Proposal") -> "SignedProposal":
        return cls(p.height, p.round, p.pol_round, p.block.hash(), p.validator, p.signature)

    def sign_bytes(self, chain_id: str) -> bytes:
        return proposal_sign_bytes(chain_id, self.height, self.round, self.pol_round, self.block_hash)

    def encode(self) -> bytes:
        return (Writer(self.TAG).u64(self.height).u32(self.round).i64(self.pol_round).blob(self.block_hash)
                .u32(self.validator).blob(self.signature).done())

    @classmethod
    def decode(cls, data: bytes) -> "SignedProposal":
        r = Reader(data, cls.TAG)
        p = cls(r.u64(), r.u32(), r.i64(), _exact(r.blob(HASH_BYTES), HASH_BYTES, "block hash"), r.u32(),
                r.blob(SIGNATURE_BYTES))
        r.end()
        return p


@dataclass(frozen=True)
class DuplicateProposalEvidence:
    """Two different proposals of one proposer for one (height, round): another block, or the
    same block with another proof-of-lock round. (CometBFT has no such evidence; a proposer that
    equivocates only delays its round, but it is a signed fault as much as a double vote.)"""

    proposal_a: SignedProposal
    proposal_b: SignedProposal

    def check(self, chain_id: str, validators: ValidatorSet) -> None:
        a, b = self.proposal_a, self.proposal_b
        if (a.height, a.round, a.validator) != (b.height, b.round, b.validator):
            raise ValueError("evidence proposals are not for the same round and proposer")
        if (a.pol_round, a.block_hash) == (b.pol_round, b.block_hash):
            raise ValueError("evidence proposals are identical")
        if a.validator >= len(validators):
            raise ValueError("evidence names an unknown validator")
        key = validators[a.validator].public_key
        if not (is_valid_signature(key, a.signature, a.sign_bytes(chain_id))
                and is_valid_signature(key, b.signature, b.sign_bytes(chain_id))):
            raise ValueError("evidence signature does not verify")

    def canonical(self) -> "DuplicateProposalEvidence":
        a, b = sorted((self.proposal_a, self.proposal_b), key=lambda p: (p.block_hash, p.pol_round))
        return DuplicateProposalEvidence(a, b)

    @property
    def height(self) -> int:
        return self.proposal_a.height

    @property
    def validator(self) -> int:
        return self.proposal_a.validator

    def encode(self) -> bytes:
        return (Writer().u8(EVIDENCE_PROPOSALS).blob(self.proposal_a.encode()).blob(self.proposal_b.encode())
                .done())


EVIDENCE_VOTES, EVIDENCE_PROPOSALS = 1, 2
Evidence = DuplicateVoteEvidence | DuplicateProposalEvidence


def read_evidence(r: Reader) -> Evidence:
    kind = r.u8()
    if kind == EVIDENCE_VOTES:
        return DuplicateVoteEvidence(Vote.decode(r.blob(512)), Vote.decode(r.blob(512)))
    if kind == EVIDENCE_PROPOSALS:
        return DuplicateProposalEvidence(SignedProposal.decode(r.blob(512)), SignedProposal.decode(r.blob(512)))
    raise DecodeError(f"unknown evidence kind {kind}")


# --------------------------------------------------------------------------- blocks


@dataclass(frozen=True)
class BlockHeader:
    chain_id: str
    height: int
    time_ms: int
    proposer: bytes  # proposer's Ed25519 public key
    last_block_hash: bytes  # hash of the previous header (empty at height 1)
    last_commit_hash: bytes  # hash of the previous block's commit (empty at height 1)
    data_hash: bytes  # hash of the transactions
    evidence_hash: bytes
    validators_hash: bytes  # the committee that signs this block's commit
    last_app_hash: bytes  # app hash after the previous block
    next_validators_hash: bytes  # the committee of the next height (CometBFT's): a light client
    # learns a changed committee from a header it trusts

    TAG = b"gt/header/v2"

    def encode(self) -> bytes:
        return (Writer(self.TAG).text(self.chain_id).u64(self.height).u64(self.time_ms)
                .blob(self.proposer).blob(self.last_block_hash).blob(self.last_commit_hash)
                .blob(self.data_hash).blob(self.evidence_hash).blob(self.validators_hash)
                .blob(self.last_app_hash).blob(self.next_validators_hash).done())

    @classmethod
    def read(cls, r: Reader) -> "BlockHeader":
        h = cls(r.text(MAX_CHAIN_ID), r.u64(), r.u64(), _exact(r.blob(PUBLIC_KEY_BYTES), PUBLIC_KEY_BYTES, "proposer"),
                r.fixed_or_empty(HASH_BYTES), r.fixed_or_empty(HASH_BYTES),
                _exact(r.blob(HASH_BYTES), HASH_BYTES, "data hash"),
                _exact(r.blob(HASH_BYTES), HASH_BYTES, "evidence hash"),
                _exact(r.blob(HASH_BYTES), HASH_BYTES, "validators hash"), r.blob(HASH_BYTES),
                _exact(r.blob(HASH_BYTES), HASH_BYTES, "next validators hash"))
        return h


    @classmethod
    def decode(cls, data: bytes) -> "BlockHeader":
        r = Reader(data, cls.TAG)
        h = cls.read(r)
        r.end()
        return h

    def hash(self) -> bytes:
        return sha256(self.encode())


def txs_hash(txs: tuple[bytes, ...]) -> bytes:
    w = Writer(b"gt/txs/v1").u32(len(txs))
    for tx in txs:
        w.raw(sha256(tx))
    return sha256(w.done())


def evidence_hash(evidence: tuple[Evidence, ...]) -> bytes:
    w = Writer(b"gt/evidence/v2").u32(len(evidence))
    for e in evidence:
        w.blob(e.encode())
    return sha256(w.done())


@dataclass(frozen=True)
class Block:
    header: BlockHeader
    txs: tuple[bytes, ...] = ()
    last_commit: Commit | None = None  # commit of height - 1 (None at height 1)
    evidence: tuple[Evidence, ...] = ()

    TAG = b"gt/block/v2"

    @property
    def height(self) -> int:
        return self.header.height

    def hash(self) -> bytes:
        h = self.__dict__.get("_hash")
        if h is None:
            h = self.header.hash()
            object.__setattr__(self, "_hash", h)
        return h

    def encode(self) -> bytes:
        w = Writer(self.TAG).blob(self.header.encode()).u32(len(self.txs))
        for tx in self.txs:
            w.blob(tx)
        w.blob(self.last_commit.encode() if self.last_commit else b"")
        w.u32(len(self.evidence))
        for e in self.evidence:
            w.blob(e.encode())
        return w.done()

    @classmethod
    def decode(cls, data: bytes) -> "Block":
        r = Reader(data, cls.TAG)
        header = BlockHeader.decode(r.blob(4096))
        txs = tuple(r.blob(WIRE.max_tx_bytes) for _ in range(r.count(MAX_TXS_PER_BLOCK)))
        lc = r.blob(WIRE.max_message_bytes)
        last_commit = Commit.decode(lc) if lc else None
        ev = tuple(_evidence_from(r.blob(1100)) for _ in range(r.count(MAX_EVIDENCE_PER_BLOCK)))
        r.end()
        return cls(header, txs, last_commit, ev)

    def check_internal(self) -> None:
        """Raise ValueError unless the header's hashes match the body."""
        if txs_hash(self.txs) != self.header.data_hash:
            raise ValueError("data hash does not match the transactions")
        if evidence_hash(self.evidence) != self.header.evidence_hash:
            raise ValueError("evidence hash does not match the evidence")
        lch = self.last_commit.hash() if self.last_commit else b""
        if lch != self.header.last_commit_hash:
            raise ValueError("last commit hash does not match the last commit")


def _evidence_from(data: bytes) -> Evidence:
    r = Reader(data)
    ev = read_evidence(r)
    r.end()
    return ev


def make_block(chain_id: str, height: int, time_ms: int, proposer: bytes, last_block_hash: bytes,
               last_commit: Commit | None, txs: tuple[bytes, ...], validators: ValidatorSet,
               last_app_hash: bytes, evidence: tuple[Evidence, ...] = (),
               next_validators: ValidatorSet | None = None) -> Block:
    header = BlockHeader(chain_id, height, time_ms, proposer, last_block_hash,
                         last_commit.hash() if last_commit else b"", txs_hash(txs),
                         evidence_hash(evidence), validators.hash(), last_app_hash,
                         (next_validators or validators).hash())
    return Block(header, tuple(txs), last_commit, tuple(evidence))


# --------------------------------------------------------------------------- proposals


@dataclass(frozen=True)
class Proposal:
    height: int
    round: int
    pol_round: int  # the proposer's valid round, -1 if none
    block: Block
    validator: int  # the proposer's index
    signature: bytes = b""

    TAG = b"gt/proposal/v1"

    def sign_bytes(self, chain_id: str) -> bytes:
        return proposal_sign_bytes(chain_id, self.height, self.round, self.pol_round, self.block.hash())

    def encode(self) -> bytes:
        return (Writer(self.TAG).u64(self.height).u32(self.round).i64(self.pol_round)
                .blob(self.block.encode()).u32(self.validator).blob(self.signature).done())

    @classmethod
    def decode(cls, data: bytes) -> "Proposal":
        r = Reader(data, cls.TAG)
        h, rnd, pol = r.u64(), r.u32(), r.i64()
        block = Block.decode(r.blob(WIRE.max_message_bytes))
        p = cls(h, rnd, pol, block, r.u32(), r.blob(SIGNATURE_BYTES))
        r.end()
        if p.pol_round < -1 or p.pol_round >= p.round:
            raise DecodeError("pol_round must be -1 or a round before the proposal's round")
        if block.height != h:
            raise DecodeError("proposal and block heights differ")
        return p

    def signed_by(self, chain_id: str, public_key: bytes) -> bool:
        return is_valid_signature(public_key, self.signature, self.sign_bytes(chain_id))


def proposal_sign_bytes(chain_id: str, height: int, round_: int, pol_round: int, block_hash: bytes) -> bytes:
    """What a proposer signs (the one definition: proposals and evidence of them)."""
    return (Writer(b"gt/sign/proposal/v1").text(chain_id).u64(height).u32(round_).i64(pol_round)
            .blob(block_hash).done())


# --------------------------------------------------------------------------- wire envelope

KIND_PROPOSAL = 1
KIND_VOTE = 2


def encode_message(msg: Proposal | Vote) -> bytes:
    """The payload of a ConsensusMessage: a kind byte and the message."""
    kind = KIND_PROPOSAL if isinstance(msg, Proposal) else KIND_VOTE
    return bytes([kind]) + msg.encode()


def decode_message(data: bytes) -> Proposal | Vote:
    if not data:
        raise DecodeError("empty consensus message")
    if data[0] == KIND_PROPOSAL:
        return Proposal.decode(data[1:])
    if data[0] == KIND_VOTE:
        return Vote.decode(data[1:])
    raise DecodeError(f"unknown consensus message kind {data[0]}")


class DirectoryProofCodec:
    """Byte encoding of interface.DirectoryProof's (height, next_header, next_commit)."""

    TAG = b"gt/dirproof/v1"

    @staticmethod
    def encode(height: int, next_header: bytes, next_commit: bytes) -> bytes:
        return (Writer(DirectoryProofCodec.TAG).u64(height).blob(next_header).blob(next_commit).done())

    @staticmethod
    def decode(data: bytes) -> tuple[int, bytes, bytes]:
        r = Reader(data, DirectoryProofCodec.TAG)
        out = (r.u64(), r.blob(HEADER_BYTES), r.blob(WIRE.max_message_bytes))
        r.end()
        return out


__all__ = [
    "Block", "BlockHeader", "Commit", "CommitError", "CommitSig", "DecodeError",
    "DirectoryProofCodec", "DuplicateProposalEvidence", "DuplicateVoteEvidence", "Evidence", "NIL",
    "SignedProposal", "Proposal", "Step", "Validator",
    "ValidatorSet", "Vote", "VoteType", "decode_message", "encode_message", "make_block",
    "verify_commit",
]
