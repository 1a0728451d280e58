"""The user node's local API with the official `openai` client, raw HTTP, and gt-user as processes.

The model nodes are `EchoModelNode`s (test doubles: real intake, keys, TLS and receipts; the
engine echoes), so answers are known exactly; every answer crosses the overlay. What is checked:
OpenAI's status codes and error JSON for every kind of mistake, decided on the user's node
where it can be (nothing reaches a model node), the `user` field never leaving the node,
usage from the serving node's receipt, streams with include_usage, /v1/completions,
/v1/models/{id}, /health, /version, 429/503 with Retry-After, sessions that carry their
history, and the user role's metric families.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from pathlib import Path

import aiohttp
import openai
import pytest
from openai.types import Completion, Model
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from gentorrent.config import USER_API, WIRE, CloveParams, OverlayParams
from gentorrent.ledger.directory import StaticDirectory
from gentorrent.metrics import exported_families
from testkit.echo_model import ECHO_PREFIX, EchoModelNode
from testkit.localnet import start_user_nodes
from user_client.openai_api import ApiServer

pytestmark = [pytest.mark.network, pytest.mark.timeout(240)]

CLOVES = CloveParams(n=4, k=3, path_length=3, proxies_kept=4)
FAST = OverlayParams(first_reply_timeout_s=10.0, reply_idle_timeout_s=15.0, forward_timeout_s=5.0,
                     establish_timeout_s=5.0, maintenance_interval_s=1.0, reply_window_s=0.05)
MODEL = "smollm2-135m"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


class Net:
    """Echo model nodes, six user nodes, and the API of the first one."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp = tmp_path
        self.directory_path = tmp_path / "directory.json"
        self.models: list[EchoModelNode] = []
        self.nodes = []
        self.server: ApiServer | None = None

    async def add_model(self, name: str, reputation: float | None = None, **kwargs) -> EchoModelNode:
        model = EchoModelNode(self.tmp / name, self.directory_path, cloves=CLOVES, params=FAST, **kwargs)
        await model.start()
        if reputation is not None:  # the order in which users try model nodes
            StaticDirectory(self.directory_path).add_model(replace(model.record, reputation=reputation))
        self.models.append(model)
        return model

    async def start(self, params=USER_API) -> "Net":
        self.nodes = await start_user_nodes(6, self.directory_path, self.tmp, cloves=CLOVES, params=FAST,
                                            maintain=False)
        await self.nodes[0].paths.fill()
        self.server = ApiServer(self.nodes[0], "127.0.0.1:0", params)
        await self.server.start()
        return self

    def client(self) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=self.server.url + "/v1", api_key="unused", max_retries=0, timeout=30)

    async def post(self, path: str, body, raw: bool = False) -> tuple[int, dict, dict]:
        data = body if raw else json.dumps(body)
        async with aiohttp.ClientSession() as s:
            async with s.post(self.server.url + path, data=data) as r:
                text = await r.text()
                return r.status, dict(r.headers), json.loads(text) if "json" in r.content_type else text

    async def get(self, path: str) -> tuple[int, dict, dict | str]:
        async with aiohttp.ClientSession() as s:
            async with s.get(self.server.url + path) as r:
                text = await r.text()
                return r.status, dict(r.headers), json.loads(text) if "json" in r.content_type else text

    def seen(self) -> list:
        return [r for m in self.models for r in m.requests]

    async def stop(self) -> None:
        if self.server:
            await self.server.stop()
        for node in self.nodes:
            await node.stop()
        for model in self.models:
            await model.stop()


@pytest.fixture
async def net(tmp_path):
    n = Net(tmp_path)
    yield n
    await n.stop()


@pytest.fixture
async def api(net):
    # 4 chunks, slower than the reply window: each leaves the model node as its own reply message
    await net.add_model("model", chunks=4, context_bytes=4096, chunk_delay_s=3 * FAST.reply_window_s)
    return await net.start()


# --------------------------------------------------------------------------- answers


async def test_chat_streamed_and_not_with_usage_from_the_receipt(api):
    client = api.client()
    reply = await client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=16)
    expected = ECHO_PREFIX + "user: What is the capital of France?"
    assert reply.choices[0].message.content == expected and reply.choices[0].finish_reason == "stop"
    # the echo engine's tokens are bytes: its receipt signs the prompt's byte count
    assert reply.usage.prompt_tokens == len("user: What is the capital of France?")
    assert reply.usage.completion_tokens == len(expected.encode())
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens
    stream = await client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=16, stream=True,
                                                  stream_options={"include_usage": True})
    chunks = [c async for c in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == expected
    assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) == 4  # the model's 4 chunks
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens == reply.usage.total_tokens
    assert all(c.usage is None for c in chunks[:-1])
    await client.close()


async def test_responses_validate_against_the_openai_sdk_types(api):
    """The SDK's pydantic types are generated from OpenAI's own API reference."""
    status, _, body = await api.post("/v1/chat/completions", {"model": MODEL, "messages": QUESTION})
    assert status == 200
    ChatCompletion.model_validate(body, strict=False)
    async with aiohttp.ClientSession() as s:
        async with s.post(api.server.url + "/v1/chat/completions",
                          json={"model": MODEL, "messages": QUESTION, "stream": True}) as r:
            events = [line[6:] for line in (await r.text()).splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    for event in events[:-1]:
        ChatCompletionChunk.model_validate(json.loads(event))
    status, _, body = await api.post("/v1/completions", {"model": MODEL, "prompt": "Once upon a time"})
    assert status == 200 and Completion.model_validate(body).choices[0].text == ECHO_PREFIX + "Once upon a time"
    assert body["usage"]["prompt_tokens"] == len("Once upon a time")
    status, _, body = await api.get(f"/v1/models/{MODEL}")
    assert status == 200 and Model.model_validate(body).id == MODEL


async def test_completions_models_health_and_version(api):
    client = api.client()
    completion = await client.completions.create(model=MODEL, prompt="The sky is blue because")
    assert completion.choices[0].text == ECHO_PREFIX + "The sky is blue because"
    assert api.seen()[-1].prompt == "The sky is blue because" and not api.seen()[-1].messages  # raw: no template
    assert api.seen()[-1].sampling.max_tokens == USER_API.completion_max_tokens
    stream = await client.completions.create(model=MODEL, prompt="Count:", stream=True)
    assert "".join([c.choices[0].text async for c in stream]) == ECHO_PREFIX + "Count:"
    assert [m.id for m in (await client.models.list()).data] == [MODEL]
    assert (await client.models.retrieve(MODEL)).id == MODEL
    with pytest.raises(openai.NotFoundError) as err:
        await client.models.retrieve("gpt-4")
    assert err.value.code == "model_not_found"
    status, _, body = await api.get("/health")
    assert status == 200 and body["status"] == "ok" and body["paths_usable"] >= CLOVES.n
    status, _, body = await api.get("/version")
    assert status == 200 and body["version"]
    await client.close()


async def test_defaults_are_what_openai_clients_send(api):
    """Unset sampling fields get the OpenAI API's defaults, so the project's own asks look like
    every other client's (the crowd verification challenges hide in)."""
    await api.client().chat.completions.create(model=MODEL, messages=QUESTION)
    s = api.seen()[-1].sampling
    assert (round(s.temperature, 3), round(s.top_p, 3), s.max_tokens, s.has_seed) == \
        (USER_API.temperature, USER_API.top_p, USER_API.max_tokens, False)
    assert api.seen()[-1].session_id == ""  # a first question carries no session


# --------------------------------------------------------------------------- mistakes


async def test_client_mistakes_are_decided_on_the_users_node(api):
    client = api.client()
    with pytest.raises(openai.NotFoundError) as err:
        await client.chat.completions.create(model="no-such-model", messages=QUESTION)
    assert err.value.status_code == 404 and err.value.code == "model_not_found" and err.value.param == "model"
    with pytest.raises(openai.BadRequestError) as err:
        await client.chat.completions.create(model=MODEL, messages=[{"role": "wizard", "content": "hi"}])
    assert err.value.param == "messages[0].role" and "wizard" in err.value.message
    for kwargs, param in (({"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}, "tools"),
                          ({"response_format": {"type": "json_object"}}, "response_format"),
                          ({"logprobs": True}, "logprobs"), ({"n": 2}, "n"), ({"presence_penalty": 0.5}, "presence_penalty"),
                          ({"max_tokens": 100_000}, "max_tokens"), ({"temperature": 3}, "temperature"),
                          ({"extra_body": {"top_z": 1}}, "top_z"),
                          ({"stream_options": {"include_usage": True}}, "stream_options")):
        with pytest.raises(openai.BadRequestError) as err:
            await client.chat.completions.create(model=MODEL, messages=QUESTION, **kwargs)
        assert err.value.param == param and param in err.value.message, (kwargs, err.value.message)
    assert api.seen() == []  # none of it reached a model node
    await client.close()


async def test_raw_http_errors_are_openai_json(api):
    status, _, body = await api.post("/v1/chat/completions", b"{not json", raw=True)
    assert status == 400 and body["error"]["type"] == "invalid_request_error"
    status, _, body = await api.post("/v1/chat/completions", b'{"model": "m", "messages": [], "temperature": NaN}',
                                     raw=True)
    assert status == 400
    status, _, body = await api.post("/v1/chat/completions", b"x" * (3 * WIRE.max_prompt_bytes), raw=True)
    assert status == 413 and body["error"]["code"] == "request_too_large"
    huge = [{"role": "user", "content": "y" * (WIRE.max_prompt_bytes + 10)}]
    status, _, body = await api.post("/v1/chat/completions", {"model": MODEL, "messages": huge})
    assert status == 413 and body["error"]["param"] == "messages"
    status, _, body = await api.get("/v1/nothing-here")
    assert status == 404 and body["error"]["code"] == "unknown_url"
    async with aiohttp.ClientSession() as s:
        async with s.get(api.server.url + "/v1/chat/completions") as r:
            assert r.status == 405 and "POST" in r.headers["Allow"]
            assert (await r.json())["error"]["code"] == "method_not_allowed"
    assert api.seen() == []


async def test_prompt_longer_than_the_context_is_a_400_not_a_retry(api):
    client = api.client()
    with pytest.raises(openai.BadRequestError) as err:
        await client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "z" * 5000}])
    assert err.value.code == "context_length_exceeded"
    assert len(api.seen()) == 1  # the one model node said so; nothing else was tried
    await client.close()


async def test_one_node_calling_asks_too_long_cannot_fail_them(net):
    """A dishonest node (here: a tiny context) that refuses every ask as too long is checked
    with a second node: the ask is answered. Two refusals end it with the 400."""
    liar = await net.add_model("liar", reputation=1.0, context_bytes=1)
    await net.add_model("honest", reputation=0.9)
    await net.start()
    reply = await net.client().chat.completions.create(model=MODEL, messages=QUESTION)
    assert reply.choices[0].message.content.startswith(ECHO_PREFIX)
    assert len(liar.requests) == 1 and reply.gentorrent["served_by"] != liar.record.node_id_hex  # type: ignore[attr-defined]


async def test_the_user_field_never_leaves_the_node(api):
    secret = "ada.lovelace@example.org-" + "x" * 200  # longer than a session id may be, too
    reply = await api.client().chat.completions.create(model=MODEL, messages=QUESTION, user=secret)
    assert reply.choices[0].message.content.startswith(ECHO_PREFIX)
    seen = api.seen()[-1]
    assert secret.encode() not in seen.SerializeToString() and seen.session_id == ""


async def test_overload_is_429_and_no_answer_503_both_with_retry_after(net):
    model = await net.add_model("model")
    await net.start(replace(USER_API, max_inflight_asks=1, retry_after_s=7))
    model.gate = asyncio.Event()
    first = asyncio.ensure_future(net.post("/v1/chat/completions", {"model": MODEL, "messages": QUESTION}))
    await asyncio.wait_for(model.received.wait(), 30)
    status, headers, body = await net.post("/v1/chat/completions", {"model": MODEL, "messages": QUESTION})
    assert status == 429 and headers["Retry-After"] == "7" and body["error"]["code"] == "rate_limit_exceeded"
    model.gate.set()
    assert (await first)[0] == 200
    await model.stop()  # registered, but nobody answers: the overlay cannot help
    status, headers, body = await net.post("/v1/chat/completions", {"model": MODEL, "messages": QUESTION})
    assert status == 503 and headers["Retry-After"] == "7" and body["error"]["type"] == "server_error"
    net.models.remove(model)


# --------------------------------------------------------------------------- sessions


async def test_a_session_keeps_its_history_and_its_node_and_any_client_asks_the_same(net):
    a, b = await net.add_model("a"), await net.add_model("b")
    await net.start()
    ask = {"model": MODEL, "session": "my chat", "stream": False, "system": "You are terse."}
    status, _, first = await net.post("/gt/ask", {**ask, "prompt": "My name is Ada."})
    assert status == 200, first
    status, _, second = await net.post("/gt/ask", {**ask, "prompt": "What is my name?"})
    assert status == 200 and second["served_by"] == first["served_by"]  # the node holding the prefix
    turn1, turn2 = net.seen()[-2:]
    assert turn1.session_id == "" and [m.role for m in turn1.messages] == ["system", "user"]
    assert [(m.role, m.content) for m in turn2.messages] == [
        ("system", "You are terse."), ("user", "My name is Ada."), ("assistant", first["text"]),
        ("user", "What is my name?")]
    assert len(turn2.session_id) == 16 and "my chat" not in turn2.session_id  # opaque, never the name
    # the same conversation from an OpenAI client is the same request on the wire
    messages = [{"role": m.role, "content": m.content} for m in turn2.messages]
    reply = await net.client().chat.completions.create(model=MODEL, messages=messages)
    mine = net.seen()[-1]
    assert reply.choices[0].message.content == second["text"]
    for field in ("messages", "sampling", "session_id", "model"):
        assert getattr(mine, field) == getattr(turn2, field), field
    assert reply.gentorrent["served_by"] == first["served_by"]  # type: ignore[attr-defined]
    assert sorted([len(a.requests), len(b.requests)]) == [0, 3]  # the whole conversation on one node


# --------------------------------------------------------------------------- metrics


async def test_user_metrics_are_the_users_own_and_latency_is_observed(api):
    await api.client().chat.completions.create(model=MODEL, messages=QUESTION)
    await api.post("/v1/chat/completions", {"model": MODEL, "messages": QUESTION, "stream": True})
    await asyncio.sleep(0.5)  # the n - k spare cloves arrive after the answer
    status, _, text = await api.get("/metrics")
    assert exported_families(text) == {"gentorrent_asks", "gentorrent_ask_seconds", "gentorrent_ask_ttft_seconds",
                        "gentorrent_ask_stage_seconds", "gentorrent_cloves_relayed", "gentorrent_cloves_dropped",
                        "gentorrent_cloves_redundant", "gentorrent_paths"}
    assert 'gentorrent_ask_seconds_count{outcome="answered"} 2.0' in text
    assert "gentorrent_ask_ttft_seconds_count 2.0" in text
    assert 'gentorrent_ask_stage_seconds_count{stage="send"} 2.0' in text
    redundant = float(next(line for line in text.splitlines() if line.startswith("gentorrent_cloves_redundant_total")
                           ).split()[1])
    assert redundant >= 1 and 'reason="late"' not in text  # spare cloves are not loss
