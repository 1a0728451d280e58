"""The node shell in-process (a committee of one, RegistryApp): bad input is refused without
harm, and a node killed between storing a block and committing it replays it on start."""

from __future__ import annotations

import asyncio
import dataclasses

import grpc
import pytest

from gentorrent.crypto.keys import NodeKeys
from gentorrent.crypto.tls import connect
from gentorrent.wire import gentorrent_pb2 as pb
from gentorrent.wire import gentorrent_pb2_grpc as rpc
from consensus_netkit import Member, free_base_port
from verifier import cli
from verifier.consensus.blockstore import BlockStore
from verifier.consensus.home import DATA_DIR
from verifier.consensus import gossip
from verifier.consensus.node import CODE_IN_MEMPOOL, CODE_OVERSIZE
from verifier.node import VerifierNode
from gentorrent.ledger.chain import Commit, CommitSig, Vote, VoteType, encode_message, make_block
from gentorrent.ledger.genesis import Genesis

pytestmark = [pytest.mark.network, pytest.mark.timeout(120)]


@pytest.fixture
def home(tmp_path):
    assert cli.main(["--log-level", "WARNING", "init", "--validators", "1", "--out", str(tmp_path),
                     "--base-port", str(free_base_port(1)), "--timeouts", "fast"]) == 0
    return tmp_path / "v0"


async def until(predicate, timeout: float = 20.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition never became true"
        await asyncio.sleep(0.05)


async def test_bad_input_is_refused_and_the_node_goes_on(home):
    node = VerifierNode(home)
    await node.start()
    genesis = Genesis.load(home)
    channel = await connect(genesis.validators[0].address, genesis.validators[0].tls_cert_pem)
    stub = rpc.VerifierStub(channel)
    try:
        await until(lambda: node.consensus.host.height >= 2)
        ack = await stub.Consensus(pb.ConsensusMessage(payload=b"\x02garbage"), timeout=5)
        assert not ack.ok and ack.reason.startswith("malformed")
        ack = await stub.Consensus(pb.ConsensusMessage(payload=b""), timeout=5)
        assert not ack.ok
        # a well-formed vote with a bad signature is ignored
        forged = Vote(VoteType.PREVOTE, node.consensus.driver.height, 0, b"\x01" * 32, 0, b"\x00" * 64)
        assert (await stub.Consensus(pb.ConsensusMessage(payload=encode_message(forged)), timeout=5)).ok
        assert not node.consensus.driver.sm.votes.has_vote(forged)

        reply = await stub.SubmitTx(pb.TxRequest(tx=b"\x00" * (70 * 1024)), timeout=5)
        assert reply.code == CODE_OVERSIZE
        reply = await stub.SubmitTx(pb.TxRequest(tx=b"not a transaction"), timeout=5)
        assert reply.code != 0 and reply.log
        member = Member(1)
        tx = member.register(genesis.chain_id)
        # twice within one turn of the event loop: no block can take it out in between
        assert (await node.consensus.submit_tx(tx, forwarded=False)).code == 0
        assert (await node.consensus.submit_tx(tx, forwarded=False)).code == CODE_IN_MEMPOOL
        await until(lambda: len(node.consensus.mempool) == 0)
        q = await stub.Query(pb.QueryRequest(path=f"/user/{member.identity.node_id_hex}"), timeout=5)
        assert q.code == 0  # committed

        with pytest.raises(grpc.aio.AioRpcError) as err:
            async for _ in stub.GetBlocks(pb.BlockRangeRequest(from_height=0, to_height=5), timeout=5):
                pass
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        q = await stub.Query(pb.QueryRequest(path="/no/such/path"), timeout=5)
        assert q.code != 0 and "unknown" in q.log
        health = await stub.Health(pb.Empty(), timeout=5)
        assert health.serving and health.role == "verifier"
        before = node.consensus.host.height
        await until(lambda: node.consensus.host.height > before + 3)  # still deciding
    finally:
        await channel.close()
        await node.stop()


async def test_a_block_stored_but_not_executed_is_replayed_on_start(home):
    node = VerifierNode(home)
    await node.start()
    await until(lambda: node.consensus.host.height >= 3)
    await node.stop()

    # forge the crash: block h+1 decided and stored, the app never executed it
    genesis = Genesis.load(home)
    vals = genesis.validator_set()
    identity = NodeKeys.load_or_create(home).identity
    store = BlockStore(home / DATA_DIR / "blocks.sqlite")
    h = store.height
    last, last_commit = store.load(h)
    from verifier.abci.app import RegistryApp
    app = RegistryApp(home / DATA_DIR / "app.sqlite")
    app_hash = app.info().last_block_app_hash
    assert app.info().last_block_height == h
    app.close()
    block = make_block(genesis.chain_id, h + 1, last.header.time_ms + 1, identity.public_key, last.hash(),
                       last_commit, (), vals, app_hash)
    vote = Vote(VoteType.PRECOMMIT, h + 1, 0, block.hash(), 0)
    commit = Commit(h + 1, 0, block.hash(), (CommitSig(identity.public_key, identity.sign(vote.sign_bytes(genesis.chain_id))),))
    store.save(block, commit)
    store.close()

    again = VerifierNode(home)
    await again.start()
    try:
        assert again.app.info().last_block_height >= h + 1  # replayed into the app on start
        await until(lambda: again.consensus.host.height >= h + 3)
        assert again.consensus.store.load(h + 1)[0].hash() == block.hash()
    finally:
        await again.stop()


async def test_a_store_ahead_by_a_block_that_does_not_match_is_refused(home):
    node = VerifierNode(home)
    await node.start()
    await until(lambda: node.consensus.host.height >= 2)
    await node.stop()
    genesis = Genesis.load(home)
    identity = NodeKeys.load_or_create(home).identity
    store = BlockStore(home / DATA_DIR / "blocks.sqlite")
    h = store.height
    last, last_commit = store.load(h)
    bogus = make_block(genesis.chain_id, h + 1, last.header.time_ms + 1, identity.public_key, last.hash(),
                       last_commit, (), genesis.validator_set(), b"\x13" * 32)
    store.save(bogus, dataclasses.replace(last_commit, height=h + 1, block_hash=bogus.hash()))
    store.close()
    with pytest.raises(Exception, match="app hash"):
        await VerifierNode(home).start()


async def test_a_flood_of_round_states_gets_one_answer_per_half_period_and_forgeries_none(tmp_path):
    """An answer can carry megabytes, so one validator asking many times in a row is answered
    once per half gossip period; a forged state (wrong key) does not use up that slot."""
    assert cli.main(["--log-level", "WARNING", "init", "--validators", "2", "--out", str(tmp_path),
                     "--base-port", str(free_base_port(2)), "--timeouts", "fast"]) == 0
    node = VerifierNode(tmp_path / "v0")
    await node.start()  # (v1 never starts: v0 waits at height 1 with its own messages)
    peer = 1 - node.consensus.me
    key = NodeKeys.load_or_create(tmp_path / f"v{peer}").identity
    try:
        await until(lambda: node.consensus.driver.sm.votes.round_power(0) > 0)  # it holds something to relay

        def state(seq: int, signer=key):
            s = gossip.RoundState(peer, seq, node.consensus.driver.height, 0, 1, ())
            return gossip.encode_payload(gossip.signed(s, node.genesis.chain_id, signer.sign))

        assert node.consensus.on_consensus_payload(state(1, signer=node.identity)).ok  # forged: v0's own key
        assert node.consensus.gossip["states_answered"] == 0
        for seq in range(2, 22):  # twenty genuine ones in a row
            assert node.consensus.on_consensus_payload(state(seq)).ok
        assert 1 <= node.consensus.gossip["states_answered"] <= 3, node.consensus.gossip
        assert node.consensus.gossip["relayed"] > 0
        answered = node.consensus.gossip["states_answered"]
        await asyncio.sleep(node.consensus.timeouts.gossip_s)
        assert node.consensus.on_consensus_payload(state(100)).ok
        assert node.consensus.gossip["states_answered"] == answered + 1
    finally:
        await node.stop()


@pytest.mark.xfail(strict=False, reason="passes alone and with its file (also under -n 2 and CPU load), but timed out "
                   "in both whole-suite runs of 2026-12-02 after the merges: cause not found yet")
async def test_a_member_restarted_with_its_clock_behind_is_still_heard(tmp_path, monkeypatch):
    """Round-state sequence numbers used to start at the wall clock at boot: a member restarted
    with its clock earlier than its previous boot (NTP stepping back, a VM snapshot) sent states
    its peers dropped as old until the clock caught up, so nobody relayed it what it had missed,
    and a quorum that needed it halted. They now come from a boot counter in the home."""
    import time as _time
    assert cli.main(["--log-level", "WARNING", "init", "--validators", "2", "--out", str(tmp_path),
                     "--base-port", str(free_base_port(2)), "--timeouts", "fast"]) == 0
    homes = [tmp_path / "v0", tmp_path / "v1"]
    a, b = VerifierNode(homes[0]), VerifierNode(homes[1])
    await a.start()
    await b.start()
    try:
        await until(lambda: a.consensus.host.height >= 2 and b.consensus.host.height >= 2)
        peer = b.consensus.me
        assert a.consensus.on_consensus_payload(gossip.encode_payload(b.consensus.driver.round_state())).ok  # a state of b's boot
        seen = a.consensus.driver.peer_state_seq(peer)
        assert seen > 0
        await b.stop()
        real = _time.time_ns
        monkeypatch.setattr(_time, "time_ns", lambda: real() - 60 * 10**9)  # the clock a minute behind
        b = VerifierNode(homes[1])
        await b.start()
        top = a.consensus.host.height
        await until(lambda: a.consensus.driver.peer_state_seq(peer) > seen, timeout=40)  # its states are fresh
        await until(lambda: min(a.consensus.host.height, b.consensus.host.height) >= top + 2)  # and the pair goes on
    finally:
        await b.stop()
        await a.stop()
