"""Audits in live epochs: four in-process verifier nodes (real consensus, real epoch rules,
`gt-verifier init`'s genesis with the members' audit keys, audits sealed to them and handed in
over their SubmitAudit RPC as a proxy does), scripted model nodes and reference. A model node that answers every challenge honestly but
its users' real asks with wrong tokens is untrusted through the audits of those asks; an
honest node whose real asks are audited keeps its reputation."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time

import pytest

from gentorrent import audits, generation, receipts
from gentorrent.config import AUDITS
from gentorrent.crypto.keys import Identity
from gentorrent.crypto import tls
from gentorrent.ledger.genesis import Genesis
from gentorrent.ledger.sections import DirectoryFormatError
from gentorrent.ledger.epoch_txs import Phase
from gentorrent.wire import gentorrent_pb2 as pb
from gentorrent.wire import gentorrent_pb2_grpc as rpc
from testkit.epochs import (CHEAT_TOKENS, EPOCH_TEST_TIMEOUT_S, HONEST_TOKENS, MODEL, REPLAYED_TOKENS, EpochCommittee,
                            ScriptedModels, ScriptedReference)
from testkit.leader_faults import LeaderFaults
from verifier.epochs.wiring import attach_audit_desk

pytestmark = [pytest.mark.network, pytest.mark.timeout(EPOCH_TEST_TIMEOUT_S)]
#: of a test's time, what stopping the committee and the assertions are left
TEARDOWN_S = 60


def _audited_ask(rng: random.Random, node: Identity, tokens: list[int], prompt: str, reusable: bool = False,
                 temperature: float = 0.0) -> bytes:
    """One real ask of `node` that its user's draw selected for audit (the node cannot tell); a
    reusable one asks for as many tokens as a donation needs (AuditParams.donated_min_tokens)."""
    probe = generation.make_request(messages=[{"role": "user", "content": prompt}], model=MODEL)
    while True:
        ticket = audits.AuditTicket(rng.randbytes(32))
        if ticket.selects(probe):
            break
    request = generation.make_request(messages=[{"role": "user", "content": prompt}], model=MODEL,
                                      temperature=temperature,
                                      max_tokens=AUDITS.donated_min_tokens if reusable else max(16, len(tokens)),
                                      audit_commitment=ticket.commitment)
    receipt = receipts.make_receipt(node, MODEL, request, tokens, int(time.time() * 1000))
    return audits.make_submission(request, tokens, receipt, ticket, reusable).SerializeToString()


async def _users(committee: EpochCommittee, asks: dict[str, tuple[Identity, list[int], float]], acks: list[str],
                 reusable: bool = False, first_taken: list[int] | None = None) -> None:
    """Users' audits keep arriving at every member, sealed to its audit key from the genesis,
    over its SubmitAudit RPC (what a proxy does: user_client/audit_handoff.py). `asks`: name ->
    (the node asked, the tokens it answers every ask with, the asks' temperature); `first_taken`
    gets the epoch open when a member first accepted one."""
    members = audits.members_of(Genesis.load(committee.homes[0] / "genesis.json"))
    assert len(members) == 4
    channels = {m.node_id: await tls.connect(m.address, m.tls_cert_pem) for m in members.values()}
    rng = random.Random(5)
    i = 0
    try:
        while True:
            for name, (node, tokens, temperature) in asks.items():
                data = _audited_ask(rng, node, tokens, f"a real question of {name}'s user, number {i}", reusable,
                                    temperature)
                for member in members.values():
                    sealed = pb.SealedAudit(sealed=audits.seal_for(member, data))
                    ack = await rpc.VerifierStub(channels[member.node_id]).SubmitAudit(sealed, timeout=10)
                    acks.append(ack.reason)  # refused until the node's registration commits, and over the caps
                    if ack.reason == "" and first_taken is not None and not first_taken:
                        first_taken.append(committee.section().epoch)
            i += 1
            await asyncio.sleep(0.5)
    finally:
        for channel in channels.values():
            await channel.close()


def _reports(committee: EpochCommittee) -> str:
    """For a failure's message: the epochs the chain closed and the one open, then each
    member's audit reports and what the chain said of them."""
    sec = committee.section()
    closed = [f"{h.epoch} {h.phase}{' (' + h.reason + ')' if h.reason else ''} at {h.closed_height}"
              for h in sec.history]
    return (f"epochs closed: {closed}; open: {sec.current.epoch} {sec.current.phase} at height "
            f"{committee.nodes[0].consensus.host.height}; reports: "
            f"{[[line for line in r.log if 'audit report' in line] for r in committee.runners]}")


def _trusted(committee: EpochCommittee, ident: Identity) -> bool:
    try:
        return committee.model(ident).trusted
    except DirectoryFormatError:  # not registered yet
        return True


@contextlib.asynccontextmanager
async def _epochs_with_users(tmp_path, models: ScriptedModels, nodes: list[Identity], watched: Identity,
                             asks: dict[str, tuple[Identity, list[int]]], reusable: bool = False,
                             faults: LeaderFaults | None = None):
    """Four members, each running an audit desk over the scripted reference as `gt-verifier
    start --epochs` does (wiring.attach_audit_desk), led as `faults` says; `nodes` registered,
    users handing in audits of `asks` throughout; yields (committee, the members' acks, the epochs
    done since the members took the first audit) once `watched` is untrusted, six such epochs
    closed or the test's time is nearly spent. Epochs count from the first audit taken, not from
    the start: on a loaded machine several close while the nodes register (CI), and there an
    epoch took over 100 s (stop 47: two epochs in the 240 s this waited then)."""
    deadline = time.monotonic() + EPOCH_TEST_TIMEOUT_S - TEARDOWN_S
    committee = EpochCommittee(tmp_path)
    await committee.start(models, faults)
    for node, runner in zip(committee.nodes, committee.runners):
        attach_audit_desk(node, runner, ScriptedReference())
    feeding = None
    try:
        for port, ident in enumerate(nodes, 9001):
            await committee.register(ident, port)
        acks: list[str] = []  # the members' answers ("" = accepted)
        first_taken: list[int] = []
        feeding = asyncio.ensure_future(_users(committee, asks, acks, reusable, first_taken))

        def audited_epochs() -> list[pb.EpochSummary]:
            return [h for h in committee.section().history
                    if first_taken and h.epoch >= first_taken[0] and h.phase == Phase.DONE]

        while _trusted(committee, watched) and len(audited_epochs()) < 6 and time.monotonic() < deadline:
            await asyncio.sleep(0.5)
        yield committee, acks, audited_epochs()
    finally:
        if feeding is not None:
            feeding.cancel()
        await committee.stop()


async def test_a_node_cheating_only_on_real_traffic_is_untrusted_through_audits(tmp_path):
    models = ScriptedModels()
    sly = models.add("honest")  # every challenge is answered honestly...
    honest = models.add("honest")
    # ...but the real asks of its users get wrong tokens
    asks = {"sly": (sly, CHEAT_TOKENS, 0.0), "honest": (honest, HONEST_TOKENS, 0.0)}
    async with _epochs_with_users(tmp_path, models, [sly, honest], sly, asks) as (committee, acks, done):
        assert not committee.model(sly).trusted, _reports(committee)
        assert len(done) <= 5
        assert committee.model(honest).trusted and committee.model(honest).reputation > 0.9
        assert any("audit report" in line and "submitted" in line for r in committee.runners for line in r.log)
        assert "" in acks and all(r == "" or "registered" in r or "no more audits" in r for r in acks), set(acks)


async def test_a_node_replaying_one_reply_to_its_users_is_untrusted_through_audits(tmp_path):
    """It answers every challenge honestly and every user with the one reply it sampled once
    (REPLAYED_TOKENS, at temperature 0.7: the scripted reference scores each copy as an honest
    sample, as teacher forcing lets the real one do). Each member's memory of the node's outputs,
    which its audit desk feeds (verifier/epochs/repeats.py), zeroes every copy after the first;
    without it every audit scored 1.0 and the node stayed trusted."""
    models = ScriptedModels()
    replayer = models.add("honest")
    honest = models.add("honest")
    asks = {"replayer": (replayer, REPLAYED_TOKENS, 0.7), "honest": (honest, HONEST_TOKENS, 0.0)}
    async with _epochs_with_users(tmp_path, models, [replayer, honest], replayer, asks) as (committee, _, done):
        assert not committee.model(replayer).trusted, _reports(committee)
        assert len(done) <= 5
        assert any("audit report" in line and "submitted" in line for r in committee.runners for line in r.log)
        assert committee.model(honest).trusted and committee.model(honest).reputation > 0.9


async def test_attack_leaders_that_report_every_node_missing_do_not_keep_the_audits_off_the_chain(tmp_path):
    """The attack: every leader reports every node missing, so no epoch has a reply to attest
    and each goes from probing straight to resolving (the members' probes reach the nodes: a
    dispute, no score). A member reported its audits only before attesting, so none reached the
    chain and the node cheating on its users' real asks stayed trusted for good. The members
    report them while the epoch resolves too."""
    models = ScriptedModels()
    sly = models.add("honest")
    honest = models.add("honest")
    asks = {"sly": (sly, CHEAT_TOKENS, 0.0), "honest": (honest, HONEST_TOKENS, 0.0)}
    faults = LeaderFaults(drop={sly.node_id_hex, honest.node_id_hex})
    async with _epochs_with_users(tmp_path, models, [sly, honest], sly, asks, faults=faults) as (committee, _, done):
        assert not committee.model(sly).trusted, _reports(committee)
        assert done and all("disputed:" in h.reason for h in done), _reports(committee)  # (none attested)
        assert committee.model(honest).trusted and committee.model(honest).reputation > 0.9


@pytest.mark.parametrize("reusable", [False, True])
async def test_attack_a_node_that_looks_challenges_up_in_the_public_corpus(tmp_path, reusable):
    """The attack: a node that stored the public corpus answers honestly what it finds there
    (every corpus challenge: the rewrite does not hide it from a 5-gram lookup, the selective
    cheater's `CorpusLookup`) and cheats on the rest; it gets no real asks of its own, so no
    audit sees it cheat. With challenges drawn from the corpus only (users do not let their
    audited asks be reused) it stays trusted; with users' donated asks (verifier/epochs/donations.py: prompts no corpus holds, served by another
    node) its challenges miss the lookup and it is untrusted."""
    models = ScriptedModels()
    looker = models.add("lookup")
    honest = models.add("honest")
    asks = {"honest": (honest, HONEST_TOKENS, 0.0)}
    async with _epochs_with_users(tmp_path, models, [looker, honest], looker, asks, reusable) as (committee, _, _):
        notes = [line for r in committee.runners for line in r.log]
        donated = [line for line in notes if "made of users' donated asks" in line]
        if reusable:
            assert not committee.model(looker).trusted, notes[-12:]
            assert donated and any(not line.split(": ")[1].startswith("0 of") for line in donated), donated
        else:
            assert len(committee.section().history) >= 6
            assert committee.model(looker).trusted and committee.model(looker).reputation == 1.0
            assert not donated
        assert committee.model(honest).trusted


@pytest.mark.parametrize("mutate, reason", [
    (lambda m: m.ClearField("scores"), "1 to"),
    (lambda m: m.scores.add(node_id=b"\0" * 32, score_micros=5), "sorted"),
    (lambda m: setattr(m.scores[0], "score_micros", 1_000_001), "micros"),
    (lambda m: setattr(m.scores[0], "verdict", 1), "verdict"),
    (lambda m: setattr(m, "receipts_digest", b"x"), "digest"),
])
def test_malformed_audit_reports_are_refused(mutate, reason):
    from gentorrent.ledger import epoch_txs
    from gentorrent.ledger.txs import TxError

    m = pb.EpochAuditReport(epoch=3, receipts_digest=b"d" * 32,
                            scores=[pb.NodeScore(node_id=b"\1" * 32, score_micros=900_000)])
    epoch_txs.validate(m)
    mutate(m)
    with pytest.raises(TxError, match=reason):
        epoch_txs.validate(m)
