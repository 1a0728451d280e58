"""Fetch the committee's directory from any one verifier and check it like a light client.

The verifier that answers is not trusted. Its reply carries the /directory value at height H
and a proof: the header of block H+1 and the commit of block H+1. The client accepts the
value only if
  1. the commit holds valid precommit signatures for that header's hash from keys of the
     genesis committee, worth more than 2/3 of its voting power, and
  2. the header's `last_app_hash` (the app hash after block H, which the committee signed)
     equals the app hash recomputed from the value itself (users and models sections in
     full, the other sections by hash: `interface.app_hash_of`).
Anything else is rejected with a `DirectoryRejected` naming the reason (ARCHITECTURE.md §3.1).

A proof says what the committee certified at height H, not that H is recent: a Byzantine
verifier can answer with any old directory it recorded, with valid signatures. So a node
keeps a `LightClient`, which never accepts a lower height than the last one it accepted,
refuses a directory certified (header time of block H+1) longer ago than
`REGISTRY.max_directory_age_s` by the local clock, asks verifiers in a random order (no
verifier is everyone's first), and before it switches to a directory that changes who is
registered or trusted, asks a second verifier and takes the newer of the two. Any f
verifiers lying or down are skipped: the next one in the order answers.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field, replace
from typing import Awaitable, Callable, Sequence

import grpc

from gentorrent.channels import ChannelPool
from gentorrent.config import REGISTRY, WIRE
from gentorrent.crypto.tls import connect
from gentorrent.wire import gentorrent_pb2 as pb
from gentorrent.wire import gentorrent_pb2_grpc as rpc
from gentorrent.ledger.chain import (BlockHeader, Commit, CommitError, DecodeError, DirectoryProofCodec,
                                    ValidatorSet, verify_commit)
from gentorrent.ledger.genesis import Genesis, GenesisValidator
from gentorrent.ledger.sections import (DirectorySnapshot, app_hash_of, decode_directory,
                                        directory_section_hashes)


class DirectoryRejected(ValueError):
    """A directory reply that does not prove itself against the genesis committee."""


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


class StaleDirectory(DirectoryRejected):
    """Certified too long ago by the local clock (a replay, a verifier that fell behind, or a
    wrong clock on this machine)."""


class NotConfirmed(DirectoryRejected):
    """A change of trust or membership that no second verifier could confirm yet."""


@dataclass(frozen=True)
class Committee:
    """What a light client trusts: the chain id and the committee keys of the genesis file."""

    chain_id: str
    validators: ValidatorSet

    @classmethod
    def from_genesis(cls, genesis: Genesis) -> "Committee":
        return cls(genesis.chain_id, genesis.validator_set())


@dataclass(frozen=True)
class DirectoryProof:
    """A directory reply a light client can check against the genesis committee alone."""

    value: bytes  # the /directory query value at `height`
    height: int
    next_header: bytes  # encoded header of block height+1 (carries last_app_hash)
    next_commit: bytes  # encoded commit of block height+1 (> 2/3 precommit signatures)


def verify_directory(value: bytes, height: int, proof: bytes, committee: Committee) -> DirectorySnapshot:
    """The decoded directory if (value, height, proof) is certified by `committee`."""
    try:
        proof_height, header_bytes, commit_bytes = DirectoryProofCodec.decode(proof)
        header = BlockHeader.decode(header_bytes)
        commit = Commit.decode(commit_bytes)
    except DecodeError as exc:
        raise MalformedProof(f"directory proof does not decode: {exc}") from exc
    if proof_height != height or header.height != height + 1:
        raise MalformedProof(f"proof is for height {proof_height} (header {header.height}), "
                             f"the value for height {height}")
    if header.chain_id != committee.chain_id:
        raise MalformedProof(f"header is for chain {header.chain_id!r}, not {committee.chain_id!r}")
    try:
        verify_commit(commit, committee.chain_id, committee.validators, header.height, header.hash())
    except CommitError as exc:
        text = str(exc)
        if text.startswith("too few"):
            raise TooFewSignatures(f"directory rejected: {text}") from exc
        if text.startswith("unknown key"):
            raise UnknownKey(f"directory rejected: {text}") from exc
        raise BadSignature(f"directory rejected: {text}") from exc
    try:
        claimed = app_hash_of(directory_section_hashes(value))
    except ValueError as exc:
        raise MalformedProof(f"directory value is malformed: {exc}") from exc
    if claimed != header.last_app_hash:
        raise WrongAppHash(f"directory rejected: wrong app hash: the value hashes to {claimed.hex()[:16]}…, "
                           f"the committee signed {header.last_app_hash.hex()[:16]}… at height {height}")
    directory = decode_directory(value)
    if directory.height != height:
        raise MalformedProof(f"value says height {directory.height}, reply says {height}")
    return replace(directory, time_ms=header.time_ms)


def verify_proof(proof: DirectoryProof, committee: Committee):
    """`verify_directory` for an `DirectoryProof` (value, height, header, commit)."""
    return verify_directory(proof.value, proof.height,
                            DirectoryProofCodec.encode(proof.height, proof.next_header, proof.next_commit),
                            committee)


def proof_of_reply(value: bytes, height: int, proof: bytes) -> DirectoryProof:
    """The `DirectoryProof` carried by a /directory QueryReply."""
    try:
        _, header, commit = DirectoryProofCodec.decode(proof)
    except DecodeError as exc:
        raise MalformedProof(f"directory proof does not decode: {exc}") from exc
    return DirectoryProof(value=value, height=height, next_header=header, next_commit=commit)


async def fetch_directory(address: str, pinned_cert_pem: bytes, committee: Committee,
                          timeout: float = WIRE.rpc_timeout_s):
    """Ask the verifier at `address` for the directory and verify it; raises DirectoryRejected
    (a TlsError naming the cause when the verifier cannot be reached)."""
    channel = await connect(address, pinned_cert_pem, timeout=min(timeout, REGISTRY.connect_timeout_s))
    try:
        return await query_directory(channel, address, committee, timeout)
    finally:
        await channel.close()


async def query_directory(channel: grpc.aio.Channel, address: str, committee: Committee,
                          timeout: float = WIRE.rpc_timeout_s) -> DirectorySnapshot:
    """The verified directory from the verifier behind `channel` (a pinned channel)."""
    reply = await rpc.VerifierStub(channel).Query(pb.QueryRequest(path="/directory"), timeout=timeout)
    if reply.code != 0:
        raise DirectoryRejected(f"{address} has no certified directory: {reply.log}")
    return verify_directory(reply.value, reply.height, reply.proof, committee)


# --------------------------------------------------------------------------- no rollback


def _standing(d: DirectorySnapshot) -> tuple[frozenset, frozenset]:
    """Who is registered, and which model nodes are trusted: what a confirmation guards."""
    return (frozenset(u.node_id for u in d.users),
            frozenset((m.node_id, m.trusted) for m in d.models))


@dataclass
class LightClient:
    """What a node accepted last, and whether a verified directory may replace it (pure)."""

    max_age_ms: int = int(REGISTRY.max_directory_age_s * 1000)
    current: DirectorySnapshot | None = None

    def check(self, candidate: DirectorySnapshot, now_ms: int) -> None:
        """Raise RolledBack or StaleDirectory unless `candidate` may be accepted now."""
        if self.current is not None and candidate.height < self.current.height:
            raise RolledBack(f"directory rejected: height {candidate.height} is older than height "
                             f"{self.current.height} already accepted (a replayed directory)")
        age_ms = now_ms - candidate.time_ms
        if age_ms > self.max_age_ms:
            raise StaleDirectory(f"directory rejected: certified {age_ms / 1000:.0f} s ago (height "
                                 f"{candidate.height}), more than {self.max_age_ms / 1000:.0f} s: the verifier "
                                 f"replays an old directory or fell behind, or this machine's clock is wrong")

    def is_newer(self, candidate: DirectorySnapshot) -> bool:
        return self.current is None or candidate.height > self.current.height

    def needs_confirmation(self, candidate: DirectorySnapshot) -> bool:
        """A switch that changes membership or trust waits for a second verifier."""
        return self.current is None or _standing(candidate) != _standing(self.current)

    def adopt(self, candidate: DirectorySnapshot) -> None:
        if self.current is not None and candidate.height < self.current.height:
            raise RolledBack(f"directory rejected: height {candidate.height} < {self.current.height}")
        self.current = candidate


Fetch = Callable[[GenesisValidator], Awaitable[DirectorySnapshot]]


@dataclass
class CommitteeReader:
    """The I/O around a LightClient: which verifiers to ask, in which order, and when."""

    validators: Sequence[GenesisValidator]
    fetch: Fetch
    client: LightClient = field(default_factory=LightClient)
    rng: random.Random = field(default_factory=random.Random)
    now_ms: Callable[[], int] = lambda: int(time.time() * 1000)
    confirmations: int = REGISTRY.confirmations
    close: Callable[[], Awaitable[None]] | None = None  # releases what `fetch` holds open

    async def refresh(self) -> DirectorySnapshot:
        """The directory to work from now (the accepted one, or a newer one); raises
        DirectoryRejected (with every verifier's reason) when no acceptable one came."""
        order = list(self.validators)
        self.rng.shuffle(order)
        errors: list[str] = []
        candidate = await self._first_acceptable(order, errors)
        if candidate is None:
            raise DirectoryRejected("no verifier returned an acceptable directory: " + "; ".join(errors))
        if not self.client.is_newer(candidate):
            return self.client.current
        if self.client.needs_confirmation(candidate):
            wanted = min(self.confirmations, len(self.validators)) - 1
            for _ in range(wanted):
                other = await self._first_acceptable(order, errors)
                if other is None:
                    if self.client.current is not None:
                        raise NotConfirmed(f"a change at height {candidate.height} is not confirmed by a second "
                                           f"verifier yet: " + "; ".join(errors))
                    break  # nothing accepted yet: a certified, fresh directory beats none
                candidate = max(candidate, other, key=lambda d: d.height)
        self.client.adopt(candidate)
        return candidate

    async def _first_acceptable(self, order: list[GenesisValidator], errors: list[str]) -> DirectorySnapshot | None:
        """Pop verifiers off `order` until one answers with a directory `client.check` accepts."""
        while order:
            v = order.pop(0)
            try:
                candidate = await self.fetch(v)
                self.client.check(candidate, self.now_ms())
                return candidate
            except DirectoryRejected as exc:
                errors.append(f"{v.name}: {exc}")
            except Exception as exc:  # noqa: BLE001 - a verifier down, refusing TLS, or timing out
                errors.append(f"{v.name}: {type(exc).__name__}: {str(exc)[:200]}")
        return None


def committee_reader(genesis: Genesis, timeout: float = WIRE.rpc_timeout_s, channels: ChannelPool | None = None,
                     **kwargs) -> CommitteeReader:
    """A CommitteeReader over the verifiers of `genesis`, over pinned TLS channels kept open
    between refreshes. A verifier that refuses connections fails its call at once (no wait
    for a connection that will not come), so a member that is down costs nothing."""
    committee = Committee.from_genesis(genesis)
    pool = channels or ChannelPool()

    async def fetch(v: GenesisValidator) -> DirectorySnapshot:
        try:
            return await query_directory(pool.get(v.address, v.tls_cert_pem), v.address, committee, timeout)
        except grpc.aio.AioRpcError as exc:
            await pool.forget(v.address)
            raise DirectoryRejected(f"{v.address}: {exc.code().name}: {exc.details()}") from exc

    return CommitteeReader(genesis.validators, fetch, close=pool.close, **kwargs)


async def fetch_from_committee(genesis: Genesis, timeout: float = WIRE.rpc_timeout_s) -> DirectorySnapshot:
    """A checked, fresh directory from a random verifier (confirmed by a second one): what a
    node that holds no directory yet accepts."""
    reader = committee_reader(genesis, timeout)
    try:
        return await reader.refresh()
    finally:
        await reader.close()
