"""Verification epochs end to end with real parts: a committee of 4 verifiers (real consensus over
gRPC/TLS), real vLLM model nodes (the session's honest SmolLM2 node and a pruned SmolLM2 that
claims to be SmolLM2, started here with `gt-model serve --dishonest pruned`), challenges asked
through the real anonymous overlay by each verifier's own user node, scored by the reference
model in one teacher-forced pass.

Single-machine shortcuts, said out loud: the four verifiers run in this test process (each a
full VerifierNode with its own keys, ports and TLS), and they share ONE reference engine, the
session's honest model node (reached through its Generate / Score RPCs; on separate machines
each member points --reference-model at its own). The honest node's overlay intake runs in this
process in front of the session node (as in tests/test_user_model.py).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from consensus_netkit import free_base_port
from conftest import ModelNodeProcess
from gentorrent.config import EPOCH_RUN, REPUTATION
from gentorrent.crypto import tls
from gentorrent.crypto.keys import NodeKeys
from gentorrent.wire import gentorrent_pb2 as pb
from gentorrent.wire import gentorrent_pb2_grpc as rpc
from test_user_model import CLOVES, PATIENT, _IntakeFront
from user_client.directory import ModelRecord, StaticDirectory
from user_client.localnet import start_user_nodes
from verifier import cli
from verifier.abci import epoch_rules as rules
from verifier.abci import txs
from verifier.abci.sections import decode_model
from verifier.consensus.node import VerifierNode
from verifier.epochs.reference import RemoteReference
from verifier.epochs.runner import LeaderFaults
from verifier.epochs.wiring import attach_epochs

pytestmark = [pytest.mark.engine, pytest.mark.network, pytest.mark.timeout(1500)]

MODEL = "smollm2-135m"
PARAMS = EPOCH_RUN.__class__(poll_s=0.5, probe_timeout_s=400.0, challenge_max_tokens=64, epoch_pause_s=0.0)


class LiveCommittee:
    def __init__(self, tmp: Path) -> None:
        assert cli.main(["--log-level", "WARNING", "init", "--validators", "4", "--out", str(tmp / "committee"),
                         "--base-port", str(free_base_port(4)), "--timeouts", "fast", "--chain-id", "live"]) == 0
        self.homes = [tmp / "committee" / f"v{i}" for i in range(4)]
        self.nodes: list[VerifierNode] = []
        self.runners = []

    async def start(self, reference_node: ModelNodeProcess, directory: Path, faults: LeaderFaults) -> None:
        for home in self.homes:
            node = VerifierNode(home)
            await node.start()
            self.nodes.append(node)
        for node in self.nodes:
            reference = RemoteReference(reference_node.address, reference_node.cert_pem)
            self.runners.append(await attach_epochs(node, reference, directory, PARAMS, faults,
                                                    user_kwargs={"cloves": CLOVES, "params": PATIENT}))

    async def stop(self) -> None:
        for node in self.nodes:
            await node.stop()

    def section(self) -> pb.EpochsSection:
        return pb.EpochsSection.FromString(self.nodes[0].app.query("/epochs").value)

    def model(self, node_id_hex: str):
        q = self.nodes[0].app.query(f"/model/{node_id_hex}")
        return decode_model(q.value) if q.code == 0 else None

    async def wait(self, predicate, what: str, timeout: float) -> pb.EpochsSection:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            sec = self.section()
            if predicate(sec):
                return sec
            await asyncio.sleep(1.0)
        raise AssertionError(f"{what} did not happen in {timeout:.0f} s; history "
                             f"{[(h.epoch, h.phase, h.reason[:80]) for h in self.section().history]}; "
                             f"runners {[r.log[-5:] for r in self.runners]}")


def register_on_chain(home: Path, info: dict) -> bytes:
    keys = NodeKeys.load_or_create(home)
    return txs.register_model(keys.identity, info["address"], MODEL, 5, Path(info["cert_file"]).read_bytes(), 1)


async def test_live_committee_untrusts_a_pruned_node_and_catches_faulty_leaders(model_node, tmp_path):
    directory_path = tmp_path / "directory.json"
    directory = StaticDirectory(directory_path)
    directory_path.write_text('{"users": [], "models": []}')
    pruned = ModelNodeProcess(tmp_path / "pruned", extra=("--dishonest", "pruned", "--directory",
                                                           str(directory_path)))
    await asyncio.to_thread(pruned.start)
    engine_channel = await model_node.connect()
    front = _IntakeFront(tmp_path / "front", directory, rpc.ModelNodeStub(engine_channel))
    server, port = tls.new_server(front.tls, "127.0.0.1:0")
    rpc.add_ModelNodeServicer_to_server(front, server)
    await server.start()
    directory.add_model(ModelRecord(model_node.node_id, model_node.public_key, f"127.0.0.1:{port}", MODEL,
                                    front.keys.onion.public_key, front.tls.cert_pem))
    pruned_keys = NodeKeys.load_or_create(pruned.home)
    directory.add_model(ModelRecord(pruned.node_id, pruned.public_key, pruned.address, MODEL,
                                    pruned_keys.onion.public_key, pruned.cert_pem))
    relays = await start_user_nodes(9, directory_path, tmp_path, cloves=CLOVES, params=PATIENT, maintain=False)
    faults = LeaderFaults()
    committee = LiveCommittee(tmp_path)
    try:
        await committee.start(model_node, directory_path, faults)
        for home, info in ((model_node.home, model_node.info), (pruned.home, pruned.info)):
            reply = await committee.nodes[0].submit_tx(register_on_chain(home, info), forwarded=False)
            assert reply.code == 0, reply.log
        honest, cheat = model_node.node_id, pruned.node_id

        # 1. epochs run by themselves until the pruned node is untrusted
        sec = await committee.wait(lambda s: committee.model(cheat) is not None and not committee.model(cheat).trusted,
                                   "pruned node untrusted", 900)
        done = [h for h in sec.history if h.phase == rules.DONE and h.result]
        assert done, [(h.epoch, h.phase, h.reason) for h in sec.history]
        scores = {n: [s.score_micros / 1e6 for h in done for s in h.result if s.node_id.hex() == n]
                  for n in (honest, cheat)}
        tau = REPUTATION.abnormal_threshold
        assert scores[honest] and min(scores[honest]) >= tau, scores  # honest: never abnormal
        assert min(scores[cheat]) < tau and sum(scores[cheat]) / len(scores[cheat]) < min(scores[honest]), scores
        assert committee.model(honest).trusted and committee.model(honest).reputation >= REPUTATION.untrusted_below
        assert committee.model(cheat).reputation < REPUTATION.untrusted_below
        before = committee.model(honest).reputation
        closed = len(sec.history)

        # 2. a leader that drops the honest node's reply is exposed by the others' own probes
        faults.drop.add(honest)
        sec = await committee.wait(lambda s: any(h.faulty_leader and "valid replies" in h.reason
                                                 for h in s.history[closed:]), "a dropping leader caught", 600)
        faults.drop.clear()
        assert committee.model(honest).trusted and committee.model(honest).reputation >= before - 0.05
        assert all(not h.result for h in sec.history[closed:] if h.faulty_leader)  # aborted: nobody touched
        closed = len(sec.history)

        # 3. a leader that alters the honest node's reply is caught by the receipt check
        faults.alter.add(honest)
        sec = await committee.wait(lambda s: any(h.faulty_leader and "did not sign" in h.reason
                                                 for h in s.history[closed:]), "an altering leader caught", 600)
        faults.alter.clear()
        assert committee.model(honest).trusted and committee.model(honest).reputation >= before - 0.05
        assert all(not h.result for h in sec.history[closed:] if h.faulty_leader)
        assert sum(m.faults for m in sec.members) >= 2
    finally:
        await committee.stop()
        for node in relays:
            await node.stop()
        await front.intake.close()
        await server.stop(None)
        await front.channels.close()
        await engine_channel.close()
        pruned.stop()
