"""A real model group: `gt-model serve --forwarding` processes with vLLM on 127.0.0.1.

Two nodes (not three: each vLLM engine takes minutes to start on this 2-core machine and
~2.5 GiB of memory; bench/routing.py runs three). Both start once for the module; the group's
roster is a directory file written once their addresses are known, as a registry would list
them. A long-prefix prompt served by one node is, once gossip has run, forwarded to that node
by the other, which answers from its prefix cache and signs the reply in its own name.
"""

from __future__ import annotations

import asyncio
import json
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from conftest import ModelNodeProcess
from gentorrent.crypto.keys import NodeKeys
from gentorrent import receipts
from gentorrent.wire import gentorrent_pb2 as pb
from gentorrent.ledger.directory import StaticDirectory
from gentorrent.ledger.sections import ModelRecord

MODEL = "smollm2-135m"
GOSSIP_INTERVAL_S = 1.0
KV_BLOCKS = 16  # of 128 tokens
pytestmark = [pytest.mark.engine, pytest.mark.network, pytest.mark.timeout(900)]

SYSTEM = ("You are the support assistant of the Northwind hardware store. " * 6
          + "Tools: lookup_order(id), refund(order, amount), stock(sku, store), open_ticket(text). "
            "Always answer politely, cite the order number, never invent prices, and ask for the "
            "store when the customer does not name one. " * 8)


@pytest.fixture(scope="module")
def group(tmp_path_factory):
    root = tmp_path_factory.mktemp("routing-group")
    directory = root / "directory.json"
    directory.write_text('{"users": [], "models": []}')
    nodes = [ModelNodeProcess(root / f"node{i}", extra=("--forwarding", "--directory", str(directory),
                                                        "--gossip-interval", str(GOSSIP_INTERVAL_S)))
             for i in range(2)]
    for node in nodes:  # a small KV cache: ~0.1 GiB instead of 1 GiB (2 engines, a shared machine)
        node.home.mkdir(parents=True, exist_ok=True)
        (node.home / "config.toml").write_text(  # vLLM keeps one block back
            f"[model_node]\nkv_cache_blocks = {KV_BLOCKS}\nmax_model_len = {(KV_BLOCKS - 1) * 128}\n")
    try:
        with ThreadPoolExecutor(len(nodes)) as pool:  # engines load in parallel: ~2.5 min, not 5
            list(pool.map(lambda node: node.start(), nodes))
        registry = StaticDirectory(directory)
        for node in nodes:
            keys = NodeKeys.load_or_create(node.home)
            registry.add_model(ModelRecord(bytes.fromhex(node.node_id), node.public_key, node.address, MODEL,
                                           keys.onion.public_key, capacity=5))
        yield nodes
    finally:
        with ThreadPoolExecutor(len(nodes)) as pool:  # each waits out its own clean shutdown
            list(pool.map(lambda node: node.stop(), nodes))


async def status(node: ModelNodeProcess) -> dict:
    channel = await node.connect()
    try:
        reply = await node.stub(channel).Status(pb.Empty(), timeout=30)
    finally:
        await channel.close()
    return json.loads(reply.json)


async def generate(node: ModelNodeProcess, prompt: str, forward_hops: int = 0) -> list[pb.GenerateChunk]:
    request = pb.GenerateRequest(model=MODEL, prompt=prompt,
                                 sampling=pb.SamplingParams(temperature=0.0, max_tokens=4))
    channel = await node.connect()
    try:
        stub = node.stub(channel)
        if forward_hops:
            call = stub.Forward(pb.ForwardRequest(request=request, hops=forward_hops), timeout=300)
        else:
            call = stub.Generate(request, timeout=300)
        return [chunk async for chunk in call]
    finally:
        await channel.close()


async def wait_for_members(nodes, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        views = [await status(n) for n in nodes]
        if all(other.node_id in v["routing"]["members"] for v, n in zip(views, nodes)
               for other in nodes if other is not n):
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"the group never formed: {[v['routing'] for v in views]}")
        await asyncio.sleep(GOSSIP_INTERVAL_S)


async def tree_nodes(node) -> dict[str, int]:
    return {n.node_id: (await status(n))["routing"]["tree"]["tree_nodes"] for n in node}


async def wait_for_subtree(other, before: int, timeout: float = 60.0) -> None:
    """Until `other`'s HR-tree holds more nodes than `before`: the subtree the other member
    grew serving a new prompt has reached it by gossip (it served nothing itself)."""
    deadline = time.monotonic() + timeout
    while (now := (await status(other))["routing"]["tree"]["tree_nodes"]) <= before:
        assert time.monotonic() < deadline, f"no gossip delta grew {other.node_id[:16]}'s tree ({now} nodes)"
        await asyncio.sleep(GOSSIP_INTERVAL_S / 4)


async def test_repeated_long_prefix_is_forwarded_to_the_node_that_served_it(group):
    await wait_for_members(group)
    trees = await tree_nodes(group)
    first = await generate(group[0], SYSTEM + "\nCustomer: where is order 1182?\nAssistant:")
    server_id = first[-1].served_by
    server = next(n for n in group if n.node_id == server_id)
    other = next(n for n in group if n is not server)
    before = (await status(server))["load"]
    await wait_for_subtree(other, trees[other.node_id])  # the server's new subtree reaches the other node

    request_text = SYSTEM + "\nCustomer: can I get a refund for order 2291?\nAssistant:"
    chunks = await generate(other, request_text)
    final = chunks[-1]
    assert final.final and final.served_by == server_id  # forwarded, and the server names itself
    request = pb.GenerateRequest(model=MODEL, prompt=request_text,
                                 sampling=pb.SamplingParams(temperature=0.0, max_tokens=4))
    receipts.verify_receipt(final.receipt, server.public_key, request,
                            [t for c in chunks for t in c.token_ids])
    after = await status(server)
    assert after["load"]["prefix_hits"] > before["prefix_hits"]  # served from the prefix cache
    routing = (await status(other))["routing"]
    assert routing["forwarded"] >= 1 and routing["tree_hits"] >= 1
    assert routing["decisions"].get("tree_match:forward", 0) >= 1
    assert after["routing"]["served_for_peers"] >= 1


async def test_a_forwarded_request_is_never_forwarded_again(group):
    await wait_for_members(group)
    text = SYSTEM + "\nCustomer: is the drill in stock?\nAssistant:"
    trees = await tree_nodes(group)
    first = await generate(group[0], text)
    holder = first[-1].served_by
    other = next(n for n in group if n.node_id != holder)
    await wait_for_subtree(other, trees[other.node_id])
    chunks = await generate(other, text, forward_hops=1)  # the tree points at `holder`
    assert chunks[-1].served_by == other.node_id
    assert (await status(other))["routing"]["decisions"].get("already_forwarded:local", 0) >= 1


async def test_gossip_carries_load_and_kv_capacity_between_real_nodes(group):
    await wait_for_members(group)
    views = [await status(n) for n in group]
    for view in views:
        gossip = view["routing"]["gossip"]
        assert gossip["received"] >= 1 and gossip["sent"] >= 1 and not gossip["rejected"]
        assert view["routing"]["tree"]["origins"] >= 1
