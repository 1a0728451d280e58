"""Local HTTP API of a user node: OpenAI-compatible as vLLM's server is, plus gt-user's endpoints.

    POST /v1/chat/completions   chat (stream: SSE chunks, `include_usage`, then `data: [DONE]`);
                                vLLM's sampling parameters, n, logprobs, tools, response_format
    POST /v1/completions        raw prompt, no chat template (stream as above)
    POST /v1/responses          the Responses API, for text (stream: its typed events)
    POST /tokenize, /detokenize vLLM's, on a model node of the model
    GET  /v1/models, /v1/models/{id}
    GET  /health, /ping, /version
    POST /gt/ask                gt-user ask: a question (+ system prompt, session); JSON or NDJSON
    GET  /gt/status             gt-user status
    GET  /metrics               Prometheus text (user_client.metrics)
    GET  /openapi.json, /docs   the OpenAPI 3 document of all of the above (user_client/openapi.json), as a page

The official `openai` client works unchanged (base_url=http://127.0.0.1:PORT/v1). Every answer
comes through the anonymous overlay. What the user's node can decide is decided here, before
anything leaves it (`user_client.api_requests`): a bad field is a 400 naming it, an unknown model
a 404 `model_not_found`, an oversized prompt a 413. A model node refusing the request itself
(a prompt longer than the model's context) is a 400 too, never a retry. 429 (this API's own
limit of asks in flight) and 503 (no model node could answer) are the only "try again"
answers, both with Retry-After. Every error body is OpenAI's error JSON, and no traceback
leaves the process. Whoever reaches it asks as this user, so it serves only requests naming
this node in Host, from no web page but its own or one allowed by --cors-origin, and with
the bearer key when it has one (`user_client.api_access`); a wildcard address needs a key.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import time
from pathlib import Path
from typing import Any, AsyncIterator, Awaitable, Callable

from aiohttp import web

import gentorrent
from gentorrent.config import USER_API, WIRE, UserApiParams
from gentorrent.generation import CLIENT_ERROR_CODES, make_request
from gentorrent.metrics import metrics_route, serve_app
from gentorrent.wire import gentorrent_pb2 as pb
from user_client.api_access import AccessDenied, ApiAccess, check_listen, is_wildcard
from user_client.api_requests import (ApiError, AskSpec, conversation_key, parse_chat, parse_completion,
                                      parse_detokenize, parse_gt_ask, parse_json, parse_responses, parse_tokenize,
                                      wire_session, with_history)
from user_client.openai_shapes import ResponseShape, Shape, event
from user_client.asking import Answer, AskError, Delta
from user_client.metrics import UserMetrics
from user_client.node import UserNode
from user_client.sessions import SessionStore

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 2 * WIRE.max_prompt_bytes
OPENAPI_PATH = Path(__file__).with_name("openapi.json")
DOCS_PATH = Path(__file__).with_name("static") / "docs.html"
CHAT_PATH = Path(__file__).with_name("static") / "chat.html"


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

    async def known_models(self, fresh: bool = False) -> dict[str, tuple[int, int]]:
        """Model name -> (registered nodes, trusted ones): the committee's catalogue (one proven
        query), else what the directory holds; `fresh` re-reads it first, at most once a second
        (a model that is missing may just have been registered)."""
        if fresh and time.monotonic() - self._last_refresh > 1.0:
            self._last_refresh = time.monotonic()
            with contextlib.suppress(Exception):  # an unreachable committee: work from what we hold
                await self.node.refresh_directory()
        catalog = getattr(self.node.directory, "catalog", None)
        if catalog is not None:
            with contextlib.suppress(Exception):
                return await catalog()
        models: dict[str, tuple[int, int]] = {}
        for m in self.node.directory.models():
            nodes, trusted = models.get(m.model, (0, 0))
            models[m.model] = (nodes + 1, trusted + m.trusted)
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

    def note_of(self, answer: Answer) -> dict:
        """Where an answer came from: the serving node (its reputation and trust in the
        directory now) and the relays of each path its cloves took."""
        record = next((m for m in self.node.directory.models() if m.node_id_hex == answer.served_by), None)
        return {"served_by": answer.served_by, "model": answer.model, "paths": answer.paths,
                "reputation": None if record is None else round(record.reputation, 4),
                "trusted": None if record is None else record.trusted}

    def ask_failed(self, exc: AskError) -> ApiError:
        """An AskError as the API answers it: the request's fault (400/404) or no answer (503)."""
        if exc.code == "model_not_found":
            return ApiError(404, str(exc), param="model", code=exc.code)
        if exc.code in CLIENT_ERROR_CODES:
            return ApiError(400, str(exc), param="messages", code=exc.code)
        return ApiError(503, f"{exc}; retry later", kind="server_error", code=exc.code,
                        retry_after=self.params.retry_after_s)


STATE_KEY = web.AppKey("state", ApiState)
ACCESS_KEY = web.AppKey("access", ApiAccess)


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


@web.middleware
async def access_control(request: web.Request, handler) -> web.StreamResponse:
    """Host, Origin and the API key (user_client.api_access) before any handler runs; a CORS
    preflight from an allowed origin is answered here."""
    access = request.app[ACCESS_KEY]
    try:
        access.check(request.method, request.path, request.headers)
    except AccessDenied as exc:
        log.warning("refused %s %s: %s", request.method, request.path, exc)
        return error_response(ApiError(exc.status, str(exc), kind="invalid_request_error" if exc.status == 403
                                       else "authentication_error", code=exc.code))
    if request.method == "OPTIONS" and "Access-Control-Request-Method" in request.headers:
        return web.Response(status=204, headers=access.cors_headers(request.headers.get("Origin")))
    return await handler(request)


async def _cors_on_prepare(request: web.Request, response: web.StreamResponse) -> None:
    """CORS headers on every answer to an allowed foreign origin (streams included)."""
    response.headers.update(request.app[ACCESS_KEY].cors_headers(request.headers.get("Origin")))


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


def _warn_ignored(request: web.Request, spec: AskSpec) -> None:
    if spec.ignored:  # as vLLM: the request is served, the fields are named in the log
        log.warning("%s: the following fields were present in the request but ignored: %s", request.path,
                    ", ".join(spec.ignored))


async def _openai_ask(request: web.Request, state: ApiState, spec: AskSpec, chat: bool) -> web.StreamResponse:
    _warn_ignored(request, spec)
    await state.check_model(spec)
    shape = Shape(chat, spec)
    with state.admitted():
        if not spec.stream:
            answers = await asyncio.gather(*(_ask_once(state, spec.choice(i)) for i in range(spec.n)))
            return web.json_response(shape.completion(list(answers)))
        return await _stream_sse(request, state, spec, shape)


async def _ask_once(state: ApiState, spec: AskSpec) -> Answer:
    t0 = time.monotonic()
    try:
        answer = await state.node.ask(**state.ask_kwargs(spec))
    except AskError as exc:
        state.metrics.observe_ask(exc.code, time.monotonic() - t0)
        raise state.ask_failed(exc) from None
    state.metrics.observe_ask("answered", time.monotonic() - t0,
                              answer.timings_ms.get("first_chunk_ms", 0) / 1000 or None, answer.timings_ms,
                              answer.prompt_tokens, len(answer.token_ids))
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
            self.state.metrics.observe_ask("answered", time.monotonic() - self.t0, self.ttft, item.timings_ms,
                                           item.prompt_tokens, len(item.token_ids))
        return item

    async def rest(self, first: Delta | Answer) -> AsyncIterator[Delta | Answer]:
        """`first`, then every further item up to the Answer."""
        item = first
        while True:
            yield item
            if isinstance(item, Answer):
                return
            item = await self.next()

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self.items.aclose()


async def _merged(streams: list[_Streamed], firsts: list) -> AsyncIterator[tuple[int, Delta | Answer]]:
    """The items of n streamed choices as they come, each with its choice's index."""
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(i: int) -> None:
        try:
            async for item in streams[i].rest(firsts[i]):
                await queue.put((i, item))
        except Exception as exc:  # an AskError mid-stream (or the client gone): reported in-band
            await queue.put((i, exc))

    tasks = [asyncio.ensure_future(pump(i)) for i in range(len(streams))]
    try:
        done = 0
        while done < len(streams):
            i, item = await queue.get()
            if isinstance(item, Exception):
                raise item
            done += isinstance(item, Answer)
            yield i, item
    finally:
        for task in tasks:
            task.cancel()


SSE = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}


async def _streaming(request: web.Request, streams: list[_Streamed], headers: dict,
                     body: Callable[[web.StreamResponse, list], Awaitable[None]],
                     failure: Callable[[AskError], bytes]) -> web.StreamResponse:
    """A streamed answer (SSE or NDJSON): the first item of every stream is awaited before any
    byte goes out (an ask that fails at once gets its status and error body), then `body`
    writes the rest; a failure after that is reported in-band (`failure`), as OpenAI does, and
    a client that left ends it (closing the streams drops the asks)."""
    try:
        firsts = list(await asyncio.gather(*(s.first() for s in streams)))
        response = web.StreamResponse(headers=headers)
        await response.prepare(request)
        try:
            await body(response, firsts)
        except AskError as exc:
            await response.write(failure(exc))
        except ConnectionResetError:
            return response
        await response.write_eof()
        return response
    finally:
        for s in streams:
            await s.close()


async def _stream_sse(request: web.Request, state: ApiState, spec: AskSpec, shape: Shape) -> web.StreamResponse:
    streams = [_Streamed(state, spec.choice(i)) for i in range(spec.n)]

    async def body(response: web.StreamResponse, firsts: list) -> None:
        if shape.chat:
            for i in range(spec.n):
                await response.write(shape.first(i))
        answers: dict[int, Answer] = {}
        async for i, item in _merged(streams, firsts):
            if isinstance(item, Answer):
                answers[i] = item
                for chunk in shape.tool_call_chunks(i, item) if shape.chat else ():
                    await response.write(chunk)
                await response.write(shape.end(i, item))
            elif item.text:
                await response.write(shape.delta(i, item))
        if spec.include_usage:
            await response.write(shape.usage_chunk([answers[i] for i in sorted(answers)]))
        await response.write(b"data: [DONE]\n\n")

    return await _streaming(request, streams, SSE, body,
                            lambda exc: event(state.ask_failed(exc).body) + b"data: [DONE]\n\n")


async def responses(request: web.Request) -> web.StreamResponse:
    """POST /v1/responses, for text (what vLLM's /v1/responses does for a text model)."""
    state = _state(request)
    spec, instructions, limit = parse_responses(await _body(request), state.params)
    _warn_ignored(request, spec)
    await state.check_model(spec)
    shape = ResponseShape(spec, instructions, limit)
    with state.admitted():
        if not spec.stream:
            return web.json_response(shape.response(await _ask_once(state, spec)))
        streamed = _Streamed(state, spec)

        async def body(response: web.StreamResponse, firsts: list) -> None:
            for chunk in shape.opening():
                await response.write(chunk)
            async for item in streamed.rest(firsts[0]):
                if isinstance(item, Answer):
                    for chunk in shape.closing(item):
                        await response.write(chunk)
                elif item.text:
                    await response.write(shape.delta(item.text))

        return await _streaming(request, [streamed], SSE, body,
                                lambda exc: shape.failed(state.ask_failed(exc).body["error"]))


async def tokenize(request: web.Request) -> web.Response:
    """POST /tokenize (vLLM's): the prompt's tokens on the serving model node (chat template applied)."""
    state = _state(request)
    spec = parse_tokenize(await _body(request))
    _warn_ignored(request, spec)
    await state.check_model(spec)
    with state.admitted():
        answer = await _token_operation(state, spec, pb.GenerateRequest.TOKENIZE)
    return web.json_response({"count": len(answer.token_ids), "max_model_len": answer.max_model_len,
                              "tokens": answer.token_ids, "token_strs": None})


async def detokenize(request: web.Request) -> web.Response:
    """POST /detokenize (vLLM's): token ids back to text, on a model node of the model."""
    state = _state(request)
    model, tokens = parse_detokenize(await _body(request))
    spec = AskSpec(model=model)
    await state.check_model(spec)
    with state.admitted():
        answer = await _token_operation(state, spec, pb.GenerateRequest.DETOKENIZE, tokens)
    return web.json_response({"prompt": answer.text})


async def _token_operation(state: ApiState, spec: AskSpec, operation: int, tokens: list[int] | None = None) -> Answer:
    """A TOKENIZE or DETOKENIZE request through the overlay (never audited: it is no generation)."""
    try:
        return await state.node.ask_request(make_request(
            spec.prompt, spec.message_dicts() if spec.messages else None, spec.model, max_tokens=None,
            operation=operation, token_ids=tokens))
    except AskError as exc:
        raise state.ask_failed(exc) from None


async def list_models(request: web.Request) -> web.Response:
    models = await _state(request).known_models()
    return web.json_response({"object": "list", "data": [_model_object(name, nodes)
                                                         for name, nodes in sorted(models.items())]})


async def retrieve_model(request: web.Request) -> web.Response:
    name = request.match_info["model"]
    state = _state(request)
    nodes = (await state.known_models()).get(name) if await state.has_model(name) else None
    if not nodes or not nodes[0]:
        raise ApiError(404, f"The model '{name}' does not exist in this network", param="model",
                       code="model_not_found")
    return web.json_response(_model_object(name, nodes))


def _model_object(name: str, counts: tuple[int, int]) -> dict:
    return {"id": name, "object": "model", "created": 0, "owned_by": "gentorrent",
            "gentorrent": {"nodes": counts[0], "trusted": counts[1]}}


async def health(request: web.Request) -> web.Response:
    """200 when this node holds enough proxy paths to ask (n), else 503 with Retry-After."""
    state = _state(request)
    usable = (state.node.status().get("paths") or {}).get("usable", 0)
    need = state.node.cloves.n
    body = {"status": "ok" if usable >= need else "starting", "paths_usable": usable, "paths_needed": need}
    headers = None if usable >= need else {"Retry-After": str(state.params.retry_after_s)}
    return web.json_response(body, status=200 if usable >= need else 503, headers=headers)


async def ping(request: web.Request) -> web.Response:
    """GET or POST /ping (vLLM's, for load balancers): /health's verdict, no body to parse."""
    answer = await health(request)
    return web.Response(status=answer.status, headers={"Retry-After": answer.headers["Retry-After"]}
                        if "Retry-After" in answer.headers else None)


async def docs(_request: web.Request) -> web.Response:
    """GET /docs: the routes of this API, rendered in the page from /openapi.json (offline: no CDN)."""
    return web.Response(body=DOCS_PATH.read_bytes(), content_type="text/html")


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
            return web.json_response(_answered(state, spec, answer))
        return await _stream_ndjson(request, state, spec)


def _answered(state: ApiState, spec: AskSpec, answer: Answer) -> dict:
    """/gt/ask's answer: the answer, where it came from, and the session (which now holds it)."""
    note = state.note_of(answer)
    if spec.session:
        state.sessions.record(spec.session, spec.messages, answer.text, note, spec.model)
    return {**answer.as_dict(), "session": spec.session, "node": note}


async def _stream_ndjson(request: web.Request, state: ApiState, spec: AskSpec) -> web.StreamResponse:
    streamed = _Streamed(state, spec)

    async def body(response: web.StreamResponse, firsts: list) -> None:
        async for item in streamed.rest(firsts[0]):
            if isinstance(item, Answer):
                await response.write(json.dumps({"answer": _answered(state, spec, item)}).encode() + b"\n")
            else:
                await response.write(json.dumps({"delta": item.text}).encode() + b"\n")

    return await _streaming(request, [streamed], {"Content-Type": "application/x-ndjson"}, body,
                            lambda exc: json.dumps(state.ask_failed(exc).body).encode() + b"\n")


async def gt_sessions(request: web.Request) -> web.Response:
    """GET /gt/sessions: the conversations this node keeps (the chat page's list)."""
    return web.json_response({"sessions": _state(request).sessions.names()})


async def gt_session(request: web.Request) -> web.Response:
    """GET /gt/sessions/{name}: its turns, each answer with its note; DELETE forgets it."""
    state, name = _state(request), request.match_info["name"]
    if request.method == "DELETE":
        if not state.sessions.forget(name):
            raise ApiError(404, f"no session {name!r} on this node", param="name", code="session_not_found")
        return web.json_response({"deleted": name})
    turns = state.sessions.transcript(name)
    if turns is None:
        raise ApiError(404, f"no session {name!r} on this node", param="name", code="session_not_found")
    return web.json_response({"name": name, "messages": turns})


async def chat_page(_request: web.Request) -> web.Response:
    """GET /: the chat page (user_client/static/chat.html: plain HTML and JS, no build step)."""
    return web.Response(body=CHAT_PATH.read_bytes(), content_type="text/html",
                        headers={"Content-Security-Policy": "default-src 'self'; script-src 'self' 'unsafe-inline'; "
                                                            "style-src 'self' 'unsafe-inline'"})


async def gt_status(request: web.Request) -> web.Response:
    state = _state(request)
    return web.json_response({**state.node.status(), "api": {"inflight": state.inflight,
                                                             "sessions": len(state.sessions)}})


async def openapi_document(_request: web.Request) -> web.Response:
    """The OpenAPI 3 description of this API (what schemathesis tests it against)."""
    return web.Response(body=OPENAPI_PATH.read_bytes(), content_type="application/json")


def make_app(node: UserNode, params: UserApiParams = USER_API, access: ApiAccess | None = None) -> web.Application:
    app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=[access_control, openai_errors])
    state = ApiState(node, params)
    app[STATE_KEY] = state
    app[ACCESS_KEY] = access or ApiAccess()
    app.on_response_prepare.append(_cors_on_prepare)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/responses", responses)
    app.router.add_post("/tokenize", tokenize)
    app.router.add_post("/detokenize", detokenize)
    app.router.add_get("/ping", ping)
    app.router.add_post("/ping", ping)
    app.router.add_get("/docs", docs)
    app.router.add_get("/v1/models", list_models)
    app.router.add_get("/v1/models/{model}", retrieve_model)
    app.router.add_get("/health", health)
    app.router.add_get("/version", version)
    app.router.add_post("/gt/ask", gt_ask)
    app.router.add_get("/gt/status", gt_status)
    app.router.add_get("/gt/sessions", gt_sessions)
    app.router.add_route("GET", "/gt/sessions/{name}", gt_session)
    app.router.add_route("DELETE", "/gt/sessions/{name}", gt_session)
    app.router.add_get("/", chat_page)
    app.router.add_get("/openapi.json", openapi_document)
    app.router.add_routes([metrics_route(lambda: state.metrics.update(node.status()))])
    return app


class ApiServer:
    """The HTTP API of `node`, on `listen` (host:port; port 0 picks a free one)."""

    def __init__(self, node: UserNode, listen: str = "127.0.0.1:0", params: UserApiParams = USER_API,
                 api_key: str | None = None, cors_origins: tuple[str, ...] = ()) -> None:
        check_listen(listen, api_key)  # a wildcard address without a key: refused (ValueError)
        self.node = node
        self.params = params
        self.access = ApiAccess.make(listen, api_key, cors_origins)
        self.host, _, port = listen.rpartition(":")
        self.port = int(port)
        self.app: web.Application | None = None
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        """Where a client on this machine reaches it (127.0.0.1 for a wildcard address)."""
        return f"http://{'127.0.0.1' if is_wildcard(self.host) else self.host}:{self.port}"

    @property
    def state(self) -> ApiState:
        return self.app[STATE_KEY]

    async def start(self) -> None:
        self.app = make_app(self.node, self.params, self.access)
        self._runner, self.port = await serve_app(self.app, self.host, self.port)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
