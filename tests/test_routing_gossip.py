"""Gossip among model nodes over real gRPC/TLS (pinned certificates, Ed25519 signatures).

No engine is needed to gossip: each node here is a real TLS gRPC server whose ModelNode
service answers Gossip with a real `GroupGossip` (testkit/gossip_group.py); the roster comes
from a directory file.
The clock is injected so that "silent for peer_silence_s" takes no wall time.
"""

from __future__ import annotations

import pytest

from gentorrent.crypto.keys import Identity
from gentorrent.routing.group import LocalLoad
from gentorrent.routing.policy import Reason
from gentorrent.wire import gentorrent_pb2 as pb
from model_node.gossip import signed_bytes
from testkit.gossip_group import PARAMS, Clock, prompt, round_all, start_group


@pytest.fixture
async def group(tmp_path):
    clock = Clock()
    nodes, _, directory = await start_group(tmp_path / "directory.json", clock, insider=False)
    for i, n in enumerate(nodes):
        n.load = LocalLoad(active=i)
    yield nodes, directory, clock
    for n in nodes:
        await n.stop()


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
