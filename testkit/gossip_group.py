"""A model group of real gossip servers on 127.0.0.1, and an insider that attacks it.

Each `GossipNode` is a real gRPC/TLS server (pinned self-signed certificate) whose ModelNode
service answers Gossip with a real `model_node.gossip.GroupGossip`; the group's roster is a
directory file, as a registry would list it. No engine is needed to gossip: requests are
routed with `GroupRouting.decide` on token arrays, and the clock is injected, so "silent for
peer_silence_s" or "the Sentry's seal timeout" take no wall time.

`Insider` is a registered, trusted member of the group with its own key: it signs whatever it
likes and sends it to a member's Gossip RPC over pinned TLS. That RPC is the attack surface of
a group member (THREAT_MODEL.md, "Model groups"); the tests (tests/test_routing_adversary.py)
and the adversary scenarios (testkit/scenarios/adversary_groups.py) share these pieces.
"""

from __future__ import annotations

import struct
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from gentorrent.config import ROUTING, RoutingParams
from gentorrent.crypto import tls
from gentorrent.crypto.keys import Identity
from gentorrent.ledger.directory import StaticDirectory
from gentorrent.ledger.sections import ModelRecord
from gentorrent.routing.chunking import ChunkLayout
from gentorrent.routing.group import GroupRouting, LocalLoad
from gentorrent.routing.hrtree import _HEADER, HRTree
from gentorrent.wire import gentorrent_pb2 as pb
from gentorrent.wire import gentorrent_pb2_grpc as rpc
from model_node.gossip import GroupGossip, sign

MODEL = "smollm2-135m"
#: test-sized parameters: the roster is re-read on every round, RPCs get a generous deadline
# homes off: a new prompt is served where it enters (the paper's miss branch), so each test
# decides which node serves a new prefix; rendezvous homes are tested in test_routing_policy
PARAMS = replace(ROUTING, directory_refresh_s=0.0, gossip_rpc_timeout_s=5.0, homes=False)


class Clock:
    """An injected monotonic clock that only moves when a test moves it."""

    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


class _GossipOnly(rpc.ModelNodeServicer):
    def __init__(self, gossip) -> None:
        self.handler = gossip

    async def Gossip(self, request, context):
        return await self.handler.gossip(request)


class GossipNode:
    """One honest member: a real TLS gRPC server answering Gossip with a real GroupGossip."""

    def __init__(self, directory_path: Path, clock: Clock, *, active: int = 0, capacity: int = 2,
                 params: RoutingParams = PARAMS, interval_s: float | None = None) -> None:
        self.identity = Identity.generate()
        self.tls = tls.TlsIdentity.bound(self.identity)
        self.id = self.identity.node_id_hex
        self.load = LocalLoad(active=active)
        self.capacity = capacity
        self.group = GroupRouting(self.id, capacity, 100_000, version_base=int(time.time() * 1000),
                                  params=params)
        self.gossip = GroupGossip(self.identity, MODEL, self.group, StaticDirectory(directory_path),
                                  lambda: self.load, params=params, clock=clock, interval_s=interval_s)
        self.server = None
        self.address = ""

    async def start(self) -> "GossipNode":
        self.server, port = tls.new_server(self.tls, "127.0.0.1:0")
        rpc.add_ModelNodeServicer_to_server(_GossipOnly(self.gossip), self.server)
        await self.server.start()
        self.address = f"127.0.0.1:{port}"
        return self

    def record(self, trusted: bool = True, capacity: int | None = None) -> ModelRecord:
        return ModelRecord(bytes.fromhex(self.id), self.identity.public_key, self.address, MODEL,
                           b"\0" * 32, capacity=self.capacity if capacity is None else capacity, trusted=trusted)

    def serve(self, tokens, now: float):
        """A user request enters the group here (hops = 0): Algorithm 2 decides where it goes."""
        return self.group.decide(tokens, 0, now, self.load)

    async def stop(self) -> None:
        if self.server is not None:
            await self.server.stop(0)
            self.server = None
        await self.gossip.close()


class _AcceptAll(rpc.ModelNodeServicer):
    """The insider's own server: it says "ok" to whatever honest members gossip to it, and keeps
    the newest subtree delta each one sent (what a member learns of the others' caches)."""

    def __init__(self) -> None:
        self.heard: dict[str, bytes] = {}

    async def Gossip(self, request, context):
        if len(request.tree_delta) > 5 and request.tree_delta[5] == 0:  # flags: not "unchanged"
            self.heard[request.node_id.hex()] = request.tree_delta
        return pb.GossipReply(ok=True, holds_version=0)


class Insider:
    """A registered, trusted group member that signs and sends arbitrary gossip."""

    def __init__(self, capacity: int = 1, params: RoutingParams = PARAMS) -> None:
        self.identity = Identity.generate()
        self.tls = tls.TlsIdentity.bound(self.identity)
        self.id = self.identity.node_id_hex
        self.capacity = capacity
        self.params = params
        self.layout = ChunkLayout.default(params)
        self.server = None
        self.address = ""
        self._seq = 0
        self._listener = _AcceptAll()
        self.sent = self.accepted = self.bytes_sent = 0

    @property
    def heard(self) -> dict[str, bytes]:
        """Member id -> the newest full subtree delta it gossiped to the insider."""
        return self._listener.heard

    async def start(self) -> "Insider":
        self.server, port = tls.new_server(self.tls, "127.0.0.1:0")
        rpc.add_ModelNodeServicer_to_server(self._listener, self.server)
        await self.server.start()
        self.address = f"127.0.0.1:{port}"
        return self

    def record(self) -> ModelRecord:
        return ModelRecord(bytes.fromhex(self.id), self.identity.public_key, self.address, MODEL,
                           b"\0" * 32, capacity=self.capacity)

    def message(self, *, tree_delta: bytes | None = None, sentry_stats: bytes = b"",
                layout: ChunkLayout | None = None, active: int = 0, capacity: int | None = None,
                kv_capacity_tokens: int = 100_000) -> pb.GossipMessage:
        """A gossip message in the insider's own name, validly signed, fresh sequence."""
        self._seq = max(int(time.time() * 1000), self._seq + 1)
        layout = layout or self.layout
        if tree_delta is None:
            tree_delta = own_delta(self.id, [], version=1, layout=layout, params=self.params)
        msg = pb.GossipMessage(
            node_id=self.identity.node_id, model=MODEL, sequence=self._seq,
            load=pb.LoadReport(active=active, capacity=self.capacity if capacity is None else capacity),
            tree_delta=tree_delta, sentry_stats=sentry_stats, chunk_version=layout.epoch,
            layout=layout.encode(), kv_capacity_tokens=kv_capacity_tokens)
        return sign(self.identity, msg)

    async def send(self, target: GossipNode, msg: pb.GossipMessage) -> pb.GossipReply:
        """One Gossip RPC to `target` over TLS pinned to its registered key."""
        channel = tls.pinned_channel(target.address, tls.anchor_pem(target.identity.public_key))
        try:
            reply = await rpc.ModelNodeStub(channel).Gossip(msg, timeout=self.params.gossip_rpc_timeout_s)
        finally:
            await channel.close()
        self.sent += 1
        self.bytes_sent += msg.ByteSize()
        self.accepted += bool(reply.ok)
        return reply

    async def stop(self) -> None:
        if self.server is not None:
            await self.server.stop(0)
            self.server = None


def own_delta(origin: str, hash_paths, *, version: int, layout: ChunkLayout,
              params: RoutingParams = ROUTING) -> bytes:
    """A well-formed subtree delta labelled `origin`, holding `hash_paths`, at any `version`
    (the 64-bit field, so also versions no honest node would ever reach)."""
    tree = HRTree(origin, layout, params)
    for path in hash_paths:
        tree.insert_hashes(path, origin, now=0.0)
    data = bytearray(tree.export_delta(origin, 0))
    if not hash_paths:  # an empty subtree: export says "unchanged", make it a full delta
        data[5] = 0
    return with_version(bytes(data), version)


def with_version(delta: bytes, version: int) -> bytes:
    """The same delta stamped with another subtree version."""
    data = bytearray(delta)
    at = _HEADER.size + data[_HEADER.size - 1] + 12  # trailer: epoch (4), digest (8), version (8)
    data[at:at + 8] = struct.pack(">Q", version)
    return bytes(data)


def prompt(seed: int, n: int = 600, prefix: np.ndarray | None = None) -> np.ndarray:
    """A synthetic prompt of n token ids; with `prefix`, one that starts with that prefix."""
    body = np.random.default_rng(seed).integers(0, 49_000, n)
    return body if prefix is None else np.concatenate([prefix, body])


async def start_group(directory_path: Path, clock: Clock, sizes: int = 3, *, insider: bool = True,
                      params: RoutingParams = PARAMS, **node_kwargs):
    """`sizes` honest members (+ one insider), all registered in the directory file."""
    directory_path.write_text('{"users": [], "models": []}')
    nodes = [await GossipNode(directory_path, clock, params=params, **node_kwargs).start()
             for _ in range(sizes)]
    bad = await Insider(params=params).start() if insider else None
    directory = StaticDirectory(directory_path)
    for n in nodes:
        directory.add_model(n.record())
    if bad is not None:
        directory.add_model(bad.record())
    return nodes, bad, directory


async def round_all(nodes) -> None:
    """One gossip round of every honest member, in order."""
    for n in nodes:
        await n.gossip.round()
