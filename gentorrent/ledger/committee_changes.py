"""Changing the committee through the chain: a change that more than 2/3 of its power approved.

A `CommitteeChange` (proto) adds a member (its card: name, key, power, address, TLS certificate,
audit key — what a genesis entry says), removes one, sets one's power, or rotates one's key (a
new card, the same power). Members approve it by signing its canonical bytes (domain tag,
chain id, the change without approvals); any member submits it in an ordinary committee
transaction (`change_committee`). The application applies it when the approvals of members
of the committee signing that block hold more than 2/3 of its power and its `number` is the
committee's change count + 1 (so each change applies once, in order, and an old one cannot be
replayed); consensus applies the resulting validator updates two heights later
(verifier/consensus/valsets.py). Operators pass a change around as a small JSON file
(`gt-verifier committee propose | approve | submit`).
"""

from __future__ import annotations

import base64
import binascii
import json

from cryptography import x509
from cryptography.x509.oid import NameOID

from gentorrent.crypto.keys import PUBLIC_KEY_BYTES, Identity, is_valid_signature, node_id_of
from gentorrent.ledger.genesis import MAX_VALIDATOR_POWER, GenesisError, GenesisValidator
from gentorrent.ledger.sections import encode
from gentorrent.ledger.signed_tx import CODE_INVALID_FIELD, CODE_MALFORMED, TxError, body, sign
from gentorrent.wire import gentorrent_pb2 as pb

CHANGE_DOMAIN = b"gt/committee-change/v1"
ACTIONS = ("add", "remove", "power", "rotate")
MAX_NAME_CHARS = 64
MAX_CERT_BYTES = 8 * 1024  # a member card's TLS certificate
MAX_CHANGE_FILE_BYTES = 64 * 1024


def card_of(v: GenesisValidator) -> pb.MemberCard:
    return pb.MemberCard(name=v.name, public_key=v.public_key, power=v.power, address=v.address,
                         tls_cert_pem=v.tls_cert_pem, audit_key=v.audit_key)


def validator_of(card: pb.MemberCard) -> GenesisValidator:
    return GenesisValidator(card.name, bytes(card.public_key), int(card.power), card.address,
                            bytes(card.tls_cert_pem), bytes(card.audit_key))


def sign_bytes(chain_id: str, change: pb.CommitteeChange) -> bytes:
    """What each approval signs: the change without its approvals, on this chain only."""
    bare = pb.CommitteeChange()
    bare.CopyFrom(change)
    del bare.approvals[:]
    return CHANGE_DOMAIN + len(chain_id.encode()).to_bytes(4, "big") + chain_id.encode() + encode(bare)


def approve(chain_id: str, change: pb.CommitteeChange, identity: Identity) -> pb.CommitteeChange:
    """The change with this member's approval added (one per key, kept sorted by key)."""
    out = pb.CommitteeChange()
    out.CopyFrom(change)
    others = [a for a in out.approvals if a.public_key != identity.public_key]
    mine = pb.Approval(public_key=identity.public_key, signature=identity.sign(sign_bytes(chain_id, change)))
    del out.approvals[:]
    out.approvals.extend(sorted(others + [mine], key=lambda a: a.public_key))
    return out


def approved_power(chain_id: str, change: pb.CommitteeChange, power: dict[bytes, int]) -> int:
    """The power of distinct members of `power` (key -> power) whose approval verifies."""
    message = sign_bytes(chain_id, change)
    seen: set[bytes] = set()
    total = 0
    for a in change.approvals:
        key = bytes(a.public_key)
        if key in seen or key not in power:
            continue
        if is_valid_signature(key, bytes(a.signature), message):
            seen.add(key)
            total += power[key]
    return total


def validate(change: pb.CommitteeChange) -> None:
    """Stateless checks (sizes, keys, cards); raise TxError."""
    action = change.WhichOneof("action")
    if action not in ACTIONS:
        raise TxError(CODE_MALFORMED, "a committee change names no action (add, remove, power or rotate)")
    if change.number < 1:
        raise TxError(CODE_INVALID_FIELD, "a committee change's number starts at 1")
    if len(change.approvals) > 1000:
        raise TxError(CODE_INVALID_FIELD, "more approvals than a committee has members")
    if action == "add":
        validate_card(change.add, with_power=True)
    elif action == "remove":
        _key(change.remove, "remove")
    elif action == "power":
        _key(change.power.public_key, "power.public_key")
        if not 0 < change.power.power <= MAX_VALIDATOR_POWER:
            raise TxError(CODE_INVALID_FIELD, f"a member's power must be in 1..{MAX_VALIDATOR_POWER}")
    else:
        _key(change.rotate.old_key, "rotate.old_key")
        validate_card(change.rotate.card, with_power=False)
        if change.rotate.card.public_key == change.rotate.old_key:
            raise TxError(CODE_INVALID_FIELD, "a rotation needs a new key")


def validate_card(card: pb.MemberCard, with_power: bool) -> None:
    from gentorrent.ledger.txs import validate_address, validate_onion_key

    _key(card.public_key, "card.public_key")
    if not 0 < len(card.name) <= MAX_NAME_CHARS or not card.name.isprintable():
        raise TxError(CODE_INVALID_FIELD, f"a member's name must be 1..{MAX_NAME_CHARS} printable characters")
    if with_power and not 0 < card.power <= MAX_VALIDATOR_POWER:
        raise TxError(CODE_INVALID_FIELD, f"a member's power must be in 1..{MAX_VALIDATOR_POWER}")
    validate_address(card.address)
    validate_member_certificate(bytes(card.tls_cert_pem), node_id_of(bytes(card.public_key)))
    if card.audit_key:
        validate_onion_key(bytes(card.audit_key))


def validate_member_certificate(cert_pem: bytes, node_id: bytes) -> None:
    """One PEM certificate whose subject CN is the member's node id: a verifier keeps a
    self-signed certificate that the genesis or its card pins (gentorrent.crypto.tls); registry
    nodes have none, peers pin them by their key."""
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
        raise TxError(CODE_INVALID_FIELD, "tls_cert_pem must name the member's node id as its subject CN")


def _key(key: bytes, what: str) -> None:
    if len(key) != PUBLIC_KEY_BYTES:
        raise TxError(CODE_INVALID_FIELD, f"{what} must be a {PUBLIC_KEY_BYTES}-byte Ed25519 key")


def change_tx(identity: Identity, change: pb.CommitteeChange, sequence: int, *, chain_id: str) -> bytes:
    """The committee transaction that submits an approved change (signed by a member)."""
    validate(change)
    return sign(identity, body(identity, sequence, "change_committee", change, chain_id))


def describe(change: pb.CommitteeChange) -> str:
    action = change.WhichOneof("action")
    if action == "add":
        return f"add {change.add.name} ({bytes(change.add.public_key).hex()[:16]}…, power {change.add.power})"
    if action == "remove":
        return f"remove {bytes(change.remove).hex()[:16]}…"
    if action == "power":
        return f"set the power of {bytes(change.power.public_key).hex()[:16]}… to {change.power.power}"
    return (f"rotate {bytes(change.rotate.old_key).hex()[:16]}… to {change.rotate.card.name} "
            f"({bytes(change.rotate.card.public_key).hex()[:16]}…)")


# --------------------------------------------------------------------------- the file operators pass around


def dumps(chain_id: str, change: pb.CommitteeChange) -> str:
    return json.dumps({"chain_id": chain_id, "change": base64.b64encode(encode(change)).decode(),
                       "summary": describe(change),
                       "approved_by": [bytes(a.public_key).hex() for a in change.approvals]}, indent=2) + "\n"


def loads(text: str) -> tuple[str, pb.CommitteeChange]:
    """(chain id, change) of a change file; GenesisError naming what is wrong."""
    if len(text) > MAX_CHANGE_FILE_BYTES:
        raise GenesisError(f"a change file is at most {MAX_CHANGE_FILE_BYTES} bytes")
    try:
        d = json.loads(text)
        chain_id, raw = d["chain_id"], base64.b64decode(d["change"], validate=True)
        change = pb.CommitteeChange.FromString(raw)
    except (ValueError, KeyError, TypeError, binascii.Error) as exc:
        raise GenesisError(f"not a committee change file: {exc}") from exc
    if not isinstance(chain_id, str) or encode(change) != raw:
        raise GenesisError("not a committee change file: malformed chain id or change")
    try:
        validate(change)
    except TxError as exc:
        raise GenesisError(f"the change is invalid: {exc}") from exc
    return chain_id, change
