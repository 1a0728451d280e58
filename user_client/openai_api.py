"""Local HTTP API of a user node: OpenAI-compatible, plus gt-user's control endpoints.

    POST /v1/chat/completions   chat (stream: SSE chunks, `include_usage`, then `data: [DONE]`)
    POST /v1/completions        raw prompt, no chat template (stream as above)
    GET  /v1/models, /v1/models/{id}
    GET  /health, /version
    POST /gt/ask                gt-user ask: a question (+ system prompt, session); JSON or NDJSON
    GET  /gt/status             gt-user status
    GET  /metrics               Prometheus text (user_client.metrics)
    GET  /openapi.json          the OpenAPI 3 document of all of the above (user_client/openapi.json)

The official `openai` client works unchanged (base_url=http://127.0.0.1:PORT/v1). Every answer
comes through the anonymous overlay. What the user's node can decide is decided here, before
anything leaves it (`user_client.api_requests`): a bad field is a 400 naming it, an unknown model
a 404 `model_not_found`, an oversized prompt a 413. A model node refusing the request itself
(a prompt longer than the model's context) is a 400 too, never a retry. 429 (this API's own
limit of asks in flight) and 503 (no model node could answer) are the only "try again"
answers, both with Retry-After. Every error body is OpenAI's error JSON, and no traceback
leaves the process. Bind it to 127.0.0.1: whoever reaches it asks as this user.
"""

from __future__ import annotations

import contextlib
import json
import logging
import secrets
import time
from pathlib import Path
from typing import Any, AsyncIterator

from aiohttp import web

import gentorrent
from gentorrent.config import USER_API, WIRE, UserApiParams
from gentorrent.generation import CLIENT_ERROR_CODES
from gentorrent.metrics import metrics_route, serve_app
from user_client.api_requests import (ApiError, AskSpec, conversation_key, parse_chat, parse_completion,
                                      parse_gt_ask, parse_json, wire_session, with_history)
from user_client.asking import Answer, AskError, Delta
from user_client.metrics import UserMetrics
from user_client.node import UserNode
from user_client.sessions import SessionStore

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 2 * WIRE.max_prompt_bytes
OPENAPI_PATH = Path(__file__).with_name("openapi.json")


class ApiState:
    """What the API keeps besides the node: limits, sessions, metrics, the conversation key."""

    def __init__(self, node: UserNode, params: UserApiParams) -> None:
        self.node = node
        self.params = params
        self.sessions = SessionStore(params)
        self.metrics = UserMetrics()
        self.secret = secrets.token_bytes(32)  # conversation keys are never the same on two nodes
        self.inflight = 0
        self._last_refresh = 0.0

    @contextlib.contextmanager
    def admitted(self):
        """One ask in flight; beyond the limit a 429 with Retry-After (real overload only)."""
        if self.inflight >= self.params.max_inflight_asks:
            raise ApiError(429, f"this user node already has {self.inflight} asks in flight; retry shortly",
                           kind="requests", code="rate_limit_exceeded", retry_after=self.params.retry_after_s)
        self.inflight += 1
        try:
            yield
        finally:
            self.inflight -= 1

    async def known_models(self, fresh: bool = False) -> dict[str, list]:
        """Model name -> its registered nodes, from the directory the node holds (kept fresh by
        its maintenance); `fresh` re-reads it first, at most once a second (a model that is
        missing may just have been registered)."""
        if fresh and time.monotonic() - self._last_refresh > 1.0:
            self._last_refresh = time.monotonic()
            with contextlib.suppress(Exception):  # an unreachable committee: work from what we hold
                await self.node.refresh_directory()
        models: dict[str, list] = {}
        for m in self.node.directory.models():
            models.setdefault(m.model, []).append(m)
        return models

    async def has_model(self, name: str) -> bool:
        return name in await self.known_models() or name in await self.known_models(fresh=True)

    async def check_model(self, spec: AskSpec) -> None:
        if spec.node_id is None and not await self.has_model(spec.model):
            raise ApiError(404, f"The model '{spec.model}' does not exist in this network (no model node "
                                "registered it); GET /v1/models lists the models that do",
                           param="model", code="model_not_found")

    def ask_kwargs(self, spec: AskSpec) -> dict:
        key = conversation_key(self.secret, spec)
        return {"prompt": spec.prompt, "messages": spec.message_dicts() if spec.messages else None,
                "model": spec.model, "session": wire_session(spec, key), "affinity": key,
                "node_id": spec.node_id, **spec.sampling()}

    def ask_failed(self, exc: AskError) -> ApiError:
        """An AskError as the API answers it: the request's fault (400/404) or no answer (503)."""
        if exc.code == "model_not_found":
            return ApiError(404, str(exc), param="model", code=exc.code)
        if exc.code in CLIENT_ERROR_CODES:
            return ApiError(400, str(exc), param="messages", code=exc.code)
        return ApiError(503, f"{exc}; retry later", kind="server_error", code=exc.code,
                        retry_after=self.params.retry_after_s)


STATE_KEY = web.AppKey("state", ApiState)


def _state(request: web.Request) -> ApiState:
    return request.app[STATE_KEY]


# --------------------------------------------------------------------------- errors


def error_response(exc: ApiError, headers: dict | None = None) -> web.Response:
    headers = dict(headers or {})
    if exc.retry_after is not None:
        headers["Retry-After"] = str(exc.retry_after)
    return web.json_response(exc.body, status=exc.status, headers=headers or None)


@web.middleware
async def openai_errors(request: web.Request, handler) -> web.StreamResponse:
    """Every failure as OpenAI's error JSON with its status; never a traceback."""
    try:
        return await handler(request)
    except ApiError as exc:
        return error_response(exc)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        allow = {"Allow": exc.headers["Allow"]} if "Allow" in exc.headers else None
        return error_response(_http_error(request, exc), allow)
    except Exception:  # a bug: logged here, a short message there
        log.exception("%s %s failed", request.method, request.path)
        return error_response(ApiError(500, "internal error of the user node (logged there)", kind="server_error",
                                       code="internal_error"))


def _http_error(request: web.Request, exc: web.HTTPException) -> ApiError:
    if exc.status == 404:
        return ApiError(404, f"no such endpoint: {request.method} {request.path} (GET /openapi.json lists them)",
                        code="unknown_url")
    if exc.status == 405:
        return ApiError(405, f"{request.method} is not allowed on {request.path}", code="method_not_allowed")
    if exc.status == 413:
        return ApiError(413, f"the request body is larger than {MAX_BODY_BYTES} bytes", code="request_too_large")
    return ApiError(exc.status, exc.reason or "request refused", code="http_error")


async def _body(request: web.Request) -> Any:
    return parse_json(await request.read())


# --------------------------------------------------------------------------- OpenAI endpoints


async def chat_completions(request: web.Request) -> web.StreamResponse:
    state = _state(request)
    spec = parse_chat(await _body(request), state.params)
    return await _openai_ask(request, state, spec, chat=True)


async def completions(request: web.Request) -> web.StreamResponse:
    state = _state(request)
    spec = parse_completion(await _body(request), state.params)
    return await _openai_ask(request, state, spec, chat=False)


async def _openai_ask(request: web.Request, state: ApiState, spec: AskSpec, chat: bool) -> web.StreamResponse:
    await state.check_model(spec)
    shape = _Shape(chat, spec, "chatcmpl-" if chat else "cmpl-")
    with state.admitted():
        if not spec.stream:
            answer = await _ask_once(state, spec)
            return web.json_response(shape.completion(answer))
        return await _stream_sse(request, state, spec, shape)


class _Shape:
    """OpenAI's response objects for one ask (chat.completion or text_completion)."""

    def __init__(self, chat: bool, spec: AskSpec, prefix: str) -> None:
        self.chat, self.spec = chat, spec
        self.id, self.created = prefix + secrets.token_hex(12), int(time.time())

    def _head(self, obj: str) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.spec.model,
                "system_fingerprint": None}

    def completion(self, answer: Answer) -> dict:
        finish = _finish(answer.finish_reason)
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": answer.text, "refusal": None},
                      "finish_reason": finish, "logprobs": None}
        else:
            choice = {"index": 0, "text": answer.text, "finish_reason": finish, "logprobs": None}
        return {**self._head("chat.completion" if self.chat else "text_completion"), "choices": [choice],
                "usage": _usage(answer),
                "gentorrent": {"served_by": answer.served_by, "paths": answer.paths,
                               "timings_ms": answer.timings_ms}}

    def chunk(self, text: str | None, finish: str | None = None, first: bool = False) -> bytes:
        if self.chat:
            delta = {"role": "assistant", "content": ""} if first else ({} if text is None else {"content": text})
            choice = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
        else:
            choice = {"index": 0, "text": text or "", "finish_reason": finish, "logprobs": None}
        doc = {**self._head("chat.completion.chunk" if self.chat else "text_completion"), "choices": [choice]}
        if self.spec.include_usage:
            doc["usage"] = None
        return _event(doc)

    def usage_chunk(self, answer: Answer) -> bytes:
        return _event({**self._head("chat.completion.chunk" if self.chat else "text_completion"), "choices": [],
                       "usage": _usage(answer)})


def _event(doc: dict) -> bytes:
    return b"data: " + json.dumps(doc).encode() + b"\n\n"


def _usage(answer: Answer) -> dict:
    prompt, completion = answer.prompt_tokens, len(answer.token_ids)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _finish(reason: str) -> str:
    return reason if reason in ("stop", "length") else "stop"


async def _ask_once(state: ApiState, spec: AskSpec) -> Answer:
    t0 = time.monotonic()
    try:
        answer = await state.node.ask(**state.ask_kwargs(spec))
    except AskError as exc:
        state.metrics.observe_ask(exc.code, time.monotonic() - t0)
        raise state.ask_failed(exc) from None
    state.metrics.observe_ask("answered", time.monotonic() - t0,
                              answer.timings_ms.get("first_chunk_ms", 0) / 1000 or None, answer.timings_ms)
    return answer


class _Streamed:
    """One streamed ask: the first item is awaited before any byte goes out, so an ask that
    fails at once still gets its proper status and error body."""

    def __init__(self, state: ApiState, spec: AskSpec) -> None:
        self.state, self.t0 = state, time.monotonic()
        self.items: AsyncIterator[Delta | Answer] = state.node.ask_stream(**state.ask_kwargs(spec))
        self.ttft: float | None = None
        self.answer: Answer | None = None

    async def first(self) -> Delta | Answer:
        try:
            return await self.next()
        except AskError as exc:
            raise self.state.ask_failed(exc) from None

    async def next(self) -> Delta | Answer:
        try:
            item = await self.items.__anext__()
        except AskError as exc:
            self.state.metrics.observe_ask(exc.code, time.monotonic() - self.t0)
            raise
        if self.ttft is None and (isinstance(item, Delta) and item.text or isinstance(item, Answer)):
            self.ttft = time.monotonic() - self.t0
        if isinstance(item, Answer):
            self.answer = item
            self.state.metrics.observe_ask("answered", time.monotonic() - self.t0, self.ttft, item.timings_ms)
        return item

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self.items.aclose()


async def _stream_sse(request: web.Request, state: ApiState, spec: AskSpec, shape: _Shape) -> web.StreamResponse:
    streamed = _Streamed(state, spec)
    try:
        item = await streamed.first()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        if shape.chat:
            await response.write(shape.chunk(None, first=True))
        try:
            while not isinstance(item, Answer):
                if item.text:
                    await response.write(shape.chunk(item.text))
                item = await streamed.next()
            await response.write(shape.chunk(None, _finish(item.finish_reason)))
            if spec.include_usage:
                await response.write(shape.usage_chunk(item))
            await response.write(b"data: [DONE]\n\n")
        except AskError as exc:  # the stream already started: report in-band, as OpenAI does
            await response.write(_event(state.ask_failed(exc).body) + b"data: [DONE]\n\n")
        except ConnectionResetError:  # the client left: the ask is dropped (closing the stream)
            return response
        await response.write_eof()
        return response
    finally:
        await streamed.close()


async def list_models(request: web.Request) -> web.Response:
    models = await _state(request).known_models()
    return web.json_response({"object": "list", "data": [_model_object(name, nodes)
                                                         for name, nodes in sorted(models.items())]})


async def retrieve_model(request: web.Request) -> web.Response:
    name = request.match_info["model"]
    state = _state(request)
    nodes = (await state.known_models()).get(name) if await state.has_model(name) else None
    if not nodes:
        raise ApiError(404, f"The model '{name}' does not exist in this network", param="model",
                       code="model_not_found")
    return web.json_response(_model_object(name, nodes))


def _model_object(name: str, nodes: list) -> dict:
    return {"id": name, "object": "model", "created": 0, "owned_by": "gentorrent",
            "gentorrent": {"nodes": len(nodes), "trusted": sum(1 for m in nodes if m.trusted)}}


async def health(request: web.Request) -> web.Response:
    """200 when this node holds enough proxy paths to ask (n), else 503 with Retry-After."""
    state = _state(request)
    usable = (state.node.status().get("paths") or {}).get("usable", 0)
    need = state.node.cloves.n
    body = {"status": "ok" if usable >= need else "starting", "paths_usable": usable, "paths_needed": need}
    headers = None if usable >= need else {"Retry-After": str(state.params.retry_after_s)}
    return web.json_response(body, status=200 if usable >= need else 503, headers=headers)


async def version(_request: web.Request) -> web.Response:
    return web.json_response({"version": gentorrent.__version__})


# --------------------------------------------------------------------------- gt-user endpoints


async def gt_ask(request: web.Request) -> web.StreamResponse:
    """gt-user ask: chat (the model's template) with the session's history kept here."""
    state = _state(request)
    spec = parse_gt_ask(await _body(request), state.params)
    if spec.session:
        spec = with_history(spec, state.sessions.history(spec.session))
    await state.check_model(spec)
    with state.admitted():
        if not spec.stream:
            answer = await _ask_once(state, spec)
            _remember(state, spec, answer)
            return web.json_response({**answer.as_dict(), "session": spec.session})
        return await _stream_ndjson(request, state, spec)


def _remember(state: ApiState, spec: AskSpec, answer: Answer) -> None:
    if spec.session:
        state.sessions.record(spec.session, spec.messages, answer.text)


async def _stream_ndjson(request: web.Request, state: ApiState, spec: AskSpec) -> web.StreamResponse:
    streamed = _Streamed(state, spec)
    try:
        item = await streamed.first()
        response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        await response.prepare(request)
        try:
            while not isinstance(item, Answer):
                await response.write(json.dumps({"delta": item.text}).encode() + b"\n")
                item = await streamed.next()
            _remember(state, spec, item)
            await response.write(json.dumps({"answer": {**item.as_dict(), "session": spec.session}}).encode() + b"\n")
        except AskError as exc:
            await response.write(json.dumps(state.ask_failed(exc).body).encode() + b"\n")
        except ConnectionResetError:
            return response
        await response.write_eof()
        return response
    finally:
        await streamed.close()


async def gt_status(request: web.Request) -> web.Response:
    state = _state(request)
    return web.json_response({**state.node.status(), "api": {"inflight": state.inflight,
                                                             "sessions": len(state.sessions)}})


async def openapi_document(_request: web.Request) -> web.Response:
    """The OpenAPI 3 description of this API (what schemathesis tests it against)."""
    return web.Response(body=OPENAPI_PATH.read_bytes(), content_type="application/json")


def make_app(node: UserNode, params: UserApiParams = USER_API) -> web.Application:
    app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=[openai_errors])
    state = ApiState(node, params)
    app[STATE_KEY] = state
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/v1/models", list_models)
    app.router.add_get("/v1/models/{model}", retrieve_model)
    app.router.add_get("/health", health)
    app.router.add_get("/version", version)
    app.router.add_post("/gt/ask", gt_ask)
    app.router.add_get("/gt/status", gt_status)
    app.router.add_get("/openapi.json", openapi_document)
    app.router.add_routes([metrics_route(lambda: state.metrics.update(node.status()))])
    return app


class ApiServer:
    """The HTTP API of `node`, on `listen` (host:port; port 0 picks a free one)."""

    def __init__(self, node: UserNode, listen: str = "127.0.0.1:0", params: UserApiParams = USER_API) -> None:
        self.node = node
        self.params = params
        self.host, _, port = listen.rpartition(":")
        self.port = int(port)
        self.app: web.Application | None = None
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def state(self) -> ApiState:
        return self.app[STATE_KEY]

    async def start(self) -> None:
        self.app = make_app(self.node, self.params)
        self._runner, self.port = await serve_app(self.app, self.host, self.port)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
