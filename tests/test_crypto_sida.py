"""Property tests of the S-IDA codec."""

from __future__ import annotations

import itertools
import os
import random

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from scipy import stats

from gentorrent.crypto import gf256, sida

NK = [(n, k) for n in range(1, 17) for k in range(1, n + 1)]


@st.composite
def params(draw):
    n = draw(st.integers(1, 16))
    k = draw(st.integers(1, n))
    return n, k


# --------------------------------------------------------------------------- field


def test_field_tables_agree_with_definition():
    # a * inv(a) == 1 and the table matches shift-and-reduce multiplication
    def slow_mul(a, b):
        r = 0
        while b:
            if b & 1:
                r ^= a
            a <<= 1
            if a & 0x100:
                a ^= gf256.POLY
            b >>= 1
        return r

    rng = random.Random(1)
    for _ in range(2000):
        a, b = rng.randrange(256), rng.randrange(256)
        assert gf256.MUL[a, b] == slow_mul(a, b) == gf256.mul(a, b)
    for a in range(1, 256):
        assert gf256.mul(a, gf256.inv(a)) == 1


@pytest.mark.parametrize("length", [2, 10, 4096])
def test_matmul_paths_agree(length):
    rng = np.random.default_rng(length)
    a = tuple(tuple(int(v) for v in row) for row in rng.integers(0, 256, (5, 3)))
    m = rng.integers(0, 256, (3, length), dtype=np.uint8)
    expected = np.zeros((5, length), dtype=np.uint8)
    for i in range(5):
        for j in range(3):
            expected[i] ^= gf256.MUL[a[i][j]][m[j]]
    assert np.array_equal(gf256.matmul(a, m), expected)


# --------------------------------------------------------------------------- round trips


@settings(max_examples=150, deadline=None)
@given(data=st.binary(max_size=3000), nk=params(), seed=st.integers(0, 2**32 - 1))
def test_round_trip_any_k_or_more_cloves_any_order(data, nk, seed):
    n, k = nk
    cloves = sida.split(data, n, k)
    assert len(cloves) == n
    rng = random.Random(seed)
    chosen = rng.sample(cloves, rng.randint(k, n))
    assert sida.combine(chosen) == data


@pytest.mark.parametrize(
    "size,n,k",
    [(0, 16, 16), (1, 1, 1), (65_537, 16, 7), (300_000, 5, 2), (1 << 20, 4, 3), (1 << 20, 16, 1), (1 << 20, 16, 16)],
)
def test_round_trip_large(size, n, k):
    data = os.urandom(size)
    cloves = sida.split(data, n, k)
    random.Random(size).shuffle(cloves)
    assert sida.combine(cloves[:k]) == data


@pytest.mark.parametrize("n,k", NK)
def test_every_k_subset_recovers_and_k_minus_1_fail(n, k):
    data = os.urandom(37 + n * k)
    cloves = sida.split(data, n, k)
    subsets = list(itertools.combinations(range(n), k))
    if len(subsets) > 120:  # n >= 10: every subset would take minutes; sample 120 of them
        subsets = random.Random(n * 100 + k).sample(subsets, 120)
    for idx in subsets:
        assert sida.combine([cloves[i] for i in reversed(idx)]) == data
    if k > 1:
        with pytest.raises(sida.NotEnoughClovesError):
            sida.combine(cloves[: k - 1])
        with pytest.raises(sida.NotEnoughClovesError):  # duplicates do not count twice
            sida.combine(cloves[: k - 1] * 3)


@pytest.mark.parametrize("n,k", [(4, 3), (6, 2), (10, 5), (3, 3)])
def test_every_k_subset_exhaustive(n, k):
    data = os.urandom(501)
    cloves = sida.split(data, n, k)
    for idx in itertools.combinations(range(n), k):
        assert sida.combine([cloves[i] for i in idx]) == data


@settings(max_examples=60, deadline=None)
@given(data=st.binary(max_size=5000), nk=params())
def test_clove_size_is_a_kth_plus_a_constant(data, nk):
    n, k = nk
    for clove in sida.split(data, n, k):
        body = len(data) + sida.TAG_BYTES + 1
        assert len(clove) - sida.HEADER_BYTES - sida.KEY_BYTES in range(-(-body // k), -(-body // k) + 2)


# --------------------------------------------------------------------------- corruption


def test_every_single_bit_flip_is_detected_or_skipped():
    data = b"the prompt to hide"
    cloves = sida.split(data, 4, 3)
    for victim in range(4):
        for bit in range(len(cloves[victim]) * 8):
            bad = bytearray(cloves[victim])
            bad[bit // 8] ^= 1 << (bit % 8)
            others = [c for i, c in enumerate(cloves) if i != victim]
            # exactly k cloves, one of them flipped: detected
            with pytest.raises(sida.CloveError):
                sida.combine([bytes(bad)] + others[:2])
            # more than k cloves: the flipped one is skipped
            assert sida.combine([bytes(bad)] + others) == data


@settings(max_examples=80, deadline=None)
@given(data=st.binary(max_size=2000), nk=params(), pick=st.integers(0, 2**31), seed=st.integers(0, 2**31))
@example(data=b"", nk=(6, 1), pick=145, seed=0)  # the index flip at k = 1 (see the test after this one)
def test_random_bit_flip_detected_or_skipped(data, nk, pick, seed):
    n, k = nk
    cloves = sida.split(data, n, k)
    victim = pick % n
    bad = bytearray(cloves[victim])
    bit = (pick // n) % (len(bad) * 8)
    bad[bit // 8] ^= 1 << (bit % 8)
    cloves[victim] = bytes(bad)
    random.Random(seed).shuffle(cloves)
    if n > k:
        assert sida.combine(cloves) == data
    try:
        out = sida.combine([bytes(bad)] + [c for c in cloves if c != bytes(bad)][: k - 1])
    except sida.CloveError:
        return  # detected
    # Never wrong data. The one flip that decodes is of the clove's index at k = 1: a single clove
    # is the whole (sealed) message whatever its evaluation point, so the index changes nothing.
    assert out == data
    assert k == 1 and bit // 8 == sida.HEADER_BYTES - 1


def test_at_k_1_a_flipped_clove_index_still_yields_the_message_never_other_data():
    """Found by the property above (data=b'', n=6, k=1): the flip it could not detect is harmless."""
    cloves = sida.split(b"secret", 6, 1)
    bad = bytearray(cloves[1])
    bad[sida.HEADER_BYTES - 1] ^= 1  # index 2 -> 3, still a valid point
    assert sida.combine([bytes(bad)]) == b"secret"
    bad[sida.HEADER_BYTES] ^= 1  # a flipped byte of the body: the AEAD tag fails
    with pytest.raises(sida.CloveError):
        sida.combine([bytes(bad)])


def test_cloves_of_different_messages_are_rejected():
    a = sida.split(b"A" * 100, 4, 3)
    b = sida.split(b"B" * 100, 4, 3)
    with pytest.raises(sida.CloveDecodeError):
        sida.combine([a[0], a[1], b[2]])
    with pytest.raises(sida.CloveDecodeError):
        sida.combine([a[0], b[1], a[2], b[3]])
    # with k of one message among the candidates, that message is found
    assert sida.combine([b[0], a[0], a[1], b[3], a[3]]) == b"A" * 100


@pytest.mark.parametrize(
    "bad",
    [[], [b""], [b"\x01\x04\x03\x01"], [b"\x02" + bytes(50)], ["not bytes"], [b"\x01\x03\x04\x01" + bytes(40)]],
)
def test_malformed_input_raises_clear_error(bad):
    with pytest.raises(sida.CloveError):
        sida.combine(bad)


@pytest.mark.parametrize("n,k", [(0, 0), (3, 4), (256, 3), (4, 0), (4.0, 3)])
def test_bad_parameters_rejected(n, k):
    with pytest.raises(sida.CloveError):
        sida.split(b"x", n, k)


# --------------------------------------------------------------------------- secrecy


def _longest_common_substring_over_8(a: bytes, b: bytes) -> bool:
    windows = {a[i : i + 9] for i in range(len(a) - 8)}
    return any(b[i : i + 9] in windows for i in range(len(b) - 8))


@settings(max_examples=60, deadline=None)
@given(data=st.one_of(st.binary(max_size=1500), st.just(b"\x00" * 1500), st.just(b"a" * 700)), nk=params())
def test_no_byte_string_over_8_shared_between_cloves(data, nk):
    n, k = nk
    if k == 1:  # replication: cloves are identical by definition (documented)
        return
    cloves = sida.split(data, n, k)
    for a, b in itertools.combinations(cloves, 2):
        assert not _longest_common_substring_over_8(a, b)


@pytest.mark.parametrize("k,xs", [(2, (1,)), (2, (7,)), (3, (1, 2)), (3, (2, 9)), (3, (254, 255))])
def test_k_minus_1_shares_are_exactly_uniform_for_every_secret_byte(k, xs):
    """Over all coefficient choices, k-1 shares of a secret byte hit every value tuple once.

    That is perfect secrecy for bytewise Shamir: the share distribution does not depend on
    the secret. Checked exhaustively over GF(256)^(k-1) for several secrets.
    """
    v = gf256.vandermonde(xs, k)
    coefs = np.array(list(itertools.product(range(256), repeat=k - 1)), dtype=np.uint8).T.copy()
    for secret in (0, 1, 0x80, 0xFF, 0x5A):
        m = np.vstack([np.full((1, coefs.shape[1]), secret, np.uint8), coefs])
        shares = gf256.matmul(v, m).astype(np.int64)
        code = np.zeros(shares.shape[1], np.int64)
        for row in shares:
            code = code * 256 + row
        counts = np.bincount(code, minlength=256 ** (k - 1))
        assert counts.min() == counts.max() == 1


class _KeyThenRandom:
    """rng for sida.split that returns a fixed key first, then fresh random coefficients."""

    def __init__(self, key: bytes):
        self.key, self.first = key, True

    def __call__(self, nbytes: int) -> bytes:
        if self.first:
            self.first = False
            return self.key
        return os.urandom(nbytes)


def test_key_shares_in_cloves_independent_of_key():
    """k-1 cloves' key-share bytes are uniform, with the same distribution for two keys."""
    n, k, rounds = 4, 3, 1500
    hist = []
    for key in (bytes(32), b"\xff" * 32):
        samples = []
        for _ in range(rounds):
            cloves = sida.split(b"", n, k, rng=_KeyThenRandom(key))
            samples += [np.frombuffer(c[4:36], np.uint8) for c in cloves[: k - 1]]
        counts = np.bincount(np.concatenate(samples), minlength=256)
        assert stats.chisquare(counts).pvalue > 1e-4
        hist.append(counts)
        # the fixed key really is what k shares rebuild
        rows = np.frombuffer(b"".join(c[4:36] for c in cloves[:k]), np.uint8).reshape(k, 32)
        assert gf256.matmul(gf256.vandermonde_inverse((1, 2, 3)), rows)[0].tobytes() == key
    assert stats.chi2_contingency(np.vstack(hist)).pvalue > 1e-4
