"""(n, k) Secure Information Dispersal (S-IDA), ARCHITECTURE.md §3.3 and paper §3.2.

split(data, n, k):
  1. K = 32 fresh random bytes; C = AES-256-GCM_K(nonce = 0^12, data, aad = ver|n|k).
     A zero nonce is safe because K is used for exactly one message.
  2. C is padded ISO/IEC 7816-4 style (0x80 then zeros) to k segments of even length s.
  3. A k x (32 + s) matrix M is formed: row j = coef_j | segment_j with coef_0 = K and
     coef_1..coef_{k-1} fresh random bytes.
  4. Clove i (i = 1..n) carries row i of V . M over GF(2^8), V the n x k Vandermonde matrix
     on the points x = 1..n. On the first 32 columns this is bytewise Shamir k-of-n of K;
     on the rest it is Rabin's IDA of C. One matrix product does both.

Clove format (bytes)::

    ver (1) | n (1) | k (1) | x (1) | key share (32) | IDA row (s)

so |clove| = 36 + s with s ~ (|data| + 17) / k. Only ver|n|k (3 bytes) are common to the
cloves of one message; there is no message id. Everything else is a distinct linear
combination of ciphertext and random coefficients, so for k >= 2 no byte string longer than
8 bytes is shared between cloves of one message (k = 1 is plain replication: cloves are
identical by definition; the overlay's per-hop layers still make them differ on the wire).

combine(cloves): the receiver has no message id to group cloves by, so it is handed the
candidate cloves and finds a k-subset (distinct x, same n, k and length) whose decode passes
the AEAD tag. The tag covers the whole ciphertext and the key, so a corrupted clove or a mix
of messages makes that subset fail, and other subsets are tried: first the k-windows of a
rotation (each skips some clove, so one bad clove among > k costs at most a few decodes),
then every remaining subset up to MAX_SUBSETS.
"""

from __future__ import annotations

import itertools
import secrets
from typing import Callable, Iterable

import numpy as np
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from gentorrent.crypto import gf256

VERSION = 1
HEADER_BYTES = 4
KEY_BYTES = 32
TAG_BYTES = 16
MAX_N = 255  # evaluation points are the non-zero elements of GF(256)
MAX_SUBSETS = 4096  # bound on decode attempts in one combine()
#: bound on the work of one combine(), in units of k^3 (a k x k inversion per attempt): 4096
#: attempts at k = 3, one at k = 128, so hostile headers cannot buy seconds of CPU
MAX_DECODE_WORK = MAX_SUBSETS * 27
_NONCE = bytes(12)


class CloveError(ValueError):
    """Base class: the cloves given cannot be turned back into a message."""


class CloveFormatError(CloveError):
    """A clove is not a well-formed S-IDA clove of this version."""


class NotEnoughClovesError(CloveError):
    """Fewer than k well-formed cloves with distinct indices."""


class CloveDecodeError(CloveError):
    """No k-subset decodes: cloves are corrupted or belong to different messages."""


# --------------------------------------------------------------------------- split


def _check_params(n: int, k: int) -> None:
    if not (isinstance(n, int) and isinstance(k, int)) or not (1 <= k <= n <= MAX_N):
        raise CloveError(f"need integers 1 <= k <= n <= {MAX_N}, got n={n!r}, k={k!r}")


def _segment_length(ct_len: int, k: int) -> int:
    s = -(-(ct_len + 1) // k)  # room for the 0x80 marker
    return s + (s & 1)  # even rows let gf256.matmul work on byte pairs


def split(data: bytes, n: int, k: int, *, rng: Callable[[int], bytes] | None = None) -> list[bytes]:
    """Seal `data` under a fresh key and disperse it into n cloves, any k of which rebuild it.

    `rng(nbytes)` supplies the key and then the Shamir coefficients; it defaults to
    `secrets.token_bytes` and is a parameter only so tests can fix the key.
    """
    _check_params(n, k)
    rng = rng or secrets.token_bytes
    header = bytes((VERSION, n, k))
    key = rng(KEY_BYTES)
    ct = AESGCM(key).encrypt(_NONCE, bytes(data), header)
    s = _segment_length(len(ct), k)
    m = np.zeros((k, KEY_BYTES + s), dtype=np.uint8)
    m[:, :KEY_BYTES] = np.frombuffer(key + rng(KEY_BYTES * (k - 1)), np.uint8).reshape(k, KEY_BYTES)
    padded = ct + b"\x80" + bytes(k * s - len(ct) - 1)
    m[:, KEY_BYTES:] = np.frombuffer(padded, np.uint8).reshape(k, s)
    xs = tuple(range(1, n + 1))
    rows = gf256.matmul(gf256.vandermonde(xs, k), m)
    return [header + bytes((x,)) + rows[i].tobytes() for i, x in enumerate(xs)]


# --------------------------------------------------------------------------- combine


def _parse(clove: bytes) -> tuple[int, int, int] | None:
    """(n, k, x) of a well-formed clove, else None."""
    if not isinstance(clove, (bytes, bytearray, memoryview)):
        return None
    if len(clove) < HEADER_BYTES + KEY_BYTES + 2 or (len(clove) - HEADER_BYTES) % 2:
        return None
    ver, n, k, x = clove[0], clove[1], clove[2], clove[3]
    if ver != VERSION or not (1 <= k <= n) or not (1 <= x <= n):
        return None
    return n, k, x


def _decode(n: int, k: int, subset: tuple[bytes, ...]) -> bytes | None:
    xs = tuple(c[3] for c in subset)
    rows = np.frombuffer(b"".join(bytes(c)[HEADER_BYTES:] for c in subset), np.uint8).reshape(k, -1)
    m = gf256.matmul(gf256.vandermonde_inverse(xs), rows)
    key = m[0, :KEY_BYTES].tobytes()
    padded = m[:, KEY_BYTES:].tobytes().rstrip(b"\x00")
    if not padded or padded[-1] != 0x80:
        return None
    try:
        return AESGCM(key).decrypt(_NONCE, padded[:-1], bytes((VERSION, n, k)))
    except InvalidTag:
        return None


def _subsets(cands: list[bytes], k: int) -> Iterable[tuple[bytes, ...]]:
    """k-subsets with distinct x: rotation windows first, then all the others."""
    c = len(cands)
    seen: set[tuple[int, ...]] = set()
    windows = (tuple((start + i) % c for i in range(k)) for start in range(c))
    for step, idx in enumerate(itertools.chain(windows, itertools.combinations(range(c), k))):
        if step >= 8 * MAX_SUBSETS:  # many candidates repeating one index: still bounded
            raise CloveDecodeError("too many candidate subsets")
        key = tuple(sorted(idx))
        if key in seen:
            continue
        seen.add(key)
        subset = tuple(cands[i] for i in key)
        if len({cl[3] for cl in subset}) == k:
            yield subset


def combine(cloves: list[bytes], *, expect: tuple[int, int] | None = None) -> bytes:
    """Rebuild the message from any >= k cloves of it, in any order; skips corrupted ones.

    `expect=(n, k)`: a receiver that knows the parameters it uses (the overlay does) treats
    cloves claiming other ones as malformed, so a hostile header cannot pick an expensive k.
    """
    if not isinstance(cloves, (list, tuple)):
        raise CloveError("combine() takes a list of cloves")
    groups: dict[tuple[int, int, int], list[bytes]] = {}
    malformed = 0
    for clove in cloves:
        meta = _parse(clove)
        if meta is None or (expect is not None and meta[:2] != tuple(expect)):
            malformed += 1
            continue
        group = groups.setdefault((meta[0], meta[1], len(clove)), [])
        if bytes(clove) not in group:
            group.append(bytes(clove))
    viable = [(key, g) for key, g in groups.items() if len({c[3] for c in g}) >= key[1]]
    if not viable:
        raise NotEnoughClovesError(
            f"fewer than k well-formed cloves of one message ({len(cloves)} given, {malformed} malformed)"
        )
    viable.sort(key=lambda item: -len(item[1]))
    attempts = work = 0
    for (n, k, _), cands in viable:
        cands.sort(key=lambda c: c[3])
        for subset in _subsets(cands, k):
            work += max(k, 3) ** 3
            if attempts >= MAX_SUBSETS or work > MAX_DECODE_WORK:
                raise CloveDecodeError(f"gave up after {attempts} k-subsets (decode budget spent)")
            attempts += 1
            message = _decode(n, k, subset)
            if message is not None:
                return message
    raise CloveDecodeError(f"no k-subset of {len(cloves)} cloves decodes: corrupted or mixed messages")
