"""The epoch runner in a real committee (4 VerifierNodes, real consensus over gRPC/TLS on
loopback, real private reveals), with a scripted reference model and a scripted prober.

What is scripted (testkit/epochs.py): the reference model's question text and token
scores, and the model nodes' replies (signed with real model-node keys and real receipts). The live test with vLLM and the
overlay is tests/test_epochs_live.py; this one runs in seconds and checks the runner's logic:
epochs run by themselves, a cheater becomes untrusted, faulty leaders are caught.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

import pytest

from consensus_netkit import free_base_port
from gentorrent.config import EPOCH_RUN, EPOCHS, REPUTATION
from gentorrent.crypto.keys import Identity
from testkit.epochs import EPOCH_TEST_TIMEOUT_S, SCRIPTED_PARAMS, EpochCommittee, ScriptedModels
from gentorrent.wire import gentorrent_pb2 as pb
from verifier import cli
from gentorrent.ledger.epoch_txs import Phase
from testkit.leader_faults import LeaderFaults

pytestmark = [pytest.mark.network, pytest.mark.timeout(EPOCH_TEST_TIMEOUT_S)]



async def test_epochs_run_by_themselves_and_a_cheater_becomes_untrusted(tmp_path):
    models = ScriptedModels()
    honest, cheat = models.add("honest"), models.add("cheat")
    committee = EpochCommittee(tmp_path)
    await committee.start(models)
    try:
        await committee.register(honest, 9001)
        await committee.register(cheat, 9002)
        sec = await committee.wait_epochs(4)
        done = [h for h in sec.history if h.phase == Phase.DONE and h.result]
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


async def test_a_node_that_replays_one_reply_becomes_untrusted(tmp_path):
    """Its reply scores as honest wherever the challenge's sampling allows it (teacher forcing);
    the members remember the output and attest 0 from the second prompt it answered with it
    (verifier/epochs/repeats.py). The first score is not asserted high: a challenge drawn with
    top_p 0.8-0.9 (a chat front-end's or a tuned client's) truncates tokens the stored sample
    holds, and the scoring pass alone marks it down (0.40 in one full run)."""
    models = ScriptedModels()
    replayer = models.add("replay")
    committee = EpochCommittee(tmp_path)
    await committee.start(models, params=replace(SCRIPTED_PARAMS, challenge_temperature=0.7))
    try:
        await committee.register(replayer, 9003)
        sec = await committee.wait_epochs(4)
        scored = [(h.epoch, s.score_micros) for h in sec.history if h.phase == Phase.DONE for s in h.result]
        scores = [v for _, v in scored]
        assert scores[0] > 0 and scores[1:] and all(v == 0 for v in scores[1:]), scores  # the first is its sample
        # Zeroed by the memory of outputs, not by the scoring pass: every member's credibility line
        # of a later epoch says so. A member may miss an epoch (the quorum closes the phase before
        # its attestation; CI saw one write 2 lines of 3), so the lines are checked per epoch: at
        # least two (a median of 0 over a quorum of 3 needs two zeros), all of them saying why.
        replayed = "credibility 0.000 (output replayed from another prompt)"
        for epoch, _ in scored[1:]:
            lines = [line for r in committee.runners for line in r.log
                     if line.startswith(f"epoch {epoch}: ") and " credibility " in line]
            assert len(lines) >= 2 and all(replayed in line for line in lines), (epoch, lines)
        assert not committee.model(replayer).trusted
    finally:
        await committee.stop()


async def test_a_node_that_forwards_its_challenge_is_neither_scored_nor_punished(tmp_path):
    """The HR-tree forwards a request to the group member that holds its prefix, and that member
    signs the reply in its own name. The prober used to refuse such a reply ("not signed by the
    probed node"), every member's own probe failed the same way, and the honest forwarder was
    punished as missing (seen in `make demo`). Now the members attest "forwarded": the reply is
    scored for the member that served and signed it, never for the forwarder, so a node is not
    blamed for the cheater it forwarded to, and the cheater is scored on what it served. A reply
    signed by a node outside the model group is still no reply at all."""
    models = ScriptedModels()
    cheat = models.add("cheat")
    forwarder = models.add("honest")
    models.forward(forwarder, cheat)
    outsider = models.add("honest")
    models.forward(outsider, Identity.generate())  # signed by a key the registry does not know
    committee = EpochCommittee(tmp_path)
    await committee.start(models)
    try:
        for port, ident in enumerate((cheat, forwarder, outsider), 9001):
            await committee.register(ident, port)
        sec = await committee.wait_epochs(4)
        done = [h for h in sec.history if h.phase == Phase.DONE]
        assert len(done) >= 3, [(h.phase, h.reason) for h in sec.history]
        scored = {s.node_id for h in done for s in h.result}
        assert cheat.node_id in scored and forwarder.node_id not in scored
        assert committee.model(forwarder).trusted and committee.model(forwarder).reputation == 1.0
        assert not committee.model(cheat).trusted
        assert not committee.model(outsider).trusted  # reported missing, confirmed by the members' own probes
        notes = [line for r in committee.runners for line in r.log]
        assert any(f"serving {forwarder.node_id_hex[:12]}'s challenge" in line for line in notes), notes[-12:]
        assert all(not h.faulty_leader for h in sec.history)
    finally:
        await committee.stop()


async def test_attack_a_node_signing_other_sampling_parameters_cannot_get_the_leader_blamed(tmp_path):
    """The attack: a node (or a group member it forwards to) answers a challenge under a receipt
    for other sampling parameters than those asked. The prober posted whatever carried a valid
    signature, every member then found that the receipt answers another request than the
    committed one, and the epoch aborted with an honest leader marked faulty -- a model node
    could have every leader that probes it blamed. Now the prober checks the receipt against the
    request it sent: such a reply is no reply (reported missing), the members' own probes get the
    same, and the node is punished, not the leader."""
    models = ScriptedModels()
    liar = models.add("reprompt")
    honest = models.add("honest")
    committee = EpochCommittee(tmp_path)
    await committee.start(models)
    try:
        for port, ident in enumerate((liar, honest), 9001):
            await committee.register(ident, port)
        sec = await committee.wait_epochs(3)
        assert all(not h.faulty_leader for h in sec.history), [(h.phase, h.reason) for h in sec.history]
        assert not committee.model(liar).trusted
        assert committee.model(honest).trusted
        notes = [line for r in committee.runners for line in r.log]
        assert any("other sampling parameters" in line for line in notes), notes[-12:]
    finally:
        await committee.stop()


async def test_challenges_leave_at_independent_random_times(tmp_path):
    """Not all at once when the plan commits (a node watching the chain could match that):
    each challenge waits its own random delay in [0, challenge_spread_s]."""
    models = ScriptedModels()
    nodes = [models.add("honest") for _ in range(4)]
    committee = EpochCommittee(tmp_path)
    await committee.start(models, params=replace(SCRIPTED_PARAMS, challenge_spread_s=6.0))
    try:
        for port, ident in enumerate(nodes, 9001):
            await committee.register(ident, port)
        sec = await committee.wait_epochs(1)
        assert sec.history[0].phase == Phase.DONE and len(sec.history[0].result) == 4
        first_epoch = models.asked_at[:4]  # the leader's four challenges (nobody was missing)
        assert sorted(models.asked[:4]) == sorted(n.node_id_hex for n in nodes)
        assert max(first_epoch) - min(first_epoch) > 0.01, first_epoch  # 4 uniform draws in 6 s (1.5 s
        # failed under disk load: an fsync of the in-process members blocked the loop past every delay)
    finally:
        await committee.stop()


def test_by_default_challenges_spread_over_the_whole_probing_window():
    """The old default sent every challenge within 120 s of the plan's commit (public), in a
    600 s phase: a node knew it was probed then. Now the send time covers the whole window a
    challenge can use: everything but one per-probe timeout and the replies tx's margin."""
    usable = EPOCHS.probe_timeout_ms / 1000 - EPOCH_RUN.probe_timeout_s
    assert EPOCH_RUN.spread_s(EPOCHS) == usable - EPOCH_RUN.replies_margin_s
    assert EPOCH_RUN.replies_margin_s <= 0.1 * usable
    assert replace(EPOCH_RUN, challenge_spread_s=2.0).spread_s(EPOCHS) == 2.0


def test_a_spread_that_would_miss_the_probe_deadline_is_refused():
    """Against the chain's probe deadline (the genesis'), which a runner checks before it starts."""
    with pytest.raises(ValueError, match="challenge_spread_s"):
        replace(EPOCH_RUN, challenge_spread_s=EPOCHS.probe_timeout_ms / 1000).fits(EPOCHS)
    replace(EPOCH_RUN, challenge_spread_s=60.0).fits(EPOCHS)
    with pytest.raises(ValueError, match="challenge_spread_s"):
        replace(EPOCH_RUN, challenge_spread_s=60.0).fits(replace(EPOCHS, probe_timeout_ms=30_000))
    with pytest.raises(ValueError, match="challenge_spread_s"):
        replace(EPOCH_RUN, challenge_spread_s=-1.0)


@pytest.mark.parametrize("fault", ["drop", "alter", "forge", "omit"])
async def test_a_faulty_leader_is_detected_and_does_not_hurt_the_honest_node(tmp_path, fault):
    models = ScriptedModels()
    honest = models.add("honest")
    faults = LeaderFaults(**{fault: {honest.node_id_hex}})
    committee = EpochCommittee(tmp_path)
    await committee.start(models, faults)  # every member misbehaves when it leads
    try:
        await committee.register(honest, 9001)
        sec = await committee.wait_epochs(2)
        probed = [h for h in sec.history if h.reason]
        # a dropped reply is disputed (the others reached the node: it is unscored, nothing aborts);
        # an altered, forged or omitted one aborts the epoch with the leader blamed
        aborted = fault != "drop"
        assert probed and all((h.phase == Phase.ABORTED) == aborted and h.faulty_leader == aborted
                              for h in probed), [(h.phase, h.reason) for h in sec.history]
        expected = {"drop": "committee got valid replies", "omit": "does not cover the epoch's probe set"}.get(
            fault, "did not sign")
        assert all(expected in h.reason for h in probed)
        assert committee.model(honest).reputation == 1.0 and committee.model(honest).trusted
        charged = {m.public_key: m.disputes if fault == "drop" else m.faults for m in sec.members}
        assert sum(charged.values()) == len(probed)
        if fault == "drop":  # the other members probed the node themselves, with prompts of their own
            assert models.asked.count(honest.node_id_hex) >= 3
        if fault == "forge":  # the forger never asked the node; its receipt verifies under no key but its own
            assert honest.node_id_hex not in models.asked
            notes = [line for r in committee.runners for line in r.log]
            assert any("receipt signature does not verify" in line for line in notes), notes[-12:]
        if fault == "omit":  # never planned: the epoch aborted at the plan, before any probe
            assert honest.node_id_hex not in models.asked
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
    from gentorrent.ledger.genesis import Genesis

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
        assert history and history[0].epoch == 1 and history[0].phase == Phase.DONE
        assert history[0].leader == v.public_key and status["epochs"]["recent"]
    finally:
        proc.send_signal(signal.SIGTERM)
        out = proc.communicate(timeout=30)[0].decode()
    assert proc.returncode == 0, out
    assert "verification epochs on" in out
