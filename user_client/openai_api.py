"""Local HTTP API of a user node: OpenAI-compatible, plus gt-user's control endpoints.

    POST /v1/chat/completions   (stream true/false: SSE chunks, then `data: [DONE]`)
    GET  /v1/models
    POST /gt/ask                (gt-user ask: JSON answer, or NDJSON lines when streaming)
    GET  /gt/status             (gt-user status)
    GET  /metrics               (Prometheus text: asks, cloves relayed / dropped by reason, paths)
    GET  /openapi.json          (OpenAPI 3 description: user_client/openapi.json)

The official `openai` client works against it unchanged (base_url=http://127.0.0.1:PORT/v1).
Every answer comes through the anonymous overlay. Bind it to 127.0.0.1: whoever can reach
it can ask as this user. Built on aiohttp (one event loop with the node's gRPC server).
"""

from __future__ import annotations

import json
import logging
import secrets
import time
from pathlib import Path
from typing import Any

from aiohttp import web

from gentorrent.config import MODEL_NODE, WIRE
from user_client.asking import Answer, AskError, Delta
from user_client.node import UserNode

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 2 * WIRE.max_prompt_bytes
NODE_KEY = web.AppKey("node", UserNode)


class BadRequest(ValueError):
    """An API request that cannot be served as given (HTTP 400)."""


def _error(status: int, message: str, kind: str, code: str | None = None) -> web.Response:
    return web.json_response({"error": {"message": message, "type": kind, "param": None, "code": code}},
                             status=status)


def _text_of(content: Any) -> str:
    """Chat content: a string, or OpenAI's list of parts (only text parts are supported)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) for p in content):
        if any(p.get("type") != "text" for p in content):
            raise BadRequest("only text content parts are supported")
        return "".join(str(p.get("text", "")) for p in content)
    raise BadRequest("message content must be a string or a list of text parts")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _length_and_temperature(max_tokens: Any, temperature: Any) -> tuple[int, float]:
    """The two sampling fields both endpoints take, checked the same way (JSON true is not 1)."""
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) \
            or not 1 <= max_tokens <= MODEL_NODE.max_new_tokens:
        raise BadRequest(f"max_tokens must be an integer in 1..{MODEL_NODE.max_new_tokens}")
    if not _is_number(temperature) or not 0 <= temperature <= 2:
        raise BadRequest("temperature must be a number in [0, 2]")
    return max_tokens, float(temperature)


def parse_chat_request(body: Any) -> dict:
    """Validated keyword arguments for UserNode.ask / ask_stream from a chat.completions body."""
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' must be a non-empty list")
    parsed = []
    for m in messages:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise BadRequest("each message needs a 'role' and 'content'")
        parsed.append({"role": m["role"], "content": _text_of(m.get("content", ""))})
    max_tokens, temperature = _length_and_temperature(
        body.get("max_completion_tokens", body.get("max_tokens", 256)), body.get("temperature", 1.0))
    top_p = body.get("top_p", 1.0)
    if not _is_number(top_p) or not 0 < top_p <= 1:
        raise BadRequest("top_p must be in (0, 1]")
    stop = body.get("stop") or []
    stop = [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop) or len(stop) > 4:
        raise BadRequest("stop must be a string or a list of at most 4 strings")
    seed = body.get("seed")
    if seed is not None and (not isinstance(seed, int) or seed < 0):
        raise BadRequest("seed must be a non-negative integer")
    n = body.get("n", 1)
    if n != 1:
        raise BadRequest("only n=1 is supported")
    model = body.get("model") or MODEL_NODE.default_model
    if not isinstance(model, str):
        raise BadRequest("model must be a string")
    session = body.get("session") or body.get("user")
    return {"messages": parsed, "model": model, "max_tokens": max_tokens, "temperature": temperature,
            "top_p": float(top_p), "stop": stop, "seed": seed,
            "session": session if isinstance(session, str) else None}


def _completion(answer: Answer, cid: str, created: int) -> dict:
    return {
        "id": cid, "object": "chat.completion", "created": created, "model": answer.model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": answer.text},
                     "finish_reason": _finish(answer.finish_reason), "logprobs": None}],
        "usage": {"prompt_tokens": 0, "completion_tokens": len(answer.token_ids),
                  "total_tokens": len(answer.token_ids)},
        "gentorrent": {"served_by": answer.served_by, "paths": answer.paths, "timings_ms": answer.timings_ms},
    }


def _chunk(cid: str, created: int, model: str, delta: dict, finish: str | None) -> bytes:
    doc = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
           "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}]}
    return b"data: " + json.dumps(doc).encode() + b"\n\n"


def _finish(reason: str) -> str:
    return reason if reason in ("stop", "length") else "stop"


async def _read_json(request: web.Request) -> Any:
    try:
        return await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BadRequest(f"the body is not JSON: {exc}") from exc


async def chat_completions(request: web.Request) -> web.StreamResponse:
    node = request.app[NODE_KEY]
    try:
        body = await _read_json(request)
        kwargs = parse_chat_request(body)
    except BadRequest as exc:
        return _error(400, str(exc), "invalid_request_error")
    cid, created = "chatcmpl-" + secrets.token_hex(12), int(time.time())
    if not body.get("stream"):
        try:
            answer = await node.ask(**kwargs)
        except AskError as exc:
            return _error(503, str(exc), "overlay_error", "no_model_node_answered")
        return web.json_response(_completion(answer, cid, created))
    stream = node.ask_stream(**kwargs)
    try:
        first = await stream.__anext__()
    except AskError as exc:
        return _error(503, str(exc), "overlay_error", "no_model_node_answered")
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    await response.write(_chunk(cid, created, kwargs["model"], {"role": "assistant", "content": ""}, None))
    item = first
    try:
        while True:
            if isinstance(item, Delta):
                await response.write(_chunk(cid, created, kwargs["model"], {"content": item.text}, None))
            else:
                await response.write(_chunk(cid, created, item.model, {}, _finish(item.finish_reason)))
                break
            item = await stream.__anext__()
    except AskError as exc:  # the stream already started: report in-band, as OpenAI does
        await response.write(b"data: " + json.dumps({"error": {"message": str(exc), "type": "overlay_error"}}).encode()
                             + b"\n\n")
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response


async def list_models(request: web.Request) -> web.Response:
    node = request.app[NODE_KEY]
    await node.refresh_directory()
    names = sorted({m.model for m in node.directory.models() if m.trusted})
    return web.json_response({"object": "list", "data": [
        {"id": name, "object": "model", "created": 0, "owned_by": "gentorrent"} for name in names]})


async def gt_ask(request: web.Request) -> web.StreamResponse:
    """gt-user ask: {"prompt", "model", "session", "stream", "node_id", "max_tokens", "temperature"}."""
    node = request.app[NODE_KEY]
    try:
        body = await _read_json(request)
        if not isinstance(body, dict) or not isinstance(body.get("prompt"), str):
            raise BadRequest("'prompt' (a string) is required")
        max_tokens, temperature = _length_and_temperature(body.get("max_tokens", 256), body.get("temperature", 0.0))
        kwargs = {"prompt": body["prompt"], "model": str(body.get("model") or MODEL_NODE.default_model),
                  "session": body.get("session"), "node_id": body.get("node_id"),
                  "max_tokens": max_tokens, "temperature": temperature}
        if not all(kwargs[k] is None or isinstance(kwargs[k], str) for k in ("session", "node_id")):
            raise BadRequest("session and node_id must be strings")
    except (BadRequest, TypeError, ValueError, OverflowError) as exc:
        return _error(400, str(exc), "invalid_request_error")
    if not body.get("stream"):
        try:
            answer = await node.ask(**kwargs)
        except AskError as exc:
            return _error(503, str(exc), "overlay_error", "no_model_node_answered")
        return web.json_response(answer.as_dict())
    response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
    await response.prepare(request)
    try:
        async for item in node.ask_stream(**kwargs):
            line = {"delta": item.text} if isinstance(item, Delta) else {"answer": item.as_dict()}
            await response.write(json.dumps(line).encode() + b"\n")
    except AskError as exc:
        await response.write(json.dumps({"error": str(exc)}).encode() + b"\n")
    await response.write_eof()
    return response


async def gt_status(request: web.Request) -> web.Response:
    return web.json_response(request.app[NODE_KEY].status())


OPENAPI_PATH = Path(__file__).with_name("openapi.json")


async def openapi_document(request: web.Request) -> web.Response:
    """The OpenAPI 3 description of this API (what schemathesis tests it against)."""
    return web.Response(body=OPENAPI_PATH.read_bytes(), content_type="application/json")


def make_app(node: UserNode) -> web.Application:
    app = web.Application(client_max_size=MAX_BODY_BYTES)
    app[NODE_KEY] = node
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_get("/v1/models", list_models)
    app.router.add_post("/gt/ask", gt_ask)
    app.router.add_get("/gt/status", gt_status)
    app.router.add_get("/openapi.json", openapi_document)
    # --- Prometheus text: the node's own status counters
    from gentorrent.metrics_views import UserNodeMetrics, metrics_route

    view = UserNodeMetrics()
    app.router.add_routes([metrics_route(lambda: view.render(node.status()))])
    return app


class ApiServer:
    """The HTTP API of `node`, on `listen` (host:port; port 0 picks a free one)."""

    def __init__(self, node: UserNode, listen: str = "127.0.0.1:0") -> None:
        self.node = node
        self.host, _, port = listen.rpartition(":")
        self.port = int(port)
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def start(self) -> None:
        self._runner = web.AppRunner(make_app(self.node), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
