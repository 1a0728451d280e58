"""The Relay service every user node runs (ARCHITECTURE.md §3.2-3.3): a thin shell over PathTable.

Neighbours reach it over one long-lived Link stream each (gentorrent.overlay.links), under
mutual TLS: the caller presents a leaf certificate, and `PeerIndex.identify` names the
registered node whose Ed25519 key signed it (anyone else is refused at once). So a predecessor
is a key, not a claimed address: a path entry records the authenticated node that sent the onion, forward cloves are
accepted on a link ID only from that node, return cloves only from the entry's successor (or,
on a proxy's fresh reply links, from a registered model node). Knowing a link ID is not enough.

Establish peels one onion layer (the only public-key operation a relay ever does), refuses
stale or replayed onions, records the hop, forwards the inner onion to the successor named
by node id, and passes the layered confirmation back. Forward cloves are checked (per-hop
MAC), numbered (per-link replay window), peeled and passed on; the proxy (last hop) hands them
to the model node named under its layer and, if the model node cannot be reached, tells the
user so in a sealed notice. Return cloves get one layer each; the proxy seals what the model
node sent. Every refusal is counted in `drops`; hop-local acks say only whether this hop
accepted a clove, and one that says the successor no longer knows the path (or a link that
died) closes the path: its user gets a sealed notice that no hop on the way can tell from a
proxy's (`_close`). A node's own paths end here too: return traffic on a link ID registered
with `add_endpoint` is handed to the node's asking machinery instead of being relayed.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Callable

import grpc
from google.protobuf.message import DecodeError

from gentorrent.channels import ChannelPool
from gentorrent.ledger.peers import MODEL, USER, PeerIndex
from gentorrent.config import OVERLAY, WIRE, OverlayParams
from gentorrent.crypto import onion, tls
from gentorrent.crypto.keys import Identity, OnionKey
from gentorrent.overlay.cover_timing import ReplyHolds
from gentorrent.overlay.links import Link, LinkHub
from gentorrent.overlay.pathtable import (PATH_GONE, Drop, DropCounter, DropReason, HopEntry, OnionReplayCache,
                                          PathTable)
from gentorrent.wire import gentorrent_pb2 as pb
from gentorrent.wire import gentorrent_pb2_grpc as rpc
from user_client.audit_handoff import CommitteeHandoff

log = logging.getLogger(__name__)

CONFIRMATION = b"gentorrent/path-established/v2"
#: the first byte of what a proxy seals for the user: a model node's reply clove, or a notice
RETURN_REPLY, RETURN_NOTICE = 0, 1
_SEQ_MOD = 1 << 64

#: (event, link_id, payload) for every blob a relay receives or sends; test instrumentation
Tap = Callable[[str, bytes, bytes], None]
#: receives the return blob of one of our own paths
Endpoint = Callable[[bytes], None]
#: model nodes a proxy may be waiting to learn of at once (each waits for one lookup by node id)
MAX_PENDING_DESTINATIONS = 64
#: what every notice a hop seals for a user is padded to (its kind, a clove number and a reason)
NOTICE_BYTES = 48


@dataclass
class _OwnPath:
    first_hop: str  # node id: the only neighbour that may send on this link
    handler: Endpoint


class Relay(rpc.RelayServicer):
    """Relay state and handlers of one user node."""

    def __init__(
        self,
        onion_key: OnionKey,
        node_id_hex: str,
        identity: Identity,
        index: PeerIndex,
        channels: ChannelPool,
        params: OverlayParams = OVERLAY,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        tap: Tap | None = None,
        handoff: CommitteeHandoff | None = None,
        path_idle_expiry_s: float | None = None,
    ) -> None:
        """`handoff`: how this relay, as a proxy, hands sealed audits to committee members
        (None: it refuses them); `path_idle_expiry_s`: the node's CloveParams' (its [cloves]).
        A proxy asked to hand cloves to a model node it has not met yet looks it up by node id
        (`index.resolve`, one proven answer) before it gives up on them (the node may just have
        registered: the first ask of a node that just joined must not fail)."""
        self.onion_key = onion_key
        self.handoff = handoff
        self.node_id_hex = node_id_hex
        self.index = index
        self.params = params
        self.clock = clock
        self.wall_clock = wall_clock
        self.tap = tap
        self.table = PathTable(params, path_idle_expiry_s)
        self.onions = OnionReplayCache(params.onion_max_age_s, 2 * params.max_paths)
        self.drops = DropCounter()
        self.hub = LinkHub(node_id_hex, identity, index.get, channels, self, params, self.drops)
        self._endpoints: dict[bytes, _OwnPath] = {}
        self._lookups: set[asyncio.Task] = set()  # proxied cloves waiting for a model node's record
        self.notices = 0
        self.closes_sent = 0  # paths this relay closed, each user told (`_close`)
        # as a proxy: what crosses it waits a random time, so no hop times its position
        self.holds = ReplyHolds(params.position_cover_s if params.hide_position else 0.0,
                                params.first_reply_timeout_s + params.reply_idle_timeout_s, params.max_paths,
                                random.SystemRandom())

    # ------------------------------------------------------------------ own paths

    def add_endpoint(self, link_id: bytes, first_hop: str, handler: Endpoint) -> None:
        """Deliver return traffic on `link_id` from `first_hop` (a path this node built) to `handler`."""
        self._endpoints[link_id] = _OwnPath(first_hop, handler)

    def remove_endpoint(self, link_id: bytes) -> None:
        self._endpoints.pop(link_id, None)

    # ------------------------------------------------------------------ gRPC

    async def Link(self, request_iterator, context) -> None:
        peer = await self.index.identify_caller(tls.caller_certificate(context))
        if peer is None:  # the handshake only checked the chain to the public root: this is the check
            self.drops.count(DropReason.UNAUTHENTICATED)
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "not a certificate signed by a registered node's key")
            return
        await self.hub.serve(context, peer)

    async def Health(self, request, context) -> pb.HealthReply:
        return pb.HealthReply(node_id=self.node_id_hex, role="user", serving=True)

    # ------------------------------------------------------------------ helpers

    def _observe(self, event: str, link_id: bytes, payload: bytes) -> None:
        if self.tap is not None:
            self.tap(event, link_id, payload)

    def _send(self, node_id: str, forward: bool, cloves: list[pb.Clove], ack: bool = False):
        """Queue cloves to a neighbour (the one place every outgoing clove passes)."""
        link = self.hub.link_to(node_id)
        if link is None:
            for _ in cloves:
                self.drops.count(DropReason.UNKNOWN_PEER)
            return None
        for c in cloves:
            self._observe("forward_out" if forward else "return_out", c.link_id, c.payload)
        return link.send(forward, cloves, ack)

    def _pass_on(self, node_id: str, forward: bool, items: list[tuple[HopEntry, pb.Clove]]) -> None:
        """Relay cloves to the next hop. Forward cloves ask for its ack, as the asker's do (a
        first hop cannot tell the asker from a relay by the frames it gets: hide_position), and
        the ack is heeded: a successor that no longer knows a path, or whose link died, has the
        path closed and its user told (`_close`). Anything else a hop refuses (a replay, a
        bad layer) is the user's to find, end to end; an ack that never comes closes nothing (a
        slow hop is not a broken one)."""
        cloves = [clove for _, clove in items]
        if not (forward and self.params.hide_position):  # (without: the relays before 2026-12-02)
            self._send(node_id, forward, cloves)
            return
        entries = [entry for entry, _ in items]
        ack = self._send(node_id, True, cloves, ack=True)
        if ack is None:  # the successor left the registry
            self._close(entries)
            return
        if not ack.done():  # an ack that never comes must not stay behind
            timer = asyncio.get_running_loop().call_later(self.params.forward_timeout_s, ack.cancel)
            ack.add_done_callback(lambda _: timer.cancel())
        ack.add_done_callback(lambda done: self._forward_acked(done, entries))

    def _forward_acked(self, ack: asyncio.Future, entries: list[HopEntry]) -> None:
        if ack.cancelled():
            return
        refused = ack.result()
        if refused is None:  # the link died before the successor answered
            self._close(entries)
        else:
            self._close([entries[i] for i, reason in refused if reason in PATH_GONE and i < len(entries)])

    def _close(self, entries: list[HopEntry]) -> None:
        """Forget these paths, and tell each one's user in a notice sealed under this hop's
        return key, sent back on the path like any returning blob: the hops before this one
        wrap it as they wrap the proxy's, so none learns that a hop behind it closed a path, and
        with it its own position (a close passed hop by hop, Tor's DESTROY, tells the hop that
        receives one that it is the first: only the second hop ever sends it one). Their entries
        idle out. The user knows from its seal which hop said so (onion.unwrap_return_from)."""
        closed = [e for e in {id(e): e for e in entries}.values() if self.table.holds(e)]
        for entry in closed:
            self.table.remove(entry)
        self._send_notices([(entry, 0) for entry in closed], DropReason.PATH_CLOSED)
        self.closes_sent += len(closed)

    # ------------------------------------------------------------------ Establish

    async def on_establish(self, link: Link, request: pb.EstablishRequest) -> pb.EstablishReply:
        try:
            confirmation = await self._establish(link, request.onion)
        except Drop as drop:
            self.drops.count(drop.reason)
            return pb.EstablishReply(ok=False, reason=drop.reason.value)
        return pb.EstablishReply(ok=True, confirmation=confirmation)

    async def _establish(self, link: Link, blob: bytes) -> bytes:
        if link.peer.role != USER:
            raise Drop(DropReason.UNKNOWN_PEER, "only user nodes build paths")
        if len(blob) != onion.ONION_SIZE:
            raise Drop(DropReason.OVERSIZE if len(blob) > onion.ONION_SIZE else DropReason.BAD_ONION)
        try:
            layer = onion.peel(blob, self.onion_key.private_key)
        except onion.OnionError as exc:
            raise Drop(DropReason.BAD_ONION, str(exc)) from exc
        if layer.next_hop is not None and self.index.user(layer.next_hop) is None:
            await self.index.resolve(layer.next_hop)  # a relay this one has not met yet
            if self.index.user(layer.next_hop) is None:
                raise Drop(DropReason.UNKNOWN_PEER, layer.next_hop[:16])
        self.onions.check_and_add(layer.ephemeral, layer.issued_s, self.wall_clock())
        now = self.clock()
        entry = HopEntry(layer.link_in, layer.link_out, link.peer.node_id, layer.next_hop, layer.hop_key, now, now,
                         linger_s=layer.linger_s)
        self.table.add(entry)
        if layer.next_hop is None:  # the proxy: its confirmation waits, as its replies do
            hold = self.holds.fresh()
            if hold:
                await asyncio.sleep(hold)
            return onion.seal_return(entry.keys, CONFIRMATION)
        successor = self.hub.link_to(layer.next_hop)
        try:
            reply = await successor.establish(layer.onion, self.params.establish_timeout_s)
        except asyncio.TimeoutError:
            reply = pb.EstablishReply(ok=False, reason=DropReason.NEXT_HOP_UNREACHABLE.value)
        if not reply.ok or len(reply.confirmation) > 4096:
            self.table.remove(entry)
            raise Drop(DropReason.NEXT_HOP_REFUSED if reply.reason != DropReason.NEXT_HOP_UNREACHABLE.value
                       else DropReason.NEXT_HOP_UNREACHABLE)
        try:
            return onion.wrap_return(entry.keys, reply.confirmation)
        except onion.CloveLayerError as exc:
            self.table.remove(entry)
            raise Drop(DropReason.BAD_LAYER) from exc

    # ------------------------------------------------------------------ cloves

    def on_cloves(self, link: Link, batch: pb.CloveBatch) -> list[tuple[int, DropReason]]:
        out: dict[str, list[tuple[HopEntry, pb.Clove]]] = defaultdict(list)  # next hop -> (path, clove)
        to_models: dict[str, list[tuple[HopEntry, int, pb.Clove]]] = defaultdict(list)
        refused = []
        one = self._forward_one if batch.forward else self._return_one
        for i, clove in enumerate(batch.cloves):
            self._observe("forward_in" if batch.forward else "return_in", clove.link_id, clove.payload)
            try:
                one(link, clove, out, to_models)
            except Drop as drop:
                self.drops.count(drop.reason)
                refused.append((i, drop.reason))
        for node_id, items in out.items():
            self._pass_on(node_id, batch.forward, items)
        for node_id, items in to_models.items():
            if self.index.model(node_id) is not None:
                self._submit_held(node_id, items)
            elif len(self._lookups) < MAX_PENDING_DESTINATIONS:  # bounded: a flood of unknown ids waits no lookup
                task = asyncio.ensure_future(self._submit_once_known(node_id, items))
                self._lookups.add(task)
                task.add_done_callback(self._lookups.discard)
            else:
                self._notify(items, DropReason.UNKNOWN_DESTINATION)
        return refused

    async def _submit_once_known(self, node_id: str, items: list[tuple[HopEntry, int, pb.Clove]]) -> None:
        """Cloves for a model node this relay did not know: hand them on once it is looked up by
        node id, or tell their users it is unknown."""
        try:
            await asyncio.wait_for(self.index.resolve(node_id), self.params.forward_timeout_s)
        except Exception as exc:  # the committee did not answer: the cloves are undeliverable
            log.info("lookup of unknown model node %s failed: %s", node_id[:16], exc)
        if self.index.model(node_id) is None:
            self._notify(items, DropReason.UNKNOWN_DESTINATION)
            return
        self._submit_held(node_id, items)

    def _submit_held(self, node_id: str, items: list[tuple[HopEntry, int, pb.Clove]]) -> None:
        """Hand cloves to a model node, each after a hold of its own (gentorrent.overlay.cover_timing)."""
        if not self.holds.bound_s:
            self._submit(node_id, items)
            return
        loop = asyncio.get_running_loop()
        for item in items:
            loop.call_later(self.holds.fresh(), self._submit, node_id, [item])

    def _forward_one(self, link: Link, clove: pb.Clove, out, to_models) -> None:
        if len(clove.payload) > WIRE.max_blob_bytes:
            raise Drop(DropReason.OVERSIZE)
        if link.peer.role != USER:
            raise Drop(DropReason.UNKNOWN_LINK)
        entry = self.table.forward_entry(clove.link_id, link.peer.node_id, self.clock())
        try:
            if entry.is_proxy:
                seq, plain = onion.open_forward(entry.keys, clove.payload)
            else:
                seq, inner = onion.peel_forward(entry.keys, clove.payload)
        except onion.CloveLayerError as exc:
            raise Drop(DropReason.BAD_LAYER) from exc
        entry.forward_window.check_and_add(seq)  # after the MAC: junk cannot touch the window
        self.table.used(entry, self.clock(), forward=True)
        if not entry.is_proxy:
            out[entry.successor].append((entry, pb.Clove(link_id=entry.link_out, payload=inner)))
            return
        try:
            instruction = pb.ProxyInstruction.FromString(plain)
        except DecodeError as exc:
            raise Drop(DropReason.BAD_INSTRUCTION) from exc
        if instruction.committee_member:  # a sealed audit for the committee (user_client/audit_handoff.py)
            if self.handoff is None or not self.handoff.take(instruction.committee_member, instruction.payload):
                raise Drop(DropReason.UNKNOWN_DESTINATION)
            return
        destination = instruction.destination.hex()
        if len(instruction.destination) != 32 or not instruction.payload:
            raise Drop(DropReason.UNKNOWN_DESTINATION)  # (an unknown node is looked up in on_cloves)
        user_seq = (seq - entry.keys.seq_offset) % _SEQ_MOD
        to_models[destination].append((entry, user_seq, pb.Clove(payload=instruction.payload)))

    def _submit(self, node_id: str, items: list[tuple[HopEntry, int, pb.Clove]]) -> None:
        """Hand cloves to a model node (looked up in on_cloves), asking for its (hop-local) ack:
        a model node that cannot be reached is reported to each clove's user, who then need not
        wait out a timeout."""
        for _, _, clove in items:
            self._observe("submit_out", b"", clove.payload)
        ack = self._send(node_id, True, [c for _, _, c in items], ack=True)
        if ack is None:
            self._notify(items, DropReason.UNKNOWN_DESTINATION)
            return
        timer = asyncio.get_running_loop().call_later(self.params.forward_timeout_s, self._model_ack_late, ack)
        ack.add_done_callback(lambda done: self._model_acked(done, timer, items))

    @staticmethod
    def _model_ack_late(ack: asyncio.Future) -> None:
        if not ack.done():
            ack.set_result(None)

    def _model_acked(self, ack: asyncio.Future, timer: asyncio.TimerHandle,
                     items: list[tuple[HopEntry, int, pb.Clove]]) -> None:
        timer.cancel()
        result = ack.result()
        if result is None:  # the link died, or the model node said nothing in time
            self._notify(items, DropReason.NEXT_HOP_UNREACHABLE)
            return
        refused = dict(result)
        self._notify([items[i] for i in refused], DropReason.NEXT_HOP_REFUSED)

    def _notify(self, items: list[tuple[HopEntry, int, pb.Clove]], reason: DropReason) -> None:
        """Tell each clove's user, sealed under the proxy's return key, that it was not delivered."""
        self._send_notices([(entry, user_seq) for entry, user_seq, _ in items], reason)
        self.notices += len(items)

    def _send_notices(self, items: list[tuple[HopEntry, int]], reason: DropReason) -> None:
        """One sealed notice per (path, clove number) back to its predecessor, padded to one
        size: a proxy's undelivered clove and a hop's closed path look alike on the way back."""
        out: dict[str, list[pb.Clove]] = defaultdict(list)
        for entry, seq in items:
            self.drops.count(reason)
            notice = bytes((RETURN_NOTICE,)) + pb.ProxyNotice(seq=seq, reason=reason.value).SerializeToString()
            blob = onion.seal_return(entry.keys, notice, pad_to=NOTICE_BYTES)
            out[entry.predecessor].append(pb.Clove(link_id=entry.link_in, payload=blob))
        for node_id, cloves in out.items():
            self._send(node_id, False, cloves)

    def _return_one(self, link: Link, clove: pb.Clove, out, to_models) -> None:
        if len(clove.payload) > WIRE.max_blob_bytes:
            raise Drop(DropReason.OVERSIZE)
        own = self._endpoints.get(clove.link_id)
        if own is not None:
            if own.first_hop != link.peer.node_id:
                raise Drop(DropReason.UNKNOWN_LINK)
            own.handler(clove.payload)
            return
        entry = self.table.return_entry(clove.link_id, link.peer.node_id, link.peer.role == MODEL, self.clock())
        entry.return_window.check_and_add(bytes(clove.payload[:32]))
        self.table.used(entry, self.clock(), forward=False)
        try:
            if entry.is_proxy:
                blob = onion.seal_return(entry.keys, bytes((RETURN_REPLY,)) + clove.payload)
            else:
                blob = onion.wrap_return(entry.keys, clove.payload)
        except onion.CloveLayerError as exc:
            raise Drop(DropReason.BAD_LAYER) from exc
        back = pb.Clove(link_id=entry.link_in, payload=blob)
        hold = self.holds.reply(clove.link_id, self.clock()) if entry.is_proxy else 0.0
        if hold:  # every reply clove of this ask waits the same: the answer keeps its pace
            asyncio.get_running_loop().call_later(hold, self._send, entry.predecessor, False, [back])
            return
        out[entry.predecessor].append((entry, back))

    # ------------------------------------------------------------------ housekeeping

    def expire(self) -> int:
        expired = self.table.expire(self.clock())
        for _ in expired:
            self.drops.count(DropReason.EXPIRED)
        return len(expired)

    def status(self) -> dict:
        return {"table": self.table.stats(), "drops": self.drops.as_dict(), "own_paths": len(self._endpoints),
                "links": self.hub.status(), "notices": self.notices, "closes_sent": self.closes_sent,
                "audit_handoffs": self.handoff.status() if self.handoff else {}}

    async def close(self) -> None:
        for task in list(self._lookups):
            task.cancel()
        await asyncio.gather(*self._lookups, return_exceptions=True)
        if self.handoff is not None:
            await self.handoff.close()
        await self.hub.close()
