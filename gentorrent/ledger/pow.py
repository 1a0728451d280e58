"""The proof of work a registration carries: hashcash over Argon2id (pure, deterministic).

Registration must cost something, or one machine registers a hundred thousand relays
(ARCHITECTURE.md §3.1, THREAT_MODEL.md "Sybil relays"). The work is memory-hard per attempt
(Argon2id, through argon2-cffi's low-level `hash_secret_raw`) so that it does not get much
cheaper on hardware built for hashing, yet an attempt is small (`memory_kib`, one pass): the
committee verifies a proof with ONE attempt (about 0.4 ms at 256 KiB), so a flood of bad proofs
costs it little, while the registrant needs 2^bits attempts on average. The work binds the
chain id and the registrant's public key (and so its node id): it cannot be reused for another
identity or another network, and a node whose lease lapsed registers again with the same
nonce. `bits` and `memory_kib` come from the genesis (`gentorrent.ledger.genesis`).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from argon2.low_level import Type, hash_secret_raw

_DOMAIN = b"gentorrent/registration-pow/v1\x00"
_SALT = b"gentorrent-pow-1"  # Argon2 wants >= 8 bytes of salt; the secret carries the binding
MAX_BITS = 40


@dataclass(frozen=True)
class PowParams:
    bits: int = 0  # leading zero bits an attempt needs (0: no proof of work)
    memory_kib: int = 256  # Argon2id memory per attempt
    time_cost: int = 1

    def __post_init__(self) -> None:
        if not 0 <= self.bits <= MAX_BITS or not 8 <= self.memory_kib <= 1 << 20 or not 1 <= self.time_cost <= 10:
            raise ValueError("pow: bits 0..40, memory_kib 8..1048576, time_cost 1..10")

    @property
    def expected_attempts(self) -> int:
        return 1 << self.bits


def challenge(chain_id: str, public_key: bytes) -> bytes:
    return hashlib.sha256(_DOMAIN + chain_id.encode() + b"\x00" + public_key).digest()


def attempt(params: PowParams, chal: bytes, nonce: int) -> bytes:
    return hash_secret_raw(chal + nonce.to_bytes(8, "big"), _SALT, time_cost=params.time_cost,
                           memory_cost=params.memory_kib, parallelism=1, hash_len=32, type=Type.ID)


def _zero_bits(digest: bytes) -> int:
    n = int.from_bytes(digest, "big")
    return 256 - n.bit_length()


def verify(params: PowParams, chain_id: str, public_key: bytes, nonce: int) -> bool:
    """One attempt: whether `nonce` is a proof of work for this key on this chain."""
    if params.bits == 0:
        return True
    if not 0 <= nonce < 1 << 64:
        return False
    return _zero_bits(attempt(params, challenge(chain_id, public_key), nonce)) >= params.bits


def solve(params: PowParams, chain_id: str, public_key: bytes, start: int = 0, limit: int | None = None) -> int:
    """The first nonce from `start` that is a proof of work (about 2^bits attempts); ValueError
    after `limit` attempts."""
    if params.bits == 0:
        return 0
    chal = challenge(chain_id, public_key)
    nonce = start
    while limit is None or nonce - start < limit:
        if _zero_bits(attempt(params, chal, nonce)) >= params.bits:
            return nonce
        nonce += 1
    raise ValueError(f"no proof of work in {limit} attempts")
