"""Oracle for the ABCI socket framing and dispatch (verifier/abci/socket_server.py).

Contract checked:
1. decode_uvarint of arbitrary bytes raises only FrameError; encode_uvarint round-trips;
2. a connection fed an arbitrary byte stream (then end of stream) is served by the real
   `_Connections._serve` loop without any exception other than IncompleteReadError (a frame
   cut by the end of stream, which the caller logs), and what it writes back is exactly one
   well-formed, length-prefixed Response per complete request frame, of the request's kind or
   an exception; a malformed frame gets one exception Response and ends the connection.
   The expected answers come from an independent re-implementation of the framing below.
"""

from __future__ import annotations

import asyncio

from google.protobuf.message import DecodeError

from testkit.fuzzing import Draw, Finding, cpu_budget, expect
from gentorrent.wire.abci import types_pb2 as abci
from verifier.abci import socket_server as ss
from verifier.abci.interface import (BlockContext, FinalizeResult, InfoResult, QueryResult, TxResult,
                                     ValidatorInfo)

LIMIT = ss.WIRE.max_abci_message_bytes


class _App:
    """A fixed-answer app: the oracle tests framing and dispatch, not the registry."""

    def info(self) -> InfoResult:
        return InfoResult(last_block_height=0, last_block_app_hash=b"")

    def validators(self) -> tuple[ValidatorInfo, ...]:
        return (ValidatorInfo(bytes(32), 1),)

    def init_chain(self, chain_id, validators, app_state, time_ms) -> bytes:
        return b"\x00" * 32

    def check_tx(self, tx: bytes) -> TxResult:
        return TxResult(code=0 if tx else 1, events=(("k", "v"),))

    def prepare_proposal(self, txs, max_tx_bytes, ctx: BlockContext) -> list[bytes]:
        return list(txs)[:4]

    def process_proposal(self, txs, ctx: BlockContext) -> bool:
        return len(txs) % 2 == 0

    def finalize_block(self, txs, ctx: BlockContext) -> FinalizeResult:
        return FinalizeResult(tuple(TxResult(code=0) for _ in txs), b"\x01" * 32,
                              (ValidatorInfo(ctx.proposer[:32].ljust(32, b"\x00"), 1),))

    def commit(self) -> int:
        return 0

    def query(self, path, data, height=0) -> QueryResult:
        if path == "/raise":
            raise RuntimeError("app failure")
        return QueryResult(code=0, value=data[:8], height=height)


class _Writer:
    def __init__(self) -> None:
        self.data = bytearray()

    def write(self, data: bytes) -> None:
        self.data += data

    async def drain(self) -> None:
        return None

    def close(self) -> None:
        return None

    def get_extra_info(self, name, default=None):
        return ("fuzz", 0) if name == "peername" else default


def _expected(stream: bytes) -> list[str]:
    """Kinds of the responses a correct server writes for `stream` ("exception" included)."""
    out, pos = [], 0
    while pos < len(stream):
        value, shift, i = 0, 0, pos
        while True:
            if i - pos >= ss.MAX_VARINT_BYTES:  # 10 continuation bytes: bad whatever follows
                return out + ["exception"]
            if i >= len(stream):
                return out  # cut inside the prefix: end of stream, no answer
            byte = stream[i]
            value |= (byte & 0x7F) << shift
            shift += 7
            i += 1
            if not byte & 0x80:
                break
        if value > LIMIT:
            return out + ["exception"]
        if i + value > len(stream):
            return out  # cut inside the body
        body = stream[i:i + value]
        pos = i + value
        try:
            req = abci.Request.FromString(body)
        except DecodeError:
            return out + ["exception"]
        out.append(req.WhichOneof("value") or "exception")
    return out


def _responses(data: bytes) -> list[abci.Response]:
    out, pos = [], 0
    while pos < len(data):
        length, pos = ss.decode_uvarint(data, pos)
        expect(pos + length <= len(data), "a response frame is cut short")
        out.append(abci.Response.FromString(data[pos:pos + length]))
        pos += length
    return out


async def _serve(stream: bytes) -> _Writer:
    reader = asyncio.StreamReader(limit=2**16)
    reader.feed_data(stream)
    reader.feed_eof()
    writer = _Writer()
    try:
        await ss._Connections(ss.AbciHandler(_App()))._serve(reader, writer)
    except asyncio.IncompleteReadError:
        pass  # end of stream inside a frame: _Connections.__call__ logs it and closes
    return writer


_LOOP = asyncio.new_event_loop()


def _requests(d: Draw) -> bytes:
    """A stream of mostly well-formed frames of real requests, with damage here and there."""
    kinds = [
        abci.Request(echo=abci.RequestEcho(message=d.blob(6).decode("latin-1"))),
        abci.Request(flush=abci.RequestFlush()),
        abci.Request(info=abci.RequestInfo()),
        abci.Request(check_tx=abci.RequestCheckTx(tx=d.blob(8))),
        abci.Request(query=abci.RequestQuery(path=d.choice(["/x", "/raise"]), data=d.blob(4))),
        abci.Request(commit=abci.RequestCommit()),
        abci.Request(finalize_block=abci.RequestFinalizeBlock(txs=[d.blob(4)], height=d.uint(2),
                                                              proposer_address=d.blob(20))),
        abci.Request(process_proposal=abci.RequestProcessProposal(txs=[d.blob(3)] * d.below(3))),
        abci.Request(init_chain=abci.RequestInitChain(chain_id="c", validators=[abci.ValidatorUpdate(
            pub_key=abci.PublicKey(ed25519=d.blob(32)) if d.flag() else abci.PublicKey(), power=1)])),
        abci.Request(prepare_proposal=abci.RequestPrepareProposal(txs=[d.blob(3)], max_tx_bytes=d.uint(2))),
        abci.Request(extend_vote=abci.RequestExtendVote()),
        abci.Request(verify_vote_extension=abci.RequestVerifyVoteExtension(vote_extension=d.blob(2))),
        abci.Request(offer_snapshot=abci.RequestOfferSnapshot()),
        abci.Request(),
    ]
    out = bytearray()
    for _ in range(d.between(1, 6)):
        frame = bytearray(ss.frame(d.choice(kinds).SerializeToString()))
        if d.below(6) == 0 and frame:
            frame[d.below(len(frame))] = d.uint(1)
        out += frame
    if d.below(4) == 0:
        out += d.blob(12)
    return bytes(out)


def check(data: bytes) -> None:
    d = Draw(data)
    mode = d.below(3)
    if mode == 0:  # the varint codec alone
        raw = d.rest()
        try:
            value, end = ss.decode_uvarint(raw)
        except ss.FrameError:
            return
        expect(0 < end <= min(len(raw), ss.MAX_VARINT_BYTES), "decode_uvarint ended outside its input")
        expect(ss.decode_uvarint(ss.encode_uvarint(value)) == (value, len(ss.encode_uvarint(value))),
               f"uvarint {value} does not round-trip")
        return
    stream = d.rest() if mode == 1 else _requests(d)
    with cpu_budget(5.0, "ABCI _serve"):
        writer = _LOOP.run_until_complete(_serve(stream))
    try:
        got = _responses(bytes(writer.data))
    except (ss.FrameError, DecodeError) as exc:
        raise Finding(f"the server wrote a malformed response stream: {exc}") from exc
    want = _expected(stream)
    kinds = [r.WhichOneof("value") for r in got]
    expect(len(kinds) == len(want), f"{len(kinds)} responses {kinds} for expected {want}")
    for k, w in zip(kinds, want):
        expect(k == w or k == "exception", f"a {w} request was answered with {k}")
