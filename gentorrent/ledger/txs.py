"""Committee transactions: how a node registers itself, and how the app checks it did.

Every kind travels in the signed envelope of `signed_tx` (domain-separated Ed25519 over a
canonical body, a per-signer sequence against replay). Stateless checks (size, encoding,
signature, field formats) live here and in `epoch_txs`; stateful ones (sequence, already
registered) in the registry application (`verifier.abci.state`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Callable, Union

from gentorrent.config import MAX_CAPACITY, MIN_CAPACITY
from gentorrent.crypto.keys import PUBLIC_KEY_BYTES, Identity, node_id_of
from gentorrent.wire import gentorrent_pb2 as pb
from gentorrent.ledger import addresses, catalogue, epoch_txs
from gentorrent.ledger.signed_tx import (CODE_ADDRESS_TAKEN, CODE_ALREADY_REGISTERED,  # noqa: F401
                                         CODE_BAD_POW, CODE_BAD_SIGNATURE, CODE_BLOCK_FULL, CODE_INVALID_FIELD,
                                         CODE_MALFORMED, CODE_NOT_LISTED, CODE_NOT_REGISTERED, CODE_OK,
                                         CODE_OVERSIZE, CODE_PREFIX_FULL, CODE_REPLAY, CODE_UNAUTHORIZED,
                                         CODE_UNKNOWN_KIND, CODE_WRONG_CHAIN, TX_SIGNING_DOMAIN, TxError,
                                         VerifiedTxs, body, open_envelope, sign, tx_hash)

#: verification-epoch kinds (TxBody fields 20..26; rules in verifier.epochs.machine)
EPOCH_KINDS: tuple[str, ...] = tuple(epoch_txs.MESSAGES)
#: the committee itself (TxBody field 40; checks in gentorrent.ledger.committee_changes, rules in
#: verifier.abci.committee)
CHANGE_KINDS: tuple[str, ...] = ("change_committee",)
#: adds a model to the committee's catalogue (TxBody field 41; gentorrent.ledger.catalogue)
CATALOGUE_KINDS: tuple[str, ...] = ("catalogue_add",)
#: kinds only committee members may sign
COMMITTEE_KINDS: frozenset[str] = frozenset(EPOCH_KINDS + CHANGE_KINDS + CATALOGUE_KINDS)

# Every field of a record is bounded (a user record is at most 200 bytes encoded:
# tests/test_registry_rules.py). No certificate: peers pin a node by its Ed25519 key
# (gentorrent.crypto.tls), which the record holds anyway.
MAX_ADDRESS_CHARS = addresses.MAX_ADDRESS_CHARS
MAX_REGION_CHARS = 24
MAX_MODEL_CHARS = 96

_REGION_RE = re.compile(r"[a-z0-9][a-z0-9._-]*")
_MODEL_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/-]*")


@dataclass(frozen=True)
class UserInfo:
    address: str
    onion_key: bytes
    region: str
    pow_nonce: int = 0  # registrations: the proof of work for the signer's key


@dataclass(frozen=True)
class ModelInfo:
    address: str
    model: str
    capacity: int
    onion_key: bytes = b""  # empty: listed, but unreachable through the anonymous overlay
    weights_digest: str = ""  # empty: none given (the catalogue must not list the model then)
    pow_nonce: int = 0  # registrations: the proof of work for the signer's key


class Role(StrEnum):
    """Which registry a record belongs to (its table in the committee's state)."""

    USER = "user"
    MODEL = "model"


@dataclass(frozen=True)
class Registration:
    """register_user / update_user / register_model / update_model: a node's record, new or changed."""

    info: UserInfo | ModelInfo
    new: bool  # register_*: the node is not registered yet; update_*: it is

    @property
    def role(self) -> Role:
        return Role.USER if isinstance(self.info, UserInfo) else Role.MODEL


@dataclass(frozen=True)
class Deregistration:
    """deregister_user / deregister_model: the signer's record of `role` leaves the registry."""

    role: Role


@dataclass(frozen=True)
class LeaseRenewal:
    """renew_lease: every registration of the signer lasts one more lease."""


#: what a decoded transaction carries; epoch kinds: their checked pb message (epoch_txs.MESSAGES)
Payload = Union[Registration, Deregistration, LeaseRenewal, "pb.Message"]


@dataclass(frozen=True)
class Kind:
    """One transaction kind: its TxBody field and how its payload is read and checked (state
    decides the rest). The registry application dispatches on the payload's type."""

    name: str
    read: Callable[[Any, bytes], Payload]  # (the field's message, the signer's node id) -> checked payload
    committee: bool = False  # only committee members may sign it


def _read_user(new: bool) -> Callable[[Any, bytes], Registration]:
    def read(m, node_id: bytes) -> Registration:
        info = UserInfo(m.address, m.onion_key, m.region, m.pow_nonce)
        validate_user(info, node_id)
        return Registration(info, new)
    return read


def _read_model(new: bool) -> Callable[[Any, bytes], Registration]:
    def read(m, node_id: bytes) -> Registration:
        info = ModelInfo(m.address, m.model, m.capacity, m.onion_key, m.weights_digest, m.pow_nonce)
        validate_model(info, node_id)
        return Registration(info, new)
    return read


def _read_epoch(m, node_id: bytes):
    epoch_txs.validate(m)
    return m


def _read_catalogue_entry(m, node_id: bytes):
    catalogue.validate_entry(m)
    return m


#: every kind this version knows, by TxBody field name
KINDS: dict[str, Kind] = {k.name: k for k in (
    Kind("register_user", _read_user(new=True)),
    Kind("update_user", _read_user(new=False)),
    Kind("deregister_user", lambda m, node_id: Deregistration(Role.USER)),
    Kind("register_model", _read_model(new=True)),
    Kind("update_model", _read_model(new=False)),
    Kind("deregister_model", lambda m, node_id: Deregistration(Role.MODEL)),
    Kind("renew_lease", lambda m, node_id: LeaseRenewal()),
    *(Kind(name, _read_epoch, committee=True) for name in EPOCH_KINDS),
    # (a change's fields are checked by the app: committee_changes.validate)
    *(Kind(name, lambda m, node_id: m, committee=True) for name in CHANGE_KINDS),
    Kind("catalogue_add", _read_catalogue_entry, committee=True),
)}


@dataclass(frozen=True)
class Tx:
    """A decoded transaction whose encoding, signature and fields have been checked."""

    signer: bytes
    sequence: int
    kind: str
    payload: Payload
    raw: bytes

    @property
    def node_id(self) -> bytes:
        return node_id_of(self.signer)

    @property
    def committee_only(self) -> bool:
        return KINDS[self.kind].committee

    @property
    def hash(self) -> bytes:
        return tx_hash(self.raw)


# --------------------------------------------------------------------------- builders


def register_user(identity: Identity, address: str, onion_key: bytes, region: str, sequence: int, *,
                  chain_id: str, pow_nonce: int = 0) -> bytes:
    return _user_tx(identity, "register_user", UserInfo(address, onion_key, region, pow_nonce), sequence, chain_id)


def update_user(identity: Identity, address: str, onion_key: bytes, region: str, sequence: int, *,
                chain_id: str) -> bytes:
    return _user_tx(identity, "update_user", UserInfo(address, onion_key, region), sequence, chain_id)


def deregister_user(identity: Identity, sequence: int, *, chain_id: str) -> bytes:
    return sign(identity, body(identity, sequence, "deregister_user", pb.Deregistration(), chain_id))


def register_model(identity: Identity, address: str, model: str, capacity: int, sequence: int,
                   onion_key: bytes = b"", *, chain_id: str, pow_nonce: int = 0, weights_digest: str = "") -> bytes:
    info = ModelInfo(address, model, capacity, onion_key, weights_digest, pow_nonce)
    return _model_tx(identity, "register_model", info, sequence, chain_id)


def update_model(identity: Identity, address: str, model: str, capacity: int, sequence: int,
                 onion_key: bytes = b"", *, chain_id: str, weights_digest: str = "") -> bytes:
    info = ModelInfo(address, model, capacity, onion_key, weights_digest)
    return _model_tx(identity, "update_model", info, sequence, chain_id)


def catalogue_add(identity: Identity, entry: pb.CatalogueEntry, sequence: int, *, chain_id: str) -> bytes:
    """A committee member lists a model: its name, weights digest and engine options."""
    catalogue.validate_entry(entry)
    return sign(identity, body(identity, sequence, "catalogue_add", entry, chain_id))


def deregister_model(identity: Identity, sequence: int, *, chain_id: str) -> bytes:
    return sign(identity, body(identity, sequence, "deregister_model", pb.Deregistration(), chain_id))


def renew_lease(identity: Identity, sequence: int, *, chain_id: str) -> bytes:
    """Extend every registration of `identity` by one lease (a small tx: no record re-sent)."""
    return sign(identity, body(identity, sequence, "renew_lease", pb.LeaseRenewal(), chain_id))


def _user_tx(identity: Identity, kind: str, info: UserInfo, sequence: int, chain_id: str) -> bytes:
    validate_user(info, identity.node_id)  # fail at the client, not in the mempool
    msg = pb.UserRegistration(address=info.address, onion_key=info.onion_key, region=info.region,
                              pow_nonce=info.pow_nonce)
    return sign(identity, body(identity, sequence, kind, msg, chain_id))


def _model_tx(identity: Identity, kind: str, info: ModelInfo, sequence: int, chain_id: str) -> bytes:
    validate_model(info, identity.node_id)
    msg = pb.ModelRegistration(address=info.address, model=info.model, capacity=info.capacity,
                               onion_key=info.onion_key, weights_digest=info.weights_digest,
                               pow_nonce=info.pow_nonce)
    return sign(identity, body(identity, sequence, kind, msg, chain_id))


# --------------------------------------------------------------------------- decoding


def decode_tx(raw: bytes, chain_id: str, verified: VerifiedTxs | None = None) -> Tx:
    """Check everything that does not depend on state, for the chain `chain_id`; raise
    TxError with a stable code. A transaction `verified` holds passed all of it before."""
    if verified is not None:
        known = verified.get(tx_hash(raw))
        if known is not None:
            return known
    body = open_envelope(raw, chain_id).body
    name = body.WhichOneof("kind")
    kind = KINDS.get(name) if name is not None else None
    if kind is None:
        raise TxError(CODE_UNKNOWN_KIND, "transaction has no kind this version knows")
    payload = kind.read(getattr(body, name), node_id_of(body.signer))
    return Tx(signer=body.signer, sequence=body.sequence, kind=name, payload=payload, raw=bytes(raw))


# --------------------------------------------------------------------------- field checks


def validate_user(info: UserInfo, node_id: bytes) -> None:
    if info.address:  # none: a client-only user (others cannot dial it; it builds paths and asks, never relays)
        validate_address(info.address)
    validate_onion_key(info.onion_key)
    if not 0 < len(info.region) <= MAX_REGION_CHARS or not _REGION_RE.fullmatch(info.region):
        raise TxError(CODE_INVALID_FIELD, f"region must be 1..{MAX_REGION_CHARS} chars of [a-z0-9._-]")


def validate_model(info: ModelInfo, node_id: bytes) -> None:
    validate_address(info.address)
    if not 0 < len(info.model) <= MAX_MODEL_CHARS or not _MODEL_RE.fullmatch(info.model):
        raise TxError(CODE_INVALID_FIELD, f"model must be 1..{MAX_MODEL_CHARS} chars of [A-Za-z0-9._:/-]")
    if not MIN_CAPACITY <= info.capacity <= MAX_CAPACITY:
        raise TxError(CODE_INVALID_FIELD, f"capacity must be in {MIN_CAPACITY}..{MAX_CAPACITY}, got {info.capacity}")
    if info.onion_key:
        validate_onion_key(info.onion_key)
    if info.weights_digest:
        catalogue.validate_digest(info.weights_digest)


def validate_onion_key(onion_key: bytes) -> None:
    if len(onion_key) != PUBLIC_KEY_BYTES or onion_key == bytes(PUBLIC_KEY_BYTES):
        raise TxError(CODE_INVALID_FIELD, f"onion_key must be a non-zero {PUBLIC_KEY_BYTES}-byte X25519 key")


def validate_address(address: str) -> None:
    """IP:PORT in its one canonical form (gentorrent.ledger.addresses) that another node could
    dial: a name, a second spelling of an address, a wildcard (0.0.0.0, [::]), multicast or
    broadcast host is refused, since it would list a node nobody can reach, or one endpoint
    twice (a node listening on a wildcard address registers the address it is reached at:
    `--advertise`)."""
    try:
        canonical = addresses.canonical(address)
    except addresses.AddressError as exc:
        raise TxError(CODE_INVALID_FIELD, str(exc)) from exc
    if canonical != address:
        raise TxError(CODE_INVALID_FIELD, f"address {address[:64]!r} is not in canonical form: register "
                                          f"{canonical!r} (one address, one spelling)")


def check_listen(listen: str, advertise: str | None) -> None:
    """Refuse, before anything starts, a node that would register an address nobody can
    dial: listening on a wildcard host needs `advertise` (the address peers reach it at)."""
    if advertise:
        validate_address(canonical_address(advertise))
        return
    try:
        ip, _ = addresses.parse(listen.rpartition(":")[0] + ":1")
    except addresses.AddressError as exc:
        raise TxError(CODE_INVALID_FIELD, f"--listen {listen}: {exc}; give an IP address, or --advertise "
                                          "IP:PORT (the address other nodes reach this one at)") from exc
    reason = addresses.unroutable_reason(ip)
    if reason:
        raise TxError(CODE_INVALID_FIELD, f"listening on {listen} needs --advertise HOST:PORT, the address "
                                          f"other nodes reach this one at ({listen.rpartition(':')[0]}: {reason})")


def canonical_address(address: str) -> str:
    """`address` in canonical form, for a node to register (TxError saying why it has none)."""
    try:
        return addresses.canonical(address)
    except addresses.AddressError as exc:
        raise TxError(CODE_INVALID_FIELD, str(exc)) from exc


def advertised_address(listen: str, port: int, advertise: str | None) -> str:
    """The address a node registers, canonical: `advertise`, else the host it listens on and
    the port it got (`check_listen` first)."""
    check_listen(listen, advertise)
    return canonical_address(advertise or f"{listen.rpartition(':')[0]}:{port}")
