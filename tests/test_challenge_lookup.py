"""A node that stored the public corpus looks challenges up: the lookups the
committee assumes (gentorrent/traffic/lookup.py) undo the published rewrite, and challenges the
reference composes fresh (gentorrent/traffic/composed.py) are not in the index. Light: the
scripted pool, no engine (the composed texts here stand for what the reference writes)."""

from __future__ import annotations

import random

import pytest

from gentorrent.traffic import composed
from gentorrent.traffic.lookup import CorpusIndex, normalise
from gentorrent.traffic.model import TrafficError
from gentorrent.traffic.transform import rewrite_text
from testkit.epochs import scripted_pool
from verifier.epochs.challenges import draw_challenge


def _index(pool) -> CorpusIndex:
    return CorpusIndex.build([*pool.user_messages(), *(c for s in pool.sessions for _, c in s), *pool.systems])


def test_the_normalised_lookup_undoes_the_published_rewrite():
    text = "Can you write a big essay about an issue I had in 2019 with 12 cats?"
    for seed in range(20):
        rewritten = rewrite_text(text, random.Random(seed), rate=1.0)
        assert normalise(rewritten) == normalise(text)
    assert normalise("A different question about 12 dogs") != normalise(text)


@pytest.mark.xfail(strict=True, reason="the leader's runner still draws corpus challenges; "
                                       "it is to send composed ones (gentorrent/traffic/composed.py)")
def test_no_challenge_the_committee_draws_is_found_by_a_lookup_of_the_public_corpus():
    pool = scripted_pool()
    index = _index(pool)
    found = 0
    for i in range(40):
        request = draw_challenge(pool, b"leader-secret", f"node-{i}")
        scores = index.request_scores(request.messages)
        found += scores["exact"] > 0 or scores["containment"] > 0.5
    assert found <= 2  # what real prompts from outside the corpus show (bench/challenge_realism.py)


def test_every_request_drawn_from_the_corpus_today_is_an_exact_hit():
    """The attack of the xfail above, measured: the published rewrite hides nothing."""
    pool = scripted_pool()
    index = _index(pool)
    hits = [index.request_scores(draw_challenge(pool, b"leader-secret", f"node-{i}").messages)["exact"]
            for i in range(40)]
    assert all(hits)


def test_containment_finds_a_verbatim_span_however_it_is_framed():
    pool = scripted_pool()
    index = _index(pool)
    span = pool.singles[3]
    assert index.containment(f"My friend asked me this and I could not answer. {span} Thanks!") > 0.3
    assert index.containment("Which birds migrate the furthest every autumn, and how do they navigate?") == 0.0
    assert index.copied(span, 0.2) and not index.copied("Tell me about the moons of Jupiter please", 0.2)


def test_a_composition_plan_draws_shots_of_its_shape_and_its_request_is_a_users():
    pool = scripted_pool()
    plans = [composed.plan(pool, random.Random(i)) for i in range(60)]
    assert {p.shape for p in plans} >= {"single", "session", "system"}
    for p in plans:
        assert all(len(shots) == composed.SHOTS for shots in p.shots)
        assert (len(p.shots) > 1) == (p.shape == "session") and bool(p.system) == (p.shape == "system")
        users = [f"A fresh question number {i} about orbital mechanics?" for i in range(len(p.shots))]
        request = composed.finish(p, users, ["A reply."] * (len(users) - 1), random.Random(1))
        assert request.messages[-1] == ("user", users[-1])
        assert bool(request.session_id) == (len(users) > 1)
        assert (request.temperature, request.top_p, request.max_tokens) == \
            (p.sampling["temperature"], p.sampling["top_p"], p.sampling["max_tokens"])


def test_a_composition_that_came_out_empty_or_does_not_match_its_plan_is_refused():
    p = composed.plan(scripted_pool(), random.Random(2))
    with pytest.raises(TrafficError):
        composed.finish(p, [""] * len(p.shots), ["x"] * (len(p.shots) - 1), random.Random(1))
    with pytest.raises(TrafficError):
        composed.finish(p, ["one question too many, surely"] * (len(p.shots) + 1), [], random.Random(1))


def test_the_prompt_the_reference_continues_ends_in_an_open_user_turn():
    text = composed.generation_prompt(("first shot", "second shot"))
    assert text.endswith(composed.TURN_OPEN) and text.count(composed.TURN_CLOSE) == 2
    assert composed.written(" What is a qubit?<|im_end|>\n<|im_start|>user\nmore") == "What is a qubit?"
