"""The traffic model challenges are drawn from: corpus parsing and split, shapes and client
profiles in their proportions, determinism, bounds, the rewrite."""

from __future__ import annotations

import json
import random
import re
from collections import Counter
from dataclasses import replace

import pytest

from gentorrent.config import MODEL_NODE, TRAFFIC, USER_API
from gentorrent.traffic import corpus as cp
from gentorrent.traffic.model import SHAPES, ChatRequest, TrafficError, TrafficPool, draw
from gentorrent.traffic.transform import SWAPS, disguise, rewrite_text
from testkit.epochs import scripted_pool


def _record(rid: str, *turns: tuple[str, str]) -> dict:
    return {"id": rid, "conversations": [{"from": f, "value": v} for f, v in turns]}


def test_the_parser_reads_records_up_to_a_truncated_tail_and_merges_parts():
    """The wheel's file is cut inside a record: everything before it is kept, the cut one is not."""
    records = [_record("abc_1", ("gpt", "part two answer"), ("human", "and then?")),
               _record("abc_0", ("human", "first question here"), ("gpt", "an answer")),
               _record("x_0", ("system", "be nice"), ("human", "hello world!"), ("bard", "hi"))]
    text = json.dumps(records) + "]"
    truncated = text[: -len(json.dumps(records[-1])) - 1] + '{"id": "cut_0", "conversations": [{"from": "hum'
    parsed = list(cp.parse_records(truncated))
    assert [r["id"] for r in parsed] == ["abc_1", "abc_0"]
    convs = {c.key: c for c in cp.conversations_of(json.loads(text[:-1]))}
    assert convs["abc"].turns == (("user", "first question here"), ("assistant", "an answer"),
                                  ("assistant", "part two answer"), ("user", "and then?"))
    assert convs["x"].turns == (("system", "be nice"), ("user", "hello world!"), ("assistant", "hi"))


def test_the_split_is_fixed_by_the_conversation_id_and_never_mixes():
    convs = [cp.Conversation(f"conv{i}", (("user", f"question {i}"),)) for i in range(2000)]
    a, b = cp.split(convs), cp.split(reversed(convs))
    assert {c.key for c in a.holdout} == {c.key for c in b.holdout}
    assert not {c.key for c in a.holdout} & {c.key for c in a.challenge}
    assert len(a.holdout) + len(a.challenge) == 2000
    assert abs(len(a.holdout) / 2000 - TRAFFIC.holdout_per_mille / 1000) < 0.04


def _draws(n: int, seed: int = 7) -> list:
    rng, pool = random.Random(seed), scripted_pool()
    return [draw(rng, pool) for _ in range(n)]


def test_shapes_and_clients_come_in_their_configured_proportions():
    draws = _draws(4000)
    for counts, weights in ((Counter(d.shape for d in draws), TRAFFIC.shape_weights),
                            (Counter(d.client for d in draws), TRAFFIC.client_weights)):
        total = sum(w for _, w in weights)
        for name, w in weights:
            assert abs(counts[name] / len(draws) - w / total) < 0.03, (name, counts)
    assert set(d.shape for d in draws) == set(SHAPES)


def test_each_shape_looks_like_what_it_names():
    for d in _draws(600):
        roles = [r for r, _ in d.request.messages]
        users = roles.count("user")
        assert roles[-1] == "user"
        assert (d.shape == "session") == (users > 1) == bool(d.request.session_id)
        assert (d.shape == "system") == ("system" in roles)
        if d.shape == "document":
            assert len(d.request.messages[-1][1]) > TRAFFIC.long_document_chars
        if d.shape == "code":
            assert "```" in d.request.messages[-1][1]


def test_client_profiles_set_sampling_as_those_clients_do():
    by_client: dict[str, list[ChatRequest]] = {}
    for d in _draws(3000):
        by_client.setdefault(d.client, []).append(d.request)
    assert all(r.temperature == 0.0 and not r.stream for r in by_client["deterministic"])
    assert all(r.stream and 0.7 <= r.temperature <= 1.0 for r in by_client["chat_ui"])
    assert all((r.temperature, r.top_p, r.max_tokens) == (1.0, 1.0, USER_API.max_tokens) for r in by_client["openai_sdk"])
    assert 0.15 < sum(r.stream for r in by_client["openai_sdk"]) / len(by_client["openai_sdk"]) < 0.45
    assert len({r.temperature for r in by_client["tuned"]}) >= 5


def test_draws_are_deterministic_and_within_bounds():
    assert [d.request for d in _draws(200, 3)] == [d.request for d in _draws(200, 3)]
    assert [d.request for d in _draws(50, 3)] != [d.request for d in _draws(50, 4)]
    for d in _draws(500):
        r = d.request
        r.check()
        assert 1 <= r.max_tokens <= min(TRAFFIC.max_tokens_cap, MODEL_NODE.max_new_tokens)
        assert sum(len(c.encode()) for _, c in r.messages) <= TRAFFIC.max_prompt_bytes


def test_long_histories_are_trimmed_from_the_oldest_turn_as_chat_clients_do():
    long = "word " * 1500  # 7.5 kB per turn: three of them do not fit
    conv = cp.Conversation("k", (("user", "first " + long), ("assistant", long), ("user", "second " + long),
                                 ("assistant", "short"), ("user", "third question?")))
    pool = TrafficPool.build([conv] + [cp.Conversation(f"f{i}", c.turns) for i, c in enumerate(scripted_pool_convs())])
    mine = [s for s in pool.sessions if s[-1] == ("user", "third question?")]
    assert mine and all(s[0][0] == "user" and sum(len(c.encode()) for _, c in s) <= TRAFFIC.max_prompt_bytes
                        for s in mine)
    assert mine[0][0][1].startswith("second")  # the first turn went first


def scripted_pool_convs() -> list[cp.Conversation]:
    return [cp.Conversation("s", (("user", "How do I fix this garden?"), ("assistant", "Water."), ("user", "And then?"))),
            cp.Conversation("d", (("user", "Summarise: " + "lorem ipsum " * 200),)),
            cp.Conversation("c", (("user", "Why?\n```\nx = 1\n```"),))]


def test_a_pool_missing_a_shape_is_refused():
    with pytest.raises(TrafficError):
        TrafficPool.build(scripted_pool_convs()[:2])


def test_malformed_requests_are_refused():
    good = ChatRequest.question("hello there")
    assert ChatRequest.from_dict(json.loads(good.canonical())) == good
    bad = [{**good.to_dict(), "messages": [["user", "hi"], ["assistant", "x"]]},
           {**good.to_dict(), "messages": [["robot", "hi"]]},
           {**good.to_dict(), "temperature": 9.0}, {**good.to_dict(), "max_tokens": 0},
           {**good.to_dict(), "stream": "yes"}, {**good.to_dict(), "session_id": "XYZ"},
           {**good.to_dict(), "messages": [["user", "x" * (TRAFFIC.max_prompt_bytes + 1)]]},
           {k: v for k, v in good.to_dict().items() if k != "top_p"}, "not a dict"]
    for body in bad:
        with pytest.raises(TrafficError):
            ChatRequest.from_dict(body)


def test_the_rewrite_changes_numbers_and_synonyms_but_keeps_roles_and_shape():
    text = "I want you to write a good plan. Can you explain a problem from 2019 with 35 steps?"
    request = ChatRequest((("system", "You are a helpful assistant."), ("user", text)), 0.7, 1.0, 256, True)
    out = [disguise(request, random.Random(i), rate=1.0) for i in range(50)]
    assert all([r for r, _ in o.messages] == ["system", "user"] and replace(o, messages=request.messages) == request
               for o in out)
    asked = [o.messages[-1][1] for o in out]
    assert all([len(n) for n in re.findall(r"\d+", a)] == [4, 2] for a in asked)
    assert sum(a != text for a in asked) >= 45
    assert any("an issue" in a for a in asked) and not any("a issue" in a for a in asked)
    assert disguise(request, random.Random(5)) == disguise(request, random.Random(5))


def test_the_rewrite_keeps_each_synonym_as_frequent_as_before():
    """A swap that favours one form (write -> compose) would make the rarer form a challenge marker."""
    write, compose = SWAPS[0][2], SWAPS[0][3]
    text = " ".join(["write"] * write + ["compose"] * compose)
    out = rewrite_text(text, random.Random(1), rate=0.5).split()
    assert abs(out.count("compose") - compose) < 30 and abs(out.count("write") - write) < 30


def test_rewritten_numbers_are_as_round_as_users_numbers():
    """Uniform random digits are not what people write ("10", "100", "2023" are): the rewrite
    draws from the corpus's own numbers, so "10" is as common in challenges as in user text."""
    out = [rewrite_text("about 37 of them", random.Random(i)).split()[1] for i in range(3000)]
    assert 0.05 < out.count("10") / len(out) < 0.11  # 3980 of 49976 two-digit numbers
    years = [rewrite_text("in 1987", random.Random(i)).split()[1] for i in range(1000)]
    assert years.count("2023") > 80


def test_the_projects_own_asks_are_in_the_crowd_challenges_are_drawn_from():
    """An OpenAI client that sets nothing and a plain `gt-user ask` send exactly what the traffic
    model's openai_sdk and gt_user profiles send, so neither the project's users nor challenges
    stand out by their sampling parameters."""
    from user_client.api_requests import parse_chat, parse_gt_ask

    sdk = parse_chat({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    ask = parse_gt_ask({"prompt": "hi", "stream": True})
    profiles: dict[str, set] = {}
    for d in _draws(2000):
        r = d.request
        profiles.setdefault(d.client, set()).add((r.temperature, r.top_p, r.max_tokens))
    assert profiles["openai_sdk"] == {(sdk.temperature, sdk.top_p, sdk.max_tokens)}
    assert profiles["gt_user"] == {(ask.temperature, ask.top_p, ask.max_tokens)}
    assert all(d.request.stream == ask.stream for d in _draws(2000) if d.client == "gt_user")
