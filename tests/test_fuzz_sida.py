"""Property tests of the S-IDA clove decoder under hostile input (oracle: testkit/fuzzing/sida.py)."""

from __future__ import annotations

from hypothesis import given, settings, strategies as st

from gentorrent.crypto import sida
from testkit.fuzzing import filtered_check

check = filtered_check("sida")


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=600))
def test_oracle_holds_on_arbitrary_input(data: bytes) -> None:
    check(data)


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_k_good_cloves_decode_among_garbage(data) -> None:
    n = data.draw(st.integers(1, 6))
    k = data.draw(st.integers(1, n))
    message = data.draw(st.binary(max_size=300))
    cloves = sida.split(message, n, k)
    good = data.draw(st.lists(st.sampled_from(cloves), min_size=k, max_size=n, unique=True))
    if len({c[3] for c in good}) < k:
        good = cloves[:k]
    garbage = data.draw(st.lists(st.binary(max_size=len(cloves[0]) + 4), max_size=5))
    flipped = []
    for c in data.draw(st.lists(st.sampled_from(cloves), max_size=3)):
        i = data.draw(st.integers(0, len(c) - 1))
        flipped.append(c[:i] + bytes([c[i] ^ 0x5A]) + c[i + 1:])
    pool = data.draw(st.permutations(good + garbage + flipped))
    assert sida.combine(list(pool)) == message


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.binary(max_size=120), st.none(), st.integers(), st.text(max_size=4)), max_size=10))
def test_arbitrary_cloves_raise_only_clove_error(cloves) -> None:
    try:
        out = sida.combine(cloves)
    except sida.CloveError:
        return
    assert isinstance(out, bytes)


def test_non_list_input_and_hopeless_sets_end_in_clove_error() -> None:
    import pytest

    with pytest.raises(sida.CloveError):
        sida.combine(b"not a list of cloves")  # type: ignore[arg-type]
    cloves = sida.split(bytes(10), 16, 8)
    broken = [c[:-1] + bytes([c[-1] ^ 1]) for c in cloves]  # every clove corrupted
    with pytest.raises(sida.CloveDecodeError):  # C(16, 8) subsets: gives up at MAX_SUBSETS
        sida.combine(broken)
