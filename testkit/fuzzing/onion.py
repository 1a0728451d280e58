"""Oracle for the onion decoders (gentorrent.crypto.onion).

Contract checked:
1. peel(bytes, key) on arbitrary bytes, or on a genuine onion with bytes changed, raises only
   OnionError; a genuine onion (unchanged) peels to the successor it was built with;
2. peel_forward / wrap_return / open_forward / unwrap_return on arbitrary blobs and hop keys
   raise only CloveLayerError; a tampered forward clove is refused by the very next hop (per-hop
   MAC), a tampered return clove never opens to a different payload.
"""

from __future__ import annotations

from functools import lru_cache

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from gentorrent.crypto import onion
from testkit.fuzzing import Draw, Finding, expect

_ERRORS = (onion.OnionError, onion.CloveLayerError)


@lru_cache(maxsize=None)
def _relay_keys(count: int = 4) -> tuple[tuple[X25519PrivateKey, bytes], ...]:
    """Fixed relay keys: private key and its raw public key."""
    out = []
    for i in range(count):
        private = X25519PrivateKey.from_private_bytes(bytes([i + 1]) * 32)
        out.append((private, private.public_key().public_bytes_raw()))
    return tuple(out)


def _only(errors: tuple[type, ...], fn, *args):
    """fn(*args), or None when it raises one of `errors` (anything else propagates)."""
    try:
        return fn(*args)
    except errors:
        return None


def _arbitrary_onion(d: Draw) -> None:
    key = d.choice([k for k, _ in _relay_keys()] + [b"", d.bytes(32), d.bytes(31)])
    size = d.choice([onion.ONION_SIZE, onion.ONION_SIZE - 1, onion.ONION_SIZE + 1, d.below(64)])
    _only((onion.OnionError,), onion.peel, d.bytes(size), key)


def _tampered_onion(d: Draw) -> None:
    keys = _relay_keys()
    hops = d.between(1, len(keys))
    addresses = [bytes([i + 1]) * 32 for i in range(hops)]  # successors are node ids
    specs = [onion.HopSpec(addresses[i], keys[i][1]) for i in range(hops)]
    built, secrets = onion.build_onion(specs, rng=d.rng())
    blob = bytearray(built)
    changes = d.below(4)
    for _ in range(changes):
        blob[d.below(len(blob))] ^= d.between(1, 255)
    layer = _only((onion.OnionError,), onion.peel, bytes(blob), keys[0][0])
    if bytes(blob) == built:
        expect(layer is not None, "a genuine onion did not peel")
        expect(layer.next_hop == (addresses[1].hex() if hops > 1 else None), "peel gave the wrong successor")
        expect(layer.hop_key == secrets.hop_keys[0], "peel derived another hop key")
    elif layer is not None:
        raise Finding("a tampered onion peeled without OnionError")


def _clove_layers(d: Draw) -> None:
    hop_keys = tuple(d.bytes(32) for _ in range(d.between(1, 4)))
    path = onion.PathSecrets(hop_keys, tuple(bytes(16) for _ in range(len(hop_keys) + 1)), "x")
    bad_key = d.choice([hop_keys[0], b"", d.bytes(16), d.bytes(33), "text"])
    blob = d.blob(300)
    _only((onion.CloveLayerError,), onion.peel_forward, bad_key, blob)
    _only((onion.CloveLayerError,), onion.wrap_return, bad_key, blob)
    _only((onion.CloveLayerError,), onion.open_forward, bad_key, blob)
    _only((onion.CloveLayerError,), onion.unwrap_return, path, blob)
    # a genuine forward clove opens to its payload; tampered, the first hop already refuses it
    payload = d.blob(200)
    wrapped = bytearray(onion.wrap_forward(path, payload, d.below(1 << 20), rng=d.rng(),
                                           pad_to=None if d.flag() else 256))
    tampered = d.flag()
    spot = d.below(len(wrapped))
    if tampered:
        wrapped[spot] ^= d.between(1, 255)
    first = onion.peel_forward if len(hop_keys) > 1 else onion.open_forward
    if tampered:
        if _only((onion.CloveLayerError,), first, hop_keys[0], bytes(wrapped)) is not None:
            raise Finding("a tampered forward clove passed the next hop")
    else:
        blob = bytes(wrapped)
        for key in hop_keys[:-1]:
            blob = onion.peel_forward(key, blob)[1]
        opened = onion.open_forward(hop_keys[-1], blob)[1]
        expect(opened == payload, "a genuine forward clove did not open to its payload")
    # and the return direction
    sealed = onion.seal_return(hop_keys[-1], payload, rng=d.rng(b"r"))
    for key in reversed(hop_keys[:-1]):
        sealed = onion.wrap_return(key, sealed)
    back = bytearray(sealed)
    spot = d.below(len(back))
    if tampered:
        back[spot] ^= d.between(1, 255)
    opened = _only((onion.CloveLayerError,), onion.unwrap_return, path, bytes(back))
    if not tampered:
        expect(opened == payload, "a genuine return clove did not open to its payload")
    elif opened is not None and not _known_malleable(len(hop_keys), spot, opened == payload):
        raise Finding("a tampered return clove opened without CloveLayerError")


def _known_malleable(hops: int, spot: int, same_payload: bool) -> bool:
    """Reported to the lead (fuzz/README.md): on a one-hop path no PRP layer mixes the
    header, and the AEAD nonce is only hdr[:12], so hdr[12:16] can be changed without
    detection. The payload still opens unchanged; anything else is a finding."""
    return hops == 1 and 12 <= spot < onion.HDR_BYTES and same_payload


def check(data: bytes) -> None:
    d = Draw(data)
    mode = d.below(3)
    (_arbitrary_onion, _tampered_onion, _clove_layers)[mode](d)
