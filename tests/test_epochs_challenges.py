"""Challenge commitments, probe sets, reveals and the question seed plan."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from verifier.epochs import challenges as ch

NONCE = bytes(range(32))


def test_commitment_opens_only_with_the_same_nonce_and_prompt():
    c = ch.commit_prompt(NONCE, "How do black holes evaporate?")
    assert len(c) == 32
    assert ch.verify_reveal(c, NONCE, "How do black holes evaporate?")
    assert not ch.verify_reveal(c, NONCE, "How do black holes evaporate")
    assert not ch.verify_reveal(c, bytes(32), "How do black holes evaporate?")
    assert not ch.verify_reveal(c, NONCE[:31], "How do black holes evaporate?")  # malformed: False
    with pytest.raises(ch.ChallengeError):
        ch.commit_prompt(NONCE[:16], "x")


@settings(max_examples=50, deadline=None)
@given(st.text(max_size=200), st.text(max_size=200))
def test_commitments_of_different_prompts_differ(a, b):
    assert (ch.commit_prompt(NONCE, a) == ch.commit_prompt(NONCE, b)) == (a == b)


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
        ch.Reveal("m1", b"\x01" * 32, "How long should I proof sourdough in a cold kitchen?"),
        ch.Reveal("m2", b"\x02" * 32, "why did the roman empire split in two"),
        ch.Reveal("m3", b"\x03" * 32, "Can you explain supply and demand to a ten-year-old?"),
    ]


def test_plan_and_reveals_round_trip():
    plan = ch.make_plan(5, _reveals())
    assert plan.node_ids == ["m1", "m2", "m3"]
    ch.check_plan(plan, ["m1", "m2", "m3", "m4"])
    prompts = ch.check_reveals(plan, list(reversed(_reveals())))
    assert prompts["m2"] == "why did the roman empire split in two"


def test_bad_plans_and_reveals_are_rejected():
    reveals = _reveals()
    plan = ch.make_plan(5, reveals)
    with pytest.raises(ch.ChallengeError):
        ch.check_plan(plan, ["m1", "m2"])  # m3 unregistered
    dup = ch.ChallengePlan(5, plan.entries + plan.entries[:1])
    with pytest.raises(ch.ChallengeError):
        ch.check_plan(dup, ["m1", "m2", "m3"])
    same_commit = ch.ChallengePlan(5, (plan.entries[0], ch.ChallengeEntry("m2", plan.entries[0].commitment)))
    with pytest.raises(ch.ChallengeError):
        ch.check_plan(same_commit, ["m1", "m2", "m3"])
    with pytest.raises(ch.ChallengeError):  # same question to two nodes (only case differs)
        ch.make_plan(5, reveals + [ch.Reveal("m4", b"\x04" * 32, "WHY did the Roman Empire split in two?")])
    altered = [reveals[0], ch.Reveal("m2", reveals[1].nonce, "why did the roman empire fall"), reveals[2]]
    with pytest.raises(ch.ChallengeError):
        ch.check_reveals(plan, altered)
    with pytest.raises(ch.ChallengeError):
        ch.check_reveals(plan, reveals[:2])  # a node missing
    with pytest.raises(ch.ChallengeError):
        ch.check_reveals(plan, reveals + reveals[:1])  # two reveals for one node


def test_question_seed_plan_is_varied_and_deterministic():
    draws = [ch.draw_question_seed(b"leader-secret", f"m{i}") for i in range(200)]
    assert draws[7] == ch.draw_question_seed(b"leader-secret", "m7")
    assert sum(ch.draw_question_seed(b"leader-secret", f"m{i}", attempt=1) != draws[i] for i in range(20)) >= 19
    assert len({d.topic for d in draws}) > 50
    assert len({d.style for d in draws}) > 15
    assert len({(d.topic, d.style, d.persona, d.form) for d in draws}) == 200
    other = [ch.draw_question_seed(b"other-secret", f"m{i}") for i in range(200)]
    assert sum(a == b for a, b in zip(draws, other)) < 5
    prompt = ch.build_meta_prompt(draws[0])
    assert draws[0].topic in prompt and draws[0].style in prompt and draws[0].persona in prompt
    assert "question only" in prompt


def test_clean_question():
    assert ch.clean_question('Sure! Here is a question: "How do I repot a cactus?"\n\nAnswer: ...') == (
        "How do I repot a cactus?"
    )
    assert ch.clean_question("Question: why is the sky blue?") == "why is the sky blue?"
    assert ch.clean_question("Explain how vaccines train the immune system").startswith("Explain")
    statement = "I'm here to help any customer request. You can take the question and provide it."
    for bad in ("", "   \n  ", "Hi?", "x" * 2000, statement):
        with pytest.raises(ch.ChallengeError):
            ch.clean_question(bad)
    assert ch.unique_questions({"a": "How are you?", "b": "how are you"}) is False
    assert ch.unique_questions({"a": "How are you?", "b": "Who are you?"}) is True


def test_each_question_is_written_with_its_own_engine_seed():
    """One engine seed per epoch made an epoch's questions look alike; now the seed depends on
    the node and the attempt as well (and stays deterministic for the leader's private seed)."""
    seed = bytes(32)
    nodes = [f"{i:064x}" for i in range(16)]
    seeds = {ch.question_engine_seed(seed, n, a) for n in nodes for a in range(3)}
    assert len(seeds) == 48
    assert ch.question_engine_seed(seed, nodes[0], 0) == ch.question_engine_seed(seed, nodes[0], 0)
    assert ch.question_engine_seed(bytes([1]) * 32, nodes[0], 0) != ch.question_engine_seed(seed, nodes[0], 0)


def test_the_probe_set_is_every_node_up_to_the_limit_and_a_seeded_sample_beyond():
    nodes = [f"{i:064x}" for i in range(10)]
    assert ch.select_probe_set(nodes, b"any", 10) == sorted(nodes)
    a, b = ch.epoch_probe_seed(b"block", [b"out1", b"out2"]), ch.epoch_probe_seed(b"block", [b"out1", b"out3"])
    assert a != b and a != ch.epoch_probe_seed(b"block", [b"out1"])
    sample_a, sample_b = ch.select_probe_set(nodes, a, 4), ch.select_probe_set(nodes, b, 4)
    assert len(sample_a) == 4 and set(sample_a) <= set(nodes) and sample_a != sample_b
