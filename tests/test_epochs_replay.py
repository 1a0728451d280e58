"""A reply must answer its own prompt: replayed output is caught (verifier/epochs/repeats.py and
the relevance test of verifier/epochs/scoring.py).

The attack: the `replay` cheater (testkit/cheaters.py) answers a challenge with the reply it
computed honestly for an earlier, different prompt. Teacher forcing adapts the reference to the
replayed text, so the whole-reply tests of the scoring pass stay close to honest."""

from __future__ import annotations

import hashlib
from dataclasses import replace
from types import SimpleNamespace

from gentorrent.config import SCORING
from verifier.epochs.repeats import CommitteeMemory, Occurrence, OutputMemory


def _h(text: str) -> bytes:
    return hashlib.sha256(text.encode()).digest()


IMPROBABLE = -80.0  # log_prob_bound of a typical honestly sampled 128-token reply at T = 0.7 (-74..-115 recorded)


def _r(credibility: float, n_tokens: int = 128, log_prob_bound: float = IMPROBABLE) -> SimpleNamespace:
    """What the memory reads of the scoring pass's report (repeats.Scored)."""
    return SimpleNamespace(n_tokens=n_tokens, credibility=credibility, log_prob_bound=log_prob_bound)


def test_an_output_replayed_for_a_different_prompt_gets_credibility_zero():
    members = [CommitteeMemory() for _ in range(4)]
    for memory in members:  # every member attests the same replies, so all reach the same verdict
        assert memory.judge("n", _h("prompt 1"), _h("reply A"), 0.7, _r(0.97)) == 0.97
        assert memory.judge("n", _h("prompt 2"), _h("reply A"), 0.7, _r(0.98)) == 0.0


def test_honest_replies_and_other_nodes_are_untouched():
    memory = CommitteeMemory()
    for i in range(50):
        assert memory.judge("n", _h(f"prompt {i}"), _h(f"reply {i}"), 1.0, _r(0.9)) == 0.9
    # another node giving the same output is not this node's replay (two honest nodes may agree)
    assert memory.judge("m", _h("prompt 49"), _h("reply 49"), 1.0, _r(0.9)) == 0.9
    # the same prompt asked again (a member's own probe) may honestly get the same output
    assert memory.judge("n", _h("prompt 49"), _h("reply 49"), 1.0, _r(0.9)) == 0.9


def test_greedy_or_short_outputs_never_count_as_replays():
    memory = CommitteeMemory()
    short = SCORING.repeat_min_tokens - 1
    for i in range(3):  # a canned greedy refusal may honestly answer two prompts
        assert memory.judge("n", _h(f"p{i}"), _h("sorry"), 0.0, _r(1.0)) == 1.0
        assert memory.judge("n", _h(f"q{i}"), _h("ok"), 0.7, _r(1.0, short)) == 1.0


def test_attack_a_user_cannot_frame_an_honest_node_with_a_repeat_it_asked_for():
    """The attack, through audits (users hand the committee their real asks, and this memory
    holds those too): ask prompt A and receive a sampled, improbable output O; ask "repeat
    exactly: O" again and again and hand in every copy the node repeated, in any order. Without
    the bound (repeat_max_log_prob), two honest signed replies with one output for two prompts
    condemned the node. An audited copy counts only where honest sampling gives it with
    probability at most e^-20, and one occurrence (the honest sample) is always set aside."""
    likely = -0.4  # log_prob_bound of a copy the prompt asks for: near-certain tokens
    copies = [(_h(f"copy O, take {i}"), likely) for i in range(40)]
    for order in ([(_h("A"), IMPROBABLE)] + copies, copies + [(_h("A"), IMPROBABLE)]):
        memory = CommitteeMemory()
        for prompt, bound in order:
            assert memory.judge("n", prompt, _h("O"), 0.7, _r(1.0, log_prob_bound=bound), audited=True) == 1.0
    # a reply a model gives every prompt (a refusal) is likely wherever it comes: never a replay
    memory = CommitteeMemory()
    assert all(memory.judge("n", _h(f"p{i}"), _h("refusal"), 1.0, _r(1.0, 40, -0.3)) == 1.0 for i in range(30))
    # the same output improbable for two prompts is a replay, whichever came first, audited or not
    assert memory.judge("n", _h("x"), _h("O"), 0.7, _r(1.0), audited=True) == 1.0
    assert memory.judge("n", _h("y"), _h("O"), 0.7, _r(1.0, log_prob_bound=SCORING.repeat_max_log_prob),
                        audited=True) == 0.0


def test_a_generic_reply_replayed_to_challenge_after_challenge_adds_up():
    """A replayer whose one output is plausible for many prompts (each copy e^-8 likely): no
    single repeat is evidence, but the committee chose every challenge and scores every reply,
    so the coincidences multiply: e^-16 after the second repeat, e^-24 after the third. The same
    copies handed in as audits never add up (a user may have picked them out of many asks)."""
    challenges, audits = CommitteeMemory(), CommitteeMemory()
    verdicts = [challenges.judge("n", _h(f"challenge {i}"), _h("generic"), 0.7, _r(0.9, 32, -8.0)) for i in range(4)]
    assert verdicts == [0.9, 0.9, 0.9, 0.0]
    assert all(audits.judge("n", _h(f"ask {i}"), _h("generic"), 0.7, _r(0.9, 32, -8.0), audited=True) == 0.9
               for i in range(10))


def test_the_log_prob_bound_never_understates_what_honest_sampling_gives():
    """ScoreReport.log_prob_bound from the single pass's top-k: at least the exact log-probability
    of the tokens under the tempered, truncated distribution the node sampled from (so a repeat
    it calls improbable is), and near 0 for a reply the prompt determines."""
    import numpy as np

    from tests.test_epochs_scoring import log_softmax, reference_logits, sample, view
    from verifier.epochs.scoring import SamplingSpec, score_reply

    rng = np.random.default_rng(3)
    for temperature, top_p in ((0.3, 1.0), (0.7, 1.0), (1.0, 0.9), (0.5, 0.8)):
        logits = reference_logits(rng, 64)
        tokens = sample(rng, logits, temperature, top_p)
        exact = 0.0
        for row, tok in zip(log_softmax(logits / temperature), tokens):
            p = np.exp(row)
            order = np.argsort(-p)
            keep = order[: int(np.searchsorted(np.cumsum(p[order]), top_p) + 1)]
            exact += float(row[tok] - np.log(p[keep].sum()))
        bound = score_reply(view(logits, tokens), SamplingSpec(temperature, top_p)).log_prob_bound
        assert exact <= bound + 1e-9 and bound < 0, (temperature, top_p, exact, bound)
    copy = reference_logits(rng, 64)  # a copy the prompt asks for: each token all but certain
    copy[np.arange(64), copy.argmax(axis=1)] += 25.0
    assert -1.0 < score_reply(view(copy, copy.argmax(axis=1)), SamplingSpec(0.7)).log_prob_bound <= 0.0
    # recorded honest replies of the real model: 128 sampled tokens at T >= 0.7 are improbable
    for reply in _recorded():
        if reply["temperature"] >= 0.7 and len(reply["scores"]) == 128:
            assert _score(reply).log_prob_bound <= SCORING.repeat_max_log_prob, reply["shape"]


def test_the_memory_is_bounded_per_node_and_in_nodes():
    params = replace(SCORING, repeat_memory=3)
    memory = OutputMemory(params=params)
    for i in range(10):
        memory = memory.remember(Occurrence(_h(f"p{i}"), _h(f"r{i}"), IMPROBABLE, False))
    assert len(memory.seen) == 3 and memory.evidence(Occurrence(_h("x"), _h("r9"), IMPROBABLE, False)) == IMPROBABLE
    assert memory.evidence(Occurrence(_h("x"), _h("r0"), IMPROBABLE, False)) is None
    committee = CommitteeMemory(params=params, max_nodes=5)
    for i in range(20):
        committee.judge(f"node {i}", _h("p"), _h("r"), 0.7, _r(1.0))
    assert len(committee.nodes) == 5 and "node 19" in committee.nodes


# ----------------------------------------------------------------------------- the relevance test


def _recorded() -> list[dict]:
    """Real token scores of honest SmolLM2-135M replies (bench/detection.py's recording)."""
    import json
    from pathlib import Path

    return json.loads((Path(__file__).parent / "data" / "honest_reply_scores.json").read_text())


def _score(reply: dict, params=SCORING):
    from verifier.epochs.scoring import SamplingSpec, TokenScores, score_reply

    s = reply["scores"]
    scores = TokenScores([t[0] for t in s], [t[1] for t in s], [dict(enumerate(t[2])) for t in s])
    return score_reply(scores, SamplingSpec(reply["temperature"], reply["top_p"]), params)


def _opened_elsewhere(reply: dict, k: int) -> dict:
    """The same reply opening with `k` words of another prompt's subject (outside the top-k)."""
    s = [list(t) for t in reply["scores"]]
    for i in range(k):
        s[i] = [min(-9.0, s[i][2][-1] - 1.0), 60, s[i][2]]
    return {**reply, "scores": s}


def test_a_reply_that_opens_on_another_subject_fails_the_relevance_test():
    """After the first few tokens the reference follows the replayed text; the whole-reply tests
    pass it (credibility 1.0 without the relevance test), the opening-token test does not."""
    no_relevance = replace(SCORING, relevance_tokens=0)
    reply = _recorded()[0]  # 128 tokens, sampled at temperature 0.7
    attack = _opened_elsewhere(reply, 5)
    assert _score(attack, no_relevance).credibility == 1.0
    report = _score(attack)
    assert report.credibility < 0.1 and report.z["relevance"] > 4, report.z


def test_recorded_honest_replies_pass_the_relevance_test():
    for reply in _recorded():
        report = _score(reply)
        assert report.z["relevance"] < SCORING.z_tolerance and report.z["opening_tail"] < SCORING.z_tolerance
        assert report.credibility == 1.0, (reply["shape"], reply["temperature"], report.z)


def test_the_opening_tail_z_is_finite_for_any_count():
    """Every opening token outside the top-k (random tokens) must give a large, finite z."""
    from verifier.epochs.scoring import _poisson_z

    assert _poisson_z(0, 0.5) == 0.0 and 0 < _poisson_z(2, 0.16) < 3 < _poisson_z(3, 0.16)
    assert 30 < _poisson_z(128, 0.001) < 100

