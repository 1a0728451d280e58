"""The ABCI socket server, spoken to byte for byte as CometBFT v0.38 would.

Golden frames in tests/data/abci_golden/ are hand-assembled from CometBFT's field numbers;
responses are read with the small independent protobuf reader below, never with the
generated code, so a wrong field number in proto/abci/types.proto cannot hide itself.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
from pathlib import Path

import pytest

from gentorrent.crypto.keys import Identity, OnionKey
from gentorrent.wire.abci import types_pb2 as abci
from gentorrent.ledger import txs
from gentorrent.ledger import queries
from verifier.abci.app import RegistryApp
from verifier.abci.socket_server import bound_address, decode_uvarint, encode_uvarint, frame, parse_address, serve

GOLDEN = Path(__file__).parent / "data" / "abci_golden"
TIMEOUT = 10.0
pytestmark = pytest.mark.timeout(60)


def golden(name: str) -> bytes:
    text = (GOLDEN / f"{name}.hex").read_text()
    return bytes.fromhex("".join(re.sub(r"#.*", "", line) for line in text.splitlines()))


# --------------------------------------------------------------------------- independent reader


def fields(data: bytes) -> list[tuple[int, int, object]]:
    """(field number, wire type, value) of a protobuf message: varints as int, LEN as bytes."""
    out, pos = [], 0
    while pos < len(data):
        key, pos = decode_uvarint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = decode_uvarint(data, pos)
        elif wire == 2:
            n, pos = decode_uvarint(data, pos)
            value, pos = data[pos:pos + n], pos + n
        else:
            raise AssertionError(f"unexpected wire type {wire}")
        out.append((number, wire, value))
    return out


def only(data: bytes) -> tuple[int, bytes]:
    """The single oneof member of a Response: (field number, body)."""
    (number, wire, value), = fields(data)
    assert wire == 2
    return number, value  # type: ignore[return-value]


def unframe(data: bytes) -> bytes:
    n, off = decode_uvarint(data)
    assert off + n == len(data)
    return data[off:]


def field(data: bytes, number: int, default=None):
    return next((v for n, _, v in fields(data) if n == number), default)


class Conn:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, address: str) -> "Conn":
        host, port = address[len("tcp://"):].rsplit(":", 1)
        return cls(*await asyncio.wait_for(asyncio.open_connection(host, int(port)), TIMEOUT))

    async def send(self, *frames: bytes) -> None:
        self.writer.write(b"".join(frames))
        await self.writer.drain()

    async def recv(self) -> bytes:
        """One whole response frame, length prefix included."""
        prefix = b""
        while True:
            prefix += await asyncio.wait_for(self.reader.readexactly(1), TIMEOUT)
            if not prefix[-1] & 0x80:
                break
        n, _ = decode_uvarint(prefix)
        return prefix + await asyncio.wait_for(self.reader.readexactly(n), TIMEOUT)

    async def call(self, request_frame: bytes) -> tuple[int, bytes]:
        """Send a request and a Flush; return the response's (oneof field, body)."""
        await self.send(request_frame, golden("request_flush"))
        resp = await self.recv()
        assert await self.recv() == golden("response_flush")
        return only(unframe(resp))

    async def close(self) -> None:
        self.writer.close()


def request(field_number: int, body: bytes) -> bytes:
    """Hand-assembled Request{<field_number>: body} frame (for bodies built in the tests)."""
    return frame(encode_uvarint(field_number << 3 | 2) + encode_uvarint(len(body)) + body)


def bytes_field(number: int, data: bytes) -> bytes:
    return encode_uvarint(number << 3 | 2) + encode_uvarint(len(data)) + data


def varint_field(number: int, value: int) -> bytes:
    return encode_uvarint(number << 3) + encode_uvarint(value)


@pytest.fixture
async def server(tmp_path):
    app = RegistryApp(tmp_path / "state.db")
    srv = await serve(app, "tcp://127.0.0.1:0")
    yield app, bound_address(srv)
    srv.close()
    await srv.wait_closed()
    app.close()


# --------------------------------------------------------------------------- tests


def test_uvarint_framing_is_unsigned_not_zigzag():
    assert encode_uvarint(1) == b"\x01"  # zigzag would give 02
    assert encode_uvarint(300) == b"\xac\x02"
    assert decode_uvarint(b"\xac\x02") == (300, 2)
    assert frame(b"x" * 200)[:2] == b"\xc8\x01"


def test_golden_requests_decode_to_the_intended_fields():
    req = abci.Request.FromString(unframe(golden("request_echo")))
    assert req.echo.message == "hello"
    req = abci.Request.FromString(unframe(golden("request_info")))
    assert (req.info.version, req.info.block_version, req.info.p2p_version, req.info.abci_version) == (
        "0.38.17", 11, 8, "2.0.0")
    req = abci.Request.FromString(unframe(golden("request_init_chain")))
    ic = req.init_chain
    assert ic.chain_id == "gt-golden" and ic.time.seconds == 1_700_000_000 and ic.initial_height == 1
    assert ic.validators[0].pub_key.ed25519 == Identity.from_seed(bytes([7]) * 32).public_key
    assert ic.validators[0].power == 10 and ic.app_state_bytes == b"{}"
    assert abci.Request.FromString(unframe(golden("request_check_tx"))).check_tx.tx == b"\x00garbage"
    fb = abci.Request.FromString(unframe(golden("request_finalize_block"))).finalize_block
    assert fb.height == 1 and fb.time.seconds == 1_700_000_001 and list(fb.txs) == []
    assert abci.Request.FromString(unframe(golden("request_query"))).query.path == "/info"
    for name, kind in (("request_flush", "flush"), ("request_commit", "commit"),
                       ("request_list_snapshots", "list_snapshots")):
        assert abci.Request.FromString(unframe(golden(name))).WhichOneof("value") == kind


async def test_echo_and_flush_are_byte_exact(server):
    _, address = server
    c = await Conn.open(address)
    # three requests in one write: answers come in order, the Flush answer last
    await c.send(golden("request_echo"), golden("request_echo"), golden("request_flush"))
    assert await c.recv() == golden("response_echo")
    assert await c.recv() == golden("response_echo")
    assert await c.recv() == golden("response_flush")
    await c.send(golden("request_flush"))  # a Flush with nothing pending is still answered
    assert await c.recv() == golden("response_flush")
    await c.close()


async def test_a_whole_chain_over_four_connections(server):
    app, address = server
    consensus, mempool, query, snapshot = [await Conn.open(address) for _ in range(4)]

    number, body = await consensus.call(golden("request_info"))
    assert number == 4  # Response.info
    assert field(body, 4, 0) == 0 and field(body, 5, b"") == b""  # height 0, no app hash yet
    assert field(body, 1) == b"gentorrent-registry"

    number, body = await consensus.call(golden("request_init_chain"))
    assert number == 6
    genesis_hash = field(body, 3)
    assert len(genesis_hash) == 32 and genesis_hash == app.info().last_block_app_hash

    number, body = await mempool.call(golden("request_check_tx"))
    assert number == 9 and field(body, 1) == txs.CODE_MALFORMED and field(body, 3)  # code + log
    assert field(body, 8) == b"gentorrent-registry"  # codespace

    user = Identity.from_seed(bytes([9]) * 32)
    reg = txs.register_user(user, "127.0.0.1:7000", OnionKey.generate().public_key, "eu", 1, chain_id="gt-golden")
    number, body = await mempool.call(request(8, bytes_field(1, reg)))
    assert number == 9 and field(body, 1, 0) == 0

    # ProcessProposal then FinalizeBlock of height 1 carrying the registration
    proposer = hashlib.sha256(Identity.from_seed(bytes([7]) * 32).public_key).digest()[:20]
    ts = bytes_field(6, varint_field(1, 1_700_000_001))
    block = bytes_field(1, reg) + varint_field(5, 1) + ts + bytes_field(8, proposer)
    number, body = await consensus.call(request(17, block))
    assert number == 18 and field(body, 1) == 1  # ACCEPT
    number, body = await consensus.call(request(20, block))
    assert number == 21
    results = [v for n, _, v in fields(body) if n == 2]
    assert len(results) == 1 and field(results[0], 1, 0) == 0
    app_hash = field(body, 5)
    assert len(app_hash) == 32 and app_hash != genesis_hash

    number, body = await consensus.call(golden("request_commit"))
    assert number == 12
    await consensus.send(golden("request_commit"), golden("request_flush"))  # a second commit: an app error
    number, body = only(unframe(await consensus.recv()))
    assert number == 1 and b"commit" in field(body, 1)  # ResponseException, then the Flush
    assert await consensus.recv() == golden("response_flush")

    number, body = await query.call(golden("request_query"))
    assert number == 7 and field(body, 1, 0) == 0 and field(body, 9) == 1
    assert b'"users": 1' in field(body, 7)
    number, body = await query.call(request(6, bytes_field(2, b"/proof/catalog")))
    assert queries.decode_answer(field(body, 7), 1 << 20).app_hash == app_hash

    assert await snapshot.call(golden("request_list_snapshots")) == (13, b"")

    number, body = await consensus.call(golden("request_info"))
    assert field(body, 4) == 1 and field(body, 5) == app_hash
    for c in (consensus, mempool, query, snapshot):
        await c.close()


async def test_golden_empty_block_then_commit_is_byte_exact(server):
    app, address = server
    c = await Conn.open(address)
    await c.call(golden("request_init_chain"))
    number, body = await c.call(golden("request_finalize_block"))
    assert number == 21 and [n for n, _, _ in fields(body)] == [5]  # no tx results, just the app hash
    await c.send(golden("request_commit"), golden("request_flush"))
    assert await c.recv() == golden("response_commit")
    assert await c.recv() == golden("response_flush")
    assert app.info().last_block_height == 1 and app.info().last_block_app_hash == field(body, 5)
    await c.close()


async def test_malformed_and_oversized_frames_get_an_exception_and_a_close(server):
    _, address = server
    c = await Conn.open(address)
    await c.send(frame(b"\x0a\x05ab"))  # a Request whose echo claims 5 bytes but has 2
    number, body = only(unframe(await c.recv()))
    assert number == 1 and b"malformed" in field(body, 1)
    assert await asyncio.wait_for(c.reader.read(), TIMEOUT) == b""  # closed
    c = await Conn.open(address)
    await c.send(encode_uvarint(2**40))  # a length far above the limit, before any body
    number, body = only(unframe(await c.recv()))
    assert number == 1 and b"exceeds" in field(body, 1)
    assert await asyncio.wait_for(c.reader.read(), TIMEOUT) == b""
    c = await Conn.open(address)  # the server still serves new connections
    await c.send(golden("request_echo"), golden("request_flush"))
    assert await c.recv() == golden("response_echo")
    await c.close()


async def test_an_empty_request_and_unknown_kinds_answer_exceptions(server):
    _, address = server
    c = await Conn.open(address)
    number, body = await c.call(frame(b""))  # Request with no oneof member
    assert number == 1 and b"unsupported" in field(body, 1)
    await c.close()


def test_parse_address():
    assert parse_address("tcp://127.0.0.1:26658") == ("tcp", ("127.0.0.1", 26658))
    assert parse_address("127.0.0.1:1") == ("tcp", ("127.0.0.1", 1))
    assert parse_address("unix:///tmp/x.sock") == ("unix", "/tmp/x.sock")
    with pytest.raises(ValueError):
        parse_address("tcp://nohost")


async def test_unix_socket(tmp_path):
    app = RegistryApp(tmp_path / "s.db")
    path = tmp_path / "abci.sock"
    srv = await serve(app, f"unix://{path}")
    reader, writer = await asyncio.open_unix_connection(str(path))
    writer.write(golden("request_echo") + golden("request_flush"))
    assert await asyncio.wait_for(reader.readexactly(len(golden("response_echo"))), TIMEOUT) == golden("response_echo")
    writer.close()
    srv.close()
    await srv.wait_closed()
    app.close()


@pytest.mark.network  # the server runs as a process of its own
async def test_standalone_server_process_serves_and_stops_cleanly(tmp_path):
    import signal
    import sys

    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "verifier.abci.socket_server", "--db", str(tmp_path / "s.db"),
        "--listen", "tcp://127.0.0.1:0", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
        cwd=Path(__file__).resolve().parents[1])
    try:
        line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode()
        address = re.search(r"tcp://\S+", line).group(0)
        c = await Conn.open(address)
        number, body = await c.call(golden("request_info"))
        assert number == 4 and field(body, 4, 0) == 0
        await c.close()
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 30) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
