"""ECVRF-EDWARDS25519-SHA512-TAI (RFC 9381, suite 0x03) and VRF leader election.

Why a VRF: the leader of epoch i must be unpredictable before epoch i-1 commits (so nobody can
prepare to be, or to attack, the leader) yet checkable by every member afterwards. Each member
proves over ``chain_id || epoch || prev_commit_hash`` with its VRF key; the proofs are public,
the outputs are uniformly random and unique per (key, input), so the lowest output is a fair,
verifiable draw.

Why hand-written point arithmetic: no well-kept Python library exposes edwards25519 scalar
multiplication of arbitrary points (``cryptography`` and PyNaCl only expose Ed25519 signing /
X25519). The curve code below is the RFC 8032 reference arithmetic in plain Python integers
(extended twisted-Edwards coordinates); it is not constant time, which is fine here because
VRF inputs and outputs are public and a verifier's VRF key only decides leader election.
It is checked against RFC 9381 Appendix B.3 (Examples 16-18) in tests/test_epochs_vrf.py.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Mapping, Sequence

__all__ = [
    "VrfError",
    "public_key",
    "prove",
    "verify",
    "proof_to_hash",
    "derive_vrf_secret",
    "election_input",
    "prove_leadership",
    "LeaderCandidate",
    "elect_leader",
    "PROOF_LEN",
    "OUTPUT_LEN",
    "KEY_LEN",
]

SUITE = b"\x03"  # ECVRF-EDWARDS25519-SHA512-TAI
KEY_LEN = 32
PROOF_LEN = 80  # Gamma (32) || c (16) || s (32)
OUTPUT_LEN = 64  # beta = SHA-512 output
C_LEN = 16

_P = 2**255 - 19
_Q = 2**252 + 27742317777372353535851937790883648493  # order of the base point
_D = -121665 * pow(121666, -1, _P) % _P
_SQRT_M1 = pow(2, (_P - 1) // 4, _P)
_COFACTOR = 8

Point = tuple[int, int, int, int]  # extended coordinates (X, Y, Z, T), x = X/Z, y = Y/Z, xy = T/Z
_IDENTITY: Point = (0, 1, 1, 0)


class VrfError(ValueError):
    """Malformed VRF key or proof (wrong length, not a curve point, scalar out of range)."""


# --------------------------------------------------------------------------- curve arithmetic


def _add(p1: Point, p2: Point) -> Point:
    a = (p1[1] - p1[0]) * (p2[1] - p2[0]) % _P
    b = (p1[1] + p1[0]) * (p2[1] + p2[0]) % _P
    c = 2 * p1[3] * p2[3] * _D % _P
    d = 2 * p1[2] * p2[2] % _P
    e, f, g, h = b - a, d - c, d + c, b + a
    return (e * f % _P, g * h % _P, f * g % _P, e * h % _P)


def _neg(pt: Point) -> Point:
    return ((-pt[0]) % _P, pt[1], pt[2], (-pt[3]) % _P)


def _mul(scalar: int, pt: Point) -> Point:
    result = _IDENTITY
    while scalar > 0:
        if scalar & 1:
            result = _add(result, pt)
        pt = _add(pt, pt)
        scalar >>= 1
    return result


def _equal(p1: Point, p2: Point) -> bool:
    return (p1[0] * p2[2] - p2[0] * p1[2]) % _P == 0 and (p1[1] * p2[2] - p2[1] * p1[2]) % _P == 0


def _recover_x(y: int, sign: int) -> int | None:
    if y >= _P:
        return None  # non-canonical encoding: RFC 8032 §5.1.3 step 1
    x2 = (y * y - 1) * pow(_D * y * y + 1, -1, _P) % _P
    if x2 == 0:
        return None if sign else 0
    x = pow(x2, (_P + 3) // 8, _P)
    if (x * x - x2) % _P != 0:
        x = x * _SQRT_M1 % _P
    if (x * x - x2) % _P != 0:
        return None
    if (x & 1) != sign:
        x = _P - x
    return x


def _decode_point(data: bytes) -> Point | None:
    """RFC 8032 §5.1.3 decoding; None where the string is not a (canonical) curve point."""
    if len(data) != 32:
        return None
    y = int.from_bytes(data, "little")
    sign = y >> 255
    y &= (1 << 255) - 1
    x = _recover_x(y, sign)
    if x is None:
        return None
    return (x, y, 1, x * y % _P)


def _encode_point(pt: Point) -> bytes:
    zinv = pow(pt[2], -1, _P)
    x = pt[0] * zinv % _P
    y = pt[1] * zinv % _P
    return int.to_bytes(y | ((x & 1) << 255), 32, "little")


_BASE_Y = 4 * pow(5, -1, _P) % _P
_BASE_X = _recover_x(_BASE_Y, 0)
assert _BASE_X is not None
_BASE: Point = (_BASE_X, _BASE_Y, 1, _BASE_X * _BASE_Y % _P)

# --------------------------------------------------------------------------- RFC 9381 pieces


def _secret_scalar(sk: bytes) -> tuple[int, bytes]:
    """RFC 8032 §5.1.5: clamped scalar x and the second half of SHA-512(SK) (nonce key)."""
    if len(sk) != KEY_LEN:
        raise VrfError(f"VRF secret key must be {KEY_LEN} bytes, got {len(sk)}")
    h = hashlib.sha512(sk).digest()
    x = int.from_bytes(h[:32], "little")
    x &= (1 << 254) - 8
    x |= 1 << 254
    return x, h[32:]


def _encode_to_curve(pk_string: bytes, alpha: bytes) -> Point:
    """§5.4.1.1 try-and-increment; encode_to_curve_salt = PK_string for this suite."""
    for ctr in range(256):
        digest = hashlib.sha512(SUITE + b"\x01" + pk_string + alpha + bytes([ctr]) + b"\x00").digest()
        pt = _decode_point(digest[:32])
        if pt is not None:
            return _mul(_COFACTOR, pt)
    raise VrfError("encode_to_curve found no point in 256 tries")  # probability ~2^-256


def _challenge(*points: Point) -> int:
    """§5.4.3: c = first cLen bytes of Hash(suite || 0x02 || Y || H || Gamma || U || V || 0x00)."""
    data = SUITE + b"\x02" + b"".join(_encode_point(p) for p in points) + b"\x00"
    return int.from_bytes(hashlib.sha512(data).digest()[:C_LEN], "little")


def _decode_proof(pi: bytes) -> tuple[Point, int, int]:
    if len(pi) != PROOF_LEN:
        raise VrfError(f"VRF proof must be {PROOF_LEN} bytes, got {len(pi)}")
    gamma = _decode_point(pi[:32])
    if gamma is None:
        raise VrfError("VRF proof: Gamma is not a curve point")
    c = int.from_bytes(pi[32 : 32 + C_LEN], "little")
    s = int.from_bytes(pi[32 + C_LEN :], "little")
    if s >= _Q:
        raise VrfError("VRF proof: s is not reduced modulo the group order")
    return gamma, c, s


def public_key(sk: bytes) -> bytes:
    """The 32-byte VRF public key of a 32-byte secret key (same as its Ed25519 public key)."""
    x, _ = _secret_scalar(sk)
    return _encode_point(_mul(x, _BASE))


def prove(sk: bytes, alpha: bytes) -> bytes:
    """ECVRF_prove (§5.1): the 80-byte proof pi for input alpha."""
    x, nonce_key = _secret_scalar(sk)
    y_point = _mul(x, _BASE)
    pk_string = _encode_point(y_point)
    h = _encode_to_curve(pk_string, alpha)
    h_string = _encode_point(h)
    gamma = _mul(x, h)
    k = int.from_bytes(hashlib.sha512(nonce_key + h_string).digest(), "little") % _Q  # §5.4.2.2
    c = _challenge(y_point, h, gamma, _mul(k, _BASE), _mul(k, h))
    s = (k + c * x) % _Q
    return _encode_point(gamma) + c.to_bytes(C_LEN, "little") + s.to_bytes(32, "little")


def proof_to_hash(pi: bytes) -> bytes:
    """ECVRF_proof_to_hash (§5.2): the 64-byte output beta. Only meaningful after verify()."""
    gamma, _, _ = _decode_proof(pi)
    return hashlib.sha512(SUITE + b"\x03" + _encode_point(_mul(_COFACTOR, gamma)) + b"\x00").digest()


def verify(pk: bytes, pi: bytes, alpha: bytes) -> bytes | None:
    """ECVRF_verify (§5.3, validate_key=TRUE): beta if pi is a valid proof for (pk, alpha), else None.

    Malformed keys and proofs are simply invalid here (None), so a caller checking many members'
    proofs never has to tell "wrong" from "garbled".
    """
    if len(pk) != KEY_LEN or len(pi) != PROOF_LEN:
        return None
    y_point = _decode_point(pk)
    if y_point is None or _equal(_mul(_COFACTOR, y_point), _IDENTITY):  # §5.4.5 key validation
        return None
    try:
        gamma, c, s = _decode_proof(pi)
    except VrfError:
        return None
    h = _encode_to_curve(pk, alpha)
    u = _add(_mul(s, _BASE), _neg(_mul(c, y_point)))
    v = _add(_mul(s, h), _neg(_mul(c, gamma)))
    if _challenge(y_point, h, gamma, u, v) != c:
        return None
    return proof_to_hash(pi)


# --------------------------------------------------------------------------- leader election


def election_input(chain_id: str, epoch: int, prev_commit_hash: bytes) -> bytes:
    """alpha for epoch `epoch`: length-prefixed chain id, 8-byte big-endian epoch, commit hash.

    The chain id keeps proofs of one committee useless for another; the commit hash of the
    previous epoch's last block is fixed only when that block commits, so nobody knows the
    outcome earlier.
    """
    if epoch < 0 or epoch >= 2**64:
        raise VrfError(f"epoch out of range: {epoch}")
    cid = chain_id.encode("utf-8")
    if len(cid) > 255:
        raise VrfError("chain id longer than 255 bytes")
    return b"gentorrent/vrf-leader/v1" + bytes([len(cid)]) + cid + epoch.to_bytes(8, "big") + prev_commit_hash


def derive_vrf_secret(identity_seed: bytes) -> bytes:
    """A member's VRF secret key, derived from (never equal to) its Ed25519 identity seed.

    Keeping the VRF key distinct from the signing key avoids any cross-protocol interplay
    between Ed25519 signatures and VRF proofs; the VRF public key is registered beside the
    identity in the committee registry.
    """
    if len(identity_seed) != KEY_LEN:
        raise VrfError(f"identity seed must be {KEY_LEN} bytes")
    return hashlib.sha256(b"gentorrent/vrf-key/v1" + identity_seed).digest()


def prove_leadership(vrf_secret: bytes, chain_id: str, epoch: int, prev_commit_hash: bytes) -> bytes:
    """This member's proof for epoch `epoch` (the shell publishes it in a transaction)."""
    return prove(vrf_secret, election_input(chain_id, epoch, prev_commit_hash))


@dataclass(frozen=True)
class LeaderCandidate:
    """A member's claim to lead: its id and VRF output (only built from verified proofs)."""

    member_id: str
    output: bytes


def elect_leader(
    chain_id: str,
    epoch: int,
    prev_commit_hash: bytes,
    members: Sequence[tuple[str, bytes]],
    proofs: Mapping[str, bytes],
) -> str:
    """The member whose valid VRF proof has the lowest output (ties by member id).

    `members` is the committee as (member_id, vrf_public_key); `proofs` maps member ids to the
    proofs committed to the chain for this epoch (the shell gathers them in a block so every
    member judges the same set). Proofs that do not verify, and members without a proof, cannot
    win: a member can at most withhold its own proof, never choose the outcome. Where no member
    has a valid proof the leader falls back to a hash ranking over the commit hash, which everyone
    computes alike (liveness over unpredictability for that one epoch).
    """
    if not members:
        raise VrfError("empty committee")
    ids = [m for m, _ in members]
    if len(set(ids)) != len(ids):
        raise VrfError("duplicate member id in committee")
    alpha = election_input(chain_id, epoch, prev_commit_hash)
    candidates = []
    for member_id, pk in members:
        pi = proofs.get(member_id)
        if pi is None:
            continue
        beta = verify(pk, pi, alpha)
        if beta is not None:
            candidates.append(LeaderCandidate(member_id, beta))
    if candidates:
        return min(candidates, key=lambda cand: (cand.output, cand.member_id)).member_id
    return min(ids, key=lambda m: (hashlib.sha512(alpha + m.encode("utf-8")).digest(), m))
