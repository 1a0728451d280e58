"""Onion codec for proxy paths (ARCHITECTURE.md §3.2) and the clove layers along them.

Pure: no I/O, no clock; randomness comes from an `rng(nbytes) -> bytes` argument (default
`secrets.token_bytes`), time from an `issued_s` argument. Keys are `cryptography` X25519
objects or their raw 32 bytes.

Establishment onion (fixed size S = CLOVES.onion_size at every hop)
------------------------------------------------------------------
What hop h receives::

    E_h (32: ephemeral X25519 public key) | tag_h (16) | beta_h (B = S - 48)

Hop h computes X25519(onion_key_h, E_h) and HKDF-SHA256(info = LABEL | E_h | pub_h) ->
aead_key (32) | hop_key (32) | filler_h (F = INFO + 48 bytes). AES-256-GCM(aead_key,
nonce 0^12, aad = E_h) opens beta_h|tag_h into P_h (B bytes; the zero nonce is safe since
aead_key comes from a fresh ephemeral key). P_h = info_h (INFO = 128 bytes) | rest_h::

    info = flags (1: 1 = forward, 0 = you are the proxy) | link_in (16) | link_out (16)
           | successor node id (32, zero for the proxy) | issued_s (8) | linger_s (2)
           | zero padding

The successor is named by node id, never by address: the relay dials the node the registry
lists under that id and accepts only its registered certificate (gentorrent.channels), so
nobody can redirect a path by registering someone else's address. `issued_s` is the user's
clock when it built the onion: a hop refuses onions older than the path could live (and
keeps the ephemeral keys of younger ones), so an onion captured on the wire cannot re-install
the same keys and link IDs after the path expired. `linger_s` (0: not set) is how long the hop
may keep the path once it has carried a clove and gone idle: a single-use path (one ask, then
never again) asks its relays to forget it soon after its ask, instead of holding its entry for
the full idle expiry (gentorrent.overlay.pathtable). Every path a shipped user builds is
single-use, so the field tells a hop nothing about whose path it is.

The next onion is rest_h | filler_h: again exactly S bytes, so every hop sees the same size
and a random-looking body, and cannot tell its position. The sender precomputes every
filler (as in Sphinx) so that each hop's AEAD covers its entire layer: any bit flipped
anywhere in a layer is rejected by the hop that opens it (OnionError). The path length is
at most MAX_HOPS (S = 2048: 11).

Link IDs are chosen by the sender: links L_0..L_l are independent random strings, hop h uses
L_{h-1} on its incoming link and L_h on its outgoing one, so only neighbours share an ID
and two relays further apart on a path (or on two paths of one user) hold nothing in common.

hop_key is derived, not carried: both the user (who knows the ephemeral secret) and the hop
compute it; it keys the symmetric clove layers below, so relays do no public-key work after
establishment.

Forward clove layers: per-hop integrity, constant size
------------------------------------------------------
A forward blob at hop h is ``T_h (16) | H_h (16) | B_h (N)``. From hop_key, HKDF derives a
MAC key, a CTR key, a header key (AES as a one-block PRP) and a sequence offset. Hop h

1. checks T_h = BLAKE2b-MAC(mac_h, H_h | B_h); a blob altered anywhere dies here
   (CloveLayerError) -- so a pattern XORed in by a dishonest hop never reaches a colluding
   hop further on (the tagging attack on AES-CTR layers without integrity);
2. decrypts D = AES-CTR(ctr_h, iv = H_h, B_h | 0^24): seq_h = D[:8] (the clove's number on
   this path, plus this hop's secret offset: what the per-link replay window checks, after
   the MAC), T_{h+1} = D[8:24], B_{h+1} = D[24:] -- N bytes again, the last 24 of them
   keystream, so the size never changes and no hop learns its position from it;
3. sets H_{h+1} = PRP_h^-1(H_h).

The user builds the layers from the proxy outwards with Sphinx-style filler precomputation:
it knows every keystream, so it knows the 24·(h-1) trailing bytes the hops before h will
have appended, and each T_h covers exactly what hop h will receive. The proxy's plaintext is
``seq (8) | 0^16 | length (4) | payload | ...``; its MAC authenticates it (encrypt-then-MAC
under a key only the user and the proxy hold). Every hop re-randomises H and B, so no byte
string follows a clove along the path.

Return layers
-------------
A return blob is ``hdr (16) | body``: the proxy seals with AES-GCM under its return key
(seal_return), every further hop adds hdr = PRP(hdr), body ^= CTR(iv = hdr) (wrap_return),
and the user removes them all and opens the proxy's seal (unwrap_return). Intermediate hops
cannot check integrity here: they share no key with the proxy. A pattern a dishonest proxy
XORs in stays hidden under the honest hops' keystreams, which only the user can remove, and
the user's AEAD drops it. (Replays and junk a proxy injects towards the user: see
THREAT_MODEL.md.) A hop before the proxy seals the same way the one thing it ever tells the
user, that its successor is gone; `unwrap_return_from` finds which hop sealed a blob.

Fresh reply links
-----------------
`reply_link(hop_key, j)` is the proxy's reply link ID for the user's j-th ask over the path:
a PRF of the proxy's hop key. The user names a new one in every query and the proxy keeps a
small window of the next ones (gentorrent.overlay.pathtable), so a model node sees a new,
unrelated link ID per ask instead of one pseudonym per path for its whole life.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets as _secrets
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF, HKDFExpand

from gentorrent.config import CLOVES

Rng = Callable[[int], bytes]

ONION_SIZE = CLOVES.onion_size
LINK_ID_BYTES = CLOVES.link_id_bytes
NODE_ID_BYTES = 32
KEY_BYTES = 32
TAG_BYTES = 16
LAYER_OVERHEAD = KEY_BYTES + TAG_BYTES  # ephemeral key + GCM tag
INFO_BYTES = 128
FILLER_BYTES = INFO_BYTES + LAYER_OVERHEAD  # what each hop appends
MAX_HOPS = 1 + (ONION_SIZE - LAYER_OVERHEAD - INFO_BYTES) // FILLER_BYTES
HDR_BYTES = 16
SEQ_BYTES = 8
MAC_BYTES = 16
SHIFT = SEQ_BYTES + MAC_BYTES  # forward bytes each hop consumes and replaces with keystream
FORWARD_HEAD = MAC_BYTES + HDR_BYTES
_LEN_BYTES = 4
_NONCE0 = bytes(12)
_ONION_LABEL = b"gentorrent/onion/v2"
_CLOVE_LABEL = b"gentorrent/clove-layer/v2"
_RAW = serialization.Encoding.Raw
_RAW_PUB = serialization.PublicFormat.Raw
_SEQ_MOD = 1 << 64
_LINGER_MAX = (1 << 16) - 1


class OnionError(ValueError):
    """An establishment onion is malformed, tampered with, or not for this key."""


class CloveLayerError(ValueError):
    """A layered clove is malformed or fails its authentication."""


@dataclass(frozen=True)
class HopSpec:
    """One relay of a path as the user knows it from the directory."""

    node_id: bytes  # 32 bytes
    onion_key: X25519PublicKey | bytes


@dataclass(frozen=True)
class PathSecrets:
    """What the user keeps about an established path (hop 1 first, the proxy last)."""

    hop_keys: tuple[bytes, ...]
    link_ids: tuple[bytes, ...]  # L_0 (user -> hop 1) .. L_l
    first_hop: str  # node id (hex) of hop 1

    @property
    def first_link(self) -> bytes:
        return self.link_ids[0]


@dataclass(frozen=True)
class PeeledLayer:
    """What one hop learns: its successor (None: it is the proxy), its link IDs, its key,
    when the onion was made and its ephemeral key (for the hop's replay cache)."""

    next_hop: str | None  # node id (hex)
    link_in: bytes
    link_out: bytes
    hop_key: bytes
    onion: bytes | None  # the onion to send to next_hop
    issued_s: int
    ephemeral: bytes
    linger_s: int = 0  # seconds to keep the path idle after its first clove (0: the relay's own expiry)


# --------------------------------------------------------------------------- helpers


def _xor(a: bytes, b: bytes) -> bytes:
    return (int.from_bytes(a, "little") ^ int.from_bytes(b, "little")).to_bytes(len(a), "little")


def _public_raw(key: X25519PublicKey | bytes) -> bytes:
    if isinstance(key, X25519PublicKey):
        return key.public_bytes(_RAW, _RAW_PUB)
    if isinstance(key, (bytes, bytearray)) and len(key) == KEY_BYTES:
        return bytes(key)
    raise OnionError("an onion public key is an X25519PublicKey or 32 raw bytes")


def _private(key: X25519PrivateKey | bytes) -> X25519PrivateKey:
    if isinstance(key, X25519PrivateKey):
        return key
    if isinstance(key, (bytes, bytearray)) and len(key) == KEY_BYTES:
        return X25519PrivateKey.from_private_bytes(bytes(key))
    raise OnionError("an onion private key is an X25519PrivateKey or 32 raw bytes")


def _layer_keys(shared: bytes, eph_pub: bytes, hop_pub: bytes) -> tuple[bytes, bytes, bytes]:
    okm = HKDF(hashes.SHA256(), 2 * KEY_BYTES + FILLER_BYTES, None, _ONION_LABEL + eph_pub + hop_pub).derive(shared)
    return okm[:KEY_BYTES], okm[KEY_BYTES : 2 * KEY_BYTES], okm[2 * KEY_BYTES :]


def _exchange(private: X25519PrivateKey, public: bytes) -> bytes:
    try:
        return private.exchange(X25519PublicKey.from_public_bytes(public))
    except ValueError as exc:  # low-order point: all-zero shared secret
        raise OnionError("degenerate X25519 key in onion") from exc


def _encode_info(next_hop: bytes | None, link_in: bytes, link_out: bytes, issued_s: int, linger_s: int) -> bytes:
    if next_hop is not None and len(next_hop) != NODE_ID_BYTES:
        raise OnionError(f"a successor is named by its {NODE_ID_BYTES}-byte node id")
    for link in (link_in, link_out):
        if len(link) != LINK_ID_BYTES:
            raise OnionError(f"link IDs are {LINK_ID_BYTES} bytes")
    if not 0 <= issued_s < _SEQ_MOD:
        raise OnionError("issued_s out of range")
    if not 0 <= linger_s <= _LINGER_MAX:
        raise OnionError(f"linger_s is 0..{_LINGER_MAX} seconds")
    info = (bytes((0 if next_hop is None else 1,)) + link_in + link_out
            + (next_hop or bytes(NODE_ID_BYTES)) + issued_s.to_bytes(8, "big") + linger_s.to_bytes(2, "big"))
    return info + bytes(INFO_BYTES - len(info))


def _decode_info(info: bytes) -> tuple[str | None, bytes, bytes, int, int]:
    flags = info[0]
    link_in, link_out = info[1 : 1 + LINK_ID_BYTES], info[1 + LINK_ID_BYTES : 1 + 2 * LINK_ID_BYTES]
    at = 1 + 2 * LINK_ID_BYTES
    successor = info[at : at + NODE_ID_BYTES]
    at += NODE_ID_BYTES
    issued_s = int.from_bytes(info[at : at + 8], "big")
    linger_s = int.from_bytes(info[at + 8 : at + 10], "big")
    if flags not in (0, 1) or (flags == 1) == (successor == bytes(NODE_ID_BYTES)):
        raise OnionError("malformed routing info")
    if any(info[at + 10 :]):
        raise OnionError("malformed routing info")
    return (successor.hex() if flags == 1 else None), link_in, link_out, issued_s, linger_s


# --------------------------------------------------------------------------- establishment


def build_onion(
    hops: list[HopSpec], rng: Rng | None = None, link_ids: list[bytes] | None = None, issued_s: int = 0,
    linger_s: int = 0,
) -> tuple[bytes, PathSecrets]:
    """The establishment onion for hops[0] (the first relay) .. hops[-1] (the proxy); every
    hop is told the same `linger_s`."""
    rng = rng or _secrets.token_bytes
    l = len(hops)
    if not 1 <= l <= MAX_HOPS:
        raise OnionError(f"a path has 1..{MAX_HOPS} hops, got {l}")
    links = list(link_ids) if link_ids is not None else [rng(LINK_ID_BYTES) for _ in range(l + 1)]
    if len(links) != l + 1:
        raise OnionError("need one link ID per link: len(hops) + 1")
    body = ONION_SIZE - LAYER_OVERHEAD
    layers = []  # (eph_pub, aead_key, hop_key, keystream, filler)
    for hop in hops:
        hop_pub = _public_raw(hop.onion_key)
        eph = X25519PrivateKey.from_private_bytes(rng(KEY_BYTES))
        eph_pub = eph.public_key().public_bytes(_RAW, _RAW_PUB)
        aead_key, hop_key, filler = _layer_keys(_exchange(eph, hop_pub), eph_pub, hop_pub)
        keystream = AESGCM(aead_key).encrypt(_NONCE0, bytes(body), eph_pub)[:body]
        layers.append((eph_pub, aead_key, hop_key, keystream, filler))
    # tails[h]: the last bytes of hop h's onion, fixed by the fillers of hops before it
    tails = [b""]
    for _, _, _, keystream, filler in layers[:-1]:
        t = tails[-1]
        tails.append(_xor(t, keystream[body - len(t) :]) + filler)
    onion = b""
    for h in range(l - 1, -1, -1):
        eph_pub, aead_key, _, keystream, _ = layers[h]
        next_hop = bytes(hops[h + 1].node_id) if h + 1 < l else None
        info = _encode_info(next_hop, links[h], links[h + 1], issued_s, linger_s)
        if h == l - 1:
            t = tails[h]
            rest = rng(body - INFO_BYTES - len(t)) + _xor(t, keystream[body - len(t) :])
        else:
            rest = onion[: ONION_SIZE - FILLER_BYTES]
        sealed = AESGCM(aead_key).encrypt(_NONCE0, info + rest, eph_pub)
        onion = eph_pub + sealed[body:] + sealed[:body]
    return onion, PathSecrets(tuple(layer[2] for layer in layers), tuple(links), bytes(hops[0].node_id).hex())


def peel(onion: bytes, onion_private_key: X25519PrivateKey | bytes) -> PeeledLayer:
    """Open this hop's layer; raises OnionError if it is not for this key or was tampered."""
    if not isinstance(onion, (bytes, bytearray)) or len(onion) != ONION_SIZE:
        raise OnionError(f"an onion is exactly {ONION_SIZE} bytes")
    onion = bytes(onion)
    private = _private(onion_private_key)
    hop_pub = private.public_key().public_bytes(_RAW, _RAW_PUB)
    eph_pub, tag, beta = onion[:KEY_BYTES], onion[KEY_BYTES:LAYER_OVERHEAD], onion[LAYER_OVERHEAD:]
    aead_key, hop_key, filler = _layer_keys(_exchange(private, eph_pub), eph_pub, hop_pub)
    try:
        plain = AESGCM(aead_key).decrypt(_NONCE0, beta + tag, eph_pub)
    except InvalidTag as exc:
        raise OnionError("onion layer does not authenticate (tampered, or not for this key)") from exc
    next_hop, link_in, link_out, issued_s, linger_s = _decode_info(plain[:INFO_BYTES])
    inner = None if next_hop is None else plain[INFO_BYTES:] + filler
    return PeeledLayer(next_hop, link_in, link_out, hop_key, inner, issued_s, eph_pub, linger_s)


# --------------------------------------------------------------------------- per-hop keys


class HopKeys:
    """The symmetric keys one hop key expands to, with reusable cipher contexts (ECB is
    stateless per block, so one context serves every header of the path)."""

    __slots__ = ("fwd_hdr", "fwd_stream", "fwd_mac", "seq_offset", "ret_hdr", "ret_hdr_inv", "ret_stream",
                 "ret_aead", "reply_prf")

    def __init__(self, hop_key: bytes) -> None:
        okm = HKDFExpand(hashes.SHA256(), 8 * KEY_BYTES, _CLOVE_LABEL).derive(hop_key)
        k = [okm[i * KEY_BYTES : (i + 1) * KEY_BYTES] for i in range(8)]
        self.fwd_hdr = Cipher(algorithms.AES(k[0]), modes.ECB()).decryptor()
        self.fwd_stream = Keystream(k[1])
        self.fwd_mac = k[2]
        self.seq_offset = int.from_bytes(k[3][:SEQ_BYTES], "big")
        self.ret_hdr = Cipher(algorithms.AES(k[4]), modes.ECB()).encryptor()
        self.ret_hdr_inv = Cipher(algorithms.AES(k[4]), modes.ECB()).decryptor()
        self.ret_stream = Keystream(k[5])
        self.ret_aead = AESGCM(k[6])
        self.reply_prf = k[7]


def hop_keys(hop_key: "bytes | HopKeys") -> HopKeys:
    """The keys of one hop key, derived once and cached (a relay keeps them in its path
    table entry and passes them instead of the key, so no cache size bounds its paths)."""
    if isinstance(hop_key, HopKeys):
        return hop_key
    if not isinstance(hop_key, (bytes, bytearray)) or len(hop_key) != KEY_BYTES:
        raise CloveLayerError("a hop key is 32 bytes")
    return _hop_keys(bytes(hop_key))


@lru_cache(maxsize=8192)
def _hop_keys(hop_key: bytes) -> HopKeys:
    return HopKeys(hop_key)


class Keystream:
    """AES-256-CTR under one key, for many short messages each with its own IV.

    A clove layer is a few hundred bytes, and a fresh `cryptography` CTR context for each
    (key schedule, mode and cipher objects) cost more than the rest of a hop's work. CTR is
    AES of the counter blocks IV, IV+1, ... (one 128-bit big-endian counter, as OpenSSL's);
    one ECB context per key (stateless per block) encrypts all of them in one call, the
    counter blocks made with two big-integer operations. Byte for byte what
    `modes.CTR(iv)` gives; long data (or a counter that would wrap) takes the library's path."""

    __slots__ = ("key", "_ecb")

    def __init__(self, key: bytes) -> None:
        self.key = key
        self._ecb = Cipher(algorithms.AES(key), modes.ECB()).encryptor()

    def xor(self, iv: bytes, data: bytes) -> bytes:
        """data XOR the keystream from counter `iv`."""
        size = len(data)
        blocks = -(-size // 16)
        counter = int.from_bytes(iv, "big")
        if size > _SHORT_CTR or counter + blocks > _CTR_MOD:
            return Cipher(algorithms.AES(self.key), modes.CTR(iv)).encryptor().update(data)
        spread, steps = _counter_pattern(blocks)
        stream = self._ecb.update((counter * spread + steps).to_bytes(16 * blocks, "big"))
        return (int.from_bytes(data, "little") ^ int.from_bytes(stream[:size], "little")).to_bytes(size, "little")


_SHORT_CTR = 16 * 1024  # above this a library context's set-up is noise: use it
_CTR_MOD = 1 << 128


@lru_cache(maxsize=_SHORT_CTR // 16 + 1)
def _counter_pattern(blocks: int) -> tuple[int, int]:
    """(R, S) such that c * R + S is the concatenation of the 128-bit blocks c, c+1, ..., c+blocks-1."""
    spread = sum(1 << (128 * j) for j in range(blocks))
    steps = sum(i << (128 * (blocks - 1 - i)) for i in range(blocks))
    return spread, steps


def _mac(key: bytes, hdr: bytes, body: bytes) -> bytes:
    m = hashlib.blake2b(key=key, digest_size=MAC_BYTES)
    m.update(hdr)
    m.update(body)
    return m.digest()


def reply_link(hop_key: bytes, counter: int) -> bytes:
    """The proxy's reply link ID for the user's `counter`-th ask over this path."""
    return hashlib.blake2b(counter.to_bytes(8, "big"), key=hop_keys(hop_key).reply_prf,
                           digest_size=LINK_ID_BYTES).digest()


# --------------------------------------------------------------------------- forward layers


def forward_size(payload_len: int, path_length: int) -> int:
    """Bytes of a forward blob carrying `payload_len` bytes over `path_length` hops."""
    return FORWARD_HEAD + payload_len + _LEN_BYTES + SHIFT * path_length


def wrap_forward(path: PathSecrets, payload: bytes, seq: int, rng: Rng | None = None,
                 pad_to: int | None = None) -> bytes:
    """User side: the layered forward blob of `payload` for the proxy of `path`; `seq` is the
    clove's number on this path (each hop sees it plus its own secret offset)."""
    rng = rng or _secrets.token_bytes
    if pad_to is not None and pad_to < len(payload):
        raise CloveLayerError(f"payload of {len(payload)} bytes exceeds pad_to={pad_to}")
    keys = [hop_keys(k) for k in path.hop_keys]
    l = len(keys)
    n = (pad_to if pad_to is not None else len(payload)) + _LEN_BYTES + SHIFT * l
    hdrs = [rng(HDR_BYTES)]
    for d in keys[:-1]:
        hdrs.append(d.fwd_hdr.update(hdrs[-1]))
    streams = [d.fwd_stream.xor(hdr, bytes(n + SHIFT)) for d, hdr in zip(keys, hdrs)]
    tail = b""  # the bytes the hops before h append, as hop h receives them
    tails = [tail]
    for ks in streams[:-1]:
        tail = _xor(tail, ks[n - len(tail) : n]) + ks[n : n + SHIFT]
        tails.append(tail)
    seqs = [((seq + d.seq_offset) % _SEQ_MOD).to_bytes(SEQ_BYTES, "big") for d in keys]
    plain = seqs[-1] + bytes(MAC_BYTES) + len(payload).to_bytes(_LEN_BYTES, "big") + bytes(payload)
    plain += bytes(n - len(tails[-1]) - len(plain))
    body = _xor(plain, streams[-1][: len(plain)]) + tails[-1]
    mac = _mac(keys[-1].fwd_mac, hdrs[-1], body)
    for h in range(l - 2, -1, -1):
        body = _xor(seqs[h] + mac + body[: n - SHIFT], streams[h][:n])
        mac = _mac(keys[h].fwd_mac, hdrs[h], body)
    return mac + hdrs[0] + body


def _check_forward(d: HopKeys, blob: bytes) -> tuple[bytes, bytes]:
    if not isinstance(blob, (bytes, bytearray)) or len(blob) < FORWARD_HEAD + SHIFT + _LEN_BYTES:
        raise CloveLayerError("layered clove too short")
    blob = bytes(blob)
    mac, hdr, body = blob[:MAC_BYTES], blob[MAC_BYTES:FORWARD_HEAD], blob[FORWARD_HEAD:]
    if not hmac.compare_digest(mac, _mac(d.fwd_mac, hdr, body)):
        raise CloveLayerError("layered clove does not authenticate at this hop (tampered, or not this path)")
    return hdr, body


def peel_forward(hop_key: bytes, blob: bytes) -> tuple[int, bytes]:
    """Relay side: check this hop's MAC, remove its layer; (seq, blob for the next hop, same size)."""
    d = hop_keys(hop_key)
    hdr, body = _check_forward(d, blob)
    plain = d.fwd_stream.xor(hdr, body + bytes(SHIFT))
    seq = int.from_bytes(plain[:SEQ_BYTES], "big")
    return seq, plain[SEQ_BYTES:SHIFT] + d.fwd_hdr.update(hdr) + plain[SHIFT:]


def open_forward(hop_key: bytes, blob: bytes) -> tuple[int, bytes]:
    """Proxy side: check the MAC and open the user's payload; (seq, payload)."""
    d = hop_keys(hop_key)
    hdr, body = _check_forward(d, blob)
    plain = d.fwd_stream.xor(hdr, body)
    n = int.from_bytes(plain[SHIFT : SHIFT + _LEN_BYTES], "big")
    if n > len(plain) - SHIFT - _LEN_BYTES:
        raise CloveLayerError("bad payload length")
    return int.from_bytes(plain[:SEQ_BYTES], "big"), plain[SHIFT + _LEN_BYTES : SHIFT + _LEN_BYTES + n]


# --------------------------------------------------------------------------- return layers


def _split_blob(blob: bytes) -> tuple[bytes, bytes]:
    if not isinstance(blob, (bytes, bytearray)) or len(blob) < HDR_BYTES + TAG_BYTES + 4:
        raise CloveLayerError("layered clove too short")
    return bytes(blob[:HDR_BYTES]), bytes(blob[HDR_BYTES:])


def seal_return(hop_key: bytes, payload: bytes, rng: Rng | None = None, pad_to: int | None = None) -> bytes:
    """Proxy side: seal a returning payload (a reply clove) for the user; any hop: seal a
    notice for the user (unwrap_return_from says which hop sealed it)."""
    plain = len(payload).to_bytes(4, "big") + bytes(payload)
    if pad_to is not None:
        if pad_to < len(payload):
            raise CloveLayerError(f"payload of {len(payload)} bytes exceeds pad_to={pad_to}")
        plain += bytes(pad_to - len(payload))
    hdr = (rng or _secrets.token_bytes)(HDR_BYTES)
    return hdr + hop_keys(hop_key).ret_aead.encrypt(hdr[:12], plain, None)


def wrap_return(hop_key: bytes, blob: bytes) -> bytes:
    """Relay side, return direction: add this hop's layer; same size."""
    d = hop_keys(hop_key)
    hdr, body = _split_blob(blob)
    hdr = d.ret_hdr.update(hdr)
    return hdr + d.ret_stream.xor(hdr, body)


def unwrap_return(path: PathSecrets, blob: bytes) -> bytes:
    """User side: remove the layers of hops 1..l-1 and open the proxy's seal."""
    hdr, body = _split_blob(blob)
    keys = [hop_keys(k) for k in path.hop_keys]
    for d in keys[:-1]:
        body = d.ret_stream.xor(hdr, body)
        hdr = d.ret_hdr_inv.update(hdr)
    try:
        plain = keys[-1].ret_aead.decrypt(hdr[:12], body, None)
    except InvalidTag as exc:
        raise CloveLayerError("layered clove does not authenticate (tampered or wrong path)") from exc
    return _sealed_payload(plain)


def unwrap_return_from(path: PathSecrets, blob: bytes) -> tuple[int, bytes]:
    """User side: (the index of the hop that sealed `blob`, its payload). The proxy seals what
    the model node sends; a hop before it seals only its word that the path broke beyond it
    (user_client.relay), which the hops before it wrap like any returning blob, so none of them
    can tell it from the proxy's. The proxy is tried first: a reply costs what unwrap_return
    does, a blob no hop sealed l AEAD checks."""
    try:
        return len(path.hop_keys) - 1, unwrap_return(path, blob)
    except CloveLayerError:
        pass
    hdr, body = _split_blob(blob)
    for i, d in enumerate(hop_keys(k) for k in path.hop_keys[:-1]):
        try:
            return i, _sealed_payload(d.ret_aead.decrypt(hdr[:12], body, None))
        except InvalidTag:
            body = d.ret_stream.xor(hdr, body)
            hdr = d.ret_hdr_inv.update(hdr)
    raise CloveLayerError("layered clove does not authenticate at any hop (tampered or wrong path)")


def _sealed_payload(plain: bytes) -> bytes:
    n = int.from_bytes(plain[:4], "big")
    if n > len(plain) - 4:
        raise CloveLayerError("bad payload length")
    return plain[4 : 4 + n]
