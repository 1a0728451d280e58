"""Canonical encodings of the replicated state's sections, and the /directory value.

The app hash is `interface.app_hash_of` over SHA-256 of each section's encoding (the
deterministic protobuf encoding of MetaSection / UsersSection / ModelsSection /
EpochsSection, records sorted by key). The /directory query returns the users and models
sections as the exact bytes that were hashed, plus the other sections' hashes, so a light
client recomputes the app hash without trusting the verifier that answered, then compares it
with the `last_app_hash` of the next header signed by > 2/3 of the committee.

This module is shared by the app (encoding) and the light client (decoding) and is pure.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Iterable

from google.protobuf.message import DecodeError

from gentorrent.config import WIRE
from gentorrent.crypto.keys import NODE_ID_BYTES, PUBLIC_KEY_BYTES, node_id_of
from gentorrent.wire import gentorrent_pb2 as pb

HASH_BYTES = 32

#: sections of the replicated state, in app-hash order
SECTIONS: tuple[str, ...] = ("meta", "users", "models", "epochs")


def app_hash_of(section_hashes: dict[str, bytes]) -> bytes:
    """The app hash committed for a state whose sections hash to `section_hashes`: SHA-256 of
    the section hashes in `SECTIONS` order (the ABCI contract, verifier/abci/interface.py)."""
    missing = [s for s in SECTIONS if s not in section_hashes]
    if missing:
        raise ValueError(f"missing section hashes: {missing}")
    return hashlib.sha256(b"".join(section_hashes[s] for s in SECTIONS)).digest()


class DirectoryFormatError(ValueError):
    """A /directory value is malformed (and must not be trusted for anything)."""


# --------------------------------------------------------------------------- records


@dataclass(frozen=True)
class UserRecord:
    """A registered user node (a relay for others): the one record type for it everywhere."""

    node_id: bytes
    public_key: bytes  # Ed25519
    address: str
    onion_key: bytes  # X25519 public
    tls_cert_pem: bytes
    region: str = "default"
    registered_height: int = 0
    updated_height: int = 0
    expires_ms: int = 0  # block time its lease ends (0: no lease, a static directory's record)

    @property
    def node_id_hex(self) -> str:
        return self.node_id.hex()

    def to_pb(self) -> pb.UserEntry:
        return pb.UserEntry(node_id=self.node_id, public_key=self.public_key, address=self.address,
                            onion_key=self.onion_key, tls_cert_pem=self.tls_cert_pem, region=self.region,
                            registered_height=self.registered_height, updated_height=self.updated_height,
                            expires_ms=self.expires_ms)

    @classmethod
    def from_pb(cls, m: pb.UserEntry) -> "UserRecord":
        return cls(node_id=m.node_id, public_key=m.public_key, address=m.address, onion_key=m.onion_key,
                   tls_cert_pem=m.tls_cert_pem, region=m.region, registered_height=m.registered_height,
                   updated_height=m.updated_height, expires_ms=m.expires_ms)


@dataclass(frozen=True)
class ModelRecord:
    """A registered model node with its standing: the one record type for it everywhere."""

    node_id: bytes
    public_key: bytes
    address: str
    model: str
    onion_key: bytes  # X25519 public; queries are sealed to it
    tls_cert_pem: bytes
    capacity: int = 1
    reputation: float = 1.0
    trusted: bool = True
    registered_height: int = 0
    updated_height: int = 0
    expires_ms: int = 0  # block time its lease ends (0: no lease, a static directory's record)

    @property
    def node_id_hex(self) -> str:
        return self.node_id.hex()

    def to_pb(self) -> pb.ModelEntry:
        return pb.ModelEntry(node_id=self.node_id, public_key=self.public_key, address=self.address,
                             model=self.model, capacity=self.capacity, tls_cert_pem=self.tls_cert_pem,
                             reputation=self.reputation, trusted=self.trusted,
                             registered_height=self.registered_height, updated_height=self.updated_height,
                             onion_key=self.onion_key, expires_ms=self.expires_ms)

    @classmethod
    def from_pb(cls, m: pb.ModelEntry) -> "ModelRecord":
        return cls(node_id=m.node_id, public_key=m.public_key, address=m.address, model=m.model,
                   onion_key=m.onion_key, tls_cert_pem=m.tls_cert_pem, capacity=m.capacity,
                   reputation=m.reputation, trusted=m.trusted, registered_height=m.registered_height,
                   updated_height=m.updated_height, expires_ms=m.expires_ms)


def encode(msg) -> bytes:
    return msg.SerializeToString(deterministic=True)


def section_hash(encoded: bytes) -> bytes:
    return hashlib.sha256(encoded).digest()


def encode_users(users: Iterable[UserRecord]) -> bytes:
    """`users` must already be sorted by node id (the caller's store keeps them so)."""
    return encode(pb.UsersSection(users=[u.to_pb() for u in users]))


def encode_models(models: Iterable[ModelRecord]) -> bytes:
    return encode(pb.ModelsSection(models=[m.to_pb() for m in models]))


def encode_meta(chain_id: str, height: int, time_ms: int, validators: Iterable[tuple[bytes, int]],
                accounts: Iterable[tuple[bytes, int]], lease_ms: int = 0) -> bytes:
    return encode(pb.MetaSection(
        chain_id=chain_id, height=height, time_ms=time_ms,
        validators=[pb.ValidatorEntry(public_key=k, power=p) for k, p in validators],
        accounts=[pb.AccountEntry(public_key=k, last_sequence=s) for k, s in accounts],
        lease_ms=lease_ms,
    ))


def encode_epochs(epochs: pb.EpochsSection) -> bytes:
    return encode(epochs)


# --------------------------------------------------------------------------- /directory


@dataclass(frozen=True)
class DirectorySnapshot:
    """A decoded /directory value. Trust it only after `app_hash` has been checked against a
    header signed by the committee (gentorrent.ledger.light_client does that)."""

    height: int
    users: tuple[UserRecord, ...]
    models: tuple[ModelRecord, ...]
    section_hashes: dict[str, bytes]
    #: block time (ms) of the header that certifies this directory (block height+1); set by
    #: the light client, 0 before: how fresh the directory is, against the local clock
    time_ms: int = 0

    @property
    def app_hash(self) -> bytes:
        return app_hash_of(self.section_hashes)

    def user(self, node_id: bytes) -> UserRecord | None:
        return next((u for u in self.users if u.node_id == node_id), None)

    def model(self, node_id: bytes) -> ModelRecord | None:
        return next((m for m in self.models if m.node_id == node_id), None)

    def trusted_models(self, model: str | None = None) -> tuple[ModelRecord, ...]:
        return tuple(m for m in self.models if m.trusted and (model is None or m.model == model))


def encode_directory(height: int, users_section: bytes, models_section: bytes, meta_hash: bytes,
                     epochs_hash: bytes) -> bytes:
    return encode(pb.DirectoryValue(height=height, users_section=users_section, models_section=models_section,
                                    meta_hash=meta_hash, epochs_hash=epochs_hash))


def _parse_value(value: bytes) -> pb.DirectoryValue:
    if len(value) > WIRE.max_message_bytes:
        raise DirectoryFormatError(f"directory value is {len(value)} bytes, the limit is {WIRE.max_message_bytes}")
    msg = pb.DirectoryValue()
    try:
        msg.ParseFromString(value)
    except (DecodeError, ValueError, RuntimeError) as exc:
        raise DirectoryFormatError(f"not a directory value: {exc}") from exc
    if len(msg.meta_hash) != HASH_BYTES or len(msg.epochs_hash) != HASH_BYTES:
        raise DirectoryFormatError("meta_hash and epochs_hash must be 32-byte SHA-256 digests")
    if msg.height < 0:
        raise DirectoryFormatError("negative height")
    return msg


def directory_section_hashes(value: bytes) -> dict[str, bytes]:
    """Hashes of every state section, recomputed from a /directory value; the app hash the
    value claims is `interface.app_hash_of(directory_section_hashes(value))`."""
    msg = _parse_value(value)
    hashes = {
        "meta": msg.meta_hash,
        "users": section_hash(msg.users_section),
        "models": section_hash(msg.models_section),
        "epochs": msg.epochs_hash,
    }
    assert tuple(sorted(hashes)) == tuple(sorted(SECTIONS))
    return hashes


def decode_directory(value: bytes) -> DirectorySnapshot:
    """Decode and sanity-check a /directory value (sorted, unique, ids bound to keys)."""
    msg = _parse_value(value)
    users_pb, models_pb = pb.UsersSection(), pb.ModelsSection()
    try:
        users_pb.ParseFromString(msg.users_section)
        models_pb.ParseFromString(msg.models_section)
    except (DecodeError, ValueError, RuntimeError) as exc:
        raise DirectoryFormatError(f"directory section does not decode: {exc}") from exc
    users = tuple(UserRecord.from_pb(u) for u in users_pb.users)
    models = tuple(ModelRecord.from_pb(m) for m in models_pb.models)
    _check_records(users, "user")
    _check_records(models, "model")
    _check_addresses_unique(users + models)
    return DirectorySnapshot(height=msg.height, users=users, models=models,
                     section_hashes=directory_section_hashes(value))


def decode_user(value: bytes) -> UserRecord:
    """The value of a /user/<id> query (unverified: only /directory values carry a proof)."""
    return _decode_entry(pb.UserEntry, UserRecord, value, "user")


def decode_model(value: bytes) -> ModelRecord:
    """The value of a /model/<id> query (unverified, as decode_user)."""
    return _decode_entry(pb.ModelEntry, ModelRecord, value, "model")


def _decode_entry(msg_cls, record_cls, value: bytes, what: str):
    if len(value) > WIRE.max_message_bytes:
        raise DirectoryFormatError(f"{what} entry larger than {WIRE.max_message_bytes} bytes")
    try:
        record = record_cls.from_pb(msg_cls.FromString(value))
    except (DecodeError, ValueError, RuntimeError) as exc:
        raise DirectoryFormatError(f"not a {what} entry: {exc}") from exc
    _check_records((record,), what)
    return record


def _check_addresses_unique(records) -> None:
    """One address, one node: nodes pin a peer's certificate by the address they dial, so a
    directory listing one address twice could make them pin the wrong node's certificate."""
    seen: set[str] = set()
    for r in records:
        if r.address in seen:
            raise DirectoryFormatError(f"address {r.address[:64]!r} is listed for two nodes")
        seen.add(r.address)


def _check_records(records, what: str) -> None:
    previous = b""
    for r in records:
        if len(r.node_id) != NODE_ID_BYTES or len(r.public_key) != PUBLIC_KEY_BYTES:
            raise DirectoryFormatError(f"{what} record with a malformed node id or key")
        if node_id_of(r.public_key) != r.node_id:
            raise DirectoryFormatError(f"{what} {r.node_id.hex()[:16]} is not bound to its public key")
        if r.node_id <= previous:
            raise DirectoryFormatError(f"{what} records are not sorted and unique by node id")
        previous = r.node_id
