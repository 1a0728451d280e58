"""The Relay gRPC service every user node runs (ARCHITECTURE.md §3.2-3.3): a thin shell over PathTable.

Establish peels one onion layer (the only public-key operation a relay ever does), records
the hop, forwards the inner onion and passes the layered confirmation back. Forward and
Return move clove blobs by link ID, adding or removing one symmetric layer; the proxy (last
hop) hands forwarded cloves to the model node named under its layer, and seals returning
reply cloves for the user. What a relay sees is a link ID and a fixed-size opaque blob.

Every refusal is an `Ack(ok=False, reason=...)` counted in `drops`; nothing raises to gRPC.
A node's own paths end here too: Return traffic on a link ID registered with
`add_endpoint` is handed to the node's asking machinery instead of being relayed.
"""

from __future__ import annotations

import logging
import time
from typing import Awaitable, Callable

import grpc
from google.protobuf.message import DecodeError

from gentorrent.config import OVERLAY, WIRE, OverlayParams
from gentorrent.crypto import onion
from gentorrent.crypto.keys import OnionKey
from gentorrent.channels import CertLookup, ChannelPool
from gentorrent.overlay.pathtable import Drop, DropCounter, DropReason, HopEntry, PathTable, ReplayFilter
from gentorrent.wire import gentorrent_pb2 as pb
from gentorrent.wire import gentorrent_pb2_grpc as rpc

log = logging.getLogger(__name__)

#: a layered clove: the clove limit plus room for seals, padding and layer headers
CONFIRMATION = b"gentorrent/path-established/v1"

#: (event, link_id, payload) for every blob a relay receives or sends; test instrumentation
Tap = Callable[[str, bytes, bytes], None]
Endpoint = Callable[[bytes], Awaitable[None]]  # receives the return blob of one of our own paths


class Relay(rpc.RelayServicer):
    """Relay state and handlers of one user node."""

    def __init__(
        self,
        onion_key: OnionKey,
        address: str,
        relay_certs: CertLookup,
        model_certs: CertLookup,
        channels: ChannelPool,
        node_id_hex: str = "",
        params: OverlayParams = OVERLAY,
        clock: Callable[[], float] = time.monotonic,
        tap: Tap | None = None,
    ) -> None:
        self.onion_key = onion_key
        self.address = address
        self.relay_certs = relay_certs
        self.model_certs = model_certs
        self.channels = channels
        self.node_id_hex = node_id_hex
        self.params = params
        self.clock = clock
        self.tap = tap
        self.table = PathTable(params)
        self.replay = ReplayFilter(params.replay_window)
        self.drops = DropCounter()
        self._endpoints: dict[bytes, Endpoint] = {}

    # ------------------------------------------------------------------ own paths

    def add_endpoint(self, link_id: bytes, handler: Endpoint) -> None:
        """Deliver Return traffic on `link_id` (a path this node built) to `handler`."""
        self._endpoints[link_id] = handler

    def remove_endpoint(self, link_id: bytes) -> None:
        self._endpoints.pop(link_id, None)

    # ------------------------------------------------------------------ helpers

    def _refuse(self, reason: DropReason) -> pb.Ack:
        self.drops.count(reason)
        return pb.Ack(ok=False, reason=reason.value)

    def _observe(self, event: str, link_id: bytes, payload: bytes) -> None:
        if self.tap is not None:
            self.tap(event, link_id, payload)

    def _relay_stub(self, address: str) -> rpc.RelayStub:
        cert = self.relay_certs(address)
        if cert is None:
            raise Drop(DropReason.UNKNOWN_PEER, address)
        return rpc.RelayStub(self.channels.get(address, cert))

    async def _call(self, coro) -> pb.Ack:
        """Await a downstream unary call; an unreachable peer is a counted refusal."""
        try:
            return await coro
        except grpc.aio.AioRpcError as exc:
            log.debug("next hop failed: %s", exc.code())
            return self._refuse(DropReason.NEXT_HOP_UNREACHABLE)

    # ------------------------------------------------------------------ Establish

    async def Establish(self, request: pb.EstablishRequest, context) -> pb.EstablishReply:
        try:
            if context is not None and _host(request.return_address) != _peer_host(context.peer()):
                raise Drop(DropReason.UNKNOWN_PEER, "return address is not the caller's")
            confirmation = await self._establish(request)
        except Drop as drop:
            self.drops.count(drop.reason)
            return pb.EstablishReply(ok=False, reason=drop.reason.value)
        return pb.EstablishReply(ok=True, confirmation=confirmation)

    async def _establish(self, request: pb.EstablishRequest) -> bytes:
        if len(request.onion) != onion.ONION_SIZE:
            raise Drop(DropReason.OVERSIZE if len(request.onion) > onion.ONION_SIZE else DropReason.BAD_ONION)
        if self.relay_certs(request.return_address) is None:
            raise Drop(DropReason.UNKNOWN_PEER, request.return_address)
        try:
            layer = onion.peel(request.onion, self.onion_key.private_key)
        except onion.OnionError as exc:
            raise Drop(DropReason.BAD_ONION, str(exc)) from exc
        now = self.clock()
        entry = HopEntry(layer.link_in, layer.link_out, request.return_address, layer.next_hop, layer.hop_key, now, now)
        if layer.next_hop is not None and self.relay_certs(layer.next_hop) is None:
            raise Drop(DropReason.UNKNOWN_PEER, layer.next_hop)
        self.table.add(entry)
        if layer.next_hop is None:
            return onion.seal_return(layer.hop_key, CONFIRMATION)
        try:
            reply = await self._relay_stub(layer.next_hop).Establish(
                pb.EstablishRequest(onion=layer.onion, return_address=self.address),
                timeout=self.params.establish_timeout_s,
            )
        except grpc.aio.AioRpcError as exc:
            self.table.remove(entry)
            raise Drop(DropReason.NEXT_HOP_UNREACHABLE, str(exc.code())) from exc
        if not reply.ok or len(reply.confirmation) > 4096:
            self.table.remove(entry)
            raise Drop(DropReason.NEXT_HOP_REFUSED, reply.reason)
        try:
            return onion.wrap_return(layer.hop_key, reply.confirmation)
        except onion.CloveLayerError as exc:
            self.table.remove(entry)
            raise Drop(DropReason.BAD_LAYER) from exc

    # ------------------------------------------------------------------ Forward

    async def Forward(self, request: pb.CloveEnvelope, context) -> pb.Ack:
        self._observe("forward_in", request.link_id, request.payload)
        try:
            if len(request.payload) > WIRE.max_blob_bytes:
                raise Drop(DropReason.OVERSIZE)
            entry = self.table.forward_entry(request.link_id, self.clock())
            self.replay.check_and_add(request.link_id, request.payload)
            if entry.is_proxy:
                return await self._deliver_to_model(entry, request.payload)
            inner = onion.peel_forward(entry.hop_key, request.payload)
            stub = self._relay_stub(entry.successor)
        except Drop as drop:
            return self._refuse(drop.reason)
        except onion.CloveLayerError:
            return self._refuse(DropReason.BAD_LAYER)
        self._observe("forward_out", entry.link_out, inner)
        return await self._call(stub.Forward(pb.CloveEnvelope(link_id=entry.link_out, payload=inner),
                                             timeout=self.params.forward_timeout_s))

    async def _deliver_to_model(self, entry: HopEntry, blob: bytes) -> pb.Ack:
        try:
            plain = onion.open_forward(entry.hop_key, blob)
            instruction = pb.ProxyInstruction.FromString(plain)
        except (onion.CloveLayerError, DecodeError):
            return self._refuse(DropReason.BAD_LAYER)
        cert = self.model_certs(instruction.destination)
        if cert is None or not instruction.payload:
            return self._refuse(DropReason.UNKNOWN_DESTINATION)
        self._observe("submit_out", b"", instruction.payload)
        stub = rpc.ModelNodeStub(self.channels.get(instruction.destination, cert))
        return await self._call(stub.SubmitClove(pb.CloveEnvelope(payload=instruction.payload),
                                                 timeout=self.params.forward_timeout_s))

    # ------------------------------------------------------------------ Return

    async def Return(self, request: pb.CloveEnvelope, context) -> pb.Ack:
        self._observe("return_in", request.link_id, request.payload)
        if len(request.payload) > WIRE.max_blob_bytes:
            return self._refuse(DropReason.OVERSIZE)
        endpoint = self._endpoints.get(request.link_id)
        if endpoint is not None:
            try:
                self.replay.check_and_add(request.link_id, request.payload)
            except Drop as drop:
                return self._refuse(drop.reason)
            await endpoint(request.payload)
            return pb.Ack(ok=True)
        try:
            entry = self.table.return_entry(request.link_id, self.clock())
            self.replay.check_and_add(request.link_id, request.payload)
            if entry.is_proxy:
                blob = onion.seal_return(entry.hop_key, request.payload)
            else:
                blob = onion.wrap_return(entry.hop_key, request.payload)
            stub = self._relay_stub(entry.predecessor)
        except Drop as drop:
            return self._refuse(drop.reason)
        except onion.CloveLayerError:
            return self._refuse(DropReason.BAD_LAYER)
        self._observe("return_out", entry.link_in, blob)
        return await self._call(stub.Return(pb.CloveEnvelope(link_id=entry.link_in, payload=blob),
                                            timeout=self.params.forward_timeout_s))

    async def Health(self, request, context) -> pb.HealthReply:
        return pb.HealthReply(node_id=self.node_id_hex, role="user", serving=True)

    # ------------------------------------------------------------------ housekeeping

    def expire(self) -> int:
        expired = self.table.expire(self.clock())
        for _ in expired:
            self.drops.count(DropReason.EXPIRED)
        return len(expired)

    def status(self) -> dict:
        return {"table": self.table.stats(), "drops": self.drops.as_dict(), "own_paths": len(self._endpoints)}


def _host(address: str) -> str:
    return address.rpartition(":")[0].strip("[]")


def _peer_host(peer: str) -> str:
    """Host of a gRPC peer string: "ipv4:127.0.0.1:5000", "ipv6:[::1]:5000"."""
    kind, _, rest = peer.partition(":")
    return _host(rest) if kind in ("ipv4", "ipv6") else peer
