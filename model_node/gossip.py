"""Gossip among the model nodes of one group: HR-tree deltas, load, Sentry statistics.

Every `gossip_interval_s` a node sends each peer one signed `GossipMessage` over gRPC/TLS
(pinned certificates from the directory): its own subtree delta since what that peer said it
holds of us, its load row, its KV capacity in tokens, its Sentry statistics and its active
chunk layout. The reply says which version of our subtree the peer now holds, so an unchanged
subtree costs a 100-byte header, not the whole tree.

Who is a peer comes from the verified directory only (a `Directory`: the committee's light-
client-checked registry, or a static file on devnets): same model name, trusted, and a node id
that is the hash of the registered public key. A message is merged only if its sender is such
a member, its Ed25519 signature verifies under the registered key, its sequence number (the
sender's clock in ms) is newer than the last one merged and within `gossip_max_skew_s` of ours,
and every field is within its size bound; a member's messages closer together than
`gossip_min_spacing_s` are refused unread, so one member cannot make us validate and merge
maximal deltas (up to ~0.1 s of CPU each) as fast as it can sign them. The content is then
bound to that sender by `GroupRouting.merge_peer`: its own subtree and Sentry statistics only,
a version no further ahead of its clock than the skew allowed, a layout that counts as one
vote, and its registered capacity (not the one it claims) in the node table
(ARCHITECTURE.md §3.4, THREAT_MODEL.md "Model groups"). A member that leaves the roster (untrusted,
deregistered, other model) or is silent for `peer_silence_s` is dropped from the tree and the
node table (`GroupRouting.tick`). Whatever fails in a round's `tick`, the round still gossips.

The protocol state lives in `GroupRouting` (pure); this module does the I/O, the clocks and the
signatures.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import struct
import time
from dataclasses import replace
from typing import Callable, Iterable

import grpc

from gentorrent.config import ROUTING, RoutingParams
from gentorrent.crypto import tls
from gentorrent.crypto.keys import Identity, is_valid_signature, node_id_of
from gentorrent.channels import ChannelPool
from gentorrent.ledger.sections import ModelRecord
from gentorrent.routing.group import GossipRejected, GroupRouting, LocalLoad, PeerReport
from gentorrent.wire import gentorrent_pb2 as pb
from gentorrent.wire import gentorrent_pb2_grpc as rpc

log = logging.getLogger(__name__)

DOMAIN = b"gentorrent/gossip/v1\x00"


def max_field_bytes(params: RoutingParams = ROUTING) -> dict[str, int]:
    """Size bounds of a gossip message's fields, checked before anything is decoded."""
    return {
        "tree_delta": 128 + params.max_node_id_bytes + 3 * params.max_subtree_nodes,
        "sentry_stats": 64 + params.max_node_id_bytes + 16 * params.sentry_max_entries,
        "layout": 64 + 4 * 1024,
        "model": 256,
    }


def group_roster(models: Iterable[ModelRecord], model: str, local_id: str) -> dict[str, ModelRecord]:
    """The trusted members serving `model` (`ModelRecord`s of the directory), ourselves left out.

    A record whose node id is not the hash of its public key is ignored: the id is what the
    tree and the signatures are keyed by."""
    roster: dict[str, ModelRecord] = {}
    for m in models:
        if m.model != model or not m.trusted or m.node_id_hex == local_id:
            continue
        try:
            if node_id_of(m.public_key) != m.node_id:
                continue
        except ValueError:
            continue
        roster[m.node_id_hex] = replace(m, capacity=min(10, max(1, int(m.capacity))))
    return roster


def _lp(data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + data


def signed_bytes(msg: pb.GossipMessage) -> bytes:
    """The canonical bytes a gossip signature covers (protobuf encodings are not canonical)."""
    ld = msg.load
    return b"".join((
        DOMAIN, _lp(msg.node_id), _lp(msg.model.encode()), struct.pack(">Q", msg.sequence),
        struct.pack(">IIfIQQ", ld.active, ld.queued, ld.kv_cache_usage, ld.capacity,
                    ld.prefix_queries, ld.prefix_hits),
        hashlib.sha256(msg.tree_delta).digest(), hashlib.sha256(msg.sentry_stats).digest(),
        struct.pack(">I", msg.chunk_version), hashlib.sha256(msg.layout).digest(),
        struct.pack(">Qf", msg.kv_capacity_tokens, msg.latency_s),
    ))


def sign(identity: Identity, msg: pb.GossipMessage) -> pb.GossipMessage:
    msg.signature = identity.sign(signed_bytes(msg))
    return msg


class GroupGossip:
    """The gossip shell of one model node: sends rounds, answers the Gossip RPC."""

    def __init__(self, identity: Identity, model: str, group: GroupRouting, directory,
                 local_load: Callable[[], LocalLoad], *, prefix_counters: Callable[[], tuple[int, int]] = lambda: (0, 0),
                 channels: ChannelPool | None = None, params: RoutingParams = ROUTING,
                 interval_s: float | None = None, clock: Callable[[], float] = time.monotonic,
                 wall_ms: Callable[[], int] = lambda: int(time.time() * 1000)) -> None:
        self.identity = identity
        self.local_id = identity.node_id_hex
        self.model = model
        self.group = group
        self.directory = directory
        self.local_load = local_load
        self.prefix_counters = prefix_counters
        self.channels = channels or ChannelPool()
        self.params = params
        self.interval_s = params.gossip_interval_s if interval_s is None else interval_s
        self.clock = clock
        self.wall_ms = wall_ms
        self.roster: dict[str, ModelRecord] = {}
        self._holds: dict[str, int] = {}  # what each peer last said it holds of our subtree
        self._last_seq: dict[str, int] = {}  # newest sequence merged per peer
        self._read_at: dict[str, float] = {}  # when we last read (validated) a peer's message
        self._last_sent_seq = 0
        self._refreshed_at = float("-inf")
        self._task: asyncio.Task | None = None
        self.sent = self.send_failures = self.received = self.tick_errors = 0
        self.rejected: dict[str, int] = {}
        self.dropped: list[str] = []

    # -- roster ---------------------------------------------------------------------------

    async def refresh_roster(self, force: bool = False) -> None:
        now = self.clock()
        if not force and now - self._refreshed_at < self.params.directory_refresh_s:
            return
        self._refreshed_at = now
        try:
            await self.directory.follow(self.model)  # the group's roster: held and kept fresh from now on
            await self.directory.refresh()
        except Exception as exc:  # a directory that fails its proof: keep the last good roster
            log.warning("group roster not refreshed: %s", exc)
            return
        self.roster = group_roster(self.directory.models(), self.model, self.local_id)

    def capacities(self) -> dict[str, int]:
        """The roster as the routing core takes it: member id -> registered capacity score."""
        return {node_id: record.capacity for node_id, record in self.roster.items()}

    # -- sending --------------------------------------------------------------------------

    def build_message(self, peer_id: str) -> pb.GossipMessage:
        load = self.local_load()
        queries, hits = self.prefix_counters()
        seq = max(self.wall_ms(), self._last_sent_seq + 1)
        self._last_sent_seq = seq
        g = self.group
        msg = pb.GossipMessage(
            node_id=self.identity.node_id, model=self.model, sequence=seq,
            load=pb.LoadReport(active=load.active, queued=load.queued,
                               kv_cache_usage=min(1.0, max(0.0, load.kv_usage)),
                               capacity=g.capacity, prefix_queries=queries, prefix_hits=hits),
            tree_delta=g.outgoing_delta(self._holds.get(peer_id, 0)),
            sentry_stats=g.sentry.export_stats(), chunk_version=g.sentry.layout.epoch,
            layout=g.sentry.export_layout(), kv_capacity_tokens=g.kv_capacity_tokens,
            latency_s=load.latency_s)
        return sign(self.identity, msg)

    async def send(self, peer: ModelRecord) -> bool:
        """One Gossip call to one peer; False (and the peer's view of us reset) on failure."""
        msg = self.build_message(peer.node_id_hex)
        try:
            channel = self.channels.to(peer)
            reply = await rpc.ModelNodeStub(channel).Gossip(
                msg, timeout=self.params.gossip_rpc_timeout_s)
        except (grpc.aio.AioRpcError, tls.TlsError, OSError) as exc:
            self.send_failures += 1
            self._holds.pop(peer.node_id_hex, None)
            log.debug("gossip to %s failed: %s", peer.node_id_hex[:12], exc)
            await self.channels.forget(peer.address)
            return False
        self.sent += 1
        if reply.ok:
            self._holds[peer.node_id_hex] = reply.holds_version
        else:
            self._holds.pop(peer.node_id_hex, None)
            log.info("gossip refused by %s: %s", peer.node_id_hex[:12], reply.reason)
        return reply.ok

    async def round(self) -> None:
        """Refresh the roster, drop members that left or fell silent, gossip to the rest."""
        await self.refresh_roster()
        try:
            dropped = self.group.tick(self.capacities(), self.clock())
        except Exception:  # one bad input must not stop this node's gossip (nor the round)
            self.tick_errors += 1
            log.exception("group tick failed; gossiping anyway")
            dropped = []
        for node_id in dropped:
            self._holds.pop(node_id, None)
            self._last_seq.pop(node_id, None)
            self._read_at.pop(node_id, None)
        self.dropped.extend(dropped)
        del self.dropped[:-64]
        peers = list(self.roster.values())
        if peers:
            await asyncio.gather(*(self.send(p) for p in peers))

    # -- receiving ------------------------------------------------------------------------

    async def gossip(self, msg: pb.GossipMessage) -> pb.GossipReply:
        """The Gossip RPC: verify, merge, and say what we now hold of the sender."""
        sender = msg.node_id.hex()
        peer = self.roster.get(sender)
        if peer is None and self.clock() - self._refreshed_at >= 1.0:
            await self.refresh_roster(force=True)  # it may have just registered
            peer = self.roster.get(sender)
        reason = self._check(msg, peer)
        if reason is None:
            self._read_at[sender] = self.clock()  # authentic: it counts against its rate
            try:
                self.group.merge_peer(self._report(msg), self.clock(), self.capacities())
            except GossipRejected as exc:
                reason = f"rejected: {exc}"
        if reason is not None:
            key = reason.split(":")[0]
            self.rejected[key] = self.rejected.get(key, 0) + 1
            return pb.GossipReply(ok=False, reason=reason,
                                  holds_version=self.group.holds_version(sender) if peer else 0)
        self._last_seq[sender] = msg.sequence
        self.received += 1
        return pb.GossipReply(ok=True, holds_version=self.group.holds_version(sender))

    def _check(self, msg: pb.GossipMessage, peer: ModelRecord | None) -> str | None:
        """Why this message must not be merged, or None."""
        if peer is None:
            return "not a member: sender is not a trusted node of this model in the directory"
        for name, bound in max_field_bytes(self.params).items():
            value = getattr(msg, name)
            if len(value.encode() if isinstance(value, str) else value) > bound:
                return f"oversized: {name} exceeds {bound} bytes"
        if msg.model != self.model:
            return f"wrong model: {msg.model!r}"
        if not is_valid_signature(peer.public_key, msg.signature, signed_bytes(msg)):
            return "bad signature: not signed by the registered key"
        if msg.sequence <= self._last_seq.get(peer.node_id_hex, 0):
            return "replay: sequence not newer than the last merged"
        if abs(msg.sequence - self.wall_ms()) > self.params.gossip_max_skew_s * 1000:
            return "stale: timestamp too far from our clock"
        last = self._read_at.get(peer.node_id_hex)
        if last is not None and self.clock() - last < self.params.gossip_min_spacing_s:
            return f"too frequent: one message per {self.params.gossip_min_spacing_s} s per member"
        return None

    @staticmethod
    def _report(msg: pb.GossipMessage) -> PeerReport:
        ld = msg.load
        return PeerReport(
            node_id=msg.node_id.hex(), sequence=msg.sequence,
            load=LocalLoad(active=ld.active, queued=ld.queued, kv_usage=ld.kv_cache_usage,
                           latency_s=msg.latency_s),
            capacity=ld.capacity, kv_capacity_tokens=msg.kv_capacity_tokens,
            tree_delta=msg.tree_delta, sentry_stats=msg.sentry_stats, layout=msg.layout)

    # -- life -----------------------------------------------------------------------------

    def start(self) -> asyncio.Task:
        if self._task is None:
            self._task = asyncio.ensure_future(self._run())
        return self._task

    async def _run(self) -> None:
        while True:
            started = self.clock()
            try:
                await self.round()
            except asyncio.CancelledError:
                raise
            except Exception:  # one bad round must not end gossip for good
                log.exception("gossip round failed")
            await asyncio.sleep(max(0.05, self.interval_s - (self.clock() - started)))

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        await self.channels.close()

    def status(self) -> dict:
        return {"peers": sorted(p[:16] for p in self.roster), "sent": self.sent,
                "send_failures": self.send_failures, "received": self.received,
                "tick_errors": self.tick_errors,
                "rejected": dict(self.rejected), "dropped": len(self.dropped),
                "interval_s": self.interval_s}
