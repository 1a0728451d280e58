"""Gossip among model nodes over real gRPC/TLS (pinned certificates, Ed25519 signatures).

No engine is needed to gossip: each node here is a real TLS gRPC server whose ModelNode
service answers Gossip with a real `GroupGossip`; the roster comes from a directory file.
The clock is injected so that "silent for peer_silence_s" takes no wall time.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from gentorrent.config import ROUTING
from gentorrent.crypto import tls
from gentorrent.crypto.keys import Identity
from model_node.gossip import GroupGossip, signed_bytes
from gentorrent.routing.group import GroupRouting, LocalLoad
from gentorrent.routing.policy import Reason
from gentorrent.wire import gentorrent_pb2 as pb
from gentorrent.wire import gentorrent_pb2_grpc as rpc
from gentorrent.ledger.directory import StaticDirectory
from gentorrent.ledger.sections import ModelRecord

MODEL = "smollm2-135m"
# homes off: a new prompt is served where it enters (the paper's miss branch), so each test
# decides which node serves a new prefix; rendezvous homes are tested in test_routing_policy
PARAMS = replace(ROUTING, directory_refresh_s=0.0, gossip_rpc_timeout_s=5.0, homes=False)


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class _GossipOnly(rpc.ModelNodeServicer):
    def __init__(self, gossip: GroupGossip) -> None:
        self.handler = gossip

    async def Gossip(self, request, context):
        return await self.handler.gossip(request)


class Node:
    def __init__(self, directory_path, clock: Clock, active: int = 0, capacity: int = 2) -> None:
        self.identity = Identity.generate()
        self.tls = tls.make_self_signed(self.identity)
        self.id = self.identity.node_id_hex
        self.load = LocalLoad(active=active)
        self.group = GroupRouting(self.id, capacity, 100_000, version_base=1, params=PARAMS)
        self.gossip = GroupGossip(self.identity, MODEL, self.group, StaticDirectory(directory_path),
                                  lambda: self.load, params=PARAMS, clock=clock)
        self.server = None
        self.address = ""

    async def start(self) -> "Node":
        self.server, port = tls.new_server(self.tls, "127.0.0.1:0")
        rpc.add_ModelNodeServicer_to_server(_GossipOnly(self.gossip), self.server)
        await self.server.start()
        self.address = f"127.0.0.1:{port}"
        return self

    def record(self, trusted: bool = True, model: str = MODEL) -> ModelRecord:
        return ModelRecord(bytes.fromhex(self.id), self.identity.public_key, self.address, model, b"\0" * 32,
                           self.tls.cert_pem, capacity=self.group.capacity, trusted=trusted)

    async def stop(self) -> None:
        if self.server is not None:
            await self.server.stop(0)
            self.server = None
        await self.gossip.close()


def prompt(seed: int, n: int = 600) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 49_000, n)


@pytest.fixture
async def group(tmp_path):
    clock = Clock()
    path = tmp_path / "directory.json"
    nodes = [await Node(path, clock, active=i).start() for i in range(3)]
    directory = StaticDirectory(path)
    for n in nodes:
        directory.add_model(n.record())
    yield nodes, directory, clock
    for n in nodes:
        await n.stop()


async def round_all(nodes) -> None:
    for n in nodes:
        await n.gossip.round()


async def test_a_prefix_served_by_one_node_is_forwarded_to_it_by_the_others(group):
    (a, b, c), _, clock = group
    p = prompt(1)
    first = a.group.decide(p, 0, clock(), a.load)  # nobody knows it yet: a serves it itself
    assert (first.node_id, first.forward) == (a.id, False)
    await round_all([a, b, c])
    for other in (b, c):
        d = other.group.decide(p, 0, clock(), other.load)
        assert (d.node_id, d.reason, d.forward) == (a.id, Reason.TREE_MATCH, True)
        assert other.group.table.get(a.id).capacity == 2  # the load row came with the delta
    miss = b.group.decide(prompt(2), 0, clock(), b.load)  # an unknown prompt stays local
    assert miss.node_id == b.id and not miss.forward


async def test_unchanged_subtree_is_sent_as_a_header_and_loads_still_refresh(group):
    (a, b, c), _, clock = group
    a.group.decide(prompt(3), 0, clock(), a.load)
    await round_all([a, b, c])
    header = len(a.gossip.build_message(b.id).tree_delta)  # b holds it all: nothing new
    assert header < 120
    a.load = LocalLoad(active=7)
    clock.t += 1
    await a.gossip.round()
    assert b.group.table.get(a.id).active == 7
    a.load = LocalLoad(active=0)
    assert not a.group.decide(prompt(4), 0, clock(), a.load).forward
    # a new prefix served by a: its subtree travels again
    assert len(a.gossip.build_message(b.id).tree_delta) >= header + 3 * 4  # 4 chunks of 128


async def test_forged_replayed_or_foreign_gossip_is_refused_without_state_change(group):
    (a, b, c), _, clock = group
    a.group.decide(prompt(5), 0, clock(), a.load)
    msg = a.gossip.build_message(b.id)
    forged = pb.GossipMessage()
    forged.CopyFrom(msg)
    forged.load.active = msg.load.active + 50
    reply = await b.gossip.gossip(forged)  # the signature covers the load
    assert not reply.ok and reply.reason.startswith("bad signature")
    assert b.group.table.get(a.id) is None and a.id not in b.group.trees.current.origins()
    assert (await b.gossip.gossip(msg)).ok
    replay = await b.gossip.gossip(msg)
    assert not replay.ok and replay.reason.startswith("replay")
    stranger = Identity.generate()
    alien = pb.GossipMessage()
    alien.CopyFrom(msg)
    alien.node_id = stranger.node_id
    alien.signature = stranger.sign(signed_bytes(alien))
    assert (await b.gossip.gossip(alien)).reason.startswith("not a member")


async def test_a_silent_peer_drops_out_of_the_tree_and_the_table(group):
    (a, b, c), _, clock = group
    c.group.decide(prompt(6), 0, clock(), c.load)
    await round_all([a, b, c])
    assert c.id in b.group.trees.current.origins()
    await c.stop()  # c goes silent
    for _ in range(3):
        clock.t += PARAMS.peer_silence_s / 2
        await round_all([a, b])
    assert b.gossip.send_failures > 0
    for n in (a, b):
        assert c.id not in n.group.trees.current.origins() and n.group.table.get(c.id) is None
        d = n.group.decide(prompt(6), 0, clock(), n.load)
        assert d.node_id != c.id
    assert a.id in b.group.trees.current.origins()  # a, still talking, stays


async def test_an_untrusted_peer_drops_out_and_its_gossip_is_refused(group):
    (a, b, c), directory, clock = group
    c.group.decide(prompt(7), 0, clock(), c.load)
    await round_all([a, b, c])
    assert c.id in a.group.trees.current.origins()
    directory.add_model(c.record(trusted=False))  # the committee untrusts c
    clock.t += 1
    await round_all([a, b, c])
    assert c.id not in a.group.trees.current.origins() and a.group.table.get(c.id) is None
    assert a.gossip.rejected.get("not a member", 0) >= 1
