"""Cutting a prompt into chunks and hashing each chunk to a few bits (paper §3.3, Fig. 6).

Two things every node of a group must agree on, or their HR-trees cannot be merged:
the chunk-length array L (a `ChunkLayout`, produced by the Sentry and versioned by epoch and
digest) and the chunk hash (a `ChunkHasher`, seeded by ROUTING.hash_seed).

The hash is a *multilinear* universal hash (Lemire & Kaser, "Strongly universal string
hashing is fast"): h(x) = top bits of (m0 + sum_j m_{j+1} * (x_j + 1)) mod 2^64 with 64-bit
coefficients m derived from the seed by SplitMix64. It is strongly universal for 32-bit
symbols, so two different chunks of the same length collide with probability 2^-bits, which is
what gives the paper's 1/256^d false-positive rate; and it vectorises in numpy (one multiply,
one segmented sum), so hashing a 10k-token prompt costs microseconds, not a Python loop.

Only *full* chunks are hashed: a prompt's trailing partial chunk is left out, as vLLM caches
only full KV blocks, and so that a prompt and its longer continuations share tree paths.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from gentorrent.config import ROUTING, RoutingParams

_MAX_TOKEN_ID = 2**32 - 2  # the hash is universal for 32-bit symbols (we add 1)
_MAX_LAYOUT_ENTRIES = 1024
_LAYOUT_MAGIC = b"GTLY"


class LayoutError(ValueError):
    """A chunk-length array that is not usable (bad lengths, malformed encoding)."""


class TokenError(ValueError):
    """Token ids that are not a 1-D array of non-negative 32-bit integers."""


@dataclass(frozen=True)
class ChunkLayout:
    """The chunk-length array L of one epoch, followed by fixed-length default chunks.

    `epoch` counts Sentry refreshes; two layouts of one epoch are told apart by `digest`,
    so a tree built under one is never searched with chunks cut by another.
    """

    epoch: int
    lengths: tuple[int, ...]
    default_length: int = ROUTING.default_chunk_length
    max_depth: int = ROUTING.max_tree_depth
    _ends_cache: dict = field(default_factory=dict, compare=False, repr=False, hash=False)

    def __post_init__(self) -> None:
        if self.epoch < 0 or self.epoch >= 2**32:
            raise LayoutError(f"epoch {self.epoch} out of range")
        if len(self.lengths) > _MAX_LAYOUT_ENTRIES:
            raise LayoutError(f"{len(self.lengths)} entries in L (max {_MAX_LAYOUT_ENTRIES})")
        if any((not isinstance(n, int)) or n < 1 or n >= 2**32 for n in self.lengths):
            raise LayoutError("every chunk length must be a positive 32-bit integer")
        if not 1 <= self.default_length < 2**32:
            raise LayoutError("default chunk length must be positive")
        if not 1 <= self.max_depth <= 65535:
            raise LayoutError("max depth must be in 1..65535")

    @classmethod
    def default(cls, params: RoutingParams = ROUTING) -> "ChunkLayout":
        """Epoch 0: no system prompt known yet, fixed-length chunks only."""
        return cls(0, (), params.default_chunk_length, params.max_tree_depth)

    # -- identity -------------------------------------------------------------------------

    def encode(self) -> bytes:
        head = struct.pack(">4sIIHH", _LAYOUT_MAGIC, self.epoch, self.default_length,
                           self.max_depth, len(self.lengths))
        return head + struct.pack(f">{len(self.lengths)}I", *self.lengths)

    @classmethod
    def decode(cls, data: bytes) -> "ChunkLayout":
        if len(data) < 16 or data[:4] != _LAYOUT_MAGIC:
            raise LayoutError("not an encoded chunk layout")
        _, epoch, default_length, max_depth, n = struct.unpack(">4sIIHH", data[:16])
        if n > _MAX_LAYOUT_ENTRIES or len(data) != 16 + 4 * n:
            raise LayoutError("chunk layout length field does not match its size")
        lengths = struct.unpack(f">{n}I", data[16:])
        return cls(epoch, tuple(lengths), default_length, max_depth)

    @cached_property
    def digest(self) -> bytes:
        """8 bytes naming this exact layout; part of every tree delta."""
        return hashlib.blake2b(self.encode(), digest_size=8).digest()

    @property
    def layout_id(self) -> tuple[int, bytes]:
        return (self.epoch, self.digest)

    # -- cutting --------------------------------------------------------------------------

    def chunk_ends(self, n_tokens: int) -> np.ndarray:
        """End offsets of the full chunks of an n-token prompt, at most `max_depth` of them."""
        cached = self._ends_cache.get(n_tokens)
        if cached is not None:
            return cached
        fixed = np.cumsum(np.asarray(self.lengths, dtype=np.int64))
        fixed_total = int(fixed[-1]) if len(fixed) else 0
        if n_tokens >= fixed_total:
            extra = (n_tokens - fixed_total) // self.default_length
            extra = min(extra, max(0, self.max_depth - len(fixed)))
            tail = fixed_total + self.default_length * np.arange(1, extra + 1, dtype=np.int64)
            ends = np.concatenate([fixed, tail])
        else:
            ends = fixed[fixed <= n_tokens]
        ends = ends[: self.max_depth]
        if len(self._ends_cache) < 4096:
            self._ends_cache[n_tokens] = ends
        return ends

    def chunk_length_at(self, depth: int) -> int:
        """Tokens in the chunk at tree depth `depth` (1-based): the KV a tree node stands for."""
        if depth <= len(self.lengths):
            return self.lengths[depth - 1]
        return self.default_length


def _splitmix64(seed: int, count: int) -> np.ndarray:
    """`count` well-mixed 64-bit words from a seed (SplitMix64), reproducible everywhere."""
    with np.errstate(over="ignore"):
        z = np.uint64(seed & (2**64 - 1)) + (np.arange(1, count + 1, dtype=np.uint64)
                                             * np.uint64(0x9E3779B97F4A7C15))
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


class ChunkHasher:
    """Seeded multilinear hash of chunks to `bits` bits, vectorised over a whole prompt."""

    def __init__(self, bits: int = ROUTING.hash_bits, seed: int = ROUTING.hash_seed) -> None:
        if not 1 <= bits <= 16:
            raise ValueError(f"hash bits must be in 1..16, not {bits}")
        self.bits = bits
        self.seed = seed
        self._coeff = _splitmix64(seed, 1024)

    def _coefficients(self, n: int) -> np.ndarray:
        if len(self._coeff) < n:
            self._coeff = _splitmix64(self.seed, max(n, 2 * len(self._coeff)))
        return self._coeff

    def hash_chunks(self, token_ids, layout: ChunkLayout) -> np.ndarray:
        """One hash (uint16) per full chunk of the prompt, in order."""
        tokens = as_token_array(token_ids)
        ends = layout.chunk_ends(len(tokens))
        if len(ends) == 0:
            return np.zeros(0, dtype=np.uint16)
        starts = np.empty_like(ends)
        starts[0] = 0
        starts[1:] = ends[:-1]
        return self.hash_segments(tokens[: int(ends[-1])], starts, ends)

    def hash_segments(self, tokens: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
        """Hashes of contiguous segments tokens[starts[i]:ends[i]] that tile tokens[:ends[-1]]."""
        lengths = ends - starts
        coeff = self._coefficients(int(lengths.max()) + 1)
        pos = np.arange(int(ends[-1]), dtype=np.int64) - np.repeat(starts, lengths)
        with np.errstate(over="ignore"):
            terms = (tokens[: int(ends[-1])].astype(np.uint64) + np.uint64(1)) * coeff[pos + 1]
            sums = np.add.reduceat(terms, starts) + coeff[0]
        return (sums >> np.uint64(64 - self.bits)).astype(np.uint16)


def as_token_array(token_ids) -> np.ndarray:
    """Token ids as a 1-D int64 array, checked (a ValueError, never a silent wrap)."""
    arr = np.asarray(token_ids)
    if arr.ndim != 1:
        raise TokenError("token ids must be a flat sequence")
    if arr.size == 0:
        return arr.astype(np.int64)
    if not np.issubdtype(arr.dtype, np.integer):
        raise TokenError("token ids must be integers")
    arr = arr.astype(np.int64, copy=False)
    if int(arr.min()) < 0 or int(arr.max()) > _MAX_TOKEN_ID:
        raise TokenError("token ids must be in 0..2^32-2")
    return arr
