"""The epoch runner in a real committee (4 VerifierNodes, real consensus over gRPC/TLS on
loopback, real private reveals), with a scripted reference model and a scripted prober.

What is scripted: the reference model's question text and token scores, and the model nodes'
replies (signed with real model-node keys and real receipts). The live test with vLLM and the
overlay is tests/test_epochs_live.py; this one runs in seconds and checks the runner's logic:
epochs run by themselves, a cheater becomes untrusted, faulty leaders are caught.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

import pytest

from consensus_netkit import free_base_port
from gentorrent.config import EPOCH_RUN, REPUTATION
from gentorrent.crypto.keys import Identity
from gentorrent.crypto.tls import make_self_signed
from gentorrent.model_node import receipts
from gentorrent.wire import gentorrent_pb2 as pb
from verifier import cli
from verifier.abci import epoch_rules as rules
from verifier.abci import txs
from verifier.abci.sections import decode_model
from verifier.consensus.node import VerifierNode
from verifier.epochs.runner import EpochRunner, LeaderFaults, ProbeAnswer, ProbeFailed
from verifier.epochs.scoring import TokenScores

pytestmark = [pytest.mark.network, pytest.mark.timeout(240)]

PARAMS = EPOCH_RUN.__class__(challenge_temperature=0.0, poll_s=0.1, probe_timeout_s=10.0, epoch_pause_s=0.0,
                             challenge_spread_s=0.0)
HONEST_TOKENS = [5, 6, 7, 8, 9, 10]
MODEL = "smollm2-135m"


class ScriptedReference:
    """Questions from the meta-prompt's own words; honest tokens are the greedy choice."""

    async def write(self, instruction: str, seed: int) -> str:
        return f"What should I know about {instruction[27:90].strip()} (ref {seed % 97})?"

    async def score(self, request, token_ids):
        lps, ranks, tops = [], [], []
        for t in token_ids:
            honest = t in HONEST_TOKENS
            lps.append(-0.05 if honest else -9.0)
            ranks.append(1 if honest else 40)
            tops.append({t if honest else HONEST_TOKENS[0]: -0.05, 3: -3.0})
        return TokenScores(lps, ranks, tops)


class ScriptedModels:
    """Model nodes behind the prober: 'honest', 'cheat' (wrong tokens) or 'down'."""

    def __init__(self) -> None:
        self.nodes: dict[str, tuple[Identity, str]] = {}
        self.asked: list[str] = []
        self.asked_at: list[float] = []

    def add(self, behaviour: str) -> Identity:
        ident = Identity.generate()
        self.nodes[ident.node_id_hex] = (ident, behaviour)
        return ident

    async def ask(self, request: pb.GenerateRequest, node_id_hex: str) -> ProbeAnswer:
        self.asked.append(node_id_hex)
        self.asked_at.append(time.monotonic())
        ident, behaviour = self.nodes[node_id_hex]
        if behaviour == "down":
            raise ProbeFailed("no reply within 1 s")
        tokens = HONEST_TOKENS if behaviour == "honest" else [900, 901, 902, 903]
        receipt = receipts.make_receipt(ident, request.model, request, tokens, int(time.time() * 1000))
        return ProbeAnswer(list(tokens), receipt)


class Committee:
    def __init__(self, tmp_path) -> None:
        assert cli.main(["--log-level", "WARNING", "init", "--validators", "4", "--out", str(tmp_path),
                         "--base-port", str(free_base_port(4)), "--timeouts", "fast",
                         "--chain-id", "epochs-test"]) == 0
        self.homes = [tmp_path / f"v{i}" for i in range(4)]
        self.nodes: list[VerifierNode] = []
        self.runners: list[EpochRunner] = []

    async def start(self, models: ScriptedModels, faults: LeaderFaults | None = None, params=PARAMS) -> None:
        for home in self.homes:
            node = VerifierNode(home)
            await node.start()
            self.nodes.append(node)
        for node in self.nodes:
            runner = EpochRunner(node.epoch_host(), ScriptedReference(), models, params, faults)
            node.epochs = runner
            runner.start()
            self.runners.append(runner)

    async def stop(self) -> None:
        for node in self.nodes:
            await node.stop()

    async def submit(self, tx: bytes) -> None:
        reply = await self.nodes[0].submit_tx(tx, forwarded=False)
        assert reply.code == 0, reply.log

    def section(self) -> pb.EpochsSection:
        return pb.EpochsSection.FromString(self.nodes[0].app.query("/epochs").value)

    def model(self, ident: Identity):
        return decode_model(self.nodes[0].app.query(f"/model/{ident.node_id_hex}").value)

    async def wait_epochs(self, closed: int, timeout: float = 90.0) -> pb.EpochsSection:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            sec = self.section()
            if len(sec.history) >= closed:
                return sec
            await asyncio.sleep(0.2)
        raise AssertionError(f"only {len(self.section().history)} epochs closed; runner logs: "
                             f"{[r.log[-6:] for r in self.runners]}")


async def register(committee: Committee, ident: Identity, port: int) -> None:
    await committee.submit(txs.register_model(ident, f"127.0.0.1:{port}", MODEL, 5,
                                              make_self_signed(ident).cert_pem, 1))


async def test_epochs_run_by_themselves_and_a_cheater_becomes_untrusted(tmp_path):
    models = ScriptedModels()
    honest, cheat = models.add("honest"), models.add("cheat")
    committee = Committee(tmp_path)
    await committee.start(models)
    try:
        await register(committee, honest, 9001)
        await register(committee, cheat, 9002)
        sec = await committee.wait_epochs(4)
        done = [h for h in sec.history if h.phase == rules.DONE and h.result]
        assert len(done) >= 3, [(h.phase, h.reason) for h in sec.history]
        scores = {s.node_id: s.score_micros for h in done for s in h.result}
        assert scores[honest.node_id] > 900_000 and scores[cheat.node_id] < 100_000
        assert not committee.model(cheat).trusted and committee.model(cheat).reputation < REPUTATION.untrusted_below
        assert committee.model(honest).trusted and committee.model(honest).reputation > 0.9
        assert {h.leader for h in sec.history} <= {n.identity.public_key for n in committee.nodes}
        assert all(not h.faulty_leader for h in sec.history)
        # every member attested (the quorum closes the phase; a late one may be refused)
        assert sum(1 for r in committee.runners for line in r.log if "attestation: submitted" in line) >= 3 * len(done)
    finally:
        await committee.stop()


async def test_challenges_leave_at_independent_random_times(tmp_path):
    """Not all at once when the plan commits (a node watching the chain could match that):
    each challenge waits its own random delay in [0, challenge_spread_s]."""
    models = ScriptedModels()
    nodes = [models.add("honest") for _ in range(4)]
    committee = Committee(tmp_path)
    await committee.start(models, params=replace(PARAMS, challenge_spread_s=1.5))
    try:
        for port, ident in enumerate(nodes, 9001):
            await register(committee, ident, port)
        sec = await committee.wait_epochs(1)
        assert sec.history[0].phase == rules.DONE and len(sec.history[0].result) == 4
        first_epoch = models.asked_at[:4]  # the leader's four challenges (nobody was missing)
        assert sorted(models.asked[:4]) == sorted(n.node_id_hex for n in nodes)
        assert max(first_epoch) - min(first_epoch) > 0.01, first_epoch  # 4 uniform draws in 1.5 s
    finally:
        await committee.stop()


def test_a_spread_that_would_miss_the_probe_deadline_is_refused():
    with pytest.raises(ValueError, match="challenge_spread_s"):
        replace(EPOCH_RUN, challenge_spread_s=EPOCH_RUN.probe_timeout_ms / 1000)
    with pytest.raises(ValueError, match="challenge_spread_s"):
        replace(EPOCH_RUN, challenge_spread_s=-1.0)


@pytest.mark.parametrize("fault", ["drop", "alter", "forge"])
async def test_a_faulty_leader_is_detected_and_does_not_hurt_the_honest_node(tmp_path, fault):
    models = ScriptedModels()
    honest = models.add("honest")
    faults = LeaderFaults(**{fault: {honest.node_id_hex}})
    committee = Committee(tmp_path)
    await committee.start(models, faults)  # every member misbehaves when it leads
    try:
        await register(committee, honest, 9001)
        sec = await committee.wait_epochs(2)
        probed = [h for h in sec.history if h.reason]
        assert probed and all(h.phase == rules.ABORTED and h.faulty_leader for h in probed), \
            [(h.phase, h.reason) for h in sec.history]
        expected = "committee got valid replies" if fault == "drop" else "did not sign"
        assert all(expected in h.reason for h in probed)
        assert committee.model(honest).reputation == 1.0 and committee.model(honest).trusted
        faults_by_member = {m.public_key: m.faults for m in sec.members}
        assert sum(faults_by_member.values()) == len(probed)
        if fault == "drop":  # the other members probed the node themselves, with prompts of their own
            assert models.asked.count(honest.node_id_hex) >= 3
        if fault == "forge":  # the forger never asked the node; its receipt verifies under no key but its own
            assert honest.node_id_hex not in models.asked
            assert all("signature does not verify" in h.reason for h in probed)
    finally:
        await committee.stop()


async def test_gt_verifier_start_with_epochs_runs_epochs_in_the_process(tmp_path):
    """The CLI wiring: `gt-verifier start --epochs` drives epochs (one member, no model yet)."""
    import json
    import signal
    import subprocess
    import sys

    from gentorrent.crypto.tls import connect
    from gentorrent.wire import gentorrent_pb2_grpc as rpc
    from verifier.genesis import Genesis

    assert cli.main(["--log-level", "WARNING", "init", "--validators", "1", "--out", str(tmp_path),
                     "--base-port", str(free_base_port(1)), "--timeouts", "fast", "--chain-id", "cli-epochs"]) == 0
    home = tmp_path / "v0"
    cert = home / "tls.crt.pem"  # any pinned certificate: no model node is registered, so it is never used
    proc = subprocess.Popen([sys.executable, "-m", "verifier.cli", "--log-level", "WARNING", "start", "--home",
                             str(home), "--epochs", "--reference-model", "127.0.0.1:9", "--reference-cert", str(cert)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    v = Genesis.load(home).validators[0]
    try:
        deadline = time.monotonic() + 90
        history = []
        while time.monotonic() < deadline and not history:
            await asyncio.sleep(1.0)
            try:
                channel = await connect(v.address, v.tls_cert_pem, timeout=5)
            except Exception:  # noqa: BLE001 - not listening yet
                continue
            try:
                reply = await rpc.VerifierStub(channel).Query(pb.QueryRequest(path="/epochs"), timeout=5)
                history = list(pb.EpochsSection.FromString(reply.value).history)
                status = json.loads((await rpc.VerifierStub(channel).Status(pb.Empty(), timeout=5)).json)
            finally:
                await channel.close()
        assert history and history[0].epoch == 1 and history[0].phase == rules.DONE
        assert history[0].leader == v.public_key and status["epochs"]["recent"]
    finally:
        proc.send_signal(signal.SIGTERM)
        out = proc.communicate(timeout=30)[0].decode()
    assert proc.returncode == 0, out
    assert "verification epochs on" in out
