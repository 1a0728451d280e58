"""The model node's clove intake (ARCHITECTURE.md §3.3): cloves in, reply cloves out.

Plugs into the ModelNode gRPC servicer: its SubmitClove handler is `intake.submit`. Each
sealed clove is opened with the node's X25519 onion key (the model node, not a relay, does
this public-key work), grouped by the group value found inside the seal, and decoded with
S-IDA once k cloves are in. The query is then served by `generate` (the node's engine or its
forwarding logic, exactly what a direct Generate call would run), and every chunk it yields
becomes one reply message: sealed with the reply key, split into one clove per reply route,
and sent to each proxy's Relay.Return. Generation never waits on the network: reply cloves
are sent by background tasks and the user puts chunks back in order by sequence number.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import AsyncIterator, Callable

import grpc

from gentorrent.config import CLOVES, MODEL_NODE, OVERLAY, WIRE, CloveParams, OverlayParams
from gentorrent import generation
from gentorrent.crypto import sida
from gentorrent.crypto.keys import OnionKey
from gentorrent.overlay import sealing
from gentorrent.channels import ChannelPool
from gentorrent.ledger.directory import Directory, DirectoryIndex
from gentorrent.overlay.pathtable import Drop, DropCounter, DropReason
from gentorrent.overlay.reassembly import CloveGroups
from gentorrent.wire import gentorrent_pb2 as pb
from gentorrent.wire import gentorrent_pb2_grpc as rpc

log = logging.getLogger(__name__)

#: reply cloves in flight on one route at a time
ROUTE_WINDOW = 4

#: what serves a decoded query: the same code path as a direct Generate call
GenerateFn = Callable[[pb.GenerateRequest], AsyncIterator[pb.GenerateChunk]]


class CloveIntake:
    def __init__(
        self,
        onion_key: OnionKey,
        generate: GenerateFn,
        directory: Directory,
        channels: ChannelPool | None = None,
        cloves: CloveParams = CLOVES,
        params: OverlayParams = OVERLAY,
        max_active: int = MODEL_NODE.max_queued_requests,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """Proxies are user nodes: their pinned certificates come from `directory` (the
        committee's, or a static file in tests). It is refreshed (at most once a second) when
        a query names a proxy it does not list yet: a user who just registered."""
        self.onion_key = onion_key
        self.generate = generate
        self.directory = directory
        self.proxies = DirectoryIndex(directory)
        self.channels = channels or ChannelPool()
        self.params = params
        self.max_active = max_active
        self.clock = clock
        self.groups = CloveGroups(cloves.k, params.max_pending_groups, params.reassembly_timeout_s,
                                  max_cloves=params.max_routes, n=cloves.n)
        self._last_refresh = float("-inf")
        self.drops = DropCounter()
        self.served = 0
        self._tasks: set[asyncio.Task] = set()
        self._windows: dict[bytes, asyncio.Semaphore] = {}
        self._active = 0

    # ------------------------------------------------------------------ cloves in

    async def submit(self, envelope: pb.CloveEnvelope) -> pb.Ack:
        """Take one sealed clove from a proxy. Never raises: refusals are counted Acks. Every
        clove that opened is acknowledged with its delivery token, whatever its fate after."""
        token = b""
        try:
            group, clove, token = self._open(envelope.payload)
            query = self._accept(group, clove)
        except Drop as drop:
            self.drops.count(drop.reason)
            # a clove arriving after its message decoded is normal (k of n suffice): the
            # path that carried it is fine and must not be reported as failing
            return pb.Ack(ok=drop.reason is DropReason.LATE, reason=drop.reason.value, delivery_token=token)
        if query is not None:
            self._spawn(self._serve(query))
        return pb.Ack(ok=True, delivery_token=token)

    async def SubmitClove(self, request: pb.CloveEnvelope, context) -> pb.Ack:
        """Same as `submit`, shaped as a gRPC handler (for servicers that delegate by name)."""
        return await self.submit(request)

    def _open(self, payload: bytes) -> tuple[bytes, bytes, bytes]:
        if len(payload) > WIRE.max_blob_bytes:
            raise Drop(DropReason.OVERSIZE)
        try:
            return sealing.open_clove(self.onion_key.private_key, payload)
        except sealing.SealError as exc:
            raise Drop(DropReason.BAD_SEAL) from exc

    def _accept(self, group: bytes, clove: bytes) -> pb.OverlayQuery | None:
        now = self.clock()
        self.groups.expire(now)
        message = self.groups.add(group, clove, now)
        if message is None:
            return None
        try:
            query = sealing.open_query(self.onion_key.private_key, message, self.params.max_routes)
        except sealing.SealError as exc:
            raise Drop(DropReason.BAD_QUERY, str(exc)) from exc
        if self._active >= self.max_active:
            # say so on the reply routes: the user moves on to another node at once instead of
            # waiting out its reply timeout (and does not blame its paths)
            self._send_chunk(query, 0, pb.GenerateChunk(final=True, error=f"{sealing.BUSY_ERROR}: at capacity"))
            raise Drop(DropReason.BUSY)
        return query

    def _spawn(self, coro) -> asyncio.Task:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # ------------------------------------------------------------------ replies out

    async def _serve(self, query: pb.OverlayQuery) -> None:
        self._active += 1
        sends: list[asyncio.Task] = []
        seq = 0
        try:
            try:
                async for chunk in self.generate(query.request):
                    sends.extend(self._send_chunk(query, seq, chunk))
                    seq += 1
                    if chunk.final:
                        break
            except Exception as exc:  # the engine failed: tell the user rather than go silent
                log.warning("serving an overlay query failed: %s", exc)
                error = pb.GenerateChunk(final=True, error=generation.reply_error(exc))
                sends.extend(self._send_chunk(query, seq, error))
            self.served += 1
            if sends:
                await asyncio.gather(*sends, return_exceptions=True)
        finally:
            self._active -= 1
            for route in query.routes:
                self._windows.pop(route.link_id, None)

    def _send_chunk(self, query: pb.OverlayQuery, seq: int, chunk: pb.GenerateChunk) -> list[asyncio.Task]:
        reply = pb.OverlayReply(seq=seq, chunk=chunk)
        sealed = sealing.seal_reply(query.reply_key, reply)
        cloves = sida.split(sealed, len(query.routes), query.k)
        tasks = []
        for index, (route, clove) in enumerate(zip(query.routes, cloves)):
            blob = sealing.seal_reply_clove(query.reply_key, index, seq, clove)
            tasks.append(self._spawn(self._send_clove(route, blob)))
        return tasks

    async def _known_proxy(self, address: str) -> bytes | None:
        cert = self.proxies.relay_cert(address)
        if cert is None and self.clock() - self._last_refresh >= 1.0:
            self._last_refresh = self.clock()
            try:
                await self.directory.refresh()
                self.proxies.rebuild()
            except Exception as exc:  # the directory is unreachable: drop, counted below
                log.info("directory refresh failed: %s", exc)
            cert = self.proxies.relay_cert(address)
        return cert

    async def _send_clove(self, route: pb.ReplyRoute, blob: bytes) -> None:
        # a bounded number of cloves in flight per route: a fast stream queues here instead
        # of flooding the path (and timing out) with one concurrent call per token
        window = self._windows.setdefault(route.link_id, asyncio.Semaphore(ROUTE_WINDOW))
        async with window:
            await self._send_clove_now(route, blob)

    async def _send_clove_now(self, route: pb.ReplyRoute, blob: bytes) -> None:
        cert = await self._known_proxy(route.proxy_address)
        if cert is None:
            self.drops.count(DropReason.UNKNOWN_PEER)
            return
        stub = rpc.RelayStub(self.channels.get(route.proxy_address, cert))
        try:
            ack = await stub.Return(pb.CloveEnvelope(link_id=route.link_id, payload=blob),
                                    timeout=self.params.forward_timeout_s)
        except grpc.aio.AioRpcError:
            self.drops.count(DropReason.NEXT_HOP_UNREACHABLE)
            return
        if not ack.ok:
            self.drops.count(DropReason.NEXT_HOP_REFUSED)

    # ------------------------------------------------------------------ lifecycle

    def status(self) -> dict:
        return {"served": self.served, "active": self._active, "pending_groups": len(self.groups),
                "drops": self.drops.as_dict()}

    async def close(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
