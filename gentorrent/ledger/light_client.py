"""Check the committee's answers like a light client (ARCHITECTURE.md §3.1).

The verifier that answers is not trusted. A reply to a proven query (gentorrent.ledger.queries)
carries the answer about the state at height H (a proof of the registry tree entries it needs
and the other parts' hashes) and a proof: the header of block H+1 and its commit. The client
accepts it only if
  1. the commit holds valid precommit signatures for that header's hash from the validator set
     `Committee.validators_for(header)` names, worth more than 2/3 of its power (`certify`), and
  2. the header's `last_app_hash` (the app hash after block H) equals the app hash recomputed
     from the answer, and the answer's tree proof shows what the query needs (`verify_reply`).
Anything else is rejected with a `DirectoryRejected` naming the reason.

The committee changes through the chain (`change_committee`, members removed for evidence), so
the set that signs a header is the one the client has followed to: `Committee` starts from the
genesis committee and, when a header names a committee it has not verified, follows the chain
to it with the light blocks a verifier serves (`light_verify`'s skipping verification and
bisection, within `REGISTRY.trusting_period_s` of the newest header it verified), before it
checks the answer again (`CommitteeReader.follow`).

What a node trusts must be recent: members who left may sell or leak their keys, and those keys
sign a history of their own that names their committee (a long-range attack). A node whose
newest trusted header (the genesis, for a new node) is older than the trusting period believes
nothing (`TrustExpired`) until it is given a trust anchor, the height and header hash of a
recent block from a source it trusts (`gt-verifier status` of a member it runs, or its
operator's word): the light block of that height, from any verifier, whose hash is that hash,
becomes what it follows from (`TrustAnchor`, `CommitteeReader.take_anchor`); CometBFT's light
clients start the same way (weak subjectivity).

A proof says what the committee certified at height H, not that H is recent: a Byzantine
verifier can answer with any old state it recorded, with valid signatures. So a node keeps a
`LightClient`, which never accepts for one subject (a node id, a roster, a region's relays) a
lower height than one it accepted for it, refuses an answer certified (header time of block
H+1) longer ago than `REGISTRY.max_directory_age_s` by the local clock, and asks verifiers in a
random order (no verifier is everyone's first); any f verifiers lying or down are skipped: the
next one in the order answers (`CommitteeReader.ask`).
"""

from __future__ import annotations

import logging
import math
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Awaitable, Callable, Sequence

import grpc

from gentorrent.channels import ChannelPool
from gentorrent.config import CONSENSUS, REGISTRY, WIRE
from gentorrent.crypto import keys
from gentorrent.wire import gentorrent_pb2 as pb
from gentorrent.wire import gentorrent_pb2_grpc as rpc
from gentorrent.ledger.chain import (BlockHeader, Commit, CommitError, DecodeError, DirectoryProofCodec, Reader,
                                    ValidatorSet, Writer, verify_commit)
from gentorrent.ledger import authtree, committee_changes, light_verify, queries
from gentorrent.ledger.genesis import Genesis, GenesisValidator
from gentorrent.ledger.light_verify import LightBlock, LightBlockCodec, genesis_block


log = logging.getLogger(__name__)


class DirectoryRejected(ValueError):
    """A directory reply that does not prove itself against the committee this client trusts."""


class TooFewSignatures(DirectoryRejected):
    pass


class UnknownKey(DirectoryRejected):
    pass


class BadSignature(DirectoryRejected):
    pass


class WrongAppHash(DirectoryRejected):
    pass


class MalformedProof(DirectoryRejected):
    pass


class RolledBack(DirectoryRejected):
    """Certified, but older than a directory this node already accepted (a replay)."""


class HeldChanged(MalformedProof):
    """A certified answer shows that a record the client holds changed or is gone, where the
    query assumed it had not (authtree.NotHeld): proven, so asking another verifier the same
    would not help; the client asks again without assuming it."""


class StaleDirectory(DirectoryRejected):
    """Certified too long ago by the local clock (a replay, a verifier that fell behind, or a
    wrong clock on this machine)."""


#: a verifier's light block of a height: header, commit and committee (verifier.directory_service)
LIGHT_BLOCK_PATH = "/light_block/"
#: what a node verified, kept in its home across restarts (`Committee.encode_trust`)
TRUST_TAG = b"gt/light-trust/v1"
MAX_TRUST_BYTES = 4 << 20
#: the trust file is written again when the newest verified header is this much newer than the
#: one it holds (and whenever a committee change was followed): far inside the trusting period
TRUST_SAVE_EVERY_MS = 3600 * 1000
#: the most verifiers a reader keeps asking (the genesis' and the members it learned since)
MAX_MEMBERS_ASKED = 256


class TrustFileError(ValueError):
    """A trust file that cannot be read back, or that is another chain's."""


class TrustExpired(DirectoryRejected):
    """What this node trusts is older than the trusting period: it needs a trust anchor."""


@dataclass(frozen=True)
class TrustAnchor:
    """A recent block a node is told to trust: its height and header hash (`HEIGHT:HASH`)."""

    height: int
    header_hash: bytes

    @classmethod
    def parse(cls, text: str) -> "TrustAnchor":
        """`HEIGHT:HASH` (HASH: 64 hex digits), as `gt-verifier status` prints `trust_anchor`."""
        height, sep, digest = text.strip().partition(":")
        if not (sep and height.isascii() and height.isdigit() and len(height) <= 19 and int(height) >= 1
                and len(digest) == 64 and all(c in "0123456789abcdefABCDEF" for c in digest)):
            raise ValueError(f"a trust anchor is HEIGHT:HASH (a block height >= 1, the header hash in 64 hex "
                             f"digits), as `gt-verifier status` prints it under trust_anchor; not {text[:80]!r}")
        return cls(int(height), bytes.fromhex(digest))

    def __str__(self) -> str:
        return f"{self.height}:{self.header_hash.hex()}"


class CommitteeChanged(DirectoryRejected):
    """A header that names a committee this client has not verified yet: the client follows
    the chain to it (`Committee.follow`, fetching light blocks) and checks the answer again."""

    def __init__(self, message: str, height: int) -> None:
        super().__init__(message)
        self.height = height


class NotFollowed(DirectoryRejected):
    """The committee changed, and the light blocks a verifier served do not lead to it from a
    header this client trusts (forged, a fork, or a trusted header past the trusting period)."""


@dataclass
class Committee:
    """What a light client trusts: the chain id, the genesis committee, and the committees it
    has followed since (light blocks it verified with `light_verify`, where the committee changed).

    A header is checked against the committee in force at its height as far as this client
    knows: the committee of the latest verified block below it. Naming that committee, it needs
    that committee's > 2/3 and nothing else (the common case: most headers follow no change);
    naming another, `validators_for` raises CommitteeChanged and the client verifies the header
    from that block first (skipping on > 1/3 of the trusted committee's power, bisecting where a
    skip lacks trust, within the trusting period: CometBFT's rules). So members added after
    genesis are believed once the genesis committee (or a committee it vouched for) vouched for
    them, and members who left sign nothing this client accepts after the change it followed."""

    chain_id: str
    validators: ValidatorSet  # the genesis committee: the root of trust
    genesis_time_ms: int = 0
    trusting_period_ms: int = int(REGISTRY.trusting_period_s * 1000)
    max_drift_ms: int = CONSENSUS.max_clock_drift_ms
    max_followed: int = 64  # light blocks kept (each a few KB); the oldest go first
    followed: list[LightBlock] = field(default_factory=list)  # verified by following a change, by height
    #: the newest header verified at all: what a later change is followed from, so trust stays
    #: within the trusting period for as long as this node keeps reading the committee
    latest: LightBlock | None = None
    #: cards of members added since genesis, as a proven `queries.Members` answer gave them: where
    #: to reach them (kept with the trust, so a restarted node finds them when the genesis members are gone)
    learned: list[pb.MemberCard] = field(default_factory=list)
    saved_ms: int = -1  # header time of `latest` when the trust was last saved or restored
    dirty: bool = False  # something worth saving was verified since (CommitteeReader saves it)

    @classmethod
    def from_genesis(cls, genesis: Genesis) -> "Committee":
        return cls(genesis.chain_id, genesis.validator_set(), genesis.genesis_time_ms)

    @property
    def root(self) -> LightBlock:
        return genesis_block(self.chain_id, self.genesis_time_ms, self.validators)

    def trusted_below(self, height: float) -> LightBlock:
        """The latest verified block below `height` (the genesis block at least)."""
        known = [b for b in (*self.followed, self.latest) if b is not None and b.height < height]
        return max(known, key=lambda b: b.height, default=self.root)

    def newest(self) -> LightBlock:
        """The newest block this client trusts (the genesis block at least)."""
        return self.trusted_below(math.inf)

    def expired(self, now_ms: int) -> bool:
        """Whether the newest trusted block is past the trusting period: after it, members who
        left since may have signed anything for it."""
        return now_ms - self.newest().time_ms >= self.trusting_period_ms

    def check_fresh(self, now_ms: int) -> None:
        """TrustExpired, saying what to do, when what this client trusts has `expired`."""
        if not self.expired(now_ms):
            return
        newest = self.newest()
        age_days, period_days = (now_ms - newest.time_ms) / 86_400_000, self.trusting_period_ms / 86_400_000
        what = "its genesis file" if newest.height == 0 else f"block {newest.height}"
        raise TrustExpired(f"this node trusts nothing newer than {what}, {age_days:.1f} days old, more than the "
                           f"trusting period ({period_days:.0f} days): members who left since could sign any "
                           f"history for it. Give it a trust anchor (--trust-anchor HEIGHT:HASH, the trust_anchor "
                           f"`gt-verifier status` prints on a member you trust)")

    def anchor(self, block: LightBlock, anchor: TrustAnchor) -> None:
        """Trust `block` because its header hash is the anchor's (nothing else vouches for it);
        NotFollowed, and nothing changed, if it is not the anchored block of this chain."""
        header = block.header
        if block.height != anchor.height or header.hash() != anchor.header_hash:
            raise NotFollowed(f"light block {block.height} (header {header.hash().hex()[:16]}…) is not the trust "
                              f"anchor {anchor.height}:{anchor.header_hash.hex()[:16]}…")
        if header.chain_id != self.chain_id or block.validators.hash() != header.validators_hash:
            raise NotFollowed(f"light block {block.height} is not a light block of chain {self.chain_id!r}")
        self._keep(block)
        self.verified(block)
        self.dirty = True

    def verified(self, block: LightBlock) -> None:
        """`block` was checked against the committee `validators_for` named: the newest such
        block is the one a later change is followed from."""
        if self.latest is None or block.height > self.latest.height:
            self.latest = block
            self.dirty |= block.time_ms - self.saved_ms >= TRUST_SAVE_EVERY_MS

    def validators_for(self, header: BlockHeader) -> ValidatorSet:
        """The committee that must have signed `header`; CommitteeChanged if the header names
        one this client has not followed to yet."""
        same = next((b for b in (*self.followed, self.latest) if b is not None and b.height == header.height
                     and b.header.hash() == header.hash()), None)
        base = same or self.trusted_below(header.height)
        if header.validators_hash == base.validators.hash():
            return base.validators
        raise CommitteeChanged(f"header {header.height} names a committee this node has not followed yet "
                               f"(it trusts the committee of height {base.height})", header.height)

    def follow(self, target: LightBlock, now_ms: int) -> light_verify.Bisection:
        """Verify `target` from the latest verified block below it and keep what was verified:
        a generator (light_verify.bisection) that yields the heights whose light blocks it needs."""
        if target.header.chain_id != self.chain_id:
            raise NotFollowed(f"light block for chain {target.header.chain_id!r}, not {self.chain_id!r}")
        try:
            verified = yield from light_verify.bisection(self.trusted_below(target.height), target, self.chain_id,
                                                         now_ms, self.trusting_period_ms, self.max_drift_ms)
        except light_verify.VerificationError as exc:
            raise NotFollowed(f"committee change at height {target.height} not followed: {exc}") from exc
        for block in verified:
            self._keep(block)
        return verified

    def _keep(self, block: LightBlock) -> None:
        """Add a verified block; two verified blocks of one height that differ are a fork."""
        for known in self.followed:
            evidence = light_verify.conflict(known, block)
            if evidence is not None:
                raise NotFollowed(f"fork at height {block.height}: two certified headers differ; signed by both: "
                                  f"{', '.join(k.hex()[:16] for k in evidence.double_signers)}")
        if all(known.height != block.height for known in self.followed):
            self.followed.append(block)
            self.followed.sort(key=lambda b: b.height)
            del self.followed[:-self.max_followed]
            self.dirty = True

    # -- kept across restarts: a node that restarts trusts what it had verified, not the genesis alone

    def encode_trust(self) -> bytes:
        w = Writer(TRUST_TAG).text(self.chain_id).u32(len(self.followed))
        for block in self.followed:
            w.blob(LightBlockCodec.encode(block))
        w.u8(self.latest is not None)
        if self.latest is not None:
            w.blob(LightBlockCodec.encode(self.latest))
        w.u32(len(self.learned))
        for card in self.learned:
            w.blob(card.SerializeToString())
        return w.done()

    def learn(self, cards: Sequence[pb.MemberCard]) -> list[pb.MemberCard]:
        """Keep the cards of members not known yet (the newest first to go past MAX_MEMBERS_ASKED
        is the oldest); returns the ones added."""
        known = {bytes(c.public_key) for c in self.learned} | {v.public_key for v in self.validators}
        added = [c for c in cards if bytes(c.public_key) not in known]
        if added:
            self.learned = [*self.learned, *added][-MAX_MEMBERS_ASKED:]
            self.dirty = True
        return added

    def restore_trust(self, data: bytes) -> None:
        """Take back what `encode_trust` kept; TrustFileError (and nothing changed) if it does
        not decode, is another chain's, or holds a block whose committee is not the one it names."""
        if len(data) > MAX_TRUST_BYTES:
            raise TrustFileError(f"{len(data)} bytes, more than {MAX_TRUST_BYTES}")
        try:
            r = Reader(data, TRUST_TAG)
            chain_id = r.text(256)
            followed = [LightBlockCodec.decode(r.blob(WIRE.max_message_bytes)) for _ in range(r.count(self.max_followed))]
            latest = LightBlockCodec.decode(r.blob(WIRE.max_message_bytes)) if r.u8() else None
            learned = [pb.MemberCard.FromString(r.blob(committee_changes.MAX_CHANGE_FILE_BYTES))
                       for _ in range(r.count(MAX_MEMBERS_ASKED))]
            r.end()
        except (ValueError, RuntimeError) as exc:  # (protobuf's DecodeError is a ValueError)
            raise TrustFileError(f"not a trust file: {exc}") from exc
        if chain_id != self.chain_id:
            raise TrustFileError(f"it is chain {chain_id[:64]!r}'s, this node's genesis is {self.chain_id!r}'s")
        for block in (*followed, *([latest] if latest else [])):
            if block.header.chain_id != chain_id or block.validators.hash() != block.header.validators_hash:
                raise TrustFileError(f"its block {block.height} is not a light block of this chain")
        self.followed = sorted(followed, key=lambda b: b.height)
        self.latest = latest
        self.learned = learned
        self.mark_saved()

    def mark_saved(self) -> None:
        """What `encode_trust` gives now is what the node keeps: nothing to save until it changes."""
        self.saved_ms = self.latest.time_ms if self.latest else -1
        self.dirty = False


@dataclass(frozen=True)
class Certified:
    """A header of height H+1 that the committee signed: it certifies the state after H."""

    height: int  # H: the state it certifies
    time_ms: int  # when the committee signed it (block time of H+1): how fresh the state is
    app_hash: bytes


def certify(height: int, proof: bytes, committee: Committee) -> Certified:
    """The state of `height` that (header H+1, commit H+1) in `proof` certifies; raises
    DirectoryRejected (TooFewSignatures, UnknownKey, BadSignature, MalformedProof) if the
    committee did not sign it. The one check every answer from a verifier goes through."""
    try:
        proof_height, header_bytes, commit_bytes = DirectoryProofCodec.decode(proof)
        header = BlockHeader.decode(header_bytes)
        commit = Commit.decode(commit_bytes)
    except DecodeError as exc:
        raise MalformedProof(f"proof does not decode: {exc}") from exc
    if proof_height != height or header.height != height + 1:
        raise MalformedProof(f"proof is for height {proof_height} (header {header.height}), "
                             f"the value for height {height}")
    if header.chain_id != committee.chain_id:
        raise MalformedProof(f"header is for chain {header.chain_id!r}, not {committee.chain_id!r}")
    validators = committee.validators_for(header)
    try:
        verify_commit(commit, committee.chain_id, validators, header.height, header.hash())
    except CommitError as exc:
        text = str(exc)
        if text.startswith("too few"):
            raise TooFewSignatures(f"answer rejected: {text}") from exc
        if text.startswith("unknown key"):
            raise UnknownKey(f"answer rejected: {text}") from exc
        raise BadSignature(f"answer rejected: {text}") from exc
    committee.verified(LightBlock(header, commit, validators))
    return Certified(height, header.time_ms, header.last_app_hash)


@dataclass(frozen=True)
class ProvenReply:
    """A verified answer to a proven query: what it says, and when the committee said it."""

    height: int
    time_ms: int
    result: object  # what `query.read` gave


def verify_reply(query: queries.Query, value: bytes, height: int, proof: bytes, committee: Committee,
                 **read_kwargs) -> ProvenReply:
    """The answer to `query` in a QueryReply (value, height, proof), checked against a header
    the committee signed; DirectoryRejected naming the reason if it is not proven."""
    certified = certify(height, proof, committee)
    try:
        answer = queries.decode_answer(value, WIRE.max_message_bytes)
    except (queries.AnswerError, authtree.ProofError) as exc:
        raise MalformedProof(f"answer is malformed: {exc}") from exc
    if answer.height != height:
        raise MalformedProof(f"answer says height {answer.height}, reply says {height}")
    if answer.app_hash != certified.app_hash:
        raise WrongAppHash(f"answer rejected: wrong app hash: the proof hashes to {answer.app_hash.hex()[:16]}…, "
                           f"the committee signed {certified.app_hash.hex()[:16]}… at height {height}")
    if getattr(query, "reads_meta", False):  # (queries.Members: the answer carries the meta section)
        read_kwargs = {**read_kwargs, "meta": answer.meta}
    try:
        result = query.read(answer.seen, **read_kwargs)
    except authtree.NotHeld as exc:
        if height >= getattr(query, "since", 0):  # not a replay of a state from before what it holds
            raise HeldChanged(f"answer to {query.path[:64]!r} at height {height}: {exc}") from exc
        raise MalformedProof(f"answer to {query.path[:64]!r} is older than what it holds: {exc}") from exc
    except (queries.AnswerError, authtree.ProofError) as exc:
        raise MalformedProof(f"answer does not answer {query.path[:64]!r}: {exc}") from exc
    return ProvenReply(height, certified.time_ms, result)


# --------------------------------------------------------------------------- no rollback


@dataclass
class LightClient:
    """What a node accepted last about each subject, and whether an answer may be accepted (pure)."""

    max_age_ms: int = int(REGISTRY.max_directory_age_s * 1000)
    #: subject (what an answer is about: a node id, a roster, a region's relays) -> the highest
    #: height accepted for it: the no-rollback rule, per thing asked
    answered: dict[str, int] = field(default_factory=dict)

    def check_answer(self, subject: str, reply: ProvenReply, now_ms: int) -> None:
        """Raise RolledBack or StaleDirectory unless `reply` about `subject` may be accepted now."""
        last = self.answered.get(subject)
        if last is not None and reply.height < last:
            raise RolledBack(f"answer rejected: height {reply.height} is older than height {last} already "
                             f"accepted for {subject[:80]} (a replayed answer)")
        self._check_age(reply.height, reply.time_ms, now_ms)

    def accept_answer(self, subject: str, reply: ProvenReply) -> None:
        if reply.height < self.answered.get(subject, -1):
            raise RolledBack(f"answer rejected: height {reply.height} < {self.answered[subject]}")
        self.answered[subject] = reply.height

    def _check_age(self, height: int, time_ms: int, now_ms: int) -> None:
        age_ms = now_ms - time_ms
        if age_ms > self.max_age_ms:
            raise StaleDirectory(f"rejected: certified {age_ms / 1000:.0f} s ago (height {height}), more than "
                                 f"{self.max_age_ms / 1000:.0f} s: the verifier replays an old state or fell "
                                 f"behind, or this machine's clock is wrong")


#: (verifier, path, data) -> its QueryReply: the transport of proven queries
Send = Callable[[GenesisValidator, str, bytes], Awaitable[pb.QueryReply]]


@dataclass
class CommitteeReader:
    """The I/O around a LightClient: which verifiers to ask, in which order, and when."""

    validators: Sequence[GenesisValidator]
    send: Send
    committee: Committee
    client: LightClient = field(default_factory=LightClient)
    rng: random.Random = field(default_factory=random.Random)
    now_ms: Callable[[], int] = lambda: int(time.time() * 1000)
    close: Callable[[], Awaitable[None]] | None = None  # releases what `send` holds open
    save_trust: Callable[[bytes], None] | None = None  # keeps `committee.encode_trust()` across restarts
    anchor: TrustAnchor | None = None  # a block to trust first (taken at the first ask)
    #: a node that keeps the chain itself (a committee member's own user node) anchors at its own
    #: newest block whenever what this reader trusts has expired
    anchor_source: Callable[[], TrustAnchor | None] | None = None
    _learning: bool = field(default=False, init=False, repr=False)  # a learn_members under way (its own
    # ask may meet a change again)

    async def ask(self, query: queries.Query, subject: str | None = None,
                  confirm: bool | Callable[[ProvenReply], bool] = False, **read_kwargs) -> ProvenReply:
        """The proven answer to `query` from the first verifier (in a random order) whose answer
        is certified, not older than one accepted before about `subject`, and fresh; with
        `confirm` (or when `confirm(first answer)` says so: a change of trust or membership), a
        second verifier's too, and the newer of the two (a replay of an older state, fresh
        enough to pass the age bound, loses to it); raises DirectoryRejected with every
        verifier's reason when none answers."""
        if self.anchor is None and self.anchor_source is not None and self.committee.expired(self.now_ms()):
            self.anchor = self.anchor_source()
        if self.anchor is not None:
            await self.take_anchor()
        self.committee.check_fresh(self.now_ms())
        subject = subject or query.path
        order = list(self.validators)
        self.rng.shuffle(order)
        errors: list[str] = []
        first = await self._first(query, subject, order, errors, read_kwargs)
        if first is None:
            raise DirectoryRejected(f"no verifier gave a proven answer to {query.path[:64]}: " + "; ".join(errors))
        if confirm is True or callable(confirm) and confirm(first):
            second = await self._first(query, subject, order, errors, read_kwargs)
            if second is not None and second.height > first.height:
                first = second
        self.client.accept_answer(subject, first)
        self._keep_trust()
        return first

    async def take_anchor(self) -> None:
        """Trust the anchor's block, as the first verifier (in a random order) that serves it
        gives it; DirectoryRejected naming each verifier's reason if none does."""
        anchor, errors = self.anchor, []
        order = list(self.validators)
        self.rng.shuffle(order)
        for v in order:
            try:
                self.committee.anchor(await self._light_block(v, anchor.height), anchor)
            except DirectoryRejected as exc:  # (a fork with what it holds, too: NotFollowed)
                errors.append(f"{v.name}: {exc}")
                continue
            except Exception as exc:  # noqa: BLE001 - a verifier down, refusing TLS, or timing out
                errors.append(f"{v.name}: {type(exc).__name__}: {str(exc)[:200]}")
                continue
            self.anchor = None
            self._keep_trust()
            return
        raise DirectoryRejected(f"no verifier served the trust anchor's block {anchor.height}: " + "; ".join(errors))

    def _keep_trust(self) -> None:
        """Save what the committee verified when it is worth it (a change followed, an hour on)."""
        if not (self.committee.dirty and self.save_trust):
            return
        try:
            self.save_trust(self.committee.encode_trust())
        except OSError as exc:  # a full disk costs the next restart its head start, not this answer
            log.warning("could not keep the light client's trust: %s", exc)
            return
        self.committee.mark_saved()

    async def _first(self, query, subject: str, order: list, errors: list[str], read_kwargs) -> ProvenReply | None:
        """Pop verifiers off `order` until one gives an acceptable answer."""
        while order:
            v = order.pop(0)
            try:
                reply = await self.send(v, query.path, query.data)
                if reply.code != 0:
                    raise DirectoryRejected(f"code {reply.code}: {reply.log[:200]}")
                try:
                    answer = verify_reply(query, reply.value, reply.height, reply.proof, self.committee, **read_kwargs)
                except CommitteeChanged as changed:  # follow the chain to the new committee, then check again
                    await self.follow(v, changed.height)
                    answer = verify_reply(query, reply.value, reply.height, reply.proof, self.committee, **read_kwargs)
                self.client.check_answer(subject, answer, self.now_ms())
            except HeldChanged:
                raise  # proven: every verifier's answer would say it
            except DirectoryRejected as exc:
                errors.append(f"{v.name}: {exc}")
                continue
            except Exception as exc:  # noqa: BLE001 - a verifier down, refusing TLS, or timing out
                errors.append(f"{v.name}: {type(exc).__name__}: {str(exc)[:200]}")
                continue
            return answer
        return None

    async def follow(self, v: GenesisValidator, height: int) -> None:
        """Verify the committee of `height` from what this client trusts, with the light blocks
        verifier `v` serves (`/light_block/<h>`); NotFollowed if they do not lead there. Then
        learn where its new members are (`learn_members`)."""
        steps = self.committee.follow(await self._light_block(v, height), self.now_ms())
        try:
            wanted = next(steps)
            while True:
                wanted = steps.send(await self._light_block(v, wanted))
        except StopIteration:
            pass
        await self.learn_members()

    def members_now(self) -> list[GenesisValidator]:
        """The verifiers this client knows (the genesis' and those it learned) that are in the
        committee of the newest header it verified: where audits go, never to a member that left."""
        newest = self.committee.latest or self.committee.root
        return [v for v in self.validators if newest.validators.index_of(v.public_key) is not None]

    async def learn_members(self) -> None:
        """Ask the committee who its members are (a proven `queries.Members`) and add the cards of
        those this client cannot reach yet to the verifiers it asks: once the genesis members have
        left, the newcomers answer. A card is only an address and a certificate to dial: what a
        member answers is still checked against the committee this client followed."""
        if self._learning:
            return
        self._learning = True
        try:
            members = (await self.ask(queries.Members())).result
        except DirectoryRejected as exc:  # the old members answer meanwhile; the next follow tries again
            log.info("could not learn the committee's new members: %s", exc)
            return
        finally:
            self._learning = False
        self._ask_too(self.committee.learn(members.cards))
        self._keep_trust()

    def _ask_too(self, cards: Sequence[pb.MemberCard]) -> None:
        """Add these members to the verifiers this reader asks."""
        known = {v.public_key for v in self.validators}
        added = [committee_changes.validator_of(c) for c in cards if bytes(c.public_key) not in known]
        if added:
            self.validators = [*self.validators, *added][-MAX_MEMBERS_ASKED:]

    async def _light_block(self, v: GenesisValidator, height: int) -> LightBlock:
        reply = await self.send(v, f"{LIGHT_BLOCK_PATH}{height}", b"")
        if reply.code != 0:
            raise NotFollowed(f"no light block {height}: code {reply.code}: {reply.log[:200]}")
        try:
            block = LightBlockCodec.decode(reply.value)
        except ValueError as exc:
            raise NotFollowed(f"light block {height} does not decode: {exc}") from exc
        if block.height != height:
            raise NotFollowed(f"asked for light block {height}, got {block.height}")
        return block


def committee_reader(genesis: Genesis, timeout: float = WIRE.rpc_timeout_s, channels: ChannelPool | None = None,
                     trust_file: Path | None = None, **kwargs) -> CommitteeReader:
    """A CommitteeReader over the verifiers of `genesis`, over pinned TLS channels kept open
    between refreshes. A verifier that refuses connections fails its call at once (no wait
    for a connection that will not come), so a member that is down costs nothing. `trust_file`:
    where the node keeps what it verified (its home's), read back here; a damaged one is
    refused, saying what to do (starting from the genesis alone trusts less: the operator decides)."""
    committee = Committee.from_genesis(genesis)
    if trust_file is not None:
        trust_file = Path(trust_file)
        try:
            if trust_file.exists():
                committee.restore_trust(trust_file.read_bytes())
        except (TrustFileError, OSError) as exc:
            raise TrustFileError(f"{trust_file}: {exc}. It holds the committee headers this node verified; if it "
                                 f"is damaged, remove it and the node starts again from the genesis file") from exc
        kwargs.setdefault("save_trust", lambda data: keys.replace_private(trust_file, data))
    pool = channels or ChannelPool()

    async def send(v: GenesisValidator, path: str, data: bytes) -> pb.QueryReply:
        try:
            return await rpc.VerifierStub(pool.get(v.address, v.tls_cert_pem)).Query(
                pb.QueryRequest(path=path, data=data), timeout=timeout)
        except grpc.aio.AioRpcError as exc:
            await pool.forget(v.address)
            raise DirectoryRejected(f"{v.address}: {exc.code().name}: {exc.details()}") from exc

    reader = CommitteeReader(genesis.validators, send, committee, close=pool.close, **kwargs)
    reader._ask_too(committee.learned)  # members learned before a restart: reachable at once
    return reader
