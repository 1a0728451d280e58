"""The signed envelope every committee transaction travels in, whatever its kind.

A transaction is a `SignedTx` (proto/gentorrent.proto, "registry transactions"): the encoded
`TxBody` plus an Ed25519 signature by the body's `signer` over `TX_SIGNING_DOMAIN || body`.
The domain prefix keeps a transaction signature from ever being valid as a vote, a gossip
message or a reply receipt signed by the same identity key.

Why the body travels as bytes: the signature covers exactly the bytes on the wire, so no
re-encoding can break it, and `parse_canonical` refuses bodies that are not the deterministic
encoding of what they decode to, so one meaning has exactly one transaction (and one hash).

Replay protection is a per-signer sequence: a transaction is valid only if its sequence is
strictly greater than the last one the signer used (gaps are allowed, so clients may use e.g.
a millisecond clock). Every body names the chain it is meant for (`chain_id`, signed with
the rest), and `open_envelope` refuses it on any other chain: without it a transaction signed
for one committee would be valid on every other one whose registry holds the same keys (a
test network's registration replayed on the production chain, say). The kinds and their
payload checks are in `txs` (registry) and `epoch_txs` (verification epochs).
"""

from __future__ import annotations

import hashlib

from google.protobuf.message import DecodeError

from dataclasses import dataclass

from gentorrent.config import WIRE
from gentorrent.crypto.keys import (PUBLIC_KEY_BYTES, SIGNATURE_BYTES, Identity, KeyFormatError, SignatureError,
                                    verify_signature)
from gentorrent.wire import gentorrent_pb2 as pb

TX_SIGNING_DOMAIN = b"gentorrent/registry-tx/v1\x00"

# Stable result codes of CheckTx / FinalizeBlock (0 = ok, as in ABCI). Never renumber.
CODE_OK = 0
CODE_MALFORMED = 1  # not a SignedTx / TxBody, or a non-canonical encoding
CODE_OVERSIZE = 2  # larger than WIRE.max_tx_bytes
CODE_BAD_SIGNATURE = 3
CODE_REPLAY = 4  # sequence not above the signer's last one (duplicate or replayed tx)
CODE_INVALID_FIELD = 5  # a field is out of range or badly formatted
CODE_ALREADY_REGISTERED = 6
CODE_NOT_REGISTERED = 7
CODE_UNAUTHORIZED = 8  # a committee-only kind signed by a non-member
CODE_UNKNOWN_KIND = 9  # no kind set, or a kind this version does not know
CODE_WRONG_CHAIN = 10  # signed for another chain id
CODE_ADDRESS_TAKEN = 11  # another node holds the address (one address, one node)
CODE_NOT_LISTED = 12  # a registration's weights are not the catalogue's for its model name
CODE_PREFIX_FULL = 13  # the genesis' cap of relays in the address's /24 (IPv4) or /48 (IPv6) is reached
CODE_BAD_POW = 14  # a registration without a valid proof of work (gentorrent/ledger/pow.py)
CODE_BLOCK_FULL = 15  # the block carries the genesis' most registrations already: next block

MAX_SEQUENCE = 2**63 - 1  # fits SQLite's signed 64-bit integers


class TxError(ValueError):
    """A transaction is invalid; `code` is one of the stable CODE_* values."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code


class VerifiedTxs:
    """Transactions (by hash) whose signature, and proof of work if any, were checked already:
    what CheckTx checked, FinalizeBlock need not check again at full cost. Only a speed-up: an
    entry exists only for exact bytes that passed every stateless check on this node, so the
    result of a transaction never depends on what is cached; a Byzantine proposer's transactions
    that no mempool here saw are checked in full (and their number is bounded per block by the
    genesis' registrations_per_block, the expensive ones). Bounded: the oldest entries go first."""

    def __init__(self, limit: int = 200_000) -> None:
        self.limit = limit
        self._txs: dict[bytes, object] = {}
        self.hits = 0

    def get(self, digest: bytes):
        tx = self._txs.get(digest)
        if tx is not None:
            self.hits += 1
        return tx

    def add(self, digest: bytes, tx: object) -> None:
        if digest not in self._txs and len(self._txs) >= self.limit:
            del self._txs[next(iter(self._txs))]
        self._txs[digest] = tx


def tx_hash(raw: bytes) -> bytes:
    """The transaction hash as CometBFT computes it (SHA-256 of the raw tx)."""
    return hashlib.sha256(raw).digest()


def body(identity: Identity, sequence: int, kind: str, payload, chain_id: str) -> pb.TxBody:
    """The unsigned body of a `kind` transaction by `identity` carrying `payload`, valid on
    the chain `chain_id` only."""
    check_sequence(sequence)
    if not chain_id:
        raise TxError(CODE_INVALID_FIELD, "a transaction must name the chain id it is meant for")
    msg = pb.TxBody(signer=identity.public_key, sequence=sequence, chain_id=chain_id)
    getattr(msg, kind).CopyFrom(payload)
    return msg


def sign(identity: Identity, tx_body: pb.TxBody) -> bytes:
    """The raw SignedTx of `tx_body`; TxError if it is over the size limit."""
    body_bytes = tx_body.SerializeToString(deterministic=True)
    raw = pb.SignedTx(body=body_bytes, signature=identity.sign(TX_SIGNING_DOMAIN + body_bytes)).SerializeToString(
        deterministic=True)
    if len(raw) > WIRE.max_tx_bytes:
        raise TxError(CODE_OVERSIZE, f"transaction is {len(raw)} bytes, the limit is {WIRE.max_tx_bytes}")
    return raw


@dataclass(frozen=True)
class Envelope:
    """A transaction whose size, encoding, signature, sequence range and chain were checked."""

    body: pb.TxBody
    signature: bytes


def open_envelope(raw: bytes, chain_id: str) -> Envelope:
    """The checked envelope of `raw` on the chain `chain_id`; TxError (stable code) if not."""
    if len(raw) > WIRE.max_tx_bytes:
        raise TxError(CODE_OVERSIZE, f"transaction is {len(raw)} bytes, the limit is {WIRE.max_tx_bytes}")
    signed = parse_canonical(pb.SignedTx, raw, "SignedTx")
    tx_body = parse_canonical(pb.TxBody, signed.body, "TxBody")
    if len(tx_body.signer) != PUBLIC_KEY_BYTES:
        raise TxError(CODE_MALFORMED, f"signer must be a {PUBLIC_KEY_BYTES}-byte Ed25519 public key")
    if len(signed.signature) != SIGNATURE_BYTES:
        raise TxError(CODE_BAD_SIGNATURE, f"signature must be {SIGNATURE_BYTES} bytes")
    try:
        verify_signature(tx_body.signer, signed.signature, TX_SIGNING_DOMAIN + signed.body)
    except (SignatureError, KeyFormatError) as exc:
        raise TxError(CODE_BAD_SIGNATURE, f"bad signature: {exc}") from exc
    if tx_body.chain_id != chain_id:
        raise TxError(CODE_WRONG_CHAIN, f"transaction is for chain {tx_body.chain_id[:64]!r}, "
                                        f"this is chain {chain_id!r}")
    try:
        check_sequence(tx_body.sequence)
    except TxError as exc:
        raise TxError(CODE_INVALID_FIELD, str(exc)) from exc
    return Envelope(tx_body, signed.signature)


def parse_canonical(cls, data: bytes, name: str):
    """`data` as a `cls` message, refused unless it is that message's deterministic encoding."""
    msg = cls()
    try:
        msg.ParseFromString(data)
    except (DecodeError, ValueError, RuntimeError) as exc:
        raise TxError(CODE_MALFORMED, f"not a {name}: {exc}") from exc
    msg.DiscardUnknownFields()  # protobuf keeps and re-emits them; we refuse them
    if msg.SerializeToString(deterministic=True) != data:
        # unknown fields, duplicated fields, default values written out, or field reordering
        raise TxError(CODE_MALFORMED, f"{name} is not canonically encoded")
    return msg


def check_sequence(sequence: int) -> None:
    if not 0 < sequence <= MAX_SEQUENCE:
        raise TxError(CODE_INVALID_FIELD, f"sequence must be in 1..{MAX_SEQUENCE}")
