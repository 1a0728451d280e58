"""A client's transaction reaches the committee however far behind the other members are when
it arrives (verifier/consensus/mempool.py).

The fault: members a block behind refuse the forwarded transaction (valid only one block on:
an epoch's plan, a VRF proof), and the member that took it never gets it into a block of its
own. Without the spread rounds only that member held it, and it waited for a round the
submitter proposed and committed (stop 46: a leader's plan never committed, its epoch stuck
until the plan deadline). The live test runs four real in-process members over gRPC/TLS.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import time
from pathlib import Path

import pytest

from testkit.committee import free_base_port, new_registration
from verifier import cli
from verifier.abci.interface import TxResult
from verifier.consensus.mempool import Mempool, TxSpread
from verifier.node import VerifierNode

A, B, C = b"a" * 32, b"b" * 32, b"c" * 32


def test_a_new_transaction_is_pending_for_every_peer_until_each_takes_it():
    spread = TxSpread(rounds=3)
    spread.add(b"t1", [A, B, C])
    spread.taken(b"t1", B)
    assert spread.due(lambda h: True) == {A: [b"t1"], C: [b"t1"]}
    spread.taken(b"t1", A)
    spread.taken(b"t1", C)
    assert len(spread) == 0 and spread.due(lambda h: True) == {}


def test_rounds_are_bounded_and_a_transaction_that_left_the_mempool_is_forgotten():
    spread = TxSpread(rounds=2)
    spread.add(b"t1", [A])
    spread.add(b"t2", [A])
    assert spread.due(lambda h: True) == {A: [b"t1", b"t2"]}  # (arrival order: a signer's S before S + 1)
    assert spread.due(lambda h: h != b"t2") == {A: [b"t1"]}  # t2 committed
    assert spread.due(lambda h: True) == {}  # t1 out of rounds: the peer disagrees with us
    assert len(spread) == 0


def test_no_peers_nothing_tracked_and_an_unknown_hash_is_ignored():
    spread = TxSpread()
    spread.add(b"t1", [])
    spread.taken(b"t9", A)
    assert len(spread) == 0


def test_the_mempool_keeps_arrival_order_and_its_bound():
    pool = Mempool(max_txs=2)
    pool.add(b"x")
    pool.add(b"y")
    assert pool.full() and pool.batch(5) == [b"x", b"y"] and pool.get(b"nope") is None
    pool.remove([b"x"])
    assert pool.batch(5) == [b"y"] and not pool.full()


@pytest.mark.network
@pytest.mark.timeout(240)
async def test_a_transaction_lagging_members_refused_once_still_commits(tmp_path: Path):
    with contextlib.redirect_stdout(io.StringIO()):
        assert cli.main(["--log-level", "WARNING", "init", "--validators", "4", "--out", str(tmp_path),
                         "--base-port", str(free_base_port(4)), "--timeouts", "fast",
                         "--chain-id", "tx-spread"]) == 0
    nodes = [VerifierNode(tmp_path / f"v{i}") for i in range(4)]
    for node in nodes:
        await node.start()
    try:
        user, tx = new_registration(1, "tx-spread")
        refused: list[int] = []
        for i, node in enumerate(nodes[1:], start=1):  # each peer is a block behind when it first sees it
            check = node.app.check_tx

            def lagging(raw, check=check, i=i):
                if raw == tx and i not in refused:
                    refused.append(i)
                    return TxResult(code=30, log="not yet: this member is a block behind")
                return check(raw)
            node.app.check_tx = lagging
        nodes[0].consensus.mempool.batch = lambda n: []  # the submitter's own proposals never carry it
        while nodes[0].consensus.host.height < 3:  # (the members connected: blocks commit)
            await asyncio.sleep(0.05)
        reply = await nodes[0].consensus.submit_tx(tx, forwarded=False)
        assert reply.code == 0, reply.log
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and nodes[0].app.query(f"/user/{user}").code != 0:
            await asyncio.sleep(0.2)
        assert nodes[0].app.query(f"/user/{user}").code == 0, (
            f"not committed in 60 s (height {nodes[0].consensus.host.height}): a refused forward was never sent again")
        # every peer that got the first forward refused it (one may commit it before another's
        # second forward arrives), and the node's status counts the refusals
        assert refused and nodes[0].consensus.gossip["txs_refused_by_peers"] >= len(refused), nodes[0].consensus.gossip
        assert len(nodes[0].consensus.tx_spread) == 0  # (forgotten once committed)
    finally:
        for node in nodes:
            await node.stop()
