"""Users' donated audited asks as challenges (verifier/epochs/donations.py,
gentorrent/traffic/challenge.donated_challenge): who may be challenged with which donation,
use-once and bounded, what the challenge keeps of the user's ask and what it never carries,
and that only asks their users let be reused reach the pool."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from gentorrent import audits, generation, receipts
from gentorrent.config import AUDITS
from gentorrent.crypto.keys import Identity
from gentorrent.traffic.model import ChatRequest, TrafficError
from tests.test_audits_desk import NOW, Registered, SyntheticReference
from verifier.epochs.audit_service import AuditService
from verifier.epochs.challenges import ChallengeError, donated_challenge, prompt_key
from verifier.epochs.donations import DonatedPool, Donation

MODEL = "smollm2-135m"
SESSION = (("system", "You are a terse assistant."), ("user", "How long should I boil an egg?"),
           ("assistant", "About nine minutes for a hard yolk."),
           ("user", "Explain a quick, simple way to make 12 soft eggs for a big start at 730."))


def _donation(i: int, served_by: bytes, model: str = MODEL) -> Donation:
    return Donation(bytes([i]) * 32, served_by, model, ChatRequest.question(f"question {i}"))


def test_a_node_is_never_challenged_with_an_ask_it_served_and_another_models_come_first():
    a, b, c = b"a" * 32, b"b" * 32, b"c" * 32
    pool = DonatedPool()
    for i, (server, model) in enumerate([(a, MODEL), (b, MODEL), (c, "other-model")]):
        pool.add(_donation(i, server, model))
    assert [d.served_by for d in pool.candidates(a, MODEL)] == [c]  # another model's ask first
    pool.take(a, MODEL, 0)
    assert [d.served_by for d in pool.candidates(a, MODEL)] == [b]  # then a peer's, never its own
    assert pool.candidates(b, MODEL)[0].served_by == a


def test_a_donation_is_used_once_and_the_pool_keeps_the_newest():
    pool = DonatedPool(replace(AUDITS, donated_kept=3))
    for i in range(5):
        pool.add(_donation(i, b"s" * 32))
    pool.add(_donation(4, b"s" * 32))  # the same receipt again: still one
    assert len(pool) == 3 and {d.key[0] for d in pool.candidates(b"x" * 32, MODEL)} == {2, 3, 4}
    taken = {pool.take(b"x" * 32, MODEL, pick).key for pick in (7, 7, 7)}
    assert len(taken) == 3 and len(pool) == 0 and pool.take(b"x" * 32, MODEL, 0) is None
    off = DonatedPool(replace(AUDITS, donated_kept=0))
    off.add(_donation(1, b"s" * 32))
    assert len(off) == 0


def test_a_donated_challenge_keeps_the_clients_sampling_and_carries_no_id_of_the_user():
    ask = ChatRequest(SESSION, temperature=0.3, top_p=0.9, max_tokens=700, stream=True, session_id="ab" * 8)
    seed = bytes(32)
    challenge = donated_challenge(ask, seed, "node", 0)
    assert (challenge.temperature, challenge.top_p, challenge.max_tokens, challenge.stream) == (0.3, 0.9, 700, True)
    assert [r for r, _ in challenge.messages] == [r for r, _ in ask.messages]
    assert challenge.session_id and challenge.session_id != ask.session_id  # a follow-up has one; not the user's
    rewritten = {donated_challenge(ask, bytes([i]) * 32, "node", 0).text for i in range(20)}
    assert len(rewritten - {ask.text}) >= 15  # numbers redrawn, words swapped, like any challenge's
    assert donated_challenge(ask, seed, "node", 0) == challenge  # a function of the leader's seed
    assert donated_challenge(ask, seed, "node", 1) != challenge
    single = donated_challenge(ChatRequest.question("What is a tide?"), seed, "node", 0)
    assert single.session_id == ""  # no history, no session id (as user nodes send it)
    capped = donated_challenge(ask, seed, "node", 0, temperature=0.0, max_tokens_cap=96)
    assert (capped.temperature, capped.max_tokens) == (0.0, 96)
    with pytest.raises(ChallengeError):
        donated_challenge(replace(ask, messages=(("user", "x" * 600_000),)), seed, "node", 0)


def test_only_chat_requests_in_a_challenges_bounds_come_from_the_wire():
    wire = generation.make_request(messages=[{"role": r, "content": c} for r, c in SESSION], model=MODEL,
                                   temperature=0.3, top_p=0.9, max_tokens=700, session="ab" * 8, stream=True)
    chat = ChatRequest.from_wire(wire)
    assert chat.messages == SESSION and chat.session_id == "" and (chat.temperature, chat.stream) == (0.3, True)
    with pytest.raises(TrafficError, match="raw prompt"):
        ChatRequest.from_wire(generation.make_request("a raw prompt", model=MODEL))
    wire.sampling.top_p = 0.0
    with pytest.raises(TrafficError):
        ChatRequest.from_wire(wire)


def _submission(node: Identity, rng: random.Random, text: str, reusable: bool, raw: bool = False,
                max_tokens: int = AUDITS.donated_min_tokens) -> bytes:
    kwargs = dict(model=MODEL, temperature=0.5, max_tokens=max_tokens)
    probe = generation.make_request(text, **kwargs) if raw else \
        generation.make_request(messages=[{"role": "user", "content": text}], **kwargs)
    while True:
        ticket = audits.AuditTicket(rng.randbytes(32))
        if ticket.selects(probe):
            break
    probe.audit_commitment = ticket.commitment
    tokens = [5, 6, 7]
    receipt = receipts.make_receipt(node, MODEL, probe, tokens, NOW)
    return audits.make_submission(probe, tokens, receipt, ticket, reusable).SerializeToString()


def test_only_asks_their_users_let_be_reused_reach_the_pool():
    node = Identity.from_seed(b"d" * 32)
    models = {node.node_id: Registered(node.public_key, MODEL)}
    service = AuditService(lambda: models, SyntheticReference(), epoch=lambda: 1, clock_ms=lambda: NOW)
    rng = random.Random(3)
    assert service.submit(_submission(node, rng, "Kept private, please.", reusable=False), "a").accepted
    assert service.submit(_submission(node, rng, "A raw prompt.", reusable=True, raw=True), "a").accepted
    short = _submission(node, rng, "Too short a reply.", reusable=True, max_tokens=AUDITS.donated_min_tokens - 1)
    assert service.submit(short, "a").accepted
    assert len(service.donations) == 0  # scored like any audit, never reused
    reused = _submission(node, rng, "Reuse this one.", reusable=True)
    assert service.submit(reused, "a").accepted
    assert not service.submit(reused, "b").accepted  # a replay is refused and adds nothing
    pool = service.donations.candidates(b"x" * 32, MODEL)
    assert [prompt_key(d.request.text) for d in pool] == ["reuse this one"]
    assert all(d.served_by == node.node_id and d.request.session_id == "" for d in pool)
