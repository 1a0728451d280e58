"""Property tests of the ABCI socket framing under hostile input (oracle: testkit/fuzzing/abci_framing.py)."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings, strategies as st

from testkit.fuzzing import filtered_check
from testkit.fuzzing.abci_framing import _expected, _responses, _serve
from verifier.abci import socket_server as ss

check = filtered_check("abci_framing")


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=500))
def test_oracle_holds_on_arbitrary_input(data: bytes) -> None:
    check(data)


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 2**70 - 1))
def test_uvarint_round_trips(n: int) -> None:
    enc = ss.encode_uvarint(n)
    assert ss.decode_uvarint(enc + b"\xff") == (n, len(enc))


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=40))
def test_uvarint_decoder_raises_only_frame_error(data: bytes) -> None:
    try:
        value, end = ss.decode_uvarint(data)
    except ss.FrameError:
        return
    assert 0 < end <= min(len(data), ss.MAX_VARINT_BYTES) and value >= 0


@pytest.mark.parametrize("stream,answers", [
    (b"\xff" * 11, ["exception"]),  # prefix longer than 10 bytes
    (b"\xa1" * 10, ["exception"]),  # 10 continuation bytes, then end of stream: already invalid
    (ss.encode_uvarint(ss.WIRE.max_abci_message_bytes + 1), ["exception"]),  # oversized frame
    (ss.frame(b"\x0a"), ["exception"]),  # a truncated protobuf field
    (ss.frame(b"") + ss.frame(b"\x12\x00"), ["exception", "flush"]),  # empty Request, then Flush
    (ss.frame(b"\x12\x00")[:1], []),  # cut by the end of stream: no answer
])
def test_malformed_frames_are_answered_as_specified(stream: bytes, answers: list[str]) -> None:
    assert _expected(stream) == answers
    writer = asyncio.run(_serve(stream))
    assert [r.WhichOneof("value") for r in _responses(bytes(writer.data))] == answers
