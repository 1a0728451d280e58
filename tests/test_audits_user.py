"""The user's side of audits (user_client/auditing.py): the commitment goes out with every ask,
an ask drawn for audit becomes a submission the committee's desk admits, audits can be turned
off, and a model node cannot strip the commitment from what it signs."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from gentorrent import audits, generation, receipts
from gentorrent.config import AUDITS
from gentorrent.crypto.keys import Identity
from gentorrent.ledger.sections import ModelRecord
from gentorrent.wire import gentorrent_pb2 as pb
from gentorrent.config import CloveParams, OverlayParams
from gentorrent.crypto import tls
from gentorrent.crypto.keys import NodeKeys
from gentorrent.ledger.directory import StaticDirectory
from gentorrent.wire import gentorrent_pb2_grpc as rpc
from testkit.echo_model import EchoModelNode
from testkit.localnet import start_user_nodes
from user_client.asking import Answer, receipt_is_valid
from user_client.auditing import Auditor
from verifier.epochs.audit_service import AuditService
from verifier.epochs.audits import AuditDesk, AuditRefused

MODEL = "smollm2-135m"
ALWAYS = dataclasses.replace(AUDITS, rate=1.0)
NEVER = dataclasses.replace(AUDITS, rate=0.0)
NODE = Identity.from_seed(b"u" * 32)
RECORD = ModelRecord(NODE.node_id, NODE.public_key, "127.0.0.1:1", MODEL, b"\0" * 32)
NOW_MS = 1_800_000_000_000
WINDOW = audits.AuditWindow(NOW_MS - 1000, NOW_MS + 1000)


def _answer(auditor: Auditor, tokens=(1, 2, 3), prompt: str = "q") -> tuple[Answer, audits.AuditTicket | None]:
    ticket = auditor.ticket()
    request = generation.make_request(prompt, model=MODEL, audit_commitment=auditor.commitment(ticket))
    receipt = receipts.make_receipt(NODE, MODEL, request, list(tokens), NOW_MS)
    return Answer("abc", list(tokens), NODE.node_id_hex, MODEL, "stop", receipt, request, [], []), ticket


def test_an_audited_ask_becomes_a_submission_the_desk_admits():
    auditor = Auditor(ALWAYS)
    answer, ticket = _answer(auditor)
    assert auditor.after(answer, ticket) and len(auditor.outbox) == 1
    desk, checked = AuditDesk(1, ALWAYS).admit(auditor.outbox[0], "proxy", {NODE.node_id: RECORD}, WINDOW)
    assert checked.token_ids == (1, 2, 3) and len(desk.queue) == 1
    assert auditor.status()["audited"] == 1


def test_asks_not_drawn_are_never_handed_in():
    auditor = Auditor(NEVER)
    answer, ticket = _answer(auditor)
    assert not auditor.after(answer, ticket) and not auditor.outbox


def test_audits_off_draws_no_secret_and_the_request_looks_the_same():
    auditor = Auditor(ALWAYS, enabled=False)
    answer, ticket = _answer(auditor)
    assert ticket is None and len(answer.request.audit_commitment) == 32
    assert not auditor.after(answer, ticket) and not auditor.outbox
    assert auditor.status()["enabled"] is False


def test_attack_model_node_strips_or_swaps_the_commitment():
    """A node that would rather not be audited signs a receipt without the user's commitment,
    or with another one: the user refuses that reply (as any reply whose receipt does not
    cover what was asked), so it cannot serve users and dodge audits."""
    auditor = Auditor(ALWAYS)
    answer, ticket = _answer(auditor)
    for forged in (b"", b"\x07" * 32):
        request = pb.GenerateRequest()
        request.CopyFrom(answer.request)
        request.audit_commitment = forged
        receipt = receipts.make_receipt(NODE, MODEL, request, answer.token_ids, NOW_MS)
        assert not receipt_is_valid(receipt, RECORD, answer.request, answer.token_ids)
    assert receipt_is_valid(answer.receipt, RECORD, answer.request, answer.token_ids)


class _Channel:
    def __init__(self, desk: AuditDesk, fail: bool = False) -> None:
        self.desk, self.fail = desk, fail

    async def submit(self, data: bytes) -> pb.AuditAck:
        if self.fail:
            raise ConnectionError("no path")
        try:
            self.desk, _ = self.desk.admit(data, "proxy", {NODE.node_id: RECORD}, WINDOW)
        except AuditRefused as exc:
            return pb.AuditAck(accepted=False, reason=str(exc))
        return pb.AuditAck(accepted=True)


def test_flush_hands_in_keeps_failures_and_counts_refusals():
    auditor = Auditor(ALWAYS)
    for prompt in ("a", "b"):
        answer, ticket = _answer(auditor, prompt=prompt)
        auditor.after(answer, ticket)
    sent = list(auditor.outbox)
    assert asyncio.run(auditor.flush(_Channel(AuditDesk(1, ALWAYS), fail=True), max_delay_s=0)) == 0
    assert len(auditor.outbox) == 2 and auditor.counts["failed"] == 2
    channel = _Channel(AuditDesk(1, ALWAYS))
    assert asyncio.run(auditor.flush(channel, max_delay_s=0)) == 2 and not auditor.outbox
    auditor.outbox.append(sent[0])  # handed in twice: the desk refuses the replay
    assert asyncio.run(auditor.flush(channel, max_delay_s=0)) == 0 and auditor.counts["refused"] == 1


class _Member(rpc.VerifierServicer):
    """A committee member's audit desk behind its real TLS endpoint (the SubmitAudit RPC only)."""

    def __init__(self, home, models) -> None:
        self.keys = NodeKeys.load_or_create(home)
        self.tls = tls.TlsIdentity.load_or_create_self_signed(home, self.keys.identity)  # a verifier's
        self.service = AuditService(models, reference=None, epoch=lambda: 1, params=ALWAYS,
                                    audit_key=self.keys.onion.private_key)
        self.arrived = asyncio.Event()
        self.peers: list[str] = []

    async def SubmitAudit(self, request, context):
        self.peers.append(context.peer())
        ack = self.service.submit_sealed(request.sealed, context.peer().rsplit(":", 1)[0])
        self.arrived.set()
        return ack

    def member(self, address: str) -> audits.AuditMember:
        return audits.AuditMember(self.keys.identity.node_id, address, self.tls.cert_pem, self.keys.onion.public_key)


@pytest.mark.network
@pytest.mark.timeout(180)
async def test_a_real_ask_is_audited_and_handed_in_through_the_overlay(tmp_path):
    """Real user nodes, 4 paths of 3 hops, the echo model node's real intake and receipts: the
    commitment travels in the request and the model node signs it unawares; the audited ask
    goes, sealed to each committee member, over the user's paths to proxies that hand it to the
    members, whose desks admit it. No relay sees the prompt; members are called by proxies."""
    cloves = CloveParams(n=4, k=3, path_length=3, proxies_kept=4)
    fast = OverlayParams(first_reply_timeout_s=8.0, reply_idle_timeout_s=15.0, forward_timeout_s=5.0,
                         establish_timeout_s=5.0, maintenance_interval_s=1.0, build_attempts=12)
    directory = tmp_path / "directory.json"
    model = EchoModelNode(tmp_path / "model", directory, cloves=cloves, params=fast)
    await model.start()
    static = StaticDirectory(directory)
    committee, servers, members = [], [], {}
    for i in range(3):
        member = _Member(tmp_path / f"member{i}", lambda: {m.node_id: m for m in static.models()})
        server, port = tls.new_server(member.tls, "127.0.0.1:0")
        rpc.add_VerifierServicer_to_server(member, server)
        await server.start()
        committee.append(member)
        servers.append(server)
        members[member.keys.identity.node_id] = member.member(f"127.0.0.1:{port}")
    nodes = await start_user_nodes(13, directory, tmp_path, cloves=cloves, params=fast, maintain=False,
                                   audits=ALWAYS, committee=lambda: members)
    seen: list[bytes] = []
    for node in nodes:
        node.relay.tap = lambda event, link_id, payload: seen.append(bytes(payload))
    try:
        await static.refresh()
        me = nodes[0]
        assert await me.paths.fill() == 4
        prompt = "What is the boiling point of water on the summit of Mont Blanc?"
        answer = await me.ask(prompt)
        streamed = [item async for item in me.ask_stream("And at altitude?")][-1]
        assert isinstance(streamed, Answer)
        assert model.requests[0].audit_commitment == answer.request.audit_commitment
        assert len(me.auditor.outbox) == 2
        assert await me.auditor.flush(me.audit_channel, max_delay_s=0) == 2
        for member in committee:  # every member gets both audits, to score and agree on
            await asyncio.wait_for(_arrivals(member, 2), 30)
            assert len(member.service.desk.queue) == 2, member.peers
            assert {a.node_id for a in member.service.desk.queue} == {model.keys.identity.node_id}
        proxies = [n for n in nodes if n.relay.handoff.counts["accepted"]]
        assert proxies and me not in proxies  # the member was called by proxies, never by the asker
        assert not any(prompt.encode() in blob for blob in seen)  # sealed all the way
        # a user with audits off sends a commitment too, and hands nothing in
        nodes[1].auditor.enabled = False
        assert await nodes[1].paths.fill() == 4
        other = await nodes[1].ask("What is the boiling point of water?")
        assert len(other.request.audit_commitment) == 32 and not nodes[1].auditor.outbox
    finally:
        for node in nodes:
            await node.stop()
        await model.stop()
        for server in servers:
            await server.stop(None)


async def _arrivals(member: _Member, count: int) -> None:
    while len(member.peers) < count:
        member.arrived.clear()
        await member.arrived.wait()
