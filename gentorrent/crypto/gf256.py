"""Arithmetic in GF(2^8), vectorised with numpy, shared by the IDA and Shamir parts of S-IDA.

Why our own: the matrix sizes are tiny (k, n <= 255) while the data is long, so the only
hot operation is "row of constants times a long byte vector".  A 256x256 product table
turns that into table gathers plus XORs; for long rows a per-constant 65,536-entry
table over byte *pairs* halves the number of gathers (the measured bottleneck).

Field: polynomial x^8 + x^4 + x^3 + x^2 + 1 (0x11d), generator 2 — the usual Reed–Solomon
choice. Addition is XOR.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

POLY = 0x11D

# --------------------------------------------------------------------------- tables


def _build_tables() -> tuple[list[int], list[int]]:
    exp = [0] * 512
    log = [0] * 256
    x = 1
    for i in range(255):
        exp[i] = x
        log[x] = i
        x <<= 1
        if x & 0x100:
            x ^= POLY
    for i in range(255, 512):
        exp[i] = exp[i - 255]
    return exp, log


EXP, LOG = _build_tables()


def mul(a: int, b: int) -> int:
    if a == 0 or b == 0:
        return 0
    return EXP[LOG[a] + LOG[b]]


def inv(a: int) -> int:
    if a == 0:
        raise ZeroDivisionError("0 has no inverse in GF(256)")
    return EXP[255 - LOG[a]]


def pow_(a: int, e: int) -> int:
    if e == 0:
        return 1
    if a == 0:
        return 0
    return EXP[(LOG[a] * e) % 255]


def _mul_table() -> np.ndarray:
    a = np.arange(256)
    log = np.array(LOG)
    exp = np.array(EXP)
    table = exp[(log[:, None] + log[None, :])].astype(np.uint8)
    table[0, :] = 0
    table[:, 0] = 0
    assert table[3, 7] == mul(3, 7) and table[a[-1], 2] == mul(255, 2)
    return table


MUL = _mul_table()  # MUL[a, b] = a * b
_MUL_FLAT = MUL.ravel()

# --------------------------------------------------------------------------- matrices


@lru_cache(maxsize=1024)
def vandermonde(xs: tuple[int, ...], k: int) -> tuple[tuple[int, ...], ...]:
    """Rows [1, x, x^2, ..., x^(k-1)]: any k rows with distinct non-zero x are invertible.

    Row x applied to (secret, r1, ..., r_{k-1}) is Shamir's share at x, and applied to
    k data segments it is Rabin's IDA: one matrix does both.
    """
    return tuple(tuple(pow_(x, j) for j in range(k)) for x in xs)


@lru_cache(maxsize=1024)
def vandermonde_inverse(xs: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
    """Inverse of vandermonde(xs, len(xs)) by Gauss–Jordan; cached per index subset."""
    k = len(xs)
    if len(set(xs)) != k or 0 in xs:
        raise ValueError("evaluation points must be distinct and non-zero")
    a = [list(row) + [1 if i == j else 0 for j in range(k)] for i, row in enumerate(vandermonde(xs, k))]
    for col in range(k):
        pivot = next(r for r in range(col, k) if a[r][col])
        a[col], a[pivot] = a[pivot], a[col]
        f = inv(a[col][col])
        a[col] = [mul(f, v) for v in a[col]]
        for r in range(k):
            if r != col and a[r][col]:
                g = a[r][col]
                a[r] = [v ^ mul(g, p) for v, p in zip(a[r], a[col])]
    return tuple(tuple(row[k:]) for row in a)


# --------------------------------------------------------------------------- products


@lru_cache(maxsize=64)
def _pair_table(a: int) -> np.ndarray:
    """T[hi*256 + lo] = (a*hi) << 8 | (a*lo), for little-endian uint16 views of byte pairs."""
    row = MUL[a].astype("<u2")
    return ((row[:, None] << 8) | row[None, :]).ravel()


_PAIR_THRESHOLD = 1024  # row length from which the byte-pair tables pay off


def matmul(a: tuple[tuple[int, ...], ...], m: np.ndarray) -> np.ndarray:
    """(r x k constants) . (k x L uint8 matrix) over GF(256) -> r x L uint8 (C-contiguous)."""
    k, length = m.shape
    if len(a) and len(a[0]) != k:
        raise ValueError("shape mismatch")
    if length < _PAIR_THRESHOLD or length % 2:
        idx = (np.asarray(a, dtype=np.intp) << 8)[:, :, None] + m[None, :, :]
        return np.bitwise_xor.reduce(_MUL_FLAT[idx], axis=1)
    pairs = np.ascontiguousarray(m).view("<u2")
    out = np.zeros((len(a), length // 2), dtype="<u2")
    tmp = np.empty(length // 2, dtype="<u2")
    for i, row in enumerate(a):
        acc = out[i]
        for j, c in enumerate(row):
            if c == 0:
                continue
            if c == 1:
                acc ^= pairs[j]
            else:
                np.take(_pair_table(c), pairs[j], out=tmp)
                acc ^= tmp
    return out.view(np.uint8)
