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
from gentorrent.metrics import REQUEST_FAMILIES, exported_families
from testkit.echo_model import ECHO_PREFIX, EchoModelNode
from testkit.localnet import start_user_nodes
from testkit.waiting import until
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

    async def start(self, params=USER_API, **access) -> "Net":
        self.nodes = await start_user_nodes(6, self.directory_path, self.tmp, cloves=CLOVES, params=FAST,
                                            maintain=False)
        await self.nodes[0].paths.fill()
        self.server = ApiServer(self.nodes[0], "127.0.0.1:0", params, **access)
        await self.server.start()
        return self

    def client(self) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=self.server.url + "/v1", api_key="unused", max_retries=0, timeout=30)

    async def post(self, path: str, body, raw: bool = False, headers: dict | None = None) -> tuple[int, dict, dict]:
        data = body if raw else json.dumps(body)
        async with aiohttp.ClientSession() as s:
            async with s.post(self.server.url + path, data=data, headers=headers) as r:
                text = await r.text()
                return r.status, dict(r.headers), json.loads(text) if "json" in r.content_type else text

    async def get(self, path: str, headers: dict | None = None) -> tuple[int, dict, dict | str]:
        async with aiohttp.ClientSession() as s:
            async with s.get(self.server.url + path, headers=headers) as r:
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
    tool = {"type": "function", "function": {"name": "f", "parameters": {}}}
    for kwargs, param in (({"tools": [{"type": "function", "function": {"parameters": {}}}]}, "tools[0]"),
                          ({"tools": [tool], "tool_choice": {"type": "function", "function": {"name": "g"}}},
                           "tool_choice"),
                          ({"response_format": {"type": "yaml"}}, "response_format"),
                          ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
                           "response_format"),
                          ({"top_logprobs": 3}, "top_logprobs"), ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
                          ({"n": 0}, "n"), ({"n": USER_API.max_choices + 1}, "n"),
                          ({"presence_penalty": 2.5}, "presence_penalty"),
                          ({"extra_body": {"repetition_penalty": 0}}, "repetition_penalty"),
                          ({"extra_body": {"structured_outputs": {"regex": "a+", "choice": ["a"]}}},
                           "structured_outputs"),
                          ({"max_tokens": 0}, "max_tokens"), ({"temperature": 3}, "temperature"),
                          ({"logit_bias": {"\u00b2": 5}}, "logit_bias"),  # a digit to str.isdigit, not to int
                          ({"stream_options": {"include_usage": True}}, "stream_options")):
        with pytest.raises(openai.BadRequestError) as err:
            await client.chat.completions.create(model=MODEL, messages=QUESTION, **kwargs)
        assert err.value.param == param and param.split("[")[0] in err.value.message, (kwargs, err.value.message)
    assert api.seen() == []  # none of it reached a model node
    await client.close()


async def test_vllm_parameters_reach_the_model_node_and_unknown_fields_are_ignored(api, caplog):
    """What vLLM's server accepts is accepted and sent on (bounded as the model node bounds it);
    a field vLLM would not use is ignored with a warning naming it, and the ask is answered."""
    client = api.client()
    tool = {"type": "function", "function": {"name": "get_weather", "description": "the weather in a city",
                                             "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                            "required": ["city"]}}}
    with caplog.at_level("WARNING", logger="user_client.openai_api"):
        reply = await client.chat.completions.create(
            model=MODEL, messages=QUESTION, presence_penalty=0.5, frequency_penalty=-0.5, logprobs=True,
            top_logprobs=2, seed=7, stop=["\n\n"], tools=[tool], tool_choice="required", parallel_tool_calls=False,
            logit_bias={"42": 5}, extra_body={"repetition_penalty": 1.1, "min_p": 0.05, "min_tokens": 1,
                                              "stop_token_ids": [2], "top_k": 40, "top_z": 1, "frobnicate": "x"})
    assert reply.choices[0].message.content.startswith(ECHO_PREFIX)
    assert "top_z" in caplog.text and "frobnicate" in caplog.text and "ignored" in caplog.text
    sent = api.seen()[-1]
    s = sent.sampling
    assert (round(s.presence_penalty, 3), round(s.frequency_penalty, 3), round(s.repetition_penalty, 3),
            round(s.min_p, 3), s.min_tokens, list(s.stop_token_ids), s.top_logprobs, s.top_k, s.seed) == \
        (0.5, -0.5, 1.1, 0.05, 1, [2], 2, 40, 7)
    assert [(b.token_id, b.bias) for b in s.logit_bias] == [(42, 5.0)] and sent.return_logprobs
    assert json.loads(sent.tools_json)[0]["function"]["name"] == "get_weather"
    assert sent.tool_choice == "required" and not sent.parallel_tool_calls
    await client.chat.completions.create(model=MODEL, messages=QUESTION,
                                         response_format={"type": "json_schema", "json_schema": {
                                             "name": "answer", "schema": {"type": "object"}}})
    st = api.seen()[-1].structured
    assert st.kind == st.JSON_SCHEMA and json.loads(st.spec) == {"type": "object"}
    await client.chat.completions.create(model=MODEL, messages=QUESTION, extra_body={"structured_outputs": {
        "choice": ["yes", "no"]}})
    st = api.seen()[-1].structured
    assert st.kind == st.CHOICE and json.loads(st.spec) == ["yes", "no"]
    await client.close()


async def test_n_choices_are_asks_of_their_own_and_the_default_length_is_the_verifiable_one(api):
    client = api.client()
    before = len(api.seen())
    reply = await client.chat.completions.create(model=MODEL, messages=QUESTION, n=3, seed=5)
    assert [c.index for c in reply.choices] == [0, 1, 2]
    assert all(c.message.content.startswith(ECHO_PREFIX) for c in reply.choices)
    seeds = sorted(r.sampling.seed for r in api.seen()[before:])
    assert seeds == [5, 6, 7]  # each choice its own ask, its own seed
    assert reply.usage.completion_tokens == 3 * len(reply.choices[0].message.content.encode())
    stream = await client.chat.completions.create(model=MODEL, messages=QUESTION, n=2, stream=True)
    texts = {0: "", 1: ""}
    async for chunk in stream:
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
    assert texts[0] == texts[1] == reply.choices[0].message.content
    assert api.seen()[-1].sampling.max_tokens == USER_API.max_tokens == 1024  # unset: up to the verifiable length
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


async def test_the_first_ask_of_a_model_node_that_just_registered_is_answered(net):
    """The report: the first ask after a model node registered waited 60 s and failed
    (`no_answer`), the retry answered in 4 s: the proxies, whose directory was older than the
    node, dropped its cloves as addressed to nobody. A proxy now awaits one more directory read
    for a model node it does not know (here the relays never re-read it by themselves)."""
    await net.start()
    model = await net.add_model("late")  # registers after every relay read the directory
    t0 = asyncio.get_running_loop().time()
    reply = await net.client().chat.completions.create(model=MODEL, messages=QUESTION)
    assert reply.choices[0].message.content.startswith(ECHO_PREFIX)
    assert reply.gentorrent["served_by"] == model.record.node_id_hex  # type: ignore[attr-defined]
    assert asyncio.get_running_loop().time() - t0 < FAST.first_reply_timeout_s
    assert sum(n.relay.drops.as_dict().get("unknown_destination", 0) for n in net.nodes) == 0


# --------------------------------------------------------------------------- who may use the API


async def test_csrf_a_web_page_cannot_ask_as_the_user(api):
    """Attack: a page on evil.example POSTs a "simple" request (text/plain, no preflight) to the
    user's API. The browser sends its Origin; the node refuses it before anything is asked."""
    body = json.dumps({"model": MODEL, "messages": QUESTION})
    status, _, answer = await api.post("/v1/chat/completions", body, raw=True,
                                       headers={"Content-Type": "text/plain", "Origin": "http://evil.example"})
    assert status == 403 and answer["error"]["code"] == "origin_not_allowed", answer
    status, _, answer = await api.post("/gt/ask", {"prompt": "hi", "stream": False},
                                       headers={"Origin": "null"})  # a sandboxed frame or file:// page
    assert status == 403
    assert api.seen() == []  # nothing left the node
    status, _, answer = await api.post("/v1/chat/completions", body, raw=True, headers={"Content-Type": "text/plain"})
    assert status == 200  # no Origin: a program (curl, an SDK), not a web page
    own = api.server.url.removeprefix("http://")
    status, _, answer = await api.post("/v1/chat/completions", body, raw=True,
                                       headers={"Origin": f"http://{own}"})  # the node's own chat page
    assert status == 200


async def test_dns_rebinding_a_foreign_host_is_not_served(api):
    """Attack: evil.example is made to resolve to 127.0.0.1, so its page reads the API as
    same-origin. Its requests still name evil.example in Host; only this node's names are served."""
    port = api.server.port
    for path in ("/gt/status", "/v1/models", "/metrics"):
        status, _, body = await api.get(path, headers={"Host": f"evil.example:{port}"})
        assert status == 403 and body["error"]["code"] == "host_not_allowed", (path, body)
    status, _, body = await api.post("/v1/chat/completions", {"model": MODEL, "messages": QUESTION},
                                     headers={"Host": f"evil.example:{port}"})
    assert status == 403 and api.seen() == []
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", "localhost"):
        status, _, body = await api.get("/gt/status", headers={"Host": host})
        assert status == 200 and body["node_id"], host


async def test_an_api_key_guards_every_route_but_liveness_and_cors_admits_only_the_named_origin(net):
    await net.add_model("model")
    await net.start(api_key="sekret", cors_origins=("http://localhost:3000",))
    status, _, body = await net.post("/v1/chat/completions", {"model": MODEL, "messages": QUESTION})
    assert status == 401 and body["error"]["code"] == "invalid_api_key"
    status, _, _ = await net.get("/gt/status", headers={"Authorization": "Bearer wrong"})
    assert status == 401
    assert (await net.get("/health"))[0] == 200 and net.seen() == []
    client = openai.AsyncOpenAI(base_url=net.server.url + "/v1", api_key="sekret", max_retries=0, timeout=30)
    reply = await client.chat.completions.create(model=MODEL, messages=QUESTION)
    assert reply.choices[0].message.content.startswith(ECHO_PREFIX)
    await client.close()
    # behind the key, any Host may be served: a page cannot know the key
    status, _, _ = await net.get("/gt/status", headers={"Authorization": "Bearer sekret", "Host": "node.lan:1"})
    assert status == 200
    async with aiohttp.ClientSession() as s:
        preflight = {"Origin": "http://localhost:3000", "Access-Control-Request-Method": "POST",
                     "Access-Control-Request-Headers": "authorization, content-type"}
        async with s.options(net.server.url + "/v1/chat/completions", headers=preflight) as r:
            assert r.status == 204 and r.headers["Access-Control-Allow-Origin"] == "http://localhost:3000"
            assert "Authorization" in r.headers["Access-Control-Allow-Headers"]
        async with s.options(net.server.url + "/v1/chat/completions",
                             headers={**preflight, "Origin": "http://evil.example"}) as r:
            assert r.status == 403 and "Access-Control-Allow-Origin" not in r.headers
        async with s.get(net.server.url + "/v1/models", headers={"Origin": "http://localhost:3000",
                                                                 "Authorization": "Bearer sekret"}) as r:
            assert r.status == 200 and r.headers["Access-Control-Allow-Origin"] == "http://localhost:3000"


def test_a_wildcard_listen_address_needs_a_key(tmp_path):
    with pytest.raises(ValueError, match="--api-key"):
        ApiServer(None, "0.0.0.0:0")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="--api-key"):
        ApiServer(None, "[::]:8000")  # type: ignore[arg-type]
    assert ApiServer(None, "0.0.0.0:0", api_key="k").url.startswith("http://127.0.0.1:")  # type: ignore[arg-type]


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

    async def spares_arrived() -> bool:  # the n - k spare cloves arrive after the answer
        text = (await api.get("/metrics"))[2]
        return any(line.startswith("gentorrent_cloves_redundant_total") and float(line.split()[1]) >= 1
                   for line in text.splitlines())

    await until(spares_arrived, 30, "a spare clove arriving after the answer")
    status, _, text = await api.get("/metrics")
    assert exported_families(text) == {"gentorrent_asks", "gentorrent_ask_seconds", "gentorrent_ask_stage_seconds",
                                       "gentorrent_cloves_relayed", "gentorrent_cloves_dropped",
                                       "gentorrent_cloves_redundant", "gentorrent_paths"} | REQUEST_FAMILIES
    assert 'gentorrent_ask_seconds_count{outcome="answered"} 2.0' in text
    assert "gentorrent_time_to_first_token_seconds_count 2.0" in text
    assert "gentorrent_e2e_request_latency_seconds_count 2.0" in text
    answer = len((ECHO_PREFIX + "user: What is the capital of France?").encode())  # the echo engine's tokens
    assert f"gentorrent_generation_tokens_total {2.0 * answer}" in text
    assert 'gentorrent_ask_stage_seconds_count{stage="send"} 2.0' in text
    redundant = float(next(line for line in text.splitlines() if line.startswith("gentorrent_cloves_redundant_total")
                           ).split()[1])
    assert redundant >= 1 and 'reason="late"' not in text  # spare cloves are not loss
