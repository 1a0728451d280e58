"""Attacks on the registry and the light client, against real processes on 127.0.0.1.

A committee of four `gt-verifier` members (fast timeouts, a 5-s registration lease) of which
v0 is faulty: first down, later replaced by a Byzantine server that holds v0's TLS identity and
replays a directory it recorded earlier (validly signed by the committee, just old). User
nodes and an echo stand-in model node register themselves through `CommitteeDirectory`, as
`gt-user start --committee` and `gt-model serve --committee` do. Every test names the attack
it replays; each fails with its defence disabled (THREAT_MODEL.md, "Registry and TLS").
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gentorrent.config import CloveParams, OverlayParams
from gentorrent.ledger import txs
from gentorrent.ledger.genesis import Genesis
from gentorrent.ledger import queries
from gentorrent.ledger.light_client import (Committee, DirectoryRejected, LightClient,
                                            committee_reader, verify_reply)
from testkit import faketime
from testkit.echo_model import ECHO_PREFIX, EchoModelNode
from testkit.scenarios.adversary_registry import (LEASE_S, RegistryCommittee, hijack_txs, init_committee,
                                                  node_directory, query_reply, replaying_verifier,
                                                  serve_as, start_verifier, stop_all, user_nodes)

pytestmark = [pytest.mark.network, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[1]
CLOVES = CloveParams(n=4, k=3, path_length=3, proxies_kept=4)
FAST = OverlayParams(first_reply_timeout_s=8.0, reply_idle_timeout_s=15.0, forward_timeout_s=5.0,
                     establish_timeout_s=5.0, maintenance_interval_s=1.0, build_attempts=12)


@pytest.fixture(scope="module")
def committee(tmp_path_factory):
    """Four members, v0 down; yields the genesis path (v1..v3 commit blocks: 3 of 4 > 2/3)."""
    c = RegistryCommittee(tmp_path_factory.mktemp("attacks"), chain_id="attacks")
    try:
        yield c.start()
    finally:
        c.stop()


# --------------------------------------------------------------------------- address hijack


async def test_a_second_registration_of_a_taken_address_is_refused(committee, tmp_path):
    """The hijack of a model node's address: an attacker registers the victim's address with
    its own certificate, so that proxies pin the attacker's key and cut the victim off. The
    committee refuses it; the victim keeps serving. A transaction signed for another chain is
    refused too. (Every node here registered itself while one verifier of four was down.)"""
    model = EchoModelNode(tmp_path / "model", node_directory(committee, tmp_path / "model"), cloves=CLOVES,
                          params=FAST)
    await model.start()
    users = await user_nodes(committee, tmp_path, 5, cloves=CLOVES, params=FAST)
    try:
        me = users[0]
        await me.paths.fill()
        before = await me.ask("Say hello.", model=model.model)
        assert before.served_by == model.keys.identity.node_id_hex and before.text.startswith(ECHO_PREFIX)

        *hijacks, foreign = hijack_txs(model.address, model.model, Genesis.load(committee).chain_id)
        for tx in hijacks:
            code, log = await me.directory.submit(tx)
            assert code == txs.CODE_ADDRESS_TAKEN, log
            assert model.keys.identity.node_id_hex[:16] in log
        assert (await me.directory.submit(foreign))[0] == txs.CODE_WRONG_CHAIN

        await asyncio.sleep(1.0)  # a few blocks: an accepted hijack would be in the registry now
        attacker = [txs.decode_tx(tx, Genesis.load(committee).chain_id).node_id for tx in hijacks]
        for node_id in attacker:  # looked up with proofs: neither a user nor a model record
            assert await me.directory.user(node_id, fresh=True) is None
            assert await me.directory.model(node_id, fresh=True) is None
        after = await me.ask("Say hello again.", model=model.model)
        assert after.served_by == model.keys.identity.node_id_hex
    finally:
        for node in users:
            await node.stop()
        await model.stop()


# --------------------------------------------------------------------------- rollback and staleness


async def test_a_replayed_old_answer_never_rolls_a_client_back(committee, tmp_path):
    """v0 turns Byzantine: it replays an answer of an earlier height, signed by the committee,
    from before a user node registered (a proof that it was absent). A client that asks it first
    (every client used to ask v0 first) must neither go back in height nor lose that node; a
    client that already holds a newer height refuses the replay outright; a fresh client refuses
    it once it is older than the age bound."""
    from gentorrent.crypto.keys import NodeKeys

    genesis = Genesis.load(committee)
    newcomer_id = NodeKeys.load_or_create(tmp_path / "user0").identity.node_id
    asked = queries.UserLookup(newcomer_id)
    old = await query_reply(genesis, 1, asked)
    newcomer = (await user_nodes(committee, tmp_path, 1))[0]  # registers after `old` was certified
    fake = await serve_as(committee.parent, genesis.validators[0].address, replaying_verifier(old))
    try:
        reader = committee_reader(genesis, timeout=5.0, rng=random.Random(1))
        heights = []
        for _ in range(12):
            answer = await reader.ask(asked, confirm=True)
            heights.append(answer.height)
            assert answer.result is not None and answer.result.node_id == newcomer_id
        await reader.close()
        assert heights == sorted(heights) and heights[0] > old.height

        only_liar = [genesis.validators[0]]
        held = committee_reader(genesis, timeout=5.0)
        held.validators = only_liar
        held.client.accept_answer(asked.path, type("R", (), {"height": heights[-1]})())
        with pytest.raises(DirectoryRejected, match="older than height") as err:
            await held.ask(asked)
        assert "v0: answer rejected" in str(err.value)
        # 2.5 s later by this reader's clock (the reader takes its clock: no need to wait)
        fresh = committee_reader(genesis, timeout=5.0, client=LightClient(max_age_ms=2000),
                                 now_ms=lambda: int(time.time() * 1000) + 2500)
        fresh.validators = only_liar
        with pytest.raises(DirectoryRejected, match="certified .* s ago"):
            await fresh.ask(asked)
        await held.close()
        await fresh.close()
    finally:
        await fake.stop(None)
        await newcomer.stop()


@pytest.mark.skipif(faketime.library() is None, reason=faketime.MISSING)
async def test_a_directory_from_a_verifier_whose_clock_is_far_behind_is_refused(tmp_path):
    """A one-member committee whose clock runs an hour behind (libfaketime, as `gt-verifier
    init` and `start` both see it): its directory is validly signed but an hour old by this
    machine's clock, and refused; the same bytes pass the signature check alone."""
    env = {**os.environ, **faketime.skewed_env(-3600)}
    genesis_path = init_committee(tmp_path / "slow", 1, "slow-clock", env=env, lease_s=None)
    procs = [start_verifier(tmp_path / "slow" / "v0", tmp_path / "slow.log", env=env)]
    try:
        genesis = Genesis.load(genesis_path)
        deadline = time.monotonic() + 60
        catalog = queries.Catalog()
        while True:
            try:
                reply = await query_reply(genesis, 0, catalog)
                if reply.code == 0:
                    break
            except Exception:  # noqa: BLE001 - still starting
                pass
            assert time.monotonic() < deadline, (tmp_path / "slow.log").read_text()[-2000:]
            await asyncio.sleep(0.5)
        certified = verify_reply(catalog, reply.value, reply.height, reply.proof, Committee.from_genesis(genesis))
        assert time.time() * 1000 - certified.time_ms > 3500 * 1000  # signed, but an hour ago
        reader = committee_reader(genesis, timeout=5.0)
        with pytest.raises(DirectoryRejected, match="certified 36\\d\\d s ago"):
            await reader.ask(catalog)
        await reader.close()
    finally:
        stop_all(procs)


# --------------------------------------------------------------------------- leases


async def test_a_node_that_stops_renewing_leaves_the_directory(committee, tmp_path):
    """Registrations are leases: a relay that vanished (stopped, so it renews no more) leaves
    the committee's directory one lease after its last renewal; one that keeps renewing stays."""
    stays, vanishes = await user_nodes(committee, tmp_path, 2)
    try:
        watcher = committee_reader(Genesis.load(committee), timeout=5.0)

        async def listed(node) -> bool:
            return (await watcher.ask(queries.UserLookup(node.keys.identity.node_id))).result is not None

        assert await listed(stays) and await listed(vanishes)
        await vanishes.stop()
        gone_after = None
        t0 = time.monotonic()
        while time.monotonic() - t0 < 2 * LEASE_S:
            if gone_after is None and not await listed(vanishes):
                gone_after = time.monotonic() - t0
            assert await listed(stays)  # renewed every lease / 3
            await asyncio.sleep(0.5)
        assert gone_after is not None and gone_after <= LEASE_S + 3.0, gone_after
        assert stays.directory.renewals >= 3
    finally:
        await watcher.close()
        await stays.stop()


# --------------------------------------------------------------------------- addresses nobody can dial


def test_listening_on_a_wildcard_needs_advertise(committee, tmp_path):
    """`--listen 0.0.0.0:PORT` (as a deployment writes it) without `--advertise` would register
    an address nobody can dial: both CLIs stop at once with an error saying what to give."""
    out = subprocess.run([sys.executable, "-m", "user_client.cli", "start", "--home", str(tmp_path / "u"),
                          "--committee", str(committee), "--listen", "0.0.0.0:0"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "needs --advertise HOST:PORT" in out.stderr and "Traceback" not in out.stderr
    out = subprocess.run([sys.executable, "-m", "model_node.cli", "serve", "--home", str(tmp_path / "m"),
                          "--committee", str(committee), "--listen", "0.0.0.0:0"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "needs --advertise HOST:PORT" in out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / "m" / "node.json").exists() and not (tmp_path / "u" / "node.json").exists()
    assert json.loads(Path(committee).read_text())["chain_id"] == "attacks"


# --------------------------------------------------------------------------- standing kept across registrations


async def test_gt_model_tells_its_operator_when_it_comes_back_untrusted(caplog):
    """The committee keeps an untrusted key's standing when the node leaves and registers again
    (tests/test_epochs_txs.py::test_attack_an_untrusted_node_that_leaves_and_registers_again_stays_untrusted);
    the operator of such a node must learn it at start-up, not wonder why no asks arrive."""
    from dataclasses import replace

    from gentorrent.crypto.keys import Identity
    from gentorrent.ledger.sections import ModelRecord
    from model_node import cli as model_cli

    ident = Identity.from_seed(bytes([42]) * 32)
    record = ModelRecord(node_id=ident.node_id, public_key=ident.public_key, address="127.0.0.1:9",
                         model="smollm2-135m", capacity=1, onion_key=b"")

    class Directory:  # what the committee's directory reports once the registration is listed
        height = 7

        def __init__(self, listed: ModelRecord) -> None:
            self.listed = listed

        def models(self) -> list[ModelRecord]:  # gentorrent.ledger.directory.Directory
            return [self.listed]

        async def register_model(self, _record) -> None:
            return None

    for trusted, warned in ((True, False), (False, True)):
        caplog.clear()
        with caplog.at_level("INFO", logger=model_cli.log.name):
            listed = replace(record, reputation=0.24 if not trusted else 1.0, trusted=trusted)
            assert await model_cli._register(Directory(listed), record, asyncio.Event())
        warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
        assert bool(warnings) == warned, warnings
        if warned:
            assert "UNTRUSTED (reputation 0.240" in warnings[0] and "probation" in warnings[0]
