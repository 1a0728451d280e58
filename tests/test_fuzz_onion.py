"""Property tests of the onion decoders under hostile input (oracle: testkit/fuzzing/onion.py)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from gentorrent.crypto import onion
from testkit.fuzzing import filtered_check
from testkit.fuzzing.onion import _relay_keys

check = filtered_check("onion")


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=600))
def test_oracle_holds_on_arbitrary_input(data: bytes) -> None:
    check(data)


@settings(max_examples=100, deadline=None)
@given(st.binary(min_size=onion.ONION_SIZE, max_size=onion.ONION_SIZE))
def test_random_onion_of_the_right_size_is_refused(blob: bytes) -> None:
    with pytest.raises(onion.OnionError):
        onion.peel(blob, _relay_keys()[0][0])


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=400), st.binary(min_size=32, max_size=32))
def test_random_layered_blobs_raise_only_clove_layer_error(blob: bytes, key: bytes) -> None:
    path = onion.PathSecrets((key, key[::-1]), (bytes(16),) * 3, "x")
    for fn in (lambda: onion.peel_forward(key, blob), lambda: onion.wrap_return(key, blob),
               lambda: onion.open_forward(key, blob), lambda: onion.unwrap_return(path, blob)):
        try:
            fn()
        except onion.CloveLayerError:
            pass


def test_one_hop_return_header_tail_is_unauthenticated_but_harmless() -> None:
    """Documents a finding (reported): on a one-hop path hdr[12:16] is not authenticated.
    The payload still opens unchanged, so integrity of content holds."""
    key = bytes(range(32))
    path = onion.PathSecrets((key,), (bytes(16),) * 2, "x")
    sealed = bytearray(onion.seal_return(key, b"reply"))
    sealed[13] ^= 1
    assert onion.unwrap_return(path, bytes(sealed)) == b"reply"
    sealed[3] ^= 1  # a nonce byte: detected
    with pytest.raises(onion.CloveLayerError):
        onion.unwrap_return(path, bytes(sealed))
