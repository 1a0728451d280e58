"""The layout of the replicated state: its records, their keys in the registry tree, the app hash.

The state has three parts (ARCHITECTURE.md §3.1): the meta section (chain id, height, time,
validators, the chain's parameters, the committee's changes and its model catalogue; small), the epochs section (verification epochs, owned by
the epoch rules) and the registry tree (gentorrent.ledger.authtree), one Merkle treap that
holds every record under a key saying what it is:

    U || node id                     a user record (a relay)
    M || node id                     a model record, with its standing
    R || tag(region) || node id      the same user record, in its region's relay index
    G || tag(model)  || node id      the same model record, in its model group's roster
    A || public key                  an account: the signer's last sequence
    C || model name                  a model's serving counts: how many nodes serve it, how many
                                     trusted (the models the committee LISTS, with their weights'
                                     digests, are the meta section's catalogue)

tag(name) is 16 bytes of a domain-separated SHA-256 of the name, so a region's relays and a
group's roster are each one contiguous key range: a light client can check that a roster is
complete and draw relays by index from a range. The app hash is SHA-256 over a domain, the
meta and epochs section hashes and the tree's root, so any answer about a record is checked
with a proof of its tree path plus two hashes.

This module is shared by the app (encoding) and the light client (decoding) and is pure.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Iterable

from google.protobuf.message import DecodeError

from gentorrent.config import WIRE
from gentorrent.crypto.keys import NODE_ID_BYTES, PUBLIC_KEY_BYTES, node_id_of
from gentorrent.ledger import authtree
from gentorrent.wire import gentorrent_pb2 as pb

HASH_BYTES = 32
APP_HASH_DOMAIN = b"gentorrent/app-hash/v2\x00"
_TAG_DOMAIN = b"gentorrent/registry-group/v1\x00"
TAG_BYTES = 16

#: the parts of the replicated state, in app-hash order
SECTIONS: tuple[str, ...] = ("meta", "epochs", "registry")

USER, MODEL, RELAY, GROUP, ACCOUNT, CATALOG = b"U", b"M", b"R", b"G", b"A", b"C"


def app_hash_of(section_hashes: dict[str, bytes]) -> bytes:
    """The app hash committed for a state whose parts hash to `section_hashes` (the registry
    part by its tree root): the ABCI contract, verifier/abci/interface.py."""
    missing = [s for s in SECTIONS if s not in section_hashes]
    if missing:
        raise ValueError(f"missing section hashes: {missing}")
    return hashlib.sha256(APP_HASH_DOMAIN + b"".join(section_hashes[s] for s in SECTIONS)).digest()


def group_tag(name: str) -> bytes:
    return hashlib.sha256(_TAG_DOMAIN + name.encode()).digest()[:TAG_BYTES]


def user_key(node_id: bytes) -> bytes:
    return USER + node_id


def model_key(node_id: bytes) -> bytes:
    return MODEL + node_id


def relay_key(region: str, node_id: bytes) -> bytes:
    return RELAY + group_tag(region) + node_id


def group_key(model: str, node_id: bytes) -> bytes:
    return GROUP + group_tag(model) + node_id


def account_key(public_key: bytes) -> bytes:
    return ACCOUNT + public_key


def catalog_key(model: str) -> bytes:
    return CATALOG + model.encode()


def prefix_range(prefix: bytes) -> tuple[bytes, bytes]:
    """[lo, hi) of every key that starts with `prefix` (keys are at most 255 bytes)."""
    return prefix, prefix + b"\xff" * (authtree.MAX_KEY_BYTES + 1 - len(prefix))


def relay_range(region: str) -> tuple[bytes, bytes]:
    return prefix_range(RELAY + group_tag(region))


def group_range(model: str) -> tuple[bytes, bytes]:
    return prefix_range(GROUP + group_tag(model))


class DirectoryFormatError(ValueError):
    """A registry record or answer is malformed (and must not be trusted for anything)."""


# --------------------------------------------------------------------------- records


@dataclass(frozen=True)
class UserRecord:
    """A registered user node (a relay for others): the one record type for it everywhere."""

    node_id: bytes
    public_key: bytes  # Ed25519
    address: str
    onion_key: bytes  # X25519 public
    region: str = "default"
    registered_height: int = 0
    updated_height: int = 0  # the last height at which anything in the record changed

    @property
    def node_id_hex(self) -> str:
        return self.node_id.hex()

    @property
    def relays(self) -> bool:
        """False for a client-only user: it registered no address, since the committee could not
        dial it back (behind NAT); it builds paths and asks, and is never chosen as a hop."""
        return bool(self.address)

    def to_pb(self) -> pb.UserEntry:
        return pb.UserEntry(node_id=self.node_id, public_key=self.public_key, address=self.address,
                            onion_key=self.onion_key, region=self.region,
                            registered_height=self.registered_height, updated_height=self.updated_height)

    @classmethod
    def from_pb(cls, m: pb.UserEntry) -> "UserRecord":
        return cls(node_id=m.node_id, public_key=m.public_key, address=m.address, onion_key=m.onion_key,
                   region=m.region, registered_height=m.registered_height,
                   updated_height=m.updated_height)


@dataclass(frozen=True)
class ModelRecord:
    """A registered model node with its standing: the one record type for it everywhere."""

    node_id: bytes
    public_key: bytes
    address: str
    model: str
    onion_key: bytes  # X25519 public; queries are sealed to it
    capacity: int = 1
    reputation: float = 1.0
    trusted: bool = True
    registered_height: int = 0
    updated_height: int = 0  # the last height at which anything in the record changed (standing too)
    weights_digest: str = ""  # the digest of the weights it registered (gentorrent.ledger.catalogue)

    @property
    def node_id_hex(self) -> str:
        return self.node_id.hex()

    def to_pb(self) -> pb.ModelEntry:
        return pb.ModelEntry(node_id=self.node_id, public_key=self.public_key, address=self.address,
                             model=self.model, capacity=self.capacity,
                             reputation=self.reputation, trusted=self.trusted,
                             registered_height=self.registered_height, updated_height=self.updated_height,
                             onion_key=self.onion_key, weights_digest=self.weights_digest)

    @classmethod
    def from_pb(cls, m: pb.ModelEntry) -> "ModelRecord":
        return cls(node_id=m.node_id, public_key=m.public_key, address=m.address, model=m.model,
                   onion_key=m.onion_key, capacity=m.capacity,
                   reputation=m.reputation, trusted=m.trusted, registered_height=m.registered_height,
                   updated_height=m.updated_height, weights_digest=m.weights_digest)


@dataclass(frozen=True)
class Account:
    """A signer's account: the sequence its next transaction must exceed, and the block time the
    lease of its registrations ends (0: none). A renewal changes only this."""

    public_key: bytes
    last_sequence: int = 0
    lease_expires_ms: int = 0

    def to_pb(self) -> pb.AccountEntry:
        return pb.AccountEntry(public_key=self.public_key, last_sequence=self.last_sequence,
                               lease_expires_ms=self.lease_expires_ms)

    @classmethod
    def from_pb(cls, m: pb.AccountEntry) -> "Account":
        return cls(m.public_key, m.last_sequence, m.lease_expires_ms)


def encode(msg) -> bytes:
    return msg.SerializeToString(deterministic=True)


def section_hash(encoded: bytes) -> bytes:
    return hashlib.sha256(encoded).digest()


def encode_meta(chain_id: str, height: int, time_ms: int, validators: Iterable[tuple[bytes, int]],
                lease_ms: int = 0, params: bytes = b"", committee=None,
                catalogue: Iterable[pb.CatalogueEntry] = ()) -> bytes:
    return encode(meta_section(chain_id, height, time_ms, validators, lease_ms, params, committee, catalogue))


def meta_section(chain_id: str, height: int, time_ms: int, validators: Iterable[tuple[bytes, int]],
                 lease_ms: int = 0, params: bytes = b"", committee=None,
                 catalogue: Iterable[pb.CatalogueEntry] = ()) -> pb.MetaSection:
    """The meta section: what it hashes is what the store keeps. `params`: the chain's parameters
    (gentorrent.ledger.chain_params.ChainParams.encode, the registry's rules among them);
    `committee`: the app's CommitteeBook (cards, pending changes, removals: its `fill`);
    `catalogue`: the models the committee lists (gentorrent.ledger.catalogue)."""
    meta = pb.MetaSection(chain_id=chain_id, height=height, time_ms=time_ms,
                          validators=[pb.ValidatorEntry(public_key=k, power=p) for k, p in validators],
                          lease_ms=lease_ms, params=params, catalogue=list(catalogue))
    return committee.fill(meta) if committee is not None else meta


def encode_epochs(epochs: pb.EpochsSection) -> bytes:
    return encode(epochs)


def encode_catalog(nodes: int, trusted: int) -> bytes:
    return encode(pb.CatalogEntry(nodes=nodes, trusted=trusted))


# --------------------------------------------------------------------------- a verifier's own reads

#: the query of every model record a verifier's own epochs, audit desk and dashboard read from its
#: own committed state; never answered to the network (verifier.consensus.node refuses /local/)
LOCAL_MODELS = "/local/models"
LOCAL_USERS = "/local/users"


def encode_models(models: Iterable[ModelRecord]) -> bytes:
    return encode(pb.ModelsSection(models=[m.to_pb() for m in models]))


def encode_users(users: Iterable[UserRecord]) -> bytes:
    return encode(pb.UsersSection(users=[u.to_pb() for u in users]))


def decode_users(value: bytes) -> tuple[UserRecord, ...]:
    """The value of LOCAL_USERS (from this verifier's own app: no proof needed)."""
    try:
        return tuple(UserRecord.from_pb(u) for u in pb.UsersSection.FromString(value).users)
    except (DecodeError, ValueError, RuntimeError) as exc:
        raise DirectoryFormatError(f"not a users list: {exc}") from exc


def decode_models(value: bytes) -> tuple[ModelRecord, ...]:
    """The value of LOCAL_MODELS (from this verifier's own app: no proof needed)."""
    try:
        return tuple(ModelRecord.from_pb(m) for m in pb.ModelsSection.FromString(value).models)
    except (DecodeError, ValueError, RuntimeError) as exc:
        raise DirectoryFormatError(f"not a models list: {exc}") from exc


def decode_user(value: bytes) -> UserRecord:
    """A user record as the registry tree holds it (unverified unless its proof was checked)."""
    return _decode_entry(pb.UserEntry, UserRecord, value, "user")


def decode_model(value: bytes) -> ModelRecord:
    """A model record as the registry tree holds it (unverified, as decode_user)."""
    return _decode_entry(pb.ModelEntry, ModelRecord, value, "model")


def _decode_entry(msg_cls, record_cls, value: bytes | None, what: str):
    if value is None:
        raise DirectoryFormatError(f"the proof shows a {what} record by its hash only")
    if len(value) > WIRE.max_message_bytes:
        raise DirectoryFormatError(f"{what} entry larger than {WIRE.max_message_bytes} bytes")
    try:
        record = record_cls.from_pb(msg_cls.FromString(value))
    except (DecodeError, ValueError, RuntimeError) as exc:
        raise DirectoryFormatError(f"not a {what} entry: {exc}") from exc
    _check_records((record,), what)
    return record


def _check_records(records, what: str) -> None:
    for r in records:
        if len(r.node_id) != NODE_ID_BYTES or len(r.public_key) != PUBLIC_KEY_BYTES:
            raise DirectoryFormatError(f"{what} record with a malformed node id or key")
        if node_id_of(r.public_key) != r.node_id:
            raise DirectoryFormatError(f"{what} {r.node_id.hex()[:16]} is not bound to its public key")
