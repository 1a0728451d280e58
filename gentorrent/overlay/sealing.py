"""End-to-end sealing of queries and replies around S-IDA (ARCHITECTURE.md §3.3).

Query (user -> model node)
--------------------------
The OverlayQuery is padded to its size class and split by S-IDA (AES-GCM under a fresh key,
the key Shamir-shared, the ciphertext dispersed) into cloves c_1..c_n. Each clove then goes
into an envelope only the model node opens::

    envelope_i = t_i (16) | e_i (32) | box_i (48) | AES-GCM(K_i, QueryClove{c_i, token_i}, aad = t_i)

with a fresh 32-byte *ask secret* S per attempt, t_i = PRF(S, "tag", i), K_i = PRF(S, "key", i),
e_i a fresh ephemeral X25519 key and box_i = AES-GCM(HKDF(X25519(e_i, model key)), S | n | k).

Why this shape (public-key work, and what stays unlinkable):

* The model node needs S once per ask. It opens the box of whichever clove comes first (one
  X25519), then knows t_1..t_n and finds every later clove of the ask by its tag in a table:
  one public-key operation per ask instead of one per clove plus one for the query.
* The user still makes one ephemeral key per clove (n keys: 2n X25519, against 2n + 2
  before; the separate seal of the whole query is gone, since every clove is already sealed
  to the model node and S-IDA already encrypts the query).
* Nothing on the wire is shared by the cloves of one ask, or by two asks: t_i is a PRF
  output under a fresh S, e_i a fresh key, box_i and the clove an AEAD ciphertext under
  independent keys. A proxy (or k colluding proxies) holding envelopes cannot tell whether
  two belong to one ask, let alone open them. Only the model node learns S, which links the
  cloves of this one ask (it must, to decode) and nothing across asks: each attempt has a
  fresh S, a fresh reply key and fresh reply links.
* Every clove carries a random delivery token that the model node lists in its reply
  (OverlayReply.delivered): acknowledgements end at the next hop, so this is how the user
  learns which paths really delivered (a relay that drops cloves silently is found).

Reply (model node -> user), per reply message `seq`
---------------------------------------------------
::

    OverlayReply --pad to class--> AES-GCM(reply key, random nonce) --sida.split--> clove_i
    clove_i --> tag(reply key, i, seq) | nonce_i (12, random) | AES-GCM(K_i, clove_i, aad = tag)

AES-GCM nonces are random 96-bit values carried with the ciphertext, never derived from the
chunk number: if a query is ever served twice (replayed cloves after the model node forgot
it, or restarted), the two replies still never share a (key, nonce) pair. The 16-byte tag
is a keyed permutation of (i, seq): the user inverts it to the route and message; an
observer sees unrelated random strings. A single clove with seq >= DELIVERY_SEQ is a
*delivery report*: the tokens of query cloves that reached the model node after it sent its
last reply message.

Sizes: queries and reply messages are padded to size classes (`size_class`: the minimum,
then powers of two), so a relay learns a message's size only to within a factor of two.
Pure functions: randomness comes from an `rng` argument.
"""

from __future__ import annotations

import hashlib
import secrets as _secrets
from dataclasses import dataclass
from typing import Callable

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF, HKDFExpand
from google.protobuf.message import DecodeError

from gentorrent.config import CLOVES, OVERLAY, WIRE
from gentorrent.crypto import sida
from gentorrent.wire import gentorrent_pb2 as pb

Rng = Callable[[int], bytes]

KEY_BYTES = 32
SECRET_BYTES = 32
TAG_BYTES = 16
TOKEN_BYTES = 16  # a query clove's delivery token
NONCE_BYTES = 12
NODE_ID_BYTES = 32
BOX_BYTES = SECRET_BYTES + 2 + 16  # S | n | k, GCM tag
ENVELOPE_HEAD = TAG_BYTES + KEY_BYTES + BOX_BYTES
#: reply messages with seq at or above this are single-clove delivery reports
DELIVERY_SEQ = 1 << 62
#: how a model node's reply error starts when it refuses work because it is at capacity
BUSY_ERROR = "busy"
_NONCE0 = bytes(12)
_RAW = serialization.Encoding.Raw
_RAW_PUB = serialization.PublicFormat.Raw
BOX_LABEL = b"gentorrent/ask-box/v2"
ASK_LABEL = b"gentorrent/ask/v2"
REPLY_LABEL = b"gentorrent/reply/v2"


class SealError(ValueError):
    """A sealed blob does not open, or opens to something malformed."""


# --------------------------------------------------------------------------- padding


def size_class(size: int, minimum: int) -> int:
    """The padded size of `size` bytes: `minimum`, or the next power of two above it."""
    if size <= minimum:
        return minimum
    return 1 << (size - 1).bit_length()


def pad(data: bytes, minimum: int) -> bytes:
    """ISO/IEC 7816-4 padding (0x80 then zeros) to size_class(len(data) + 1, minimum)."""
    total = size_class(len(data) + 1, minimum)
    return data + b"\x80" + bytes(total - len(data) - 1)


def unpad(data: bytes) -> bytes:
    stripped = data.rstrip(b"\x00")
    if not stripped or stripped[-1] != 0x80:
        raise SealError("bad padding")
    return stripped[:-1]


def _parse(cls, data: bytes):
    try:
        return cls.FromString(data)
    except (DecodeError, ValueError) as exc:
        raise SealError(f"malformed {cls.__name__}") from exc


# --------------------------------------------------------------------------- sealed boxes


def seal_to(recipient: X25519PublicKey | bytes, plaintext: bytes, label: bytes, rng: Rng | None = None) -> bytes:
    """Anonymous sealed box: ephemeral X25519 + HKDF-SHA256 + AES-256-GCM; eph_pub | ct.
    (The verifiers' private reveals use it; the overlay's envelopes are built below.)"""
    rng = rng or _secrets.token_bytes
    recipient_pub = _public_raw(recipient)
    eph = X25519PrivateKey.from_private_bytes(rng(KEY_BYTES))
    eph_pub = eph.public_key().public_bytes(_RAW, _RAW_PUB)
    try:
        shared = eph.exchange(X25519PublicKey.from_public_bytes(recipient_pub))
    except ValueError as exc:
        raise SealError("degenerate recipient key") from exc
    key = HKDF(hashes.SHA256(), KEY_BYTES, None, label + eph_pub + recipient_pub).derive(shared)
    return eph_pub + AESGCM(key).encrypt(_NONCE0, plaintext, label)


def open_sealed(private: X25519PrivateKey, blob: bytes, label: bytes) -> bytes:
    if len(blob) < KEY_BYTES + 16:
        raise SealError("sealed blob too short")
    eph_pub = bytes(blob[:KEY_BYTES])
    recipient_pub = private.public_key().public_bytes(_RAW, _RAW_PUB)
    try:
        shared = private.exchange(X25519PublicKey.from_public_bytes(eph_pub))
        key = HKDF(hashes.SHA256(), KEY_BYTES, None, label + eph_pub + recipient_pub).derive(shared)
        return AESGCM(key).decrypt(_NONCE0, bytes(blob[KEY_BYTES:]), label)
    except (ValueError, InvalidTag) as exc:
        raise SealError("sealed blob does not open with this key") from exc


# --------------------------------------------------------------------------- query


def _prf(secret: bytes, what: bytes, index: int, size: int) -> bytes:
    return hashlib.blake2b(what + index.to_bytes(2, "big"), key=secret, digest_size=size,
                           person=ASK_LABEL[:16]).digest()


def clove_tags(secret: bytes, n: int) -> list[bytes]:
    """t_1..t_n of the ask with secret S: how the model node recognises its later cloves."""
    return [_prf(secret, b"tag", i, TAG_BYTES) for i in range(n)]


def _public_raw(key: X25519PublicKey | bytes) -> bytes:
    if isinstance(key, X25519PublicKey):
        return key.public_bytes(_RAW, _RAW_PUB)
    if isinstance(key, (bytes, bytearray)) and len(key) == KEY_BYTES:
        return bytes(key)
    raise SealError("an X25519 public key is 32 bytes")


def _box_key(shared: bytes, eph_pub: bytes, recipient_pub: bytes) -> bytes:
    return HKDF(hashes.SHA256(), KEY_BYTES, None, BOX_LABEL + eph_pub + recipient_pub).derive(shared)


@dataclass(frozen=True)
class SealedAsk:
    """What the user keeps of one sealed attempt: the envelopes (clove i goes over path i)
    and the delivery token sealed in each."""

    envelopes: list[bytes]
    tokens: list[bytes]


def seal_ask(model_onion_key: X25519PublicKey | bytes, query: pb.OverlayQuery, n: int, k: int,
             rng: Rng | None = None, minimum: int = OVERLAY.query_size_min) -> SealedAsk:
    """Pad, split and seal a query into n envelopes for the model node (see the module doc)."""
    rng = rng or _secrets.token_bytes
    recipient = X25519PublicKey.from_public_bytes(_public_raw(model_onion_key))
    recipient_pub = _public_raw(model_onion_key)
    secret = rng(SECRET_BYTES)
    cloves = sida.split(pad(query.SerializeToString(), minimum), n, k, rng=rng)
    tags = clove_tags(secret, n)
    envelopes, tokens = [], []
    for i, (tag, clove) in enumerate(zip(tags, cloves)):
        token = rng(TOKEN_BYTES)
        eph = X25519PrivateKey.from_private_bytes(rng(KEY_BYTES))
        eph_pub = eph.public_key().public_bytes(_RAW, _RAW_PUB)
        box = AESGCM(_box_key(eph.exchange(recipient), eph_pub, recipient_pub)).encrypt(
            _NONCE0, secret + bytes((n, k)), tag)
        inner = pb.QueryClove(clove=clove, delivery_token=token).SerializeToString()
        body = AESGCM(_prf(secret, b"key", i, KEY_BYTES)).encrypt(_NONCE0, inner, tag)
        envelopes.append(tag + eph_pub + box + body)
        tokens.append(token)
    return SealedAsk(envelopes, tokens)


def envelope_tag(envelope: bytes) -> bytes:
    """The tag an envelope starts with (what the model node looks up first)."""
    if len(envelope) < ENVELOPE_HEAD + 16:
        raise SealError("envelope too short")
    return bytes(envelope[:TAG_BYTES])


def open_box(private: X25519PrivateKey, envelope: bytes, max_n: int = CLOVES.n) -> tuple[bytes, int, int]:
    """(S, n, k) from an envelope's box: the one public-key operation of an ask."""
    tag = envelope_tag(envelope)
    eph_pub = bytes(envelope[TAG_BYTES:TAG_BYTES + KEY_BYTES])
    box = bytes(envelope[TAG_BYTES + KEY_BYTES:ENVELOPE_HEAD])
    recipient_pub = private.public_key().public_bytes(_RAW, _RAW_PUB)
    try:
        shared = private.exchange(X25519PublicKey.from_public_bytes(eph_pub))
        plain = AESGCM(_box_key(shared, eph_pub, recipient_pub)).decrypt(_NONCE0, box, tag)
    except (ValueError, InvalidTag) as exc:
        raise SealError("envelope does not open with this key") from exc
    secret, n, k = plain[:SECRET_BYTES], plain[SECRET_BYTES], plain[SECRET_BYTES + 1]
    if not 1 <= k <= n <= max_n:
        raise SealError(f"an ask has 1 <= k <= n <= {max_n} cloves, got n={n} k={k}")
    return secret, n, k


def open_envelope(secret: bytes, index: int, envelope: bytes) -> tuple[bytes, bytes]:
    """(clove, delivery token) of envelope `index` of the ask with secret S."""
    tag = envelope_tag(envelope)
    try:
        inner = AESGCM(_prf(secret, b"key", index, KEY_BYTES)).decrypt(_NONCE0, bytes(envelope[ENVELOPE_HEAD:]), tag)
    except InvalidTag as exc:
        raise SealError("clove does not open") from exc
    clove = _parse(pb.QueryClove, inner)
    if not clove.clove or len(clove.delivery_token) != TOKEN_BYTES:
        raise SealError("malformed query clove")
    return clove.clove, clove.delivery_token


def open_query(message: bytes, max_routes: int = CLOVES.n) -> pb.OverlayQuery:
    """The query S-IDA rebuilt, validated: at most `max_routes` reply routes, sane k and keys."""
    query = _parse(pb.OverlayQuery, unpad(message))
    n = len(query.routes)
    if not 1 <= n <= max_routes:
        raise SealError(f"a query names 1..{max_routes} reply routes, got {n}")
    if not 1 <= query.k <= n:
        raise SealError(f"reply k={query.k} out of range for {n} routes")
    if len(query.reply_key) != KEY_BYTES:
        raise SealError("reply key must be 32 bytes")
    if any(len(r.proxy) != NODE_ID_BYTES or len(r.link_id) != 16 for r in query.routes):
        raise SealError("malformed reply route")
    if len({(r.proxy, r.link_id) for r in query.routes}) != n:
        raise SealError("a reply route is named twice")
    if len(query.request.prompt.encode()) + sum(len(m.content.encode()) for m in query.request.messages) > WIRE.max_prompt_bytes:
        raise SealError("prompt too large")
    return query


# --------------------------------------------------------------------------- reply


def _reply_subkey(reply_key: bytes, what: bytes) -> bytes:
    return HKDFExpand(hashes.SHA256(), KEY_BYTES, REPLY_LABEL + what).derive(reply_key)


_TAG_MAGIC = b"GTrt"


def reply_tag_key(reply_key: bytes) -> bytes:
    return _reply_subkey(reply_key, b"tag")


def reply_tag(reply_key: bytes, index: int, seq: int, tag_key: bytes | None = None) -> bytes:
    """What marks reply clove `index` of message `seq`: one AES block (a PRP) under a key
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


class ReplySealer:
    """The model node's keys for the replies to one query (derived once, not per clove)."""

    def __init__(self, reply_key: bytes, routes: int, rng: Rng | None = None,
                 minimum: int = OVERLAY.reply_size_min) -> None:
        self.reply_key = reply_key
        self.rng = rng or _secrets.token_bytes
        self.minimum = minimum
        self._message = AESGCM(_reply_subkey(reply_key, b"message"))
        self._cloves = [AESGCM(_reply_subkey(reply_key, b"clove" + i.to_bytes(2, "big"))) for i in range(routes)]
        self._tags = Cipher(algorithms.AES(reply_tag_key(reply_key)), modes.ECB()).encryptor()
        self._clove_body = 0  # S-IDA clove size of the last reply message: what a report pads to

    def _tag(self, index: int, seq: int) -> bytes:
        return self._tags.update(_TAG_MAGIC + index.to_bytes(2, "big") + seq.to_bytes(8, "big") + bytes(2))

    def message(self, reply: pb.OverlayReply) -> bytes:
        nonce = self.rng(NONCE_BYTES)
        return nonce + self._message.encrypt(nonce, pad(reply.SerializeToString(), self.minimum), None)

    def clove(self, index: int, seq: int, clove: bytes) -> bytes:
        tag, nonce = self._tag(index, seq), self.rng(NONCE_BYTES)
        return tag + nonce + self._cloves[index].encrypt(nonce, clove, tag)

    def cloves(self, reply: pb.OverlayReply, k: int) -> list[bytes]:
        """The n reply cloves of one reply message, clove i for route i."""
        parts = sida.split(self.message(reply), len(self._cloves), k, rng=self.rng)
        self._clove_body = len(parts[0])
        return [self.clove(i, reply.seq, part) for i, part in enumerate(parts)]

    def delivery_report(self, index: int, number: int, tokens: list[bytes], k: int) -> bytes:
        """One clove, for route `index`: the delivery tokens of late query cloves, padded to
        the size of the last reply message's cloves (it looks like one more of them)."""
        body = pb.OverlayReply(seq=DELIVERY_SEQ + number, delivered=tokens).SerializeToString()
        size = self._clove_body or len(sida.split(bytes(self.minimum + NONCE_BYTES + 16), len(self._cloves), k)[0])
        return self.clove(index, DELIVERY_SEQ + number, pad(body, size))


class ReplyOpener:
    """The user's keys for the replies to one attempt (derived once, not per clove)."""

    def __init__(self, reply_key: bytes, routes: int) -> None:
        self.tags = TagReader(reply_key)
        self._message = AESGCM(_reply_subkey(reply_key, b"message"))
        self._cloves = [AESGCM(_reply_subkey(reply_key, b"clove" + i.to_bytes(2, "big"))) for i in range(routes)]

    def clove(self, index: int, blob: bytes) -> bytes:
        """The S-IDA clove (or a delivery report's padded body) inside reply clove `blob`."""
        if len(blob) < TAG_BYTES + NONCE_BYTES + 16 or not 0 <= index < len(self._cloves):
            raise SealError("reply clove too short")
        tag, nonce = bytes(blob[:TAG_BYTES]), bytes(blob[TAG_BYTES:TAG_BYTES + NONCE_BYTES])
        try:
            return self._cloves[index].decrypt(nonce, bytes(blob[TAG_BYTES + NONCE_BYTES:]), tag)
        except (InvalidTag, ValueError) as exc:
            raise SealError("reply clove does not open") from exc

    def message(self, seq: int, sealed: bytes) -> pb.OverlayReply:
        if len(sealed) < NONCE_BYTES + 16:
            raise SealError("reply too short")
        try:
            plain = self._message.decrypt(bytes(sealed[:NONCE_BYTES]), bytes(sealed[NONCE_BYTES:]), None)
        except (InvalidTag, ValueError) as exc:
            raise SealError("reply does not open with the reply key") from exc
        reply = _parse(pb.OverlayReply, unpad(plain))
        if reply.seq != seq:
            raise SealError("reply sequence number does not match its tag")
        return reply

    def report(self, index: int, seq: int, blob: bytes) -> list[bytes]:
        """The delivery tokens of a delivery report clove."""
        report = _parse(pb.OverlayReply, unpad(self.clove(index, blob)))
        if report.seq != seq or len(report.delivered) > 255:
            raise SealError("malformed delivery report")
        return list(report.delivered)
