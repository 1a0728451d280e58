"""End-to-end sealing of queries and replies around S-IDA (ARCHITECTURE.md §3.3).

Query (user -> model node)::

    OverlayQuery --seal_to(model onion key)--> sealed --sida.split--> clove_1..clove_n
    clove_i --seal_to(model onion key, fresh ephemeral key per clove)--> envelope_i

The query is sealed before it is split (k colluding proxies still learn nothing), and each
clove is sealed again with its own ephemeral key, together with a random *group* value. That
second seal is what lets the model node group the cloves of one query although no field is
shared by them on the wire: the group value only exists inside the per-clove seals. The seal
also holds a random *delivery token* per clove, which the model node echoes in its Ack: a
relay that drops a clove and acknowledges it anyway cannot forge that, so the user learns which
path silently loses cloves (k of n would still arrive, and nothing else would show it).

Reply (model node -> user), per chunk `seq`::

    OverlayReply --AES-GCM(reply key)--> sealed --sida.split--> clove_1..clove_n
    clove_i --> tag(reply key, i, seq) | AES-GCM(key_i, pad(clove_i))

The reply key travels inside the query. The 16-byte tag is a keyed permutation of (i, seq),
distinct for every clove: the user, who knows which requests use the path a clove came back
on, inverts it to the route and chunk; an observer sees unrelated random strings.

Every inner plaintext is padded (0x80 then zeros) to a multiple of the pad bucket, so sizes
on the wire reveal little. Pure functions: randomness comes from an `rng` argument.
"""

from __future__ import annotations

import secrets as _secrets
from typing import Callable

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF, HKDFExpand
from google.protobuf.message import DecodeError

from gentorrent.config import OVERLAY, WIRE
from gentorrent.wire import gentorrent_pb2 as pb

Rng = Callable[[int], bytes]

KEY_BYTES = 32
GROUP_BYTES = 16
TAG_BYTES = 16
TOKEN_BYTES = 16  # a query clove's delivery token
#: how a model node's reply error starts when it refuses work because it is at capacity
BUSY_ERROR = "busy"
_NONCE0 = bytes(12)
_RAW = serialization.Encoding.Raw
_RAW_PUB = serialization.PublicFormat.Raw
QUERY_LABEL = b"gentorrent/query/v1"
CLOVE_LABEL = b"gentorrent/query-clove/v1"
REPLY_LABEL = b"gentorrent/reply/v1"


class SealError(ValueError):
    """A sealed blob does not open, or opens to something malformed."""


# --------------------------------------------------------------------------- padding


def pad(data: bytes, bucket: int = OVERLAY.pad_bucket_bytes) -> bytes:
    """ISO/IEC 7816-4 padding to a multiple of `bucket` (always at least one byte added)."""
    total = -(-(len(data) + 1) // bucket) * bucket
    return data + b"\x80" + bytes(total - len(data) - 1)


def unpad(data: bytes) -> bytes:
    stripped = data.rstrip(b"\x00")
    if not stripped or stripped[-1] != 0x80:
        raise SealError("bad padding")
    return stripped[:-1]


# --------------------------------------------------------------------------- sealed boxes


def _public_raw(key: X25519PublicKey | bytes) -> bytes:
    if isinstance(key, X25519PublicKey):
        return key.public_bytes(_RAW, _RAW_PUB)
    if isinstance(key, (bytes, bytearray)) and len(key) == KEY_BYTES:
        return bytes(key)
    raise SealError("an X25519 public key is 32 bytes")


def _box_key(shared: bytes, label: bytes, eph_pub: bytes, recipient_pub: bytes) -> bytes:
    return HKDF(hashes.SHA256(), KEY_BYTES, None, label + eph_pub + recipient_pub).derive(shared)


def seal_to(recipient: X25519PublicKey | bytes, plaintext: bytes, label: bytes, rng: Rng | None = None) -> bytes:
    """Anonymous sealed box: ephemeral X25519 + HKDF-SHA256 + AES-256-GCM; eph_pub | ct."""
    rng = rng or _secrets.token_bytes
    recipient_pub = _public_raw(recipient)
    eph = X25519PrivateKey.from_private_bytes(rng(KEY_BYTES))
    eph_pub = eph.public_key().public_bytes(_RAW, _RAW_PUB)
    try:
        shared = eph.exchange(X25519PublicKey.from_public_bytes(recipient_pub))
    except ValueError as exc:
        raise SealError("degenerate recipient key") from exc
    key = _box_key(shared, label, eph_pub, recipient_pub)
    return eph_pub + AESGCM(key).encrypt(_NONCE0, plaintext, label)


def open_sealed(private: X25519PrivateKey, blob: bytes, label: bytes) -> bytes:
    if len(blob) < KEY_BYTES + 16:
        raise SealError("sealed blob too short")
    eph_pub = bytes(blob[:KEY_BYTES])
    recipient_pub = private.public_key().public_bytes(_RAW, _RAW_PUB)
    try:
        shared = private.exchange(X25519PublicKey.from_public_bytes(eph_pub))
        key = _box_key(shared, label, eph_pub, recipient_pub)
        return AESGCM(key).decrypt(_NONCE0, bytes(blob[KEY_BYTES:]), label)
    except (ValueError, InvalidTag) as exc:
        raise SealError("sealed blob does not open with this key") from exc


def _parse(cls, data: bytes):
    try:
        return cls.FromString(data)
    except (DecodeError, ValueError) as exc:
        raise SealError(f"malformed {cls.__name__}") from exc


# --------------------------------------------------------------------------- query


def seal_query(model_onion_key: X25519PublicKey | bytes, query: pb.OverlayQuery, rng: Rng | None = None) -> bytes:
    return seal_to(model_onion_key, pad(query.SerializeToString()), QUERY_LABEL, rng)


def open_query(private: X25519PrivateKey, sealed: bytes, max_routes: int = OVERLAY.max_routes) -> pb.OverlayQuery:
    """The query inside `sealed`, validated: routes, reply key and k are sane."""
    query = _parse(pb.OverlayQuery, unpad(open_sealed(private, sealed, QUERY_LABEL)))
    n = len(query.routes)
    if not 1 <= n <= max_routes:
        raise SealError(f"a query names 1..{max_routes} reply routes, got {n}")
    if not 1 <= query.k <= n:
        raise SealError(f"reply k={query.k} out of range for {n} routes")
    if len(query.reply_key) != KEY_BYTES:
        raise SealError("reply key must be 32 bytes")
    if any(not r.proxy_address or len(r.link_id) != 16 for r in query.routes):
        raise SealError("malformed reply route")
    if len(query.request.prompt.encode()) + sum(len(m.content.encode()) for m in query.request.messages) > WIRE.max_prompt_bytes:
        raise SealError("prompt too large")
    return query


def seal_clove(model_onion_key: X25519PublicKey | bytes, group: bytes, clove: bytes, token: bytes = b"",
               rng: Rng | None = None) -> bytes:
    """One query clove sealed to the model node, with the delivery token it will echo back."""
    inner = pb.QueryClove(group=group, clove=clove, delivery_token=token).SerializeToString()
    return seal_to(model_onion_key, pad(inner), CLOVE_LABEL, rng)


def open_clove(private: X25519PrivateKey, envelope: bytes) -> tuple[bytes, bytes, bytes]:
    """(group, clove, delivery token) of a sealed query clove."""
    inner = _parse(pb.QueryClove, unpad(open_sealed(private, envelope, CLOVE_LABEL)))
    if len(inner.group) != GROUP_BYTES or not inner.clove or len(inner.delivery_token) not in (0, TOKEN_BYTES):
        raise SealError("malformed query clove")
    return inner.group, inner.clove, inner.delivery_token


# --------------------------------------------------------------------------- reply


def _reply_subkey(reply_key: bytes, what: bytes) -> bytes:
    return HKDFExpand(hashes.SHA256(), KEY_BYTES, REPLY_LABEL + what).derive(reply_key)


def _seq_nonce(seq: int) -> bytes:
    return seq.to_bytes(12, "big")


_TAG_MAGIC = b"GTrt"


def reply_tag_key(reply_key: bytes) -> bytes:
    return _reply_subkey(reply_key, b"tag")


def reply_tag(reply_key: bytes, index: int, seq: int, tag_key: bytes | None = None) -> bytes:
    """What marks reply clove `index` of chunk `seq`: one AES block (a PRP) under a key
    derived from the reply key, so the tags of one message look unrelated to anyone else,
    while the user inverts a tag to (index, seq) without precomputing any table."""
    block = _TAG_MAGIC + index.to_bytes(2, "big") + seq.to_bytes(8, "big") + bytes(2)
    ctx = Cipher(algorithms.AES(tag_key or reply_tag_key(reply_key)), modes.ECB()).encryptor()
    return ctx.update(block) + ctx.finalize()


class TagReader:
    """Inverts the reply tags of one request; keeps one AES context (ECB is stateless per block)."""

    def __init__(self, reply_key: bytes) -> None:
        self._ecb = Cipher(algorithms.AES(reply_tag_key(reply_key)), modes.ECB()).decryptor()

    def read(self, tag: bytes) -> tuple[int, int] | None:
        """(index, seq) if `tag` belongs to this request, else None (48 bits of redundancy)."""
        if len(tag) != TAG_BYTES:
            return None
        block = self._ecb.update(bytes(tag))
        if block[:4] != _TAG_MAGIC or block[14:] != bytes(2):
            return None
        return int.from_bytes(block[4:6], "big"), int.from_bytes(block[6:14], "big")


def seal_reply(reply_key: bytes, reply: pb.OverlayReply) -> bytes:
    key = _reply_subkey(reply_key, b"message")
    return AESGCM(key).encrypt(_seq_nonce(reply.seq), pad(reply.SerializeToString()), None)


def open_reply(reply_key: bytes, seq: int, sealed: bytes) -> pb.OverlayReply:
    try:
        plain = AESGCM(_reply_subkey(reply_key, b"message")).decrypt(_seq_nonce(seq), sealed, None)
    except (InvalidTag, ValueError) as exc:
        raise SealError("reply does not open with the reply key") from exc
    reply = _parse(pb.OverlayReply, unpad(plain))
    if reply.seq != seq:
        raise SealError("reply sequence number does not match its tag")
    return reply


def seal_reply_clove(reply_key: bytes, index: int, seq: int, clove: bytes) -> bytes:
    key = _reply_subkey(reply_key, b"clove" + index.to_bytes(2, "big"))
    return reply_tag(reply_key, index, seq) + AESGCM(key).encrypt(_seq_nonce(seq), pad(clove), None)


def open_reply_clove(reply_key: bytes, index: int, seq: int, blob: bytes) -> bytes:
    key = _reply_subkey(reply_key, b"clove" + index.to_bytes(2, "big"))
    try:
        return unpad(AESGCM(key).decrypt(_seq_nonce(seq), bytes(blob[TAG_BYTES:]), None))
    except (InvalidTag, ValueError) as exc:
        raise SealError("reply clove does not open") from exc
