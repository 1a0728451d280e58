"""Audits of real replies, the pure core (gentorrent/audits.py): the selection is fixed before
the reply and checkable, and every way of handing in an inadmissible audit is refused."""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

import pytest

from gentorrent import audits, generation, receipts
from gentorrent.config import AUDITS
from gentorrent.crypto.keys import Identity
from gentorrent.wire import gentorrent_pb2 as pb

MODEL = "smollm2-135m"
T0 = 1_800_000_000_000
WINDOW = audits.AuditWindow(T0 - 60_000, T0 + 60_000)


@dataclass(frozen=True)
class Registered:
    public_key: bytes
    model: str


def _ticket(rng: random.Random, prompt: str, rate: float = AUDITS.rate, selected: bool = True) -> audits.AuditTicket:
    """A ticket whose draw for `prompt` is (or is not) in the sample, drawn the honest way."""
    request = generation.make_request(prompt, model=MODEL)
    while True:
        ticket = audits.AuditTicket(rng.randbytes(32))
        if ticket.selects(request, rate) == selected:
            return ticket


def _ask(node: Identity, ticket: audits.AuditTicket, prompt: str = "Why is the sky blue?",
         tokens: tuple[int, ...] = (5, 6, 7), time_ms: int = T0, session: str | None = None) -> pb.AuditSubmission:
    request = generation.make_request(prompt, model=MODEL, temperature=0.7, audit_commitment=ticket.commitment,
                                      session=session)
    request.request_id = "f00d"
    receipt = receipts.make_receipt(node, MODEL, request, list(tokens), time_ms)
    return audits.make_submission(request, list(tokens), receipt, ticket)


@pytest.fixture
def world():
    rng = random.Random(7)
    node = Identity.from_seed(b"m" * 32)
    models = {node.node_id: Registered(node.public_key, MODEL)}
    return rng, node, models


def test_an_honestly_selected_ask_is_admitted(world):
    rng, node, models = world
    sub = _ask(node, _ticket(rng, "Why is the sky blue?"), session="a1b2c3")
    assert not sub.request.session_id and not sub.request.request_id  # nothing that links audits
    checked = audits.check_submission(sub.SerializeToString(), models, WINDOW)
    assert checked.node_id == node.node_id and checked.token_ids == (5, 6, 7)
    assert checked.key == audits.receipt_key(sub.receipt)


def test_selection_rate_matches_the_setting():
    rng = random.Random(1)
    ph = receipts.prompt_hash("q")
    drawn = sum(audits.is_audited(rng.randbytes(32), ph, 0.1) for _ in range(20_000))
    assert 1_800 < drawn < 2_200  # 10 % +- 7 standard deviations
    assert not any(audits.is_audited(rng.randbytes(32), ph, 0.0) for _ in range(1000))
    assert all(audits.is_audited(rng.randbytes(32), ph, 1.0) for _ in range(1000))


def test_every_ask_carries_a_commitment_that_marks_nothing():
    """Asks that will never be audited (verifiers' challenges, users with audits off) carry
    random bytes of the same length as a real commitment."""
    plain = generation.make_request("q", model=MODEL)
    committed = generation.make_request("q", model=MODEL, audit_commitment=audits.commitment_of(b"s" * 32))
    assert len(plain.audit_commitment) == len(committed.audit_commitment) == 32
    assert plain.audit_commitment != generation.make_request("q", model=MODEL).audit_commitment
    with pytest.raises(generation.BadRequestError, match="audit_commitment"):
        generation.parse_generate(generation.make_request("q", model=MODEL, audit_commitment=b"x" * 5), MODEL)


def test_attack_user_hands_in_a_reply_it_dislikes_that_was_not_selected(world):
    """The user reads a reply, dislikes it, and hands it in though its draw did not select it."""
    rng, node, models = world
    sub = _ask(node, _ticket(rng, "Why is the sky blue?", selected=False))
    with pytest.raises(audits.AuditError, match="not selected"):
        audits.check_submission(sub.SerializeToString(), models, WINDOW)


def test_attack_user_picks_a_selecting_secret_after_the_reply(world):
    """...or, after the reply, finds a secret that selects it and reveals that one instead."""
    rng, node, models = world
    sub = _ask(node, _ticket(rng, "Why is the sky blue?", selected=False))
    sub.secret = _ticket(rng, "Why is the sky blue?").secret
    with pytest.raises(audits.AuditError, match="does not open"):
        audits.check_submission(sub.SerializeToString(), models, WINDOW)
    # the user also rewrites the request's commitment: the node's signature no longer covers it
    sub.request.audit_commitment = audits.commitment_of(sub.secret)
    with pytest.raises(audits.AuditError, match="commitment"):
        audits.check_submission(sub.SerializeToString(), models, WINDOW)
    # ...and the receipt's too: the node's signature covers the commitment it was sent
    sub.receipt.audit_commitment = audits.commitment_of(sub.secret)
    with pytest.raises(audits.AuditError, match="signature"):
        audits.check_submission(sub.SerializeToString(), models, WINDOW)


def test_receipt_signs_the_commitment_and_old_receipts_keep_their_bytes():
    me = Identity.from_seed(b"n" * 32)
    request = generation.make_request("q", model=MODEL)
    r = receipts.make_receipt(me, MODEL, request, [1], T0)
    assert r.audit_commitment == request.audit_commitment
    receipts.verify_receipt(r, me.public_key, request, [1])
    stripped = pb.ReplyReceipt()
    stripped.CopyFrom(r)
    stripped.audit_commitment = b""
    with pytest.raises(receipts.ReceiptError):  # a node cannot drop the commitment after signing
        receipts.verify_receipt(stripped, me.public_key)
    old = pb.GenerateRequest()
    old.CopyFrom(request)
    old.audit_commitment = b""
    legacy = receipts.make_receipt(me, MODEL, old, [1], T0)
    assert not legacy.audit_commitment and len(receipts.signed_message(legacy)) + 4 + 32 == len(receipts.signed_message(r))
    receipts.verify_receipt(legacy, me.public_key, old, [1])
    with pytest.raises(receipts.ReceiptError, match="commitment"):  # the user asked with one
        receipts.verify_receipt(legacy, me.public_key, request, [1])


def test_attack_forged_or_unsigned_receipt(world):
    rng, node, models = world
    ticket = _ticket(rng, "Why is the sky blue?")
    sub = _ask(Identity.from_seed(b"x" * 32), ticket)  # signed by a node nobody registered
    with pytest.raises(audits.AuditError, match="no registered"):
        audits.check_submission(sub.SerializeToString(), models, WINDOW)
    sub = _ask(node, ticket)
    sub.receipt.signature = b""
    with pytest.raises(audits.AuditError, match="signature"):
        audits.check_submission(sub.SerializeToString(), models, WINDOW)
    sub = _ask(node, ticket)
    del sub.token_ids[-1]  # the user trims the reply it hands in
    with pytest.raises(audits.AuditError, match="output"):
        audits.check_submission(sub.SerializeToString(), models, WINDOW)
    sub = _ask(node, ticket)
    sub.request.sampling.temperature = 0.0  # claims the node was asked greedily
    with pytest.raises(audits.AuditError, match="sampling"):
        audits.check_submission(sub.SerializeToString(), models, WINDOW)
    other = {node.node_id: Registered(node.public_key, "another-model")}
    with pytest.raises(audits.AuditError, match="registered"):
        audits.check_submission(_ask(node, ticket).SerializeToString(), other, WINDOW)


def test_stale_or_future_receipts_are_refused(world):
    rng, node, models = world
    ticket = _ticket(rng, "Why is the sky blue?")
    for t in (WINDOW.min_time_ms - 1, WINDOW.max_time_ms + 1):
        with pytest.raises(audits.AuditError, match="epoch"):
            audits.check_submission(_ask(node, ticket, time_ms=t).SerializeToString(), models, WINDOW)


@pytest.mark.parametrize("mutate, reason", [
    (lambda s: s.ClearField("receipt"), "carries"),
    (lambda s: s.ClearField("token_ids"), "tokens"),
    (lambda s: s.token_ids.extend([1] * AUDITS.max_reply_tokens), "tokens"),
    (lambda s: s.token_ids.append(-3), "non-negative"),
    (lambda s: setattr(s, "secret", b"short"), "bytes"),
])
def test_malformed_submissions_are_refused(world, mutate, reason):
    rng, node, models = world
    sub = _ask(node, _ticket(rng, "Why is the sky blue?"))
    mutate(sub)
    with pytest.raises(audits.AuditError, match=reason):
        audits.check_submission(sub.SerializeToString(), models, WINDOW)


def test_oversized_and_garbage_bytes_are_refused(world):
    _, _, models = world
    small = replace(AUDITS, max_submission_bytes=64)
    with pytest.raises(audits.AuditError, match="at most"):
        audits.check_submission(b"\0" * 65, models, WINDOW, small)
    with pytest.raises(audits.AuditError, match="decode"):
        audits.check_submission(b"\xff\xff\xff", models, WINDOW)


def test_genesis_publishes_audit_keys_and_old_genesis_files_still_load():
    from gentorrent.ledger.genesis import Genesis, GenesisError, GenesisValidator

    ident = Identity.from_seed(b"v" * 32)
    with_key = GenesisValidator("v0", ident.public_key, 1, "127.0.0.1:7000", b"CERT", audit_key=b"\x09" * 32)
    without = GenesisValidator("v1", Identity.from_seed(b"w" * 32).public_key, 1, "127.0.0.1:7001", b"CERT")
    genesis = Genesis("c", 1, (with_key, without))
    again = Genesis.loads(genesis.dumps())
    assert again.validators == genesis.validators and "audit_key" not in without.to_json()
    members = audits.members_of(again)
    assert list(members) == [ident.node_id] and members[ident.node_id].audit_key == b"\x09" * 32
    bad = with_key.to_json() | {"audit_key": "AAAA"}
    with pytest.raises(GenesisError, match="audit_key"):
        GenesisValidator.from_json(bad)


# --------------------------------------------------------------------------- what cannot be scored honestly

CONSTRAINED = {  # each makes tokens come from another distribution than the model's own
    "json schema": dict(structured=(pb.StructuredOutput.JSON_SCHEMA, '{"type":"object"}')),
    "choice": dict(structured=(pb.StructuredOutput.CHOICE, '["yes","no"]')),
    "presence penalty": dict(presence_penalty=0.5), "frequency penalty": dict(frequency_penalty=0.5),
    "repetition penalty": dict(repetition_penalty=1.2), "logit bias": dict(logit_bias={5: 10.0}),
    "min tokens": dict(min_tokens=4), "ignore eos": dict(ignore_eos=True),
    "tools": dict(tools='[{"function":{"name":"f","parameters":{}},"type":"function"}]', tool_choice="auto"),
    "tokenize": dict(operation=pb.GenerateRequest.TOKENIZE),
}


@pytest.mark.parametrize("kind", list(CONSTRAINED))
def test_replies_under_guided_decoding_or_penalties_are_never_audited(world, kind):
    """Guided decoding masks tokens by a grammar and penalties shift them by counts of earlier
    tokens; the committee's teacher-forced pass applies neither, so an honest reply made under them
    can score like a cheater's. Such asks are never selected by the user (at rate 1 too) and the
    desk refuses one handed in anyway (a user framing a node with one), while the same ask
    without the constraint is admitted."""
    rng, node, models = world
    ticket = audits.AuditTicket(rng.randbytes(32))
    constrained = generation.make_request("Why is the sky blue?", model=MODEL, audit_commitment=ticket.commitment,
                                          **CONSTRAINED[kind])
    assert not generation.is_plain(constrained) and not ticket.selects(constrained, rate=1.0)
    receipt = receipts.make_receipt(node, MODEL, constrained, [5, 6, 7], T0)
    sub = audits.make_submission(constrained, [5, 6, 7], receipt, ticket)
    with pytest.raises(audits.AuditError, match="not audited"):
        audits.check_submission(sub.SerializeToString(), models, WINDOW, replace(AUDITS, rate=1.0))
    plain = generation.make_request("Why is the sky blue?", model=MODEL, audit_commitment=ticket.commitment)
    assert generation.is_plain(plain) and ticket.selects(plain, rate=1.0)
    sub = audits.make_submission(plain, [5, 6, 7], receipts.make_receipt(node, MODEL, plain, [5, 6, 7], T0), ticket)
    audits.check_submission(sub.SerializeToString(), models, WINDOW, replace(AUDITS, rate=1.0))


def test_challenges_are_plain_asks():
    """Challenges are drawn from the traffic model without guided decoding or penalties: their
    replies are scored under the request's own sampling, which the scoring pass reproduces."""
    from gentorrent.traffic.challenge import draw_challenge
    from testkit.epochs import scripted_pool

    pool = scripted_pool()
    for seed in range(40):
        request = draw_challenge(pool, seed.to_bytes(32, "big"), "ab" * 32, 0).to_generate_request(MODEL)
        assert generation.is_plain(request)


def test_every_constraint_is_in_the_signed_sampling_hash_and_plain_receipts_keep_their_bytes():
    """A node must not apply a constraint nobody asked for (or drop one): each is covered by the
    sampling hash its receipt signs; a plain ask's hash is the one receipts had before them."""
    plain = generation.make_request("hi", model=MODEL)
    assert receipts.request_sampling_hash(plain) == receipts.sampling_hash(plain.sampling)
    assert receipts.request_prompt_hash(plain) == receipts.prompt_hash("hi")
    hashes = {receipts.request_sampling_hash(plain)}
    for kind, kwargs in CONSTRAINED.items():
        if kind == "tools":
            continue  # the tools are the prompt's (below); the tool choice is sampling's
        hashes.add(receipts.request_sampling_hash(generation.make_request("hi", model=MODEL, **kwargs)))
    hashes.add(receipts.request_sampling_hash(generation.make_request("hi", model=MODEL, tool_choice="required")))
    assert len(hashes) == len(CONSTRAINED) + 1  # every one differs from plain and from the others
    tools = generation.make_request(messages=[{"role": "user", "content": "hi"}], model=MODEL,
                                    tools=CONSTRAINED["tools"]["tools"])
    assert receipts.request_prompt_hash(tools) != receipts.prompt_hash(messages=[("user", "hi")])
