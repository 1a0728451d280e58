"""Overlay links: one long-lived, mutually authenticated gRPC stream per neighbour (ARCHITECTURE.md §3.2).

The shell both roles share under their overlay logic (user_client.relay, model_node.intake).
Every pair of neighbours on paths shares one bidirectional `Link` stream, opened by whichever
side needs it first and multiplexing every path between them: establishment onions, cloves
both ways, and hop-local acknowledgements. A clove therefore costs one frame write and one
frame read per hop instead of a unary call each (with its HTTP/2 stream set-up, its deadline
and a task on each side), and bursts that meet a busy writer leave as one batch.

Who is on the other end is authenticated before any frame is processed:

* a relay's Link (mutual TLS): the caller presented a certificate that the TLS handshake
  checked against the registered ones; `PeerIndex.identify` maps it to its node id;
* a model node's Link (its port also serves callers without certificates: verifiers'
  reference scoring, operators' status): the model node sends a fresh nonce, the caller
  answers with an Ed25519 signature, by its registered identity key, over the model node's
  id, its own id and the nonce. The model node's certificate is pinned by the caller, so the
  signature cannot be relayed to another server: it names the model node it was made for.

Acknowledgements are hop-local: a `LinkAck` says which cloves of a batch the next hop
accepted (authenticated, known link, not replayed), nothing about what happened further on.
So no hop can time the model node, and no hop reads the model node's words (the old
end-to-end acks carried both). Relays forward without waiting for the ack, and act on it when
it comes: a path the next hop no longer knows is closed, and its user told (user_client.relay).

Sending never blocks the caller: frames go into a bounded per-link queue drained by one
writer task; a full queue or a dead link drops the frame, counted.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import secrets
from typing import Awaitable, Callable, Protocol

import grpc

from gentorrent.channels import ChannelPool
from gentorrent.ledger.peers import MODEL, Peer, PeerLookup
from gentorrent.config import OVERLAY, WIRE, OverlayParams
from gentorrent.crypto import keys
from gentorrent.overlay.pathtable import DropCounter, DropReason
from gentorrent.wire import gentorrent_pb2 as pb
from gentorrent.wire import gentorrent_pb2_grpc as rpc

log = logging.getLogger(__name__)

HELLO_DOMAIN = b"gentorrent/link-hello/v1"
NONCE_BYTES = 32


class LinkError(ConnectionError):
    """A link could not be opened, or its peer did not authenticate."""


def hello_message(model_id: str, caller_id: str, nonce: bytes) -> bytes:
    return HELLO_DOMAIN + bytes.fromhex(model_id) + bytes.fromhex(caller_id) + nonce


class LinkHandler(Protocol):
    """What a hub hands authenticated frames to (the relay, the model node's intake)."""

    def on_cloves(self, link: "Link", batch: pb.CloveBatch) -> list[tuple[int, DropReason]]:
        """Process a batch synchronously; the refused cloves (index, reason)."""

    async def on_establish(self, link: "Link", request: pb.EstablishRequest) -> pb.EstablishReply: ...


class Link:
    """One stream with one authenticated neighbour; either side may have opened it."""

    def __init__(self, hub: "LinkHub", peer: Peer, outbound: bool) -> None:
        self.hub = hub
        self.peer = peer
        self.outbound = outbound
        self.alive = True
        self._queue: collections.deque[pb.LinkFrame] = collections.deque()
        self._wake: asyncio.Future | None = None  # the writer waits on it when the queue is empty
        self._acks: dict[int, asyncio.Future] = {}
        self._establishing: dict[int, asyncio.Future] = {}
        self._numbers = itertools.count(1)
        self._tasks: list[asyncio.Task] = []

    # ------------------------------------------------------------------ sending

    def send(self, forward: bool, cloves: list[pb.Clove], ack: bool = False) -> asyncio.Future | None:
        """Queue a batch; with `ack`, a future of the refused [(index, reason)] (the next hop's
        word only). Never blocks; a dead link or a full queue refuses at once, counted."""
        number = next(self._numbers) if ack else 0
        future = asyncio.get_running_loop().create_future() if ack else None
        if future is not None:
            self._acks[number] = future
            # an ack that never comes (the caller gave up waiting) must not stay behind
            future.add_done_callback(lambda _: self._acks.pop(number, None))
        if not self._put(pb.LinkFrame(cloves=pb.CloveBatch(batch=number, forward=forward, cloves=cloves))):
            self._acks.pop(number, None)
            reason = DropReason.NEXT_HOP_UNREACHABLE if not self.alive else DropReason.QUEUE_FULL
            self.hub.drops.count(reason)
            if future is not None:
                future.set_result([(i, reason) for i in range(len(cloves))])
        return future

    async def establish(self, onion: bytes, timeout: float) -> pb.EstablishReply:
        """Send an onion to this neighbour and wait for its layered confirmation."""
        number = next(self._numbers)
        future = self._establishing[number] = asyncio.get_running_loop().create_future()
        try:
            if not self._put(pb.LinkFrame(establish=pb.EstablishRequest(request=number, onion=onion))):
                return pb.EstablishReply(request=number, ok=False, reason=DropReason.NEXT_HOP_UNREACHABLE.value)
            return await asyncio.wait_for(future, timeout)
        finally:
            self._establishing.pop(number, None)

    def _put(self, frame: pb.LinkFrame) -> bool:
        if not self.alive or len(self._queue) >= self.hub.params.link_queue_frames:
            return False
        self._queue.append(frame)
        if self._wake is not None and not self._wake.done():
            self._wake.set_result(None)
        return True

    # ------------------------------------------------------------------ the stream

    async def _write_loop(self, write: Callable[[pb.LinkFrame], Awaitable[None]]) -> None:
        """Drain the queue; clove frames that wait together leave as one batch."""
        loop = asyncio.get_running_loop()
        while True:
            if not self._queue:
                self._wake = loop.create_future()
                await self._wake
            frames = list(self._queue)
            self._queue.clear()
            for frame in _merge(frames) if len(frames) > 1 else frames:
                await write(frame)

    async def _read_loop(self, read: Callable[[], Awaitable[object]]) -> None:
        while True:
            frame = await read()
            if frame is grpc.aio.EOF or frame is None:
                return
            try:
                self._dispatch(frame)
            except LinkError:
                raise
            except Exception:  # noqa: BLE001 - a bug in one frame's handling must not cut the link
                log.exception("handling a frame from %s failed", self.peer.node_id[:16])

    def _dispatch(self, frame: pb.LinkFrame) -> None:
        kind = frame.WhichOneof("body")
        if kind is None:
            raise LinkError("empty frame")
        if kind == "cloves":
            handler = self.hub.handler
            if frame.cloves.batch and getattr(handler, "ack_before_processing", False):
                self._put(pb.LinkFrame(ack=pb.LinkAck(batch=frame.cloves.batch)))
                handler.on_cloves(self, frame.cloves)
                return
            refused = handler.on_cloves(self, frame.cloves)
            if frame.cloves.batch:
                self._put(pb.LinkFrame(ack=pb.LinkAck(batch=frame.cloves.batch, refused=[i for i, _ in refused],
                                                      reasons=[r.value for _, r in refused])))
        elif kind == "ack":
            future = self._acks.pop(frame.ack.batch, None)
            if future is not None and not future.done():
                future.set_result([(i, _reason(r)) for i, r in zip(frame.ack.refused, frame.ack.reasons)])
        elif kind == "establish":
            self._spawn(self._answer_establish(frame.establish))
        elif kind == "established":
            future = self._establishing.get(frame.established.request)
            if future is not None and not future.done():
                future.set_result(frame.established)
        else:  # a hello or challenge after the handshake: a broken or hostile peer
            raise LinkError(f"unexpected {kind} frame")

    async def _answer_establish(self, request: pb.EstablishRequest) -> None:
        try:
            reply = await self.hub.handler.on_establish(self, request)
        except Exception as exc:  # noqa: BLE001 - a refusal, never a dead link
            log.info("establishment failed: %s", exc)
            reply = pb.EstablishReply(ok=False, reason=DropReason.NEXT_HOP_REFUSED.value)
        reply.request = request.request
        self._put(pb.LinkFrame(established=reply))

    def _spawn(self, coro) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.append(task)
        task.add_done_callback(lambda t: t in self._tasks and self._tasks.remove(t))

    async def run(self, read, write) -> None:
        """Read and write until the stream ends or fails either way; then the link is dead."""
        reader = asyncio.ensure_future(self._read_loop(read))
        writer = asyncio.ensure_future(self._write_loop(write))
        try:
            done, _ = await asyncio.wait({reader, writer}, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                exc = task.exception()
                if exc is not None and not isinstance(exc, (grpc.aio.AioRpcError, LinkError)):
                    log.warning("link to %s failed: %r", self.peer.node_id[:16], exc)
        finally:
            for task in (reader, writer):
                task.cancel()
            await asyncio.gather(reader, writer, return_exceptions=True)
            self.close()

    def close(self) -> None:
        """Mark dead; everyone waiting on this link hears it now."""
        if not self.alive:
            return
        self.alive = False
        self.hub._forget(self)
        dropped = len(self._queue)
        self._queue.clear()
        for _ in range(dropped):
            self.hub.drops.count(DropReason.NEXT_HOP_UNREACHABLE)
        for number, future in list(self._acks.items()):
            if not future.done():
                future.set_result(None)  # None: the link died before the next hop answered
        for future in self._establishing.values():
            if not future.done():
                future.set_result(pb.EstablishReply(ok=False, reason=DropReason.NEXT_HOP_UNREACHABLE.value))
        for task in self._tasks:
            task.cancel()


def _reason(word: str) -> DropReason:
    try:
        return DropReason(word)
    except ValueError:
        return DropReason.NEXT_HOP_REFUSED


#: a merged batch stops growing here, well below the gRPC message limit (WireLimits)
MAX_BATCH_BYTES = WIRE.max_message_bytes // 4


def _merge(frames: list[pb.LinkFrame]) -> list[pb.LinkFrame]:
    """Consecutive clove frames in one direction that want no ack become one batch (bounded)."""
    out: list[pb.LinkFrame] = []
    size = 0
    for frame in frames:
        last = out[-1] if out else None
        frame_size = frame.ByteSize()
        if (last is not None and frame.WhichOneof("body") == "cloves" and last.WhichOneof("body") == "cloves"
                and not frame.cloves.batch and not last.cloves.batch
                and frame.cloves.forward == last.cloves.forward and size + frame_size <= MAX_BATCH_BYTES):
            last.cloves.cloves.extend(frame.cloves.cloves)
            size += frame_size
        else:
            out.append(frame)
            size = frame_size
    return out


class LinkHub:
    """The links of one node: opens them on demand, accepts and authenticates incoming ones."""

    def __init__(self, node_id: str, identity: keys.Identity | None, peers: PeerLookup, channels: ChannelPool,
                 handler: LinkHandler, params: OverlayParams = OVERLAY, drops: DropCounter | None = None) -> None:
        """`identity` signs hellos to model nodes (user nodes); `peers` is the registry by node id."""
        self.node_id = node_id
        self.identity = identity
        self.peers = peers
        self.channels = channels
        self.handler = handler
        self.params = params
        self.drops = drops if drops is not None else DropCounter()
        self.closing = False
        self._links: dict[str, Link] = {}
        self._all: set[Link] = set()
        self._tasks: set[asyncio.Task] = set()
        self.opened = 0
        self.accepted = 0

    def link_to(self, node_id: str) -> Link | None:
        """The live link to registered node `node_id`, opened now if there is none; None if
        the registry does not list it."""
        link = self._links.get(node_id)
        if link is not None and link.alive:
            return link
        peer = self.peers(node_id)
        if peer is None or self.closing:
            return None
        link = Link(self, peer, outbound=True)
        self._register(link)
        task = asyncio.ensure_future(self._run_outbound(link))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        self.opened += 1
        return link

    def _register(self, link: Link) -> None:
        self._all.add(link)
        current = self._links.get(link.peer.node_id)
        if current is None or not current.alive:
            self._links[link.peer.node_id] = link

    def _forget(self, link: Link) -> None:
        self._all.discard(link)
        if self._links.get(link.peer.node_id) is link:
            del self._links[link.peer.node_id]
            other = next((l for l in self._all if l.peer.node_id == link.peer.node_id and l.alive), None)
            if other is not None:
                self._links[other.peer.node_id] = other

    async def _run_outbound(self, link: Link) -> None:
        channel = self.channels.to(link.peer)
        stub = rpc.ModelNodeStub(channel) if link.peer.role == MODEL else rpc.RelayStub(channel)
        call = stub.Link()
        try:
            if link.peer.role == MODEL:
                await self._say_hello(call, link.peer)
        except (grpc.aio.AioRpcError, LinkError, asyncio.TimeoutError) as exc:
            log.info("cannot open a link to %s: %s", link.peer.node_id[:16], exc)
            call.cancel()
            link.close()
            return
        try:
            await link.run(call.read, call.write)
        finally:
            call.cancel()

    async def _say_hello(self, call, peer: Peer) -> None:
        if self.identity is None:
            raise LinkError("this node has no identity to authenticate to a model node with")
        first = await asyncio.wait_for(call.read(), self.params.link_hello_timeout_s)
        if first is grpc.aio.EOF or first.WhichOneof("body") != "challenge" or len(first.challenge.nonce) != NONCE_BYTES:
            raise LinkError("the model node sent no challenge")
        signature = self.identity.sign(hello_message(peer.node_id, self.node_id, first.challenge.nonce))
        await call.write(pb.LinkFrame(hello=pb.LinkHello(node_id=bytes.fromhex(self.node_id), signature=signature)))

    # ------------------------------------------------------------------ incoming

    async def serve(self, context, peer: Peer) -> None:
        """Run an incoming link whose caller the server already authenticated (mutual TLS)."""
        link = Link(self, peer, outbound=False)
        self._register(link)
        self.accepted += 1
        await link.run(context.read, context.write)

    async def serve_with_hello(self, context, callers: PeerLookup,
                               resolve: Callable[[str], Awaitable[object]] | None = None) -> None:
        """Run an incoming link on a model node: challenge, check the signed hello against the
        caller's registered key (`callers`: registered user nodes; `resolve` looks the caller up
        by node id once if this node does not hold it: it may just have registered), then serve."""
        nonce = secrets.token_bytes(NONCE_BYTES)
        await context.write(pb.LinkFrame(challenge=pb.LinkChallenge(nonce=nonce)))
        try:
            first = await asyncio.wait_for(context.read(), self.params.link_hello_timeout_s)
        except asyncio.TimeoutError:
            first = None
        peer = self._check_hello(first, nonce, callers)
        if peer is None and resolve is not None and first is not None and first is not grpc.aio.EOF \
                and first.WhichOneof("body") == "hello" and len(first.hello.node_id) == 32:
            await resolve(first.hello.node_id.hex())
            peer = self._check_hello(first, nonce, callers)
        if peer is None:
            self.drops.count(DropReason.UNAUTHENTICATED)
            await context.abort(grpc.StatusCode.UNAUTHENTICATED,
                                "a link needs a hello signed by a registered user node")
            return
        await self.serve(context, peer)

    def _check_hello(self, frame, nonce: bytes, callers: PeerLookup) -> Peer | None:
        if frame is None or frame is grpc.aio.EOF or frame.WhichOneof("body") != "hello":
            return None
        caller = frame.hello.node_id.hex()
        peer = callers(caller) if len(frame.hello.node_id) == 32 else None
        if peer is None or not keys.is_valid_signature(peer.public_key, frame.hello.signature,
                                                       hello_message(self.node_id, caller, nonce)):
            return None
        return peer

    # ------------------------------------------------------------------ lifecycle

    def status(self) -> dict:
        return {"links": len(self._all), "opened": self.opened, "accepted": self.accepted}

    async def close(self) -> None:
        self.closing = True
        for link in list(self._all):
            link.close()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
