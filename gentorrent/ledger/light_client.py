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
"""

from __future__ import annotations

from dataclasses import dataclass

from gentorrent.config import WIRE
from gentorrent.crypto.tls import connect
from gentorrent.wire import gentorrent_pb2 as pb
from gentorrent.wire import gentorrent_pb2_grpc as rpc
from gentorrent.ledger.chain import (BlockHeader, Commit, CommitError, DecodeError, DirectoryProofCodec,
                                    ValidatorSet, verify_commit)
from gentorrent.ledger.genesis import Genesis
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
    if getattr(directory, "height", height) != height:
        raise MalformedProof(f"value says height {directory.height}, reply says {height}")
    return directory


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
    """Ask the verifier at `address` for the directory and verify it; raises DirectoryRejected."""
    channel = await connect(address, pinned_cert_pem, timeout=timeout)
    try:
        reply = await rpc.VerifierStub(channel).Query(pb.QueryRequest(path="/directory"), timeout=timeout)
    finally:
        await channel.close()
    if reply.code != 0:
        raise DirectoryRejected(f"{address} has no certified directory: {reply.log}")
    return verify_directory(reply.value, reply.height, reply.proof, committee)


async def fetch_from_committee(genesis: Genesis, timeout: float = WIRE.rpc_timeout_s):
    """The directory from the first verifier of the genesis that answers with a valid proof."""
    committee = Committee.from_genesis(genesis)
    errors = []
    for v in genesis.validators:
        try:
            return await fetch_directory(v.address, v.tls_cert_pem, committee, timeout)
        except (DirectoryRejected, ConnectionError, OSError) as exc:
            errors.append(f"{v.name}: {exc}")
        except Exception as exc:  # grpc errors of a down verifier
            errors.append(f"{v.name}: {type(exc).__name__}: {exc}")
    raise DirectoryRejected("no verifier returned a valid directory: " + "; ".join(errors))
