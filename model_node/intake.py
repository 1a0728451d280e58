"""The model node's clove intake (ARCHITECTURE.md §3.3): cloves in, reply cloves out.

Proxies reach it over the ModelNode.Link stream (gentorrent.overlay.links): each must prove,
with a signature by its registered identity key, that it is a registered user node before
the intake reads a clove from it. A proxy's ack says only "received" -- never how the clove
fared -- and is sent before the clove is even opened, so a proxy learns nothing from it.

Each envelope is found by its tag in the `AskBook`, or, for the first envelope of an ask,
opened with the node's X25519 onion key (the one public-key operation per ask). Once k cloves
of an ask are in, S-IDA rebuilds the query; a query older than `query_max_age_s`, naming
more than n reply routes, or seen before (replayed cloves), is refused. It is then served by
`generate` (the node's engine or its forwarding logic, exactly what a direct Generate call
would run).

Replies leave by content, not by clock (gentorrent/overlay/reply_pacing.py, the anonymity
budget of THREAT_MODEL.md): the first chunk at once, later chunks at the next point of a grid of
`reply_window_s` (what came since the last message merged, never an empty message), the final
chunk as soon as generation ends. A relay thus sees when the answer started and ended and which
windows held tokens, not when each token came, nor how many there were (messages are padded
to size classes). `_release` is the one place a reply message leaves. Every message lists
the delivery tokens of
the query cloves received so far; a clove arriving after the last message is reported in a
one-clove delivery report, for up to `delivery_grace_s`. Each message is sealed with the reply
key (fresh random nonces), split into one clove per route and queued on the link to that
route's proxy: one task per query, none per clove, and cloves to one proxy leave in batches.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import AsyncIterator, Callable

from gentorrent.channels import ChannelPool
from gentorrent.ledger.peers import USER, PeerIndex
from gentorrent.config import CLOVES, MODEL_NODE, OVERLAY, WIRE, CloveParams, OverlayParams
from gentorrent import generation
from gentorrent.crypto.keys import OnionKey
from gentorrent.ledger.directory import Directory
from gentorrent.overlay import sealing
from gentorrent.overlay.links import Link, LinkHub
from gentorrent.overlay.pathtable import Drop, DropCounter, DropReason
from gentorrent.overlay.reassembly import Ask, AskBook, CloveGroups
from gentorrent.overlay.reply_pacing import ReplyPacer
from gentorrent.wire import gentorrent_pb2 as pb

log = logging.getLogger(__name__)

#: what serves a decoded query: the same code path as a direct Generate call
GenerateFn = Callable[[pb.GenerateRequest], AsyncIterator[pb.GenerateChunk]]


class CloveIntake:
    # a proxy's ack carries no verdict; sent before the clove is opened, its timing carries none either
    ack_before_processing = True

    def __init__(
        self,
        node_id_hex: str,
        onion_key: OnionKey,
        generate: GenerateFn,
        directory: Directory,
        channels: ChannelPool | None = None,
        cloves: CloveParams = CLOVES,
        params: OverlayParams = OVERLAY,
        max_active: int = MODEL_NODE.max_queued_requests,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        """Proxies are user nodes: their keys and pinned certificates come from `directory` (the
        committee's, or a static file in tests), re-read (at most once a second) when a proxy
        it does not list yet shows up: a user who just registered. `channels` must present this
        node's certificate: the proxies' relays ask for one (mutual TLS) when the intake opens
        a link to send replies on."""
        self.node_id_hex = node_id_hex
        self.onion_key = onion_key
        self.generate = generate
        self.directory = directory
        self.index = PeerIndex(directory)  # a proxy it does not hold is looked up by id (`_known`)
        self.channels = channels or ChannelPool()
        self.cloves = cloves
        self.params = params
        self.max_active = max_active
        self.clock = clock
        self.wall_clock = wall_clock
        self._refreshing: asyncio.Future | None = None
        self.drops = DropCounter()
        self.hub = LinkHub(node_id_hex, None, self.index.user, self.channels, self, params, self.drops)
        self.asks = AskBook(params.max_pending_groups, params.reassembly_timeout_s,
                            seen_s=2 * params.query_max_age_s + params.query_time_granularity_s,
                            grace_s=params.delivery_grace_s)
        self.groups = CloveGroups(cloves.k, params.max_pending_groups, params.reassembly_timeout_s,
                                  max_cloves=cloves.n, n=cloves.n)
        self.served = 0
        self.public_key_ops = 0  # X25519 operations: one per ask (bench and tests read it)
        self.reply_cloves = 0  # reply cloves queued to proxies (what a query can make this node send)
        self._tasks: set[asyncio.Task] = set()
        self._active = 0

    # ------------------------------------------------------------------ the link

    async def Link(self, request_iterator, context) -> None:
        """The ModelNode.Link handler: a proxy's stream, after its signed hello."""
        await self.hub.serve_with_hello(context, self.index.user, self.index.resolve)

    async def on_establish(self, link: Link, request: pb.EstablishRequest) -> pb.EstablishReply:
        return pb.EstablishReply(ok=False, reason=DropReason.UNKNOWN_PEER.value)  # model nodes relay no paths

    def on_cloves(self, link: Link, batch: pb.CloveBatch) -> list[tuple[int, DropReason]]:
        if not batch.forward or link.peer.role != USER:
            self.drops.count(DropReason.UNKNOWN_LINK)
            return []
        for clove in batch.cloves:
            self.submit(clove.payload)
        return []  # a proxy learns nothing of a clove's fate

    # ------------------------------------------------------------------ cloves in

    def submit(self, envelope: bytes) -> None:
        """Take one sealed clove; never raises: refusals are counted."""
        try:
            ask, index = self._find(envelope)
            self._accept(ask, index, envelope)
        except Drop as drop:
            self.drops.count(drop.reason)

    def _find(self, envelope: bytes) -> tuple[Ask, int]:
        if len(envelope) > WIRE.max_blob_bytes:
            raise Drop(DropReason.OVERSIZE)
        now = self.clock()
        try:
            hit = self.asks.lookup(sealing.envelope_tag(envelope))
            if hit is None:
                self.public_key_ops += 1
                secret, n, k = sealing.open_box(self.onion_key.private_key, envelope, self.cloves.n)
                self.asks.add(secret, n, k, sealing.clove_tags(secret, n), now)
                hit = self.asks.lookup(sealing.envelope_tag(envelope))
        except sealing.SealError as exc:
            raise Drop(DropReason.BAD_SEAL) from exc
        if hit is None:
            raise Drop(DropReason.BAD_SEAL, "a box not matching its tag")
        return hit

    def _accept(self, ask: Ask, index: int, envelope: bytes) -> None:
        if index in ask.received:
            raise Drop(DropReason.REPLAY)
        try:
            clove, token = sealing.open_envelope(ask.secret, index, envelope)
        except sealing.SealError as exc:
            raise Drop(DropReason.BAD_SEAL) from exc
        ask.received.add(index)
        ask.tokens.append(token)
        if ask.decoded:
            self._late(ask, index, token)
            raise Drop(DropReason.LATE)  # normal: k of n suffice; counted, not an error
        now = self.clock()
        self.groups.expire(now)
        message = self.groups.add(ask.secret, clove, now)
        if message is None:
            return
        ask.decoded = True
        try:
            query = sealing.open_query(message, self.cloves.n)
        except sealing.SealError as exc:
            self.asks.forget(ask, now)
            raise Drop(DropReason.TOO_MANY_ROUTES if "routes" in str(exc) else DropReason.BAD_QUERY, str(exc)) from exc
        age = self.wall_clock() - query.issued_s
        if not -self.params.query_max_age_s <= age <= self.params.query_max_age_s + self.params.query_time_granularity_s:
            self._spawn(self._say(ask, query, f"stale query: made {age:.0f} s from this node's clock; check yours"))
            raise Drop(DropReason.STALE)
        if self._active >= self.max_active:
            # say so on the reply routes: the user moves on to another node at once instead of
            # waiting out its reply timeout (and does not blame its paths)
            self._spawn(self._say(ask, query, f"{sealing.BUSY_ERROR}: at capacity"))
            raise Drop(DropReason.BUSY)
        self._spawn(self._serve(ask, query))

    def _late(self, ask: Ask, index: int, token: bytes) -> None:
        """A clove after the last reply message: report its token on its own route."""
        if ask.last_reply_at is None or ask.sealer is None or index >= len(ask.routes):
            return  # still replying: the next message lists it
        report = ask.sealer.delivery_report(index, ask.reported, [token], ask.k)
        ask.reported += 1
        self._send(ask.routes[index], report)

    def _spawn(self, coro) -> asyncio.Task:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # ------------------------------------------------------------------ replies out

    def _send(self, route: pb.ReplyRoute, blob: bytes) -> None:
        link = self.hub.link_to(route.proxy.hex())
        if link is None:
            self.drops.count(DropReason.UNKNOWN_PEER)
            return
        self.reply_cloves += 1
        link.send(False, [pb.Clove(link_id=route.link_id, payload=blob)])

    def _release(self, ask: Ask, query: pb.OverlayQuery, seq: int, chunk: pb.GenerateChunk) -> None:
        """The one place a reply message leaves: sealed, split, one clove queued per route.
        (When it leaves is the ReplyPacer's decision; anything that times replies goes here.)"""
        reply = pb.OverlayReply(seq=seq, chunk=chunk, delivered=ask.tokens)
        for route, blob in zip(query.routes, ask.sealer.cloves(reply, query.k)):
            self._send(route, blob)
        if chunk.final:
            self.asks.replied(ask, self.clock())

    def _prepare(self, ask: Ask, query: pb.OverlayQuery) -> None:
        ask.sealer = sealing.ReplySealer(query.reply_key, len(query.routes), minimum=self.params.reply_size_min)
        ask.routes = list(query.routes)

    async def _known(self, query: pb.OverlayQuery) -> None:
        """Look up (by node id, with a proof) every route's proxy this node does not hold yet."""
        unknown = {r.proxy.hex() for r in query.routes if self.index.user(r.proxy.hex()) is None}
        if unknown:
            await asyncio.gather(*(self.index.resolve(p) for p in unknown))

    async def _say(self, ask: Ask, query: pb.OverlayQuery, error: str) -> None:
        await self._known(query)
        self._prepare(ask, query)
        self._release(ask, query, 0, pb.GenerateChunk(final=True, error=error))

    async def _serve(self, ask: Ask, query: pb.OverlayQuery) -> None:
        self._active += 1
        await self._known(query)
        self._prepare(ask, query)
        pacer = ReplyPacer(self.params.reply_window_s)
        sooner = asyncio.Event()  # set when a chunk makes a message due sooner than we sleep
        pump = self._spawn(self._pump(query.request, pacer, sooner))
        try:
            while not pacer.finished:
                due = pacer.due_at()
                if due is None or due > self.clock():
                    sooner.clear()
                    try:  # until the message is due, or a chunk makes it due sooner (the final one)
                        await asyncio.wait_for(sooner.wait(), None if due is None else max(0.0, due - self.clock()))
                    except asyncio.TimeoutError:
                        pass
                chunk = pacer.take(self.clock())
                if chunk is not None:
                    self._release(ask, query, pacer.sent - 1, chunk)
            self.served += 1
        finally:
            self._active -= 1
            pump.cancel()

    async def _pump(self, request: pb.GenerateRequest, pacer: ReplyPacer, sooner: asyncio.Event) -> None:
        """Engine chunks into the pacer. Only a chunk that moves the next message's time (the
        first one waiting, or the end) wakes the sender: a token per 20 ms must not cost a
        wake-up each."""
        try:
            async for chunk in self.generate(request):
                before = pacer.due_at()
                pacer.add(chunk, self.clock())
                if before is None or pacer.due_at() < before:
                    sooner.set()
                if chunk.final:
                    break
        except Exception as exc:  # the engine failed: tell the user rather than go silent
            log.warning("serving an overlay query failed: %s", exc)
            pacer.end(generation.reply_error(exc), self.clock())
        finally:
            pacer.end("generation ended without a final chunk", self.clock())
            sooner.set()

    # ------------------------------------------------------------------ directory

    async def _refresh(self) -> None:
        """Re-read what the directory holds (one refresh at a time, shared by every waiter)."""
        if self._refreshing is None or self._refreshing.done():
            self._refreshing = asyncio.ensure_future(self._refresh_now())
        await asyncio.shield(self._refreshing)

    async def _refresh_now(self) -> None:
        try:
            await self.directory.refresh()
            self.index.rebuild()
        except Exception as exc:  # the directory is unreachable: the lookup stays a miss, counted
            log.info("directory refresh failed: %s", exc)

    # ------------------------------------------------------------------ lifecycle

    def status(self) -> dict:
        return {"served": self.served, "active": self._active, "asks": len(self.asks),
                "public_key_ops": self.public_key_ops, "reply_cloves": self.reply_cloves, "links": self.hub.status(), "drops": self.drops.as_dict()}

    async def close(self) -> None:
        await self.hub.close()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
