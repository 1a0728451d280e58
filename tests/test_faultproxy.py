"""The fault proxy really passes, drops, delays, blackholes, corrupts and partitions traffic:
real asyncio TCP echo servers on 127.0.0.1, and one real gRPC server over pinned TLS."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest

from gentorrent.crypto import tls
from gentorrent.crypto.keys import Identity
from testkit.faultproxy import DOWN, UP, FaultKind, FaultNetwork, FaultProxy
from gentorrent.wire import gentorrent_pb2 as pb
from gentorrent.wire import gentorrent_pb2_grpc as rpc

pytestmark = pytest.mark.timeout(60)
WAIT = 5.0  # bound on every wait for something that should happen


class EchoServer:
    """Echoes every byte back; counts what it received."""

    def __init__(self) -> None:
        self.received = 0
        self.server: asyncio.AbstractServer | None = None

    async def start(self) -> "EchoServer":
        self.server = await asyncio.start_server(self._echo, "127.0.0.1", 0)
        return self

    @property
    def port(self) -> int:
        return self.server.sockets[0].getsockname()[1]

    async def _echo(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                self.received += len(data)
                writer.write(data)
                await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()

    async def stop(self) -> None:
        self.server.close()
        await self.server.wait_closed()


@pytest.fixture
async def echo():
    server = await EchoServer().start()
    yield server
    await server.stop()


@pytest.fixture
async def proxy(echo):
    p = await FaultProxy("127.0.0.1", echo.port, seed=7).start()
    yield p
    await p.stop()


async def _connect(p: FaultProxy):
    return await asyncio.wait_for(asyncio.open_connection("127.0.0.1", p.port), WAIT)


async def _roundtrip(reader, writer, payload: bytes, timeout: float = WAIT) -> bytes:
    writer.write(payload)
    await writer.drain()
    return await asyncio.wait_for(reader.readexactly(len(payload)), timeout)


async def test_pass_forwards_both_directions_unchanged(proxy, echo):
    reader, writer = await _connect(proxy)
    payload = bytes(range(256)) * 1000
    assert await _roundtrip(reader, writer, payload) == payload
    assert echo.received == len(payload)
    assert proxy.stats.forwarded == {UP: len(payload), DOWN: len(payload)}
    writer.write_eof()  # a half-close passes through: the echo server closes, we see EOF
    assert await asyncio.wait_for(reader.read(), WAIT) == b""
    writer.close()


async def test_drop_resets_open_connections_and_refuses_new_ones(proxy):
    reader, writer = await _connect(proxy)
    assert await _roundtrip(reader, writer, b"hello") == b"hello"
    proxy.drop()
    with pytest.raises((ConnectionError, asyncio.IncompleteReadError)):
        await _roundtrip(reader, writer, b"again")
    r2, w2 = await _connect(proxy)  # the listener still accepts ...
    with pytest.raises((ConnectionError, asyncio.IncompleteReadError)):
        await _roundtrip(r2, w2, b"new")  # ... and resets at once
    assert proxy.stats.reset == 1 and proxy.stats.refused >= 1
    proxy.pass_through()
    r3, w3 = await _connect(proxy)
    assert await _roundtrip(r3, w3, b"back") == b"back"
    for w in (writer, w2, w3):
        w.close()


async def test_delay_holds_every_chunk_back_and_keeps_order(proxy):
    reader, writer = await _connect(proxy)
    proxy.delay(0.3, jitter_s=0.05, directions=[UP])
    start = time.monotonic()
    assert await _roundtrip(reader, writer, b"ping") == b"ping"
    assert time.monotonic() - start >= 0.3  # a lower bound: the fault's own definition
    # jittered chunks still arrive in order
    messages = b"".join(f"<{i:04d}>".encode() for i in range(300))
    for i in range(300):
        writer.write(messages[i * 6:(i + 1) * 6])
        await writer.drain()
        await asyncio.sleep(0)
    assert await asyncio.wait_for(reader.readexactly(len(messages)), WAIT) == messages
    proxy.pass_through()
    start = time.monotonic()
    assert await _roundtrip(reader, writer, b"fast") == b"fast"
    writer.close()


async def test_blackhole_accepts_but_never_forwards_then_heals(proxy, echo):
    reader, writer = await _connect(proxy)
    assert await _roundtrip(reader, writer, b"before") == b"before"
    received = echo.received
    proxy.blackhole()
    with pytest.raises(asyncio.TimeoutError):
        await _roundtrip(reader, writer, b"into the void", timeout=0.5)
    r2, w2 = await _connect(proxy)  # new connections are accepted and swallowed too
    with pytest.raises(asyncio.TimeoutError):
        await _roundtrip(r2, w2, b"also lost", timeout=0.5)
    assert echo.received == received
    assert proxy.stats.blackholed[UP] == len(b"into the void") + len(b"also lost")
    proxy.pass_through()  # connections with a hole in their stream are reset ...
    with pytest.raises((ConnectionError, asyncio.IncompleteReadError)):
        await _roundtrip(reader, writer, b"x")
    r3, w3 = await _connect(proxy)  # ... and new ones work
    assert await _roundtrip(r3, w3, b"after") == b"after"
    for w in (writer, w2, w3):
        w.close()


async def test_blackhole_one_direction_only(proxy, echo):
    reader, writer = await _connect(proxy)
    proxy.blackhole(directions=[DOWN])
    with pytest.raises(asyncio.TimeoutError):
        await _roundtrip(reader, writer, b"heard but unanswered", timeout=0.5)
    assert echo.received == len(b"heard but unanswered")  # the request got through
    assert proxy.stats.blackholed == {UP: 0, DOWN: len(b"heard but unanswered")}
    writer.close()


async def test_corrupt_flips_single_bits_at_the_given_rate(proxy, echo):
    reader, writer = await _connect(proxy)
    proxy.corrupt(rate=0.01, directions=[UP])
    payload = bytes(200_000)
    got = await _roundtrip(reader, writer, payload)
    diffs = [b for b in got if b]
    assert all(bin(b).count("1") == 1 for b in diffs)  # one bit per corrupted byte
    assert 0.005 * len(payload) < len(diffs) < 0.02 * len(payload)
    assert proxy.stats.corrupted[UP] == len(diffs) and proxy.stats.corrupted[DOWN] == 0
    proxy.corrupt(rate=1.0)
    got = await _roundtrip(reader, writer, bytes(1000))
    assert all(bin(b).count("1") in (0, 2) for b in got)  # flipped once each way (maybe back)
    writer.close()


async def test_unreachable_upstream_is_refused_not_hung():
    free = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = free.sockets[0].getsockname()[1]
    free.close()
    await free.wait_closed()
    async with FaultProxy("127.0.0.1", port) as p:
        reader, writer = await _connect(p)
        assert await asyncio.wait_for(reader.read(), WAIT) == b""
        assert p.stats.refused == 1
        writer.close()


async def test_partition_cuts_links_across_groups_and_heal_restores_them():
    servers = {name: await EchoServer().start() for name in "abc"}
    net = FaultNetwork(seed=3)
    try:
        for src in "abc":
            for dst in "abc":
                if src != dst:
                    await net.add_link(src, dst, "127.0.0.1", servers[dst].port)

        async def works(src: str, dst: str) -> bool:
            reader, writer = await _connect(net.link(src, dst))
            try:
                return await _roundtrip(reader, writer, f"{src}{dst}".encode(), timeout=0.5) == f"{src}{dst}".encode()
            except (asyncio.TimeoutError, ConnectionError, asyncio.IncompleteReadError):
                return False
            finally:
                writer.close()

        pairs = [(s, d) for s in "abc" for d in "abc" if s != d]
        assert all([await works(s, d) for s, d in pairs])
        net.partition([{"a", "b"}, {"c"}])
        reach = {(s, d): await works(s, d) for s, d in pairs}
        assert reach == {(s, d): {s, d} <= {"a", "b"} for s, d in pairs}
        net.heal()
        assert all([await works(s, d) for s, d in pairs])
        net.isolate("a", how=FaultKind.DROP)
        reach = {(s, d): await works(s, d) for s, d in pairs}
        assert reach == {(s, d): "a" not in (s, d) for s, d in pairs}
        with pytest.raises(ValueError):
            net.partition([{"a"}, {"a", "b"}])
    finally:
        await net.stop()
        for s in servers.values():
            await s.stop()


# --------------------------------------------------------------------------- gRPC over TLS


class _Health(rpc.RelayServicer):
    async def Health(self, request, context):
        return pb.HealthReply(node_id="behind-proxy", role="relay", serving=True)


async def _health_after_reset(stub, attempts: int = 5):
    """An RPC issued while gRPC has not yet noticed its connection was reset fails with
    UNAVAILABLE ("Stream removed"); callers retry, and the next attempt reconnects."""
    for attempt in range(attempts):
        try:
            return await asyncio.wait_for(stub.Health(pb.Empty(), timeout=WAIT, wait_for_ready=True), 2 * WAIT)
        except grpc.aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.UNAVAILABLE or attempt == attempts - 1:
                raise
            await asyncio.sleep(0.1)


@pytest.mark.network
async def test_grpc_tls_through_the_proxy_passes_and_blackhole_hits_the_deadline():
    tls_id = tls.make_self_signed(Identity.generate())
    server, port = tls.new_server(tls_id, "127.0.0.1:0")
    rpc.add_RelayServicer_to_server(_Health(), server)
    await server.start()
    proxy = await FaultProxy("127.0.0.1", port, seed=1).start()
    channel = tls.pinned_channel(proxy.address, tls_id.cert_pem)
    stub = rpc.RelayStub(channel)
    try:
        reply = await asyncio.wait_for(stub.Health(pb.Empty(), timeout=WAIT), 2 * WAIT)
        assert reply.node_id == "behind-proxy"  # TLS handshake and HTTP/2 passed unchanged
        assert proxy.stats.forwarded[UP] > 0 and proxy.stats.forwarded[DOWN] > 0

        proxy.blackhole()
        start = time.monotonic()
        with pytest.raises(grpc.aio.AioRpcError) as err:
            # the outer wait_for only turns a hang into a clear failure
            await asyncio.wait_for(stub.Health(pb.Empty(), timeout=1.0), 4 * WAIT)
        assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert time.monotonic() - start < 4 * WAIT

        proxy.pass_through()  # the tainted connection is reset; gRPC reconnects
        reply = await _health_after_reset(stub)
        assert reply.serving

        proxy.corrupt(rate=1.0, directions=[DOWN])  # every TLS record fails its MAC
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await asyncio.wait_for(stub.Health(pb.Empty(), timeout=2.0), 4 * WAIT)
        # the TLS layer detects it (TSI_DATA_CORRUPTED) or the reset connection is unavailable
        assert ("TSI_DATA_CORRUPTED" in (err.value.details() or "")
                or err.value.code() == grpc.StatusCode.UNAVAILABLE), err.value
    finally:
        await channel.close()
        await proxy.stop()
        await server.stop(None)
