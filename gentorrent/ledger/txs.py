"""Committee transactions: how a node registers itself, and how the app checks it did.

Every kind travels in the signed envelope of `signed_tx` (domain-separated Ed25519 over a
canonical body, a per-signer sequence against replay). Stateless checks (size, encoding,
signature, field formats) live here and in `epoch_txs`; stateful ones (sequence, already
registered) in the registry application (`verifier.abci.state`).
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Union

from cryptography import x509
from cryptography.x509.oid import NameOID

from gentorrent.config import MODEL_NODE
from gentorrent.crypto.keys import PUBLIC_KEY_BYTES, Identity, node_id_of
from gentorrent.wire import gentorrent_pb2 as pb
from gentorrent.ledger import epoch_txs
from gentorrent.ledger.signed_tx import (CODE_ADDRESS_TAKEN, CODE_ALREADY_REGISTERED,  # noqa: F401
                                         CODE_BAD_SIGNATURE, CODE_INVALID_FIELD, CODE_MALFORMED,
                                         CODE_NOT_REGISTERED, CODE_OK, CODE_OVERSIZE, CODE_REPLAY,
                                         CODE_UNAUTHORIZED, CODE_UNKNOWN_KIND, CODE_WRONG_CHAIN,
                                         TX_SIGNING_DOMAIN, TxError, body, open_envelope, sign, tx_hash)

USER_KINDS = ("register_user", "update_user", "deregister_user")
MODEL_KINDS = ("register_model", "update_model", "deregister_model")
#: renews every registration of its signer (user and model records alike) by one lease
LEASE_KINDS = ("renew_lease",)
KINDS = USER_KINDS + MODEL_KINDS + LEASE_KINDS
#: verification-epoch kinds (TxBody fields 20..26; rules in verifier.epochs.rules)
EPOCH_KINDS = ("epoch_member_keys", "epoch_vrf_proof", "epoch_plan", "epoch_replies", "epoch_attestation",
               "epoch_probe_report", "epoch_audit_report")
#: kinds only committee members may sign
COMMITTEE_KINDS: frozenset[str] = frozenset(EPOCH_KINDS)

MAX_ADDRESS_CHARS = 255
MAX_REGION_CHARS = 32
MAX_MODEL_CHARS = 128
MAX_CERT_BYTES = 8 * 1024

_REGION_RE = re.compile(r"[a-z0-9][a-z0-9._-]*")
_MODEL_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/-]*")
_HOST_RE = re.compile(r"[A-Za-z0-9._-]+|\[[0-9A-Fa-f:.]+\]")


@dataclass(frozen=True)
class UserInfo:
    address: str
    onion_key: bytes
    tls_cert_pem: bytes
    region: str


@dataclass(frozen=True)
class ModelInfo:
    address: str
    model: str
    capacity: int
    tls_cert_pem: bytes
    onion_key: bytes = b""  # empty: listed, but unreachable through the anonymous overlay


Payload = Union[UserInfo, ModelInfo, None, "pb.Message"]  # epoch kinds: their checked pb message


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
    def hash(self) -> bytes:
        return tx_hash(self.raw)


# --------------------------------------------------------------------------- builders


def register_user(identity: Identity, address: str, onion_key: bytes, tls_cert_pem: bytes, region: str,
                  sequence: int, *, chain_id: str) -> bytes:
    return _user_tx(identity, "register_user", UserInfo(address, onion_key, tls_cert_pem, region), sequence,
                    chain_id)


def update_user(identity: Identity, address: str, onion_key: bytes, tls_cert_pem: bytes, region: str,
                sequence: int, *, chain_id: str) -> bytes:
    return _user_tx(identity, "update_user", UserInfo(address, onion_key, tls_cert_pem, region), sequence,
                    chain_id)


def deregister_user(identity: Identity, sequence: int, *, chain_id: str) -> bytes:
    return sign(identity, body(identity, sequence, "deregister_user", pb.Deregistration(), chain_id))


def register_model(identity: Identity, address: str, model: str, capacity: int, tls_cert_pem: bytes,
                   sequence: int, onion_key: bytes = b"", *, chain_id: str) -> bytes:
    info = ModelInfo(address, model, capacity, tls_cert_pem, onion_key)
    return _model_tx(identity, "register_model", info, sequence, chain_id)


def update_model(identity: Identity, address: str, model: str, capacity: int, tls_cert_pem: bytes,
                 sequence: int, onion_key: bytes = b"", *, chain_id: str) -> bytes:
    info = ModelInfo(address, model, capacity, tls_cert_pem, onion_key)
    return _model_tx(identity, "update_model", info, sequence, chain_id)


def deregister_model(identity: Identity, sequence: int, *, chain_id: str) -> bytes:
    return sign(identity, body(identity, sequence, "deregister_model", pb.Deregistration(), chain_id))


def renew_lease(identity: Identity, sequence: int, *, chain_id: str) -> bytes:
    """Extend every registration of `identity` by one lease (a small tx: no record re-sent)."""
    return sign(identity, body(identity, sequence, "renew_lease", pb.LeaseRenewal(), chain_id))


def _user_tx(identity: Identity, kind: str, info: UserInfo, sequence: int, chain_id: str) -> bytes:
    validate_user(info, identity.node_id)  # fail at the client, not in the mempool
    msg = pb.UserRegistration(address=info.address, onion_key=info.onion_key, tls_cert_pem=info.tls_cert_pem,
                              region=info.region)
    return sign(identity, body(identity, sequence, kind, msg, chain_id))


def _model_tx(identity: Identity, kind: str, info: ModelInfo, sequence: int, chain_id: str) -> bytes:
    validate_model(info, identity.node_id)
    msg = pb.ModelRegistration(address=info.address, model=info.model, capacity=info.capacity,
                               tls_cert_pem=info.tls_cert_pem, onion_key=info.onion_key)
    return sign(identity, body(identity, sequence, kind, msg, chain_id))


# --------------------------------------------------------------------------- decoding


def decode_tx(raw: bytes, chain_id: str) -> Tx:
    """Check everything that does not depend on state, for the chain `chain_id`; raise
    TxError with a stable code."""
    body = open_envelope(raw, chain_id).body
    kind = body.WhichOneof("kind")
    if kind is None or (kind not in KINDS and kind not in EPOCH_KINDS):
        raise TxError(CODE_UNKNOWN_KIND, "transaction has no kind this version knows")
    node_id = node_id_of(body.signer)
    payload: Payload = None
    if kind in ("register_user", "update_user"):
        m = getattr(body, kind)
        payload = UserInfo(m.address, m.onion_key, m.tls_cert_pem, m.region)
        validate_user(payload, node_id)
    elif kind in ("register_model", "update_model"):
        m = getattr(body, kind)
        payload = ModelInfo(m.address, m.model, m.capacity, m.tls_cert_pem, m.onion_key)
        validate_model(payload, node_id)
    elif kind in EPOCH_KINDS:
        payload = getattr(body, kind)
        epoch_txs.validate(kind, payload)
    return Tx(signer=body.signer, sequence=body.sequence, kind=kind, payload=payload, raw=bytes(raw))


# --------------------------------------------------------------------------- field checks


def validate_user(info: UserInfo, node_id: bytes) -> None:
    validate_address(info.address)
    validate_onion_key(info.onion_key)
    if not 0 < len(info.region) <= MAX_REGION_CHARS or not _REGION_RE.fullmatch(info.region):
        raise TxError(CODE_INVALID_FIELD, f"region must be 1..{MAX_REGION_CHARS} chars of [a-z0-9._-]")
    validate_certificate(info.tls_cert_pem, node_id)


def validate_model(info: ModelInfo, node_id: bytes) -> None:
    validate_address(info.address)
    if not 0 < len(info.model) <= MAX_MODEL_CHARS or not _MODEL_RE.fullmatch(info.model):
        raise TxError(CODE_INVALID_FIELD, f"model must be 1..{MAX_MODEL_CHARS} chars of [A-Za-z0-9._:/-]")
    if not MODEL_NODE.min_capacity <= info.capacity <= MODEL_NODE.max_capacity:
        raise TxError(CODE_INVALID_FIELD,
                      f"capacity must be in {MODEL_NODE.min_capacity}..{MODEL_NODE.max_capacity}, got {info.capacity}")
    if info.onion_key:
        validate_onion_key(info.onion_key)
    validate_certificate(info.tls_cert_pem, node_id)


def validate_onion_key(onion_key: bytes) -> None:
    if len(onion_key) != PUBLIC_KEY_BYTES or onion_key == bytes(PUBLIC_KEY_BYTES):
        raise TxError(CODE_INVALID_FIELD, f"onion_key must be a non-zero {PUBLIC_KEY_BYTES}-byte X25519 key")


def validate_address(address: str) -> None:
    """host:port with a DNS name, IPv4 or [IPv6] host and a port in 1..65535, that another
    node could dial: a wildcard (0.0.0.0, [::]), multicast or broadcast host is refused, since
    registering it would list a node nobody can reach (a node listening on a wildcard address
    registers the address it is reached at: `--advertise`)."""
    host, sep, port = address.rpartition(":")
    ok = (0 < len(address) <= MAX_ADDRESS_CHARS and sep and _HOST_RE.fullmatch(host) is not None
          and port.isascii() and port.isdigit() and not port.startswith("0") and 0 < int(port) < 65536)
    if not ok:
        raise TxError(CODE_INVALID_FIELD, f"address must be host:port, got {address[:64]!r}")
    reason = unroutable_reason(host)
    if reason:
        raise TxError(CODE_INVALID_FIELD, f"address {address[:64]!r} cannot be dialled by other nodes: {reason}")


def unroutable_reason(host: str) -> str:
    """Why no other node could dial `host` (an IP literal or a DNS name), or "" if it could."""
    try:
        ip = ipaddress.ip_address(host[1:-1] if host.startswith("[") else host)
    except ValueError:
        return "" if host.strip(".") else "an empty host name"
    if ip.is_unspecified:
        return "it is a wildcard address (listen there, but register the address peers reach)"
    if ip.is_multicast:
        return "it is a multicast address"
    if ip.version == 4 and (ip == ipaddress.IPv4Address("255.255.255.255") or ip in _THIS_NETWORK):
        return "it is a broadcast or 'this network' address"
    return ""


_THIS_NETWORK = ipaddress.IPv4Network("0.0.0.0/8")


def check_listen(listen: str, advertise: str | None) -> None:
    """Refuse, before anything starts, a node that would register an address nobody can
    dial: listening on a wildcard host needs `advertise` (the address peers reach it at)."""
    if advertise:
        validate_address(advertise)
        return
    reason = unroutable_reason(listen.rpartition(":")[0])
    if reason:
        raise TxError(CODE_INVALID_FIELD, f"listening on {listen} needs --advertise HOST:PORT, the address "
                                          f"other nodes reach this one at ({listen.rpartition(':')[0]}: {reason})")


def advertised_address(listen: str, port: int, advertise: str | None) -> str:
    """The address a node registers: `advertise`, else the host it listens on and the port it
    got (`check_listen` first)."""
    check_listen(listen, advertise)
    return advertise or f"{listen.rpartition(':')[0]}:{port}"


def validate_certificate(cert_pem: bytes, node_id: bytes) -> None:
    """One PEM certificate whose subject CN is the signer's node id (gentorrent.crypto.tls)."""
    if not 0 < len(cert_pem) <= MAX_CERT_BYTES:
        raise TxError(CODE_INVALID_FIELD, f"tls_cert_pem must be 1..{MAX_CERT_BYTES} bytes")
    if cert_pem.count(b"-----BEGIN") != 1:
        raise TxError(CODE_INVALID_FIELD, "tls_cert_pem must hold exactly one PEM certificate")
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
        names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    except Exception as exc:  # noqa: BLE001 - attacker-chosen DER: any parser failure is a refusal,
        # never an exception escaping FinalizeBlock on every node at once
        raise TxError(CODE_INVALID_FIELD, f"tls_cert_pem is not a PEM certificate: {exc}") from exc
    if len(names) != 1 or names[0].value != node_id.hex():
        raise TxError(CODE_INVALID_FIELD, "tls_cert_pem must name the signer's node id as its subject CN")
