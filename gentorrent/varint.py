"""Unsigned varints (LEB128: protobuf's, hence ABCI's length prefixes, and the sizes inside the
registry's proofs): one encoder for every place that writes them."""

from __future__ import annotations


def encode_uvarint(n: int) -> bytes:
    """`n` in 7-bit groups, least significant first, the high bit set on all but the last."""
    if n < 0:
        raise ValueError("uvarint of a negative number")
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)
