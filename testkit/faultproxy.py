"""A fault-injecting TCP proxy on 127.0.0.1, for fault-scenario tests between real nodes.

Put one `FaultProxy` in front of a node's listening port and point a peer at the proxy's
address instead: the peer's connections go through it and can be made, at any moment and
under program control, to

* pass     -- forward both directions untouched (the default);
* drop     -- reset every open connection and refuse new ones (a killed peer, a RST storm);
* delay    -- deliver every chunk `delay_s` (+ up to `jitter_s`) later, order preserved;
* blackhole -- accept and read, forward nothing (a silent partition: the sender's RPCs hang
              until their deadline, which is what deadlines are for);
* corrupt  -- flip bits in forwarded bytes (seeded, so a failure replays);

optionally in one direction only ("up": client -> server, "down": server -> client).
`FaultNetwork` keeps one proxy per directed link (src -> dst) and partitions a set of nodes
into groups (links across groups blackholed or dropped) and heals them again.

It works on bytes, so TLS and HTTP/2 pass through unchanged: a corrupted byte in a TLS
record is caught by the record MAC, exactly as on a real wire. It cannot reorder bytes
inside one TCP stream (TCP itself never delivers them out of order); reordering between
messages of different connections follows from delaying one link and not another.

Bytes lost to a blackhole leave a connection's stream with a hole, which no real TCP link
would deliver. When the fault is lifted such "tainted" connections are reset, so the peers
reconnect (as they would after a long real partition, once keep-alives fail).

Every wait is bounded: upstream connects by `connect_timeout_s`; `stop()` aborts everything.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import math
import random
from dataclasses import dataclass, field
from typing import Iterable

log = logging.getLogger(__name__)

CHUNK = 64 * 1024
QUEUE_CHUNKS = 64  # per direction: a delayed link buffers at most ~4 MiB, then back-pressures
UP, DOWN = "up", "down"


class FaultKind(enum.Enum):
    PASS = "pass"
    DROP = "drop"
    DELAY = "delay"
    BLACKHOLE = "blackhole"
    CORRUPT = "corrupt"


@dataclass(frozen=True)
class Fault:
    """What the proxy does to traffic; `directions` limits it to UP and/or DOWN."""

    kind: FaultKind = FaultKind.PASS
    delay_s: float = 0.0
    jitter_s: float = 0.0
    corrupt_rate: float = 0.0  # probability that a forwarded byte gets one bit flipped
    directions: frozenset[str] = frozenset({UP, DOWN})

    def __post_init__(self) -> None:
        if self.delay_s < 0 or self.jitter_s < 0 or not 0.0 <= self.corrupt_rate <= 1.0:
            raise ValueError("delay and jitter must be >= 0 and corrupt_rate in 0..1")
        if not self.directions <= {UP, DOWN}:
            raise ValueError(f"directions are {UP!r} and {DOWN!r}")

    def hits(self, direction: str) -> bool:
        return self.kind is not FaultKind.PASS and direction in self.directions


PASS = Fault()


@dataclass
class ProxyStats:
    """Counters a test can assert on (they only grow)."""

    accepted: int = 0  # client connections accepted and connected upstream
    refused: int = 0  # client connections reset because of a drop fault or a dead upstream
    reset: int = 0  # open connections reset by a fault (drop, or a healed blackhole)
    forwarded: dict[str, int] = field(default_factory=lambda: {UP: 0, DOWN: 0})  # bytes
    blackholed: dict[str, int] = field(default_factory=lambda: {UP: 0, DOWN: 0})  # bytes
    corrupted: dict[str, int] = field(default_factory=lambda: {UP: 0, DOWN: 0})  # bytes changed


class _Connection:
    def __init__(self, client: asyncio.StreamWriter, upstream: asyncio.StreamWriter) -> None:
        self.client = client
        self.upstream = upstream
        self.tainted = False  # lost bytes to a blackhole
        self.tasks: list[asyncio.Task] = []

    def abort(self) -> None:
        """Reset both ends and stop the pumps (but never the task calling this)."""
        for w in (self.client, self.upstream):
            w.transport.abort()
        me = asyncio.current_task()
        for t in self.tasks:
            if t is not me:
                t.cancel()


class FaultProxy:
    """One listening socket on 127.0.0.1 forwarding to one upstream `target_host:target_port`."""

    def __init__(self, target_host: str, target_port: int, *, listen_port: int = 0, seed: int = 0,
                 name: str = "", connect_timeout_s: float = 5.0) -> None:
        self.target = (target_host, target_port)
        self.name = name or f"proxy->{target_host}:{target_port}"
        self.stats = ProxyStats()
        self._listen_port = listen_port
        self._rng = random.Random(seed)
        self._fault = PASS
        self._server: asyncio.AbstractServer | None = None
        self._connections: set[_Connection] = set()
        self._connect_timeout_s = connect_timeout_s

    # -- life cycle

    async def start(self) -> "FaultProxy":
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self._listen_port, limit=CHUNK)
        self._listen_port = self._server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for conn in list(self._connections):
            conn.abort()
        self._connections.clear()
        if self._server is not None:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._server.wait_closed(), 5.0)
            self._server = None

    async def __aenter__(self) -> "FaultProxy":
        return await self.start()

    async def __aexit__(self, *exc) -> None:
        await self.stop()

    @property
    def port(self) -> int:
        return self._listen_port

    @property
    def address(self) -> str:
        """"127.0.0.1:port" to give the peer instead of the target's address."""
        return f"127.0.0.1:{self._listen_port}"

    @property
    def open_connections(self) -> int:
        return len(self._connections)

    # -- control

    @property
    def fault(self) -> Fault:
        return self._fault

    def set_fault(self, fault: Fault) -> None:
        """Apply `fault` from now on, to open connections too."""
        lifted_hole = self._fault.kind is FaultKind.BLACKHOLE and fault.kind is not FaultKind.BLACKHOLE
        self._fault = fault
        log.info("%s: %s", self.name, fault.kind.value)
        if fault.kind is FaultKind.DROP:
            self._reset(lambda c: True)
        elif lifted_hole:
            self._reset(lambda c: c.tainted)

    def pass_through(self) -> None:
        self.set_fault(PASS)

    def drop(self) -> None:
        self.set_fault(Fault(FaultKind.DROP))

    def delay(self, seconds: float, jitter_s: float = 0.0, directions: Iterable[str] = (UP, DOWN)) -> None:
        self.set_fault(Fault(FaultKind.DELAY, delay_s=seconds, jitter_s=jitter_s, directions=frozenset(directions)))

    def blackhole(self, directions: Iterable[str] = (UP, DOWN)) -> None:
        self.set_fault(Fault(FaultKind.BLACKHOLE, directions=frozenset(directions)))

    def corrupt(self, rate: float = 0.01, directions: Iterable[str] = (UP, DOWN)) -> None:
        self.set_fault(Fault(FaultKind.CORRUPT, corrupt_rate=rate, directions=frozenset(directions)))

    def _reset(self, which) -> None:
        for conn in [c for c in self._connections if which(c)]:
            conn.abort()
            self._connections.discard(conn)
            self.stats.reset += 1

    # -- forwarding

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._fault.kind is FaultKind.DROP:
            self.stats.refused += 1
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.wait_for(
                asyncio.open_connection(*self.target, limit=CHUNK), self._connect_timeout_s)
        except (OSError, asyncio.TimeoutError) as exc:
            log.info("%s: upstream unreachable: %s", self.name, exc)
            self.stats.refused += 1
            writer.transport.abort()
            return
        conn = _Connection(writer, up_writer)
        self._connections.add(conn)
        self.stats.accepted += 1
        conn.tasks = [asyncio.ensure_future(self._pipe(reader, up_writer, UP, conn)),
                      asyncio.ensure_future(self._pipe(up_reader, writer, DOWN, conn))]
        try:
            await asyncio.gather(*conn.tasks, return_exceptions=True)
        finally:
            self._connections.discard(conn)
            for w in (writer, up_writer):
                w.close()

    async def _pipe(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter, direction: str,
                    conn: _Connection) -> None:
        """Read side and write side joined by a queue, so a delay does not slow reading.

        An I/O error on either side resets the whole connection (both ends), as a reset
        travels through a real path; a clean end of stream is passed on as a half-close."""
        queue: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue(QUEUE_CHUNKS)
        sender = asyncio.ensure_future(self._send(queue, dst, direction, conn))
        conn.tasks.append(sender)
        loop = asyncio.get_running_loop()
        clean = False
        try:
            while True:
                data = await src.read(CHUNK)
                if not data:
                    break
                fault = self._fault
                due = loop.time()
                if fault.hits(direction):
                    if fault.kind is FaultKind.BLACKHOLE:
                        self.stats.blackholed[direction] += len(data)
                        conn.tainted = True
                        continue
                    if fault.kind is FaultKind.CORRUPT:
                        data = self._corrupt(data, fault.corrupt_rate, direction)
                    elif fault.kind is FaultKind.DELAY:
                        due += fault.delay_s + self._rng.uniform(0.0, fault.jitter_s)
                await queue.put((due, data))
            await queue.put(None)
            await sender
            clean = True
        except (ConnectionError, OSError):
            pass
        finally:
            if not clean:
                conn.abort()

    async def _send(self, queue: asyncio.Queue, dst: asyncio.StreamWriter, direction: str,
                    conn: _Connection) -> None:
        loop = asyncio.get_running_loop()
        last_due = 0.0
        try:
            while True:
                item = await queue.get()
                if item is None:
                    if dst.can_write_eof():
                        dst.write_eof()  # half-close: the other direction may still flow
                    return
                due, data = item
                due = max(due, last_due)  # jitter never reorders bytes of one stream
                last_due = due
                wait = due - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                dst.write(data)
                await dst.drain()
                self.stats.forwarded[direction] += len(data)
        except (ConnectionError, OSError):
            conn.abort()

    def _corrupt(self, data: bytes, rate: float, direction: str) -> bytes:
        """Flip one random bit in each byte hit; hits are Bernoulli(rate) per byte, drawn as
        geometric gaps so the cost is O(hits), not O(bytes)."""
        buf = bytearray(data)
        count = 0
        i = -1
        while rate > 0.0:
            u = self._rng.random()
            gap = 0 if rate >= 1.0 or u == 0.0 else int(math.log(u) / math.log1p(-rate))
            i += 1 + gap
            if i >= len(buf):
                break
            buf[i] ^= 1 << self._rng.randrange(8)
            count += 1
        self.stats.corrupted[direction] += count
        return bytes(buf)


class FaultNetwork:
    """One FaultProxy per directed link (src -> dst) among named nodes; partitions and heals.

    `add_link("a", "b", host, port)` starts a proxy in front of b's server for a's use and
    returns it; give a `net.address("a", "b")` as b's address.
    """

    def __init__(self, seed: int = 0) -> None:
        self._seed = seed
        self.links: dict[tuple[str, str], FaultProxy] = {}

    async def add_link(self, src: str, dst: str, target_host: str, target_port: int) -> FaultProxy:
        if (src, dst) in self.links:
            raise ValueError(f"link {src}->{dst} exists")
        proxy = FaultProxy(target_host, target_port, seed=self._seed + len(self.links), name=f"{src}->{dst}")
        await proxy.start()
        self.links[(src, dst)] = proxy
        return proxy

    def address(self, src: str, dst: str) -> str:
        return self.links[(src, dst)].address

    def link(self, src: str, dst: str) -> FaultProxy:
        return self.links[(src, dst)]

    def partition(self, groups: Iterable[Iterable[str]], how: FaultKind = FaultKind.BLACKHOLE) -> None:
        """Cut every link whose ends are not in one group (nodes in no group are cut off)."""
        if how not in (FaultKind.BLACKHOLE, FaultKind.DROP):
            raise ValueError("a partition blackholes or drops")
        member = {}
        for i, group in enumerate(groups):
            for node in group:
                if node in member:
                    raise ValueError(f"{node} is in two groups")
                member[node] = i
        for (src, dst), proxy in self.links.items():
            together = src in member and dst in member and member[src] == member[dst]
            proxy.set_fault(PASS if together else Fault(how))

    def isolate(self, node: str, how: FaultKind = FaultKind.BLACKHOLE) -> None:
        """Cut every link from and to `node`; the others are left as they are."""
        for (src, dst), proxy in self.links.items():
            if node in (src, dst):
                proxy.set_fault(Fault(how))

    def heal(self) -> None:
        for proxy in self.links.values():
            proxy.pass_through()

    async def stop(self) -> None:
        for proxy in self.links.values():
            await proxy.stop()
        self.links.clear()
