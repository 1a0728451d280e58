"""Challenge commitments over full requests, probe sets, reveals, and drawing challenges."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dataclasses import replace

from gentorrent.traffic.model import ChatRequest
from testkit.epochs import scripted_pool
from verifier.epochs import challenges as ch
from verifier.epochs.probe_format import challenge_request, receipt_matches_request

NONCE = bytes(range(32))
Q = ChatRequest.question


def test_commitment_opens_only_with_the_same_nonce_and_prompt():
    c = ch.commit_request(NONCE, Q("How do black holes evaporate?"))
    assert len(c) == 32
    assert ch.verify_reveal(c, NONCE, Q("How do black holes evaporate?"))
    assert not ch.verify_reveal(c, NONCE, Q("How do black holes evaporate"))
    assert not ch.verify_reveal(c, bytes(32), Q("How do black holes evaporate?"))
    assert not ch.verify_reveal(c, NONCE[:31], Q("How do black holes evaporate?"))  # malformed: False
    with pytest.raises(ch.ChallengeError):
        ch.commit_request(NONCE[:16], Q("x"))


def test_commitment_binds_the_whole_request_not_only_its_text():
    """A leader that opens its commitment with the same messages but other sampling, streaming,
    session id, length or history is caught: each of these changes what the node was asked."""
    request = ChatRequest((("system", "You are a helpful assistant."), ("user", "hi there"), ("assistant", "Hello!"),
                           ("user", "Tell me a joke about owls.")), 0.7, 0.9, 512, True, "0123456789abcdef")
    c = ch.commit_request(NONCE, request)
    assert ch.verify_reveal(c, NONCE, request)
    tampered = [replace(request, temperature=0.0), replace(request, top_p=1.0), replace(request, max_tokens=128),
                replace(request, stream=False), replace(request, session_id=""),
                replace(request, messages=request.messages[2:]),
                replace(request, messages=(("user", "hi there"),) + request.messages[1:])]
    assert not any(ch.verify_reveal(c, NONCE, t) for t in tampered)


def test_a_member_rebuilds_the_exact_wire_request_from_the_reveal():
    request = ChatRequest((("system", "Be brief."), ("user", "Why is the sea salty?")), 0.0, 1.0, 300, False)
    a, b = challenge_request(request, "m"), challenge_request(ChatRequest.from_dict(request.to_dict()), "m")
    # every ask carries 32 fresh bytes in place of an audit commitment, a challenge too (so it looks
    # like a user's ask); the receipt covers them apart from the prompt and sampling hashes
    assert len(a.audit_commitment) == len(b.audit_commitment) == 32 and a.audit_commitment != b.audit_commitment
    a_bare, b_bare = a.__class__(), b.__class__()
    a_bare.CopyFrom(a)
    b_bare.CopyFrom(b)
    a_bare.ClearField("audit_commitment")
    b_bare.ClearField("audit_commitment")
    assert a_bare.SerializeToString(deterministic=True) == b_bare.SerializeToString(deterministic=True)
    assert [(m.role, m.content) for m in a.messages] == list(request.messages)
    assert (a.sampling.temperature, a.sampling.max_tokens, a.stream) == (0.0, 300, False)
    from gentorrent import receipts
    from gentorrent.crypto.keys import Identity
    receipt = receipts.make_receipt(Identity.generate(), "m", a, [1, 2, 3], 0)
    assert receipt_matches_request(receipt, b)
    assert not receipt_matches_request(receipt, challenge_request(replace(request, temperature=0.7), "m"))


@settings(max_examples=50, deadline=None)
@given(st.text(min_size=1, max_size=200), st.text(min_size=1, max_size=200))
def test_commitments_of_different_prompts_differ(a, b):
    assert (ch.commit_request(NONCE, Q(a)) == ch.commit_request(NONCE, Q(b))) == (a == b)


def test_prompt_key_normalises_case_spacing_and_punctuation():
    assert ch.prompt_key("  How do  Volcanoes form?? ") == ch.prompt_key("how do volcanoes form")
    assert ch.prompt_key("How do volcanoes form?") != ch.prompt_key("Why do volcanoes form?")


def test_probe_set_is_seeded_deterministic_and_bounded():
    nodes = [f"m{i}" for i in range(100)]
    a = ch.select_probe_set(nodes, b"seed-1", limit=10)
    assert len(a) == 10 and set(a) <= set(nodes)
    assert a == ch.select_probe_set(reversed(nodes), b"seed-1", limit=10)
    assert a != ch.select_probe_set(nodes, b"seed-2", limit=10)
    assert ch.select_probe_set(nodes[:5], b"s", limit=10) == sorted(nodes[:5])
    # over many seeds every node gets probed (no node can hide from a fair sample)
    seen = set()
    for i in range(60):
        seen.update(ch.select_probe_set(nodes, hashlib.sha256(bytes([i])).digest(), limit=10))
    assert len(seen) > 95


def _reveals():
    return [
        ch.Reveal("m1", b"\x01" * 32, Q("How long should I proof sourdough in a cold kitchen?")),
        ch.Reveal("m2", b"\x02" * 32, Q("why did the roman empire split in two")),
        ch.Reveal("m3", b"\x03" * 32, Q("Can you explain supply and demand to a ten-year-old?")),
    ]


def test_plan_and_reveals_round_trip():
    plan = ch.make_plan(5, _reveals())
    assert plan.node_ids == ["m1", "m2", "m3"]
    ch.check_plan(plan, ["m1", "m2", "m3", "m4"], 64)
    prompts = ch.check_reveals(plan, list(reversed(_reveals())))
    assert prompts["m2"] == Q("why did the roman empire split in two")


def test_bad_plans_and_reveals_are_rejected():
    reveals = _reveals()
    plan = ch.make_plan(5, reveals)
    with pytest.raises(ch.ChallengeError):
        ch.check_plan(plan, ["m1", "m2"], 64)  # m3 unregistered
    dup = ch.ChallengePlan(5, plan.entries + plan.entries[:1])
    with pytest.raises(ch.ChallengeError):
        ch.check_plan(dup, ["m1", "m2", "m3"], 64)
    same_commit = ch.ChallengePlan(5, (plan.entries[0], ch.ChallengeEntry("m2", plan.entries[0].commitment)))
    with pytest.raises(ch.ChallengeError):
        ch.check_plan(same_commit, ["m1", "m2", "m3"], 64)
    with pytest.raises(ch.ChallengeError):  # same question to two nodes (only case differs)
        ch.make_plan(5, reveals + [ch.Reveal("m4", b"\x04" * 32, Q("WHY did the Roman Empire split in two?"))])
    altered = [reveals[0], ch.Reveal("m2", reveals[1].nonce, Q("why did the roman empire fall")), reveals[2]]
    with pytest.raises(ch.ChallengeError):
        ch.check_reveals(plan, altered)
    with pytest.raises(ch.ChallengeError):
        ch.check_reveals(plan, reveals[:2])  # a node missing
    with pytest.raises(ch.ChallengeError):
        ch.check_reveals(plan, reveals + reveals[:1])  # two reveals for one node


def test_a_reveal_with_other_sampling_does_not_open_the_plan():
    reveals = _reveals()
    plan = ch.make_plan(5, reveals)
    greedy = ch.Reveal("m2", reveals[1].nonce, replace(reveals[1].request, temperature=0.0))
    with pytest.raises(ch.ChallengeError):
        ch.check_reveals(plan, [reveals[0], greedy, reveals[2]])


def test_challenges_are_drawn_deterministically_varied_and_in_bounds():
    pool = scripted_pool()
    draws = [ch.draw_challenge(pool, b"leader-secret", f"m{i}") for i in range(100)]
    assert draws[7] == ch.draw_challenge(pool, b"leader-secret", "m7")
    assert sum(ch.draw_challenge(pool, b"other-secret", f"m{i}") != draws[i] for i in range(100)) >= 90
    assert len({(d.temperature, d.max_tokens, d.stream, len(d.messages)) for d in draws}) >= 10  # no single shape
    for d in draws:
        d.check()
        assert d.messages[-1][0] == "user" and bool(d.session_id) == (sum(r == "user" for r, _ in d.messages) > 1)
    capped = ch.draw_challenge(pool, b"leader-secret", "m7", temperature=0.0, max_tokens_cap=16)
    assert capped.temperature == 0.0 and capped.max_tokens <= 16
    assert ch.unique_questions({"a": Q("How are you?"), "b": Q("how are you")}) is False
    assert ch.unique_questions({"a": Q("How are you?"), "b": Q("Who are you?")}) is True


def test_the_probe_set_is_every_node_up_to_the_limit_and_a_seeded_sample_beyond():
    nodes = [f"{i:064x}" for i in range(10)]
    assert ch.select_probe_set(nodes, b"any", 10) == sorted(nodes)
    a, b = ch.epoch_probe_seed(b"block", [b"out1", b"out2"]), ch.epoch_probe_seed(b"block", [b"out1", b"out3"])
    assert a != b and a != ch.epoch_probe_seed(b"block", [b"out1"])
    sample_a, sample_b = ch.select_probe_set(nodes, a, 4), ch.select_probe_set(nodes, b, 4)
    assert len(sample_a) == 4 and set(sample_a) <= set(nodes) and sample_a != sample_b
