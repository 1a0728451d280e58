"""A reply must answer its own prompt: replayed output is caught (verifier/epochs/repeats.py and
the relevance test of verifier/epochs/scoring.py).

The attack: the `replay` cheater (model_node/cheaters.py) answers a challenge with the reply it
computed honestly for an earlier, different prompt. Teacher forcing adapts the reference to the
replayed text, so the whole-reply tests of the scoring pass stay close to honest."""

from __future__ import annotations

import hashlib
from dataclasses import replace

from gentorrent.config import SCORING
from verifier.epochs.repeats import CommitteeMemory, OutputMemory


def _h(text: str) -> bytes:
    return hashlib.sha256(text.encode()).digest()


def test_an_output_replayed_for_a_different_prompt_gets_credibility_zero():
    members = [CommitteeMemory() for _ in range(4)]
    for memory in members:  # every member attests the same replies, so all reach the same verdict
        assert memory.judge("n", _h("prompt 1"), _h("reply A"), 0.7, 128, 0.97) == 0.97
        assert memory.judge("n", _h("prompt 2"), _h("reply A"), 0.7, 128, 0.98) == 0.0


def test_honest_replies_and_other_nodes_are_untouched():
    memory = CommitteeMemory()
    for i in range(50):
        assert memory.judge("n", _h(f"prompt {i}"), _h(f"reply {i}"), 1.0, 128, 0.9) == 0.9
    # another node giving the same output is not this node's replay (two honest nodes may agree)
    assert memory.judge("m", _h("prompt 49"), _h("reply 49"), 1.0, 128, 0.9) == 0.9
    # the same prompt asked again (a member's own probe) may honestly get the same output
    assert memory.judge("n", _h("prompt 49"), _h("reply 49"), 1.0, 128, 0.9) == 0.9


def test_greedy_or_short_outputs_never_count_as_replays():
    memory = CommitteeMemory()
    short = SCORING.repeat_min_tokens - 1
    for i in range(3):  # a canned greedy refusal may honestly answer two prompts
        assert memory.judge("n", _h(f"p{i}"), _h("sorry"), 0.0, 128, 1.0) == 1.0
        assert memory.judge("n", _h(f"q{i}"), _h("ok"), 0.7, short, 1.0) == 1.0


def test_the_memory_is_bounded_per_node_and_in_nodes():
    params = replace(SCORING, repeat_memory=3)
    memory = OutputMemory(params=params)
    for i in range(10):
        memory = memory.remember(_h(f"p{i}"), _h(f"r{i}"))
    assert len(memory.seen) == 3 and memory.repeats(_h("x"), _h("r9")) and not memory.repeats(_h("x"), _h("r0"))
    committee = CommitteeMemory(params=params, max_nodes=5)
    for i in range(20):
        committee.judge(f"node {i}", _h("p"), _h("r"), 0.7, 128, 1.0)
    assert len(committee.nodes) == 5 and "node 19" in committee.nodes
