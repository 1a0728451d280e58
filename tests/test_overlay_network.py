"""The overlay end to end: real user nodes (Relay servers, pinned TLS, 127.0.0.1), 4 paths of 3
hops, the real clove intake on a model node. The model node here is `EchoModelNode`, a test
double whose engine echoes the prompt (real keys, TLS, receipts and intake); the ask with
the real vLLM model node is in tests/test_user_model.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time
from collections import defaultdict

import pytest

from gentorrent.config import CloveParams, OverlayParams
from gentorrent.crypto import onion
from gentorrent.wire import gentorrent_pb2 as pb
from user_client.asking import AskError
from testkit.echo_model import ECHO_PREFIX, EchoModelNode
from testkit.localnet import start_user_nodes

pytestmark = [pytest.mark.network, pytest.mark.timeout(180)]

CLOVES = CloveParams(n=4, k=3, path_length=3, proxies_kept=4)
# short enough that a lost answer fails within seconds, long enough for a machine under load
FAST = OverlayParams(first_reply_timeout_s=8.0, reply_idle_timeout_s=15.0, forward_timeout_s=5.0,
                     establish_timeout_s=5.0, maintenance_interval_s=1.0, build_attempts=12, reply_window_s=0.05)
PROMPT = "Tell me the secret recipe of grandmother's plum cake, step by step, please."


class Taps:
    """What every relay handled: (node index, event, link_id, payload)."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, str, bytes, bytes]] = []
        self.enabled = True

    def for_node(self, i: int):
        def tap(event: str, link_id: bytes, payload: bytes) -> None:
            if self.enabled:
                self.seen.append((i, event, bytes(link_id), bytes(payload)))
        return tap


@pytest.fixture
async def net(tmp_path):
    """13 user nodes (node 0 asks, 12 relay) and one echo model node, on 127.0.0.1."""
    directory = tmp_path / "directory.json"
    model = EchoModelNode(tmp_path / "model", directory, cloves=CLOVES, params=FAST)
    await model.start()
    taps = Taps()
    nodes = await start_user_nodes(13, directory, tmp_path, cloves=CLOVES, params=FAST, maintain=False)
    for i, node in enumerate(nodes):
        node.relay.tap = taps.for_node(i)
    me = nodes[0]
    assert await me.paths.fill() == 4
    yield me, nodes, model, taps
    for node in nodes:
        await node.stop()
    await model.stop()


async def _quiet(taps: Taps, settle_s: float = 0.3, limit_s: float = 10.0) -> None:
    """Wait until no relay has handled anything for `settle_s` (the last reply clove is home)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit_s
    while loop.time() < deadline:
        before = len(taps.seen)
        await asyncio.sleep(settle_s)
        if len(taps.seen) == before:
            return


def _common_9gram(a: bytes, b: bytes) -> bool:
    grams = {a[i:i + 9] for i in range(len(a) - 8)}
    return any(b[i:i + 9] in grams for i in range(len(b) - 8))


async def test_ask_through_four_paths_of_three_hops_returns_the_answer(net):
    me, nodes, model, _ = net
    answer = await me.ask(PROMPT)
    assert answer.text == ECHO_PREFIX + PROMPT
    assert answer.served_by == model.keys.identity.node_id_hex
    assert len(answer.paths) == 4 and all(len(p) == 3 for p in answer.paths)
    assert me.address not in {r for p in answer.paths for r in p}
    # streamed: the same text, in order, in several chunks (slower than the reply window)
    model.chunks, model.chunk_delay_s = 5, 3 * FAST.reply_window_s
    items = [item async for item in me.ask_stream(PROMPT)]
    assert "".join(i.text for i in items[:-1]) == ECHO_PREFIX + PROMPT and len(items) == 6
    assert items[-1].text == ECHO_PREFIX + PROMPT
    # a fast stream of 41 chunks of 2 characters leaves on the window's grid, several chunks per
    # reply message (relays cannot count tokens), and is put back together in order
    model.chunks, model.chunk_delay_s = 60, FAST.reply_window_s / 5
    items = [item async for item in me.ask_stream(PROMPT)]
    assert items[-1].text == ECHO_PREFIX + PROMPT and "".join(i.text for i in items[:-1]) == items[-1].text
    assert 2 <= len(items) - 1 < 41


async def test_reply_messages_go_by_content_never_an_empty_one(net):
    """An answer of 5 chunks with pauses of 3 windows between them: 5 reply messages (n cloves
    each), every one carrying tokens. The old clock (a message per 50 ms tick, empty or not)
    sent 13 here (a loaded machine stretches its ticks), 8 of them empty, each costing the
    whole path as much as a full one."""
    me, nodes, model, _ = net
    model.chunks, model.chunk_delay_s = 5, 3 * FAST.reply_window_s
    await me.ask(PROMPT)  # links up
    await asyncio.sleep(0.5)
    cloves, messages = model.intake.reply_cloves, me.asker.chunks_in
    items = [item async for item in me.ask_stream(PROMPT)]
    deltas = [i for i in items[:-1] if i.text]
    assert len(deltas) == 5 and "".join(d.text for d in deltas) == ECHO_PREFIX + PROMPT
    assert model.intake.reply_cloves - cloves == 4 * 5  # the model node sent 5 messages, n = 4 cloves each
    assert me.asker.chunks_in - messages == 5  # and the user rebuilt 5, each with text (the deltas)


async def test_relays_never_see_plaintext_and_cloves_share_no_9_bytes(net):
    me, nodes, model, taps = net
    model.chunks = 1
    answer = await me.ask(PROMPT)
    await _quiet(taps)  # let the n-th reply clove finish its way back
    blobs = {payload for _, _, _, payload in taps.seen}
    assert len(taps.seen) >= 4 * 3 + 4 * 3  # every hop handled the query and the reply
    secrets = [PROMPT.encode(), answer.text.encode(), PROMPT.encode()[:20], answer.text.encode()[-20:]]
    for blob in blobs:
        for s in secrets:
            assert s not in blob
    # a blob seen at both ends of one link counts once; every two different blobs share < 9 bytes
    distinct = sorted(blobs)
    for i in range(len(distinct)):
        for j in range(i + 1, len(distinct)):
            assert not _common_9gram(distinct[i], distinct[j])
    # link IDs: each link has its own
    links = defaultdict(set)
    for node, _, link, _ in taps.seen:
        if link:
            links[link].add(node)
    assert all(len(nodes_) <= 2 for nodes_ in links.values())  # only the two ends of a link


async def test_killing_n_minus_k_relays_mid_request_still_answers(net):
    me, nodes, model, _ = net
    model.gate = asyncio.Event()
    task = asyncio.ensure_future(me.ask(PROMPT))
    await asyncio.wait_for(model.received.wait(), 10)
    await asyncio.sleep(0.1)
    used = [p for p in me.paths.pool.paths.values() if p.sends]
    victim = _relay_only_on_one_path(used)
    await _node_at(nodes, victim).stop()
    model.gate.set()
    answer = await asyncio.wait_for(task, 30)
    assert answer.text == ECHO_PREFIX + PROMPT


async def test_killing_more_than_n_minus_k_gives_clear_error_then_paths_are_rebuilt(net):
    me, nodes, model, _ = net
    model.gate = asyncio.Event()
    task = asyncio.ensure_future(me.ask(PROMPT))
    await asyncio.wait_for(model.received.wait(), 10)
    await asyncio.sleep(0.1)
    used = [p for p in me.paths.pool.paths.values() if p.sends]
    victims = {_relay_only_on_one_path([p]) for p in used[:2]}
    for v in victims:
        await _node_at(nodes, v).stop()
    model.gate.set()
    with pytest.raises(AskError) as err:
        await asyncio.wait_for(task, 30)
    assert "no model node answered" in str(err.value) and "no_answer" in str(err.value)
    model.gate = None
    model.received.clear()
    answer = await asyncio.wait_for(me.ask(PROMPT), 30)
    assert answer.text == ECHO_PREFIX + PROMPT
    assert not {r for p in answer.paths for r in p} & victims


async def test_a_verifier_challenge_looks_like_a_user_ask_on_the_wire(net):
    me, nodes, model, taps = net
    await me.ask(PROMPT)  # warm channels
    await _quiet(taps)
    taps.seen.clear()
    await me.ask(PROMPT.upper())
    await _quiet(taps)
    user = [(e, len(l), len(p)) for _, e, l, p in taps.seen]
    taps.seen.clear()
    await me.ask(PROMPT, node_id=model.keys.identity.node_id_hex)  # how verifiers probe one node
    await _quiet(taps)
    challenge = [(e, len(l), len(p)) for _, e, l, p in taps.seen]
    # the same cloves, of the same sizes, on the way in; on the way back the same sizes (whether
    # a delivery report follows the answer depends on which clove came last, for either kind)
    assert sorted(x for x in user if x[0].startswith(("forward", "submit"))) == \
        sorted(x for x in challenge if x[0].startswith(("forward", "submit")))
    assert set(user) == set(challenge)


async def test_bad_input_is_dropped_with_a_counted_reason(net):
    me, nodes, model, _ = net
    relay_node = nodes[5]
    link = me.relay.hub.link_to(relay_node.node_id_hex)  # a registered node, authenticated by its certificate

    async def send(forward: bool, link_id: bytes, payload: bytes):
        return await asyncio.wait_for(link.send(forward, [pb.Clove(link_id=link_id, payload=payload)], ack=True), 5)

    assert [r.value for _, r in await send(True, os.urandom(16), b"x" * 100)] == ["unknown_link"]
    assert [r.value for _, r in await send(False, os.urandom(16), b"x" * 100)] == ["unknown_link"]
    reply = await link.establish(os.urandom(2048), 5)
    assert (reply.ok, reply.reason) == (False, "bad_onion")
    unregistered = onion.HopSpec(os.urandom(32), os.urandom(32))  # a successor nobody registered
    blob, _ = onion.build_onion([onion.HopSpec(relay_node.keys.identity.node_id, relay_node.keys.onion.public_key),
                                 unregistered], issued_s=int(time.time()))
    reply = await link.establish(blob, 5)
    assert (reply.ok, reply.reason) == (False, "unknown_peer")
    assert [r.value for _, r in await send(True, b"", b"x" * (2 * 1024 * 1024))] == ["oversize"]
    assert relay_node.relay.drops.as_dict() == {"bad_onion": 1, "oversize": 1, "unknown_link": 2,
                                                "unknown_peer": 1}
    # a real clove replayed on its link by the hop before it
    path = next(iter(me.paths.pool.paths.values()))
    hop = _node_at_id(nodes, path.first_hop)
    captured = []
    hop.relay.tap = lambda e, l, p: captured.append((e, l, p)) if e == "forward_in" else None
    await me.ask(PROMPT)
    assert captured  # all 4 paths carry every ask
    e, link_id, payload = captured[0]
    hop_link = me.relay.hub.link_to(hop.node_id_hex)
    refused = await asyncio.wait_for(hop_link.send(True, [pb.Clove(link_id=link_id, payload=payload)], ack=True), 5)
    assert [r.value for _, r in refused] == ["replay"]
    # garbage straight at the model node's intake, over an authenticated link: counted there,
    # and the ack says nothing about it
    model_link = me.relay.hub.link_to(model.keys.identity.node_id_hex)
    assert await asyncio.wait_for(model_link.send(True, [pb.Clove(payload=os.urandom(700))], ack=True), 5) == []
    assert model.intake.drops.as_dict().get("bad_seal") == 1
    # a reply clove of no request of ours, on one of our own paths
    me.asker.on_return(path, os.urandom(600))
    assert me.asker.drops.counts["bad_layer"] >= 1
    answer = await me.ask(PROMPT)  # still serving
    assert answer.text == ECHO_PREFIX + PROMPT


async def test_bad_model_node_is_skipped_and_session_sticks_to_the_good_one(net, tmp_path):
    me, nodes, model, _ = net
    impostor = EchoModelNode(tmp_path / "impostor", me.directory.path, cloves=CLOVES, params=FAST)
    await impostor.start()
    registered_id = impostor.record.node_id_hex
    # from now on it signs with a key other than the one the directory binds to its id
    impostor.keys = dataclasses.replace(impostor.keys, identity=type(impostor.keys.identity).generate())
    try:
        for node in nodes:  # what each node's maintenance loop does every few seconds
            await node.refresh_directory()
        served = set()
        for i in range(4):
            answer = await me.ask(f"{PROMPT} {i}", session="s1")
            served.add(answer.served_by)
            bad_attempts = [a for a in answer.attempts if a.get("ok") is False]
            assert all(a["reason"] == "bad_signature" for a in bad_attempts), [(a["reason"], a.get("detail")) for a in bad_attempts]
        assert served == {model.keys.identity.node_id_hex}
        assert me.asker.affinity["s1"] == model.keys.identity.node_id_hex
        with pytest.raises(AskError) as err:
            await me.ask(PROMPT, node_id=registered_id)
        assert "bad_signature" in str(err.value)
    finally:
        await impostor.stop()


def _node_at(nodes, address):
    return next(n for n in nodes if n.address == address)


def _node_at_id(nodes, node_id):
    return next(n for n in nodes if n.node_id_hex == node_id)


def _relay_only_on_one_path(paths) -> str:
    counts = defaultdict(int)
    for p in paths:
        for r in p.relays:
            counts[r] += 1
    return next(r for r in paths[0].relays if counts[r] == 1)


async def test_a_node_replying_garbage_is_dropped_counted_and_another_node_answers(net, tmp_path):
    me, nodes, model, _ = net
    garbler = EchoModelNode(tmp_path / "garbler", me.directory.path, cloves=CLOVES, params=FAST)
    real_prepare = garbler.intake._prepare

    def garble(ask, query):  # seal every reply with a key the user never gave
        bad = pb.OverlayQuery()
        bad.CopyFrom(query)
        bad.reply_key = os.urandom(32)
        return real_prepare(ask, bad)

    garbler.intake._prepare = garble
    await garbler.start()
    try:
        for node in nodes:
            await node.refresh_directory()
        answer = await me.ask(PROMPT, node_id=None)
        while garbler.keys.identity.node_id_hex not in [a["node"] for a in answer.attempts]:
            answer = await me.ask(PROMPT)  # until the random choice tried the garbler first
        assert answer.text == ECHO_PREFIX + PROMPT and answer.served_by == model.keys.identity.node_id_hex
        assert answer.attempts[0]["reason"] == "no_answer"
        assert me.asker.drops.counts["unknown_request"] >= 3
    finally:
        await garbler.stop()


async def test_a_busy_node_says_so_and_the_user_moves_on_at_once(net, tmp_path):
    me, nodes, model, _ = net
    busy = EchoModelNode(tmp_path / "busy", me.directory.path, cloves=CLOVES, params=FAST)
    await busy.start()
    busy.intake.max_active = 0  # at capacity: every query is refused
    try:
        for node in nodes:
            await node.refresh_directory()
        loop = asyncio.get_running_loop()
        failed = me.paths.failed
        with pytest.raises(AskError) as err:
            await me.ask(PROMPT, node_id=busy.record.node_id_hex)
        assert "busy" in str(err.value)
        assert busy.intake.drops.as_dict().get("busy", 0) >= 1
        started = loop.time()
        answer = await me.ask(PROMPT)  # the busy node is skipped without waiting out a timeout
        assert loop.time() - started < FAST.first_reply_timeout_s
        assert answer.served_by == model.keys.identity.node_id_hex
        assert me.paths.failed == failed  # busy is not the paths' fault
    finally:
        await busy.stop()


async def test_relays_gone_before_an_ask_close_its_paths_back_and_it_is_answered_over_new_ones(net):
    """Two relays, each the middle of one of the four paths, stop while nothing is asked; then
    an ask. Its cloves on those paths reach a hop whose successor is gone: that hop closes the
    path and tells the user in a sealed notice (relay.py `_close`), who ends the attempt (k = 3
    of 4 can no longer arrive) and asks again over new paths, none through the gone relays.
    Without the close the user never learned of it: the node got 2 of 4 cloves, said nothing,
    the attempt waited out its reply timeout, no path was judged, and the next ask took the
    same dead paths again."""
    me, nodes, model, _ = net
    await me.ask(PROMPT)  # every link up
    await me.paths.fill()  # that ask's single-use paths replaced: the next ask's
    used = list(me.paths.pool.usable(me.paths.clock()))
    victims = {p.relays[1] for p in used[:2]} - {r for p in used[2:] for r in p.relays}
    assert len(victims) == 2, [p.relays for p in used]
    for v in victims:
        await _node_at(nodes, v).stop()
    answer = await me.ask(PROMPT)
    assert answer.text == ECHO_PREFIX + PROMPT
    assert answer.attempts[0]["reason"] == "path_closed", answer.attempts
    assert not {r for p in answer.paths for r in p} & victims
    assert me.paths.closed >= 1 and me.asker.drops.as_dict().get("path_closed") == 1
    assert sum(n.relay.closes_sent for n in nodes if n.address not in victims) >= 2  # each victim's predecessor
    assert all(me.paths._suspect_hops[v] >= 1 for v in victims), me.paths.status()["suspects"]
