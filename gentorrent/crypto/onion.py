"""Onion codec for proxy paths (ARCHITECTURE.md §3.2) and symmetric clove layering along them.

Pure: no I/O; randomness comes from an `rng(nbytes) -> bytes` argument (default
`secrets.token_bytes`). Keys are `cryptography` X25519 objects or their raw 32 bytes.

Establishment onion (fixed size S = CLOVES.onion_size at every hop)
------------------------------------------------------------------
What hop h receives::

    E_h (32: ephemeral X25519 public key) | tag_h (16) | beta_h (B = S - 48)

Hop h computes X25519(onion_key_h, E_h) and HKDF-SHA256(info = LABEL | E_h | pub_h) ->
aead_key (32) | hop_key (32) | filler_h (F = INFO + 48 bytes). AES-256-GCM(aead_key,
nonce 0^12, aad = E_h) opens beta_h|tag_h into P_h (B bytes; the zero nonce is safe since
aead_key comes from a fresh ephemeral key). P_h = info_h (INFO = 128 bytes) | rest_h::

    info = flags (1: 1 = forward, 0 = you are the proxy) | link_in (16) | link_out (16)
           | address length (1) | successor address (utf-8, zero padded to ADDR_MAX)

The next onion is rest_h | filler_h: again exactly S bytes, so every hop sees the same size
and a random-looking body, and cannot tell its position. The sender precomputes every
filler (as in Sphinx) so that each hop's AEAD covers its entire layer: any bit flipped
anywhere in a layer is rejected by the hop that opens it (OnionError). The path length is
at most MAX_HOPS (S = 2048: 11).

Link IDs are chosen by the sender: links L_0..L_l are independent random strings, hop h uses
L_{h-1} on its incoming link and L_h on its outgoing one, so only neighbours share an ID
and two relays further apart on a path (or on two paths of one user) hold nothing in common.
The proxy's outgoing ID L_l is the reply link ID the user gives to model nodes.

hop_key is derived, not carried: both the user (who knows the ephemeral secret) and the hop
compute it; it keys the symmetric clove layers below, so relays do no public-key work after
establishment.

Clove layers (constant size along the path)
-------------------------------------------
A layered blob is ``hdr (16) | body``. From each hop_key, HKDF derives separate forward and
return keys: hdr_key (AES-256 as a one-block PRP), ctr_key (AES-256-CTR) and aead_key.

* forward: the user seals the payload for the proxy with AES-GCM(aead_key of hop l, random
  96-bit nonce taken from a random 16-byte hdr), then for h = l..1 sets
  hdr = PRP_h(hdr), body ^= CTR_h(iv = hdr). Hop h undoes its layer (peel_forward); the
  proxy also opens the AEAD (open_forward). Every hop re-randomises hdr and body, so no
  byte string follows a clove along the path.
* return: the proxy seals (seal_return), each further hop adds a layer (wrap_return), the
  user removes all of them and opens the proxy's AEAD (unwrap_return).

Intermediate hops cannot check integrity (layers are length-preserving, like Tor's relay
cells); tampering is caught at the end by the AEAD (CloveLayerError). AEAD nonces are random
96-bit values per message under per-path keys; CTR IVs are pseudo-random 128-bit blocks.
"""

from __future__ import annotations

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
KEY_BYTES = 32
TAG_BYTES = 16
LAYER_OVERHEAD = KEY_BYTES + TAG_BYTES  # ephemeral key + GCM tag
INFO_BYTES = 128
ADDR_MAX = INFO_BYTES - 2 - 2 * LINK_ID_BYTES
FILLER_BYTES = INFO_BYTES + LAYER_OVERHEAD  # what each hop appends
MAX_HOPS = 1 + (ONION_SIZE - LAYER_OVERHEAD - INFO_BYTES) // FILLER_BYTES
HDR_BYTES = 16
_NONCE0 = bytes(12)
_ONION_LABEL = b"gentorrent/onion/v1"
_CLOVE_LABEL = b"gentorrent/clove-layer/v1"
_RAW = serialization.Encoding.Raw
_RAW_PUB = serialization.PublicFormat.Raw


class OnionError(ValueError):
    """An establishment onion is malformed, tampered with, or not for this key."""


class CloveLayerError(ValueError):
    """A layered clove is malformed or fails its end-to-end authentication."""


@dataclass(frozen=True)
class HopSpec:
    """One relay of a path as the user knows it from the directory."""

    address: str
    onion_key: X25519PublicKey | bytes


@dataclass(frozen=True)
class PathSecrets:
    """What the user keeps about an established path (hop 1 first, the proxy last)."""

    hop_keys: tuple[bytes, ...]
    link_ids: tuple[bytes, ...]  # L_0 (user -> hop 1) .. L_l (proxy's reply link)
    first_hop: str

    @property
    def first_link(self) -> bytes:
        return self.link_ids[0]

    @property
    def reply_link(self) -> bytes:
        return self.link_ids[-1]


@dataclass(frozen=True)
class PeeledLayer:
    """What one hop learns: its successor (None: it is the proxy), its link IDs, its key."""

    next_hop: str | None
    link_in: bytes
    link_out: bytes
    hop_key: bytes
    onion: bytes | None  # the onion to send to next_hop


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


def _encode_info(next_hop: str | None, link_in: bytes, link_out: bytes) -> bytes:
    addr = b"" if next_hop is None else next_hop.encode("utf-8")
    if next_hop is not None and not 0 < len(addr) <= ADDR_MAX:
        raise OnionError(f"relay address must be 1..{ADDR_MAX} utf-8 bytes: {next_hop!r}")
    for link in (link_in, link_out):
        if len(link) != LINK_ID_BYTES:
            raise OnionError(f"link IDs are {LINK_ID_BYTES} bytes")
    info = bytes((0 if next_hop is None else 1,)) + link_in + link_out + bytes((len(addr),)) + addr
    return info + bytes(INFO_BYTES - len(info))


def _decode_info(info: bytes) -> tuple[str | None, bytes, bytes]:
    flags, n = info[0], info[1 + 2 * LINK_ID_BYTES]
    link_in, link_out = info[1 : 1 + LINK_ID_BYTES], info[1 + LINK_ID_BYTES : 1 + 2 * LINK_ID_BYTES]
    if flags not in (0, 1) or n > ADDR_MAX or (flags == 1) != (n > 0):
        raise OnionError("malformed routing info")
    if flags == 0:
        return None, link_in, link_out
    start = 2 + 2 * LINK_ID_BYTES
    try:
        return info[start : start + n].decode("utf-8"), link_in, link_out
    except UnicodeDecodeError as exc:
        raise OnionError("malformed successor address") from exc


# --------------------------------------------------------------------------- establishment


def build_onion(
    hops: list[HopSpec], rng: Rng | None = None, link_ids: list[bytes] | None = None
) -> tuple[bytes, PathSecrets]:
    """The establishment onion for hops[0] (the first relay) .. hops[-1] (the proxy)."""
    rng = rng or _secrets.token_bytes
    l = len(hops)
    if not 1 <= l <= MAX_HOPS:
        raise OnionError(f"a path has 1..{MAX_HOPS} hops, got {l}")
    links = list(link_ids) if link_ids is not None else [rng(LINK_ID_BYTES) for _ in range(l + 1)]
    if len(links) != l + 1:
        raise OnionError("need one link ID per link: len(hops) + 1")
    body = ONION_SIZE - LAYER_OVERHEAD
    layers = []  # (eph_pub, aead_key, hop_key, keystream)
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
        next_hop = hops[h + 1].address if h + 1 < l else None
        info = _encode_info(next_hop, links[h], links[h + 1])
        if h == l - 1:
            t = tails[h]
            rest = rng(body - INFO_BYTES - len(t)) + _xor(t, keystream[body - len(t) :])
        else:
            rest = onion[: ONION_SIZE - FILLER_BYTES]
        sealed = AESGCM(aead_key).encrypt(_NONCE0, info + rest, eph_pub)
        onion = eph_pub + sealed[body:] + sealed[:body]
    return onion, PathSecrets(tuple(layer[2] for layer in layers), tuple(links), hops[0].address)


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
    next_hop, link_in, link_out = _decode_info(plain[:INFO_BYTES])
    inner = None if next_hop is None else plain[INFO_BYTES:] + filler
    return PeeledLayer(next_hop, link_in, link_out, hop_key, inner)


# --------------------------------------------------------------------------- clove layers


@dataclass(frozen=True)
class _Dir:
    hdr: bytes
    ctr: bytes
    aead: AESGCM


def _clove_keys(hop_key: bytes) -> tuple[_Dir, _Dir]:
    """(forward, return) keys of one hop; derived once per hop key and cached."""
    if not isinstance(hop_key, (bytes, bytearray)) or len(hop_key) != KEY_BYTES:
        raise CloveLayerError("a hop key is 32 bytes")
    return _derive_clove_keys(bytes(hop_key))


@lru_cache(maxsize=4096)
def _derive_clove_keys(hop_key: bytes) -> tuple[_Dir, _Dir]:
    okm = HKDFExpand(hashes.SHA256(), 6 * KEY_BYTES, _CLOVE_LABEL).derive(hop_key)
    k = [okm[i * KEY_BYTES : (i + 1) * KEY_BYTES] for i in range(6)]
    return _Dir(k[0], k[1], AESGCM(k[2])), _Dir(k[3], k[4], AESGCM(k[5]))


def _prp(key: bytes, block: bytes, inverse: bool = False) -> bytes:
    cipher = Cipher(algorithms.AES(key), modes.ECB())
    ctx = cipher.decryptor() if inverse else cipher.encryptor()
    return ctx.update(block) + ctx.finalize()


def _ctr(key: bytes, iv: bytes, data: bytes) -> bytes:
    ctx = Cipher(algorithms.AES(key), modes.CTR(iv)).encryptor()
    return ctx.update(data) + ctx.finalize()


def _split_blob(blob: bytes) -> tuple[bytes, bytes]:
    if not isinstance(blob, (bytes, bytearray)) or len(blob) < HDR_BYTES + TAG_BYTES + 4:
        raise CloveLayerError("layered clove too short")
    return bytes(blob[:HDR_BYTES]), bytes(blob[HDR_BYTES:])


def _seal(d: _Dir, payload: bytes, rng: Rng, pad_to: int | None) -> tuple[bytes, bytes]:
    plain = len(payload).to_bytes(4, "big") + bytes(payload)
    if pad_to is not None:
        if pad_to < len(payload):
            raise CloveLayerError(f"payload of {len(payload)} bytes exceeds pad_to={pad_to}")
        plain += bytes(pad_to - len(payload))
    hdr = rng(HDR_BYTES)
    return hdr, d.aead.encrypt(hdr[:12], plain, None)


def _open(d: _Dir, hdr: bytes, body: bytes) -> bytes:
    try:
        plain = d.aead.decrypt(hdr[:12], body, None)
    except InvalidTag as exc:
        raise CloveLayerError("layered clove does not authenticate (tampered or wrong path)") from exc
    n = int.from_bytes(plain[:4], "big")
    if n > len(plain) - 4:
        raise CloveLayerError("bad payload length")
    return plain[4 : 4 + n]


def _add_layer(d: _Dir, hdr: bytes, body: bytes) -> tuple[bytes, bytes]:
    hdr = _prp(d.hdr, hdr)
    return hdr, _ctr(d.ctr, hdr, body)


def _remove_layer(d: _Dir, hdr: bytes, body: bytes) -> tuple[bytes, bytes]:
    return _prp(d.hdr, hdr, inverse=True), _ctr(d.ctr, hdr, body)


def wrap_forward(path: PathSecrets, payload: bytes, rng: Rng | None = None, pad_to: int | None = None) -> bytes:
    """User side: seal `payload` for the proxy and add one layer per hop (hop 1 outermost)."""
    keys = [_clove_keys(k)[0] for k in path.hop_keys]
    hdr, body = _seal(keys[-1], payload, rng or _secrets.token_bytes, pad_to)
    for d in reversed(keys):
        hdr, body = _add_layer(d, hdr, body)
    return hdr + body


def peel_forward(hop_key: bytes, blob: bytes) -> bytes:
    """Relay side: remove this hop's layer; the result has the same size."""
    hdr, body = _remove_layer(_clove_keys(hop_key)[0], *_split_blob(blob))
    return hdr + body


def open_forward(hop_key: bytes, blob: bytes) -> bytes:
    """Proxy side: remove its layer and open the user's end-to-end seal."""
    d = _clove_keys(hop_key)[0]
    return _open(d, *_remove_layer(d, *_split_blob(blob)))


def seal_return(hop_key: bytes, payload: bytes, rng: Rng | None = None, pad_to: int | None = None) -> bytes:
    """Proxy side: seal a returning payload (a reply clove) for the user."""
    hdr, body = _seal(_clove_keys(hop_key)[1], payload, rng or _secrets.token_bytes, pad_to)
    return hdr + body


def wrap_return(hop_key: bytes, blob: bytes) -> bytes:
    """Relay side, return direction: add this hop's layer; same size."""
    hdr, body = _add_layer(_clove_keys(hop_key)[1], *_split_blob(blob))
    return hdr + body


def unwrap_return(path: PathSecrets, blob: bytes) -> bytes:
    """User side: remove the layers of hops 1..l-1 and open the proxy's seal."""
    hdr, body = _split_blob(blob)
    keys = [_clove_keys(k)[1] for k in path.hop_keys]
    for d in keys[:-1]:
        hdr, body = _remove_layer(d, hdr, body)
    return _open(keys[-1], hdr, body)

