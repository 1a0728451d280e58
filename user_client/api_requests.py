"""What the user node's API accepts, decided before anything leaves the node (pure).

Every body that `user_client.openai_api` receives is checked here, field by field, the way
OpenAI's API checks it: a field it does not know is "unrecognized", a field it knows but
GenTorrent cannot honour (tools, response formats other than text, logprobs, penalties, n > 1)
is refused with a 400 naming it rather than silently ignored, and every number is bounded
with the same limits the model node applies (`gentorrent.config`), so a request that a model
node would refuse never crosses the overlay. Errors are `ApiError`s carrying OpenAI's error
JSON (`ApiError.body`).

What never leaves the user's node: the OpenAI `user` (and `safety_identifier`) field, and the
names of `gt-user ask` sessions. A conversation is keyed here by a keyed hash of its opening
(`conversation_key`), which gives its follow-ups the same model node (its prefix cache holds
the conversation) and, on turns that carry history, the session id the request shows.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
from dataclasses import dataclass, replace
from typing import Any

from gentorrent.config import MODEL_NODE, USER_API, WIRE, UserApiParams
from gentorrent.generation import ROLES

#: roles OpenAI clients send that map onto the model's chat template ("developer" is the
#: newer name of "system" in OpenAI's API)
ROLE_ALIASES = {"developer": "system"}
SESSION_ID_BYTES = 8  # the session id a request carries: 16 hex characters


class ApiError(Exception):
    """A request the API refuses: HTTP status and OpenAI's error object."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None, retry_after: int | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind
        self.param = param
        self.code = code
        self.retry_after = retry_after

    @property
    def body(self) -> dict:
        return {"error": {"message": str(self), "type": self.kind, "param": self.param, "code": self.code}}


def bad(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


@dataclass(frozen=True)
class AskSpec:
    """One validated ask: what to send (chat messages or a raw prompt) and how to sample."""

    model: str
    messages: tuple[tuple[str, str], ...] = ()
    prompt: str | None = None
    max_tokens: int = USER_API.max_tokens
    temperature: float = USER_API.temperature
    top_p: float = USER_API.top_p
    top_k: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stream: bool = False
    include_usage: bool = False
    session: str | None = None  # a gt-user ask session name (local only)
    node_id: str | None = None  # gt-user ask: ask this model node

    def message_dicts(self) -> list[dict]:
        return [{"role": r, "content": c} for r, c in self.messages]

    def sampling(self) -> dict:
        """Keyword arguments of generation.make_request."""
        return {"max_tokens": self.max_tokens, "temperature": self.temperature, "top_p": self.top_p,
                "top_k": self.top_k, "seed": self.seed, "stop": list(self.stop)}


# --------------------------------------------------------------------------- JSON


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def parse_json(raw: bytes) -> Any:
    """The body as JSON; NaN and Infinity literals are refused (they are not JSON)."""
    try:
        return json.loads(raw.decode("utf-8"), parse_constant=_no_constants)
    except (ValueError, UnicodeDecodeError) as exc:
        raise bad(f"the body is not valid JSON: {exc}. Send a JSON object with Content-Type "
                  "application/json.") from exc


# --------------------------------------------------------------------------- fields


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _max_tokens(value: Any, name: str) -> int:
    if not _is_int(value) or not 1 <= value <= MODEL_NODE.max_new_tokens:
        raise bad(f"{name} must be an integer from 1 to {MODEL_NODE.max_new_tokens}, got {value!r}", name)
    return value


def _temperature(value: Any) -> float:
    if not _is_number(value) or not 0 <= value <= MODEL_NODE.max_temperature:
        raise bad(f"temperature must be a number from 0 to {MODEL_NODE.max_temperature:g}, got {value!r}",
                  "temperature")
    return float(value)


def _top_p(value: Any) -> float:
    if not _is_number(value) or not 0 < value <= 1:
        raise bad(f"top_p must be a number in (0, 1], got {value!r}", "top_p")
    return float(value)


def _top_k(value: Any) -> int:
    if not _is_int(value) or not -1 <= value <= MODEL_NODE.max_top_k:
        raise bad(f"top_k must be an integer from -1 to {MODEL_NODE.max_top_k} (-1 or 0: off), got {value!r}",
                  "top_k")
    return max(value, 0)


def _seed(value: Any) -> int | None:
    if value is None:
        return None
    if not _is_int(value) or not 0 <= value < 2 ** 63:
        raise bad(f"seed must be a non-negative integer below 2^63, got {value!r}", "seed")
    return value


def _stop(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    limit = min(4, MODEL_NODE.max_stop_strings)  # OpenAI takes up to 4
    if (not isinstance(stops, list) or len(stops) > limit
            or not all(isinstance(s, str) and 1 <= len(s) <= MODEL_NODE.max_stop_chars for s in stops)):
        raise bad(f"stop must be a string or a list of at most {limit} strings of 1 to "
                  f"{MODEL_NODE.max_stop_chars} characters", "stop")
    return tuple(stops)


def _stream(body: dict) -> tuple[bool, bool]:
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise bad(f"stream must be true or false, got {stream!r}", "stream")
    options = body.get("stream_options")
    if options is None:
        return bool(stream), False
    if not stream:
        raise bad("stream_options is only allowed when stream is true", "stream_options")
    if not isinstance(options, dict) or set(options) - {"include_usage"} \
            or not isinstance(options.get("include_usage", False), bool):
        raise bad("stream_options takes only include_usage (true or false)", "stream_options")
    return True, bool(options.get("include_usage", False))


def _model(body: dict) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad("you must name a model (the `model` field); GET /v1/models lists them", "model")
    if len(model) > 256:
        raise bad("model names are at most 256 characters", "model")
    return model


def _private_string(body: dict, name: str) -> None:
    """`user` and `safety_identifier`: checked, and dropped here (they never leave the node)."""
    value = body.get(name)
    if value is not None and not isinstance(value, str):
        raise bad(f"{name} must be a string", name)


# --------------------------------------------------------------------------- unsupported fields

def _neutral(value: Any, allowed: tuple) -> bool:
    """None, or one of `allowed` of the same JSON type (false is no 0, 1.0 no 1 here)."""
    return value is None or any(type(value) is type(a) and value == a for a in allowed)


#: fields OpenAI knows that GenTorrent serves only at their neutral value; anything else is a 400
NEUTRAL: dict[str, tuple] = {
    "frequency_penalty": (0, 0.0), "presence_penalty": (0, 0.0), "logprobs": (False, 0), "top_logprobs": (0,),
    "logit_bias": ({},), "response_format": ({"type": "text"},), "tools": ([],), "tool_choice": ("none",),
    "functions": ([],), "function_call": ("none",), "modalities": (["text"],), "store": (False,),
    "service_tier": ("auto", "default"), "parallel_tool_calls": (True, False), "audio": (), "prediction": (),
    "reasoning_effort": (), "web_search_options": (), "verbosity": (), "metadata": ({},), "n": (1,),
    "best_of": (1,), "echo": (False,), "suffix": (), "prompt_cache_key": (),
}
#: keys of a chat message besides role and content, accepted at these values only (what a
#: client sends back when it resends a reply message it got: refusal null, no tool calls)
MESSAGE_NEUTRAL: dict[str, tuple] = {"name": ("",), "refusal": (), "annotations": ([],), "audio": (),
                                     "function_call": (), "tool_calls": ([],)}
CHAT_FIELDS = {"messages", "model", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "seed",
               "stop", "stream", "stream_options", "user", "safety_identifier"}
CHAT_NEUTRAL = set(NEUTRAL) - {"best_of", "echo", "suffix"}
COMPLETION_FIELDS = {"prompt", "model", "max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "stream",
                     "stream_options", "user"}
COMPLETION_NEUTRAL = {"frequency_penalty", "presence_penalty", "logprobs", "logit_bias", "n", "best_of", "echo",
                      "suffix"}


def _check_fields(body: Any, supported: set[str], neutral: set[str]) -> dict:
    if not isinstance(body, dict):
        raise bad("the request body must be a JSON object")
    for name, value in body.items():
        if name in supported:
            continue
        if name not in neutral:
            raise bad(f"Unrecognized request argument supplied: {name}", name, "unknown_parameter")
        if not _neutral(value, NEUTRAL[name]):
            raise bad(f"{name}={json.dumps(value)[:80]} is not supported by GenTorrent; leave it out",
                      name, "unsupported_parameter")
    return body


# --------------------------------------------------------------------------- messages


def _content(value: Any, where: str) -> str:
    """Chat content: a string, or OpenAI's list of parts (text parts only)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(p, dict) for p in value):
        for i, part in enumerate(value):
            if part.get("type") != "text" or not isinstance(part.get("text"), str) or set(part) != {"type", "text"}:
                raise bad(f"{where}[{i}]: only text content parts are supported", where, "unsupported_parameter")
        return "".join(p["text"] for p in value)
    raise bad(f"{where} must be a string or a list of text parts", where)


def parse_messages(messages: Any) -> tuple[tuple[str, str], ...]:
    if not isinstance(messages, list) or not messages:
        raise bad("messages must be a non-empty list of {role, content} objects", "messages")
    if len(messages) > MODEL_NODE.max_chat_messages:
        raise bad(f"{len(messages)} messages; at most {MODEL_NODE.max_chat_messages}", "messages")
    out = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise bad(f"{where} must be an object with role and content", where)
        role = m.get("role")
        role = ROLE_ALIASES.get(role, role) if isinstance(role, str) else None
        if role not in ROLES:
            raise bad(f"{where}.role {m.get('role')!r} is not supported; use one of "
                      f"{', '.join(sorted(ROLES | set(ROLE_ALIASES)))}", f"{where}.role")
        for key, value in m.items():  # e.g. a reply message sent back with refusal: null
            if key in ("role", "content"):
                continue
            if key not in MESSAGE_NEUTRAL:
                raise bad(f"{where}.{key} is not a message field", f"{where}.{key}", "unknown_parameter")
            if not _neutral(value, MESSAGE_NEUTRAL[key]):
                raise bad(f"{where}.{key} is not supported by GenTorrent; leave it out", f"{where}.{key}",
                          "unsupported_parameter")
        if "content" not in m or m["content"] is None:
            raise bad(f"{where}.content is required", f"{where}.content")
        out.append((role, _content(m["content"], f"{where}.content")))
    if not any(c.strip() for _, c in out):
        raise bad("every message is empty", "messages")
    _check_size(sum(len(r) + len(c.encode()) for r, c in out))
    return tuple(out)


def _check_size(size: int) -> None:
    if size > WIRE.max_prompt_bytes:
        raise ApiError(413, f"the prompt is {size} bytes; at most {WIRE.max_prompt_bytes} can be sent",
                       param="messages", code="request_too_large")


# --------------------------------------------------------------------------- request kinds


def parse_chat(body: Any, params: UserApiParams = USER_API) -> AskSpec:
    """POST /v1/chat/completions."""
    body = _check_fields(body, CHAT_FIELDS, CHAT_NEUTRAL)
    messages = parse_messages(body.get("messages"))
    stream, usage = _stream(body)
    for name in ("user", "safety_identifier"):
        _private_string(body, name)
    limits = [_max_tokens(body[name], name) for name in ("max_completion_tokens", "max_tokens")
              if body.get(name) is not None]
    return AskSpec(
        model=_model(body), messages=messages, max_tokens=limits[0] if limits else params.max_tokens,
        **_sampling(body, params), stream=stream, include_usage=usage)


def _sampling(body: dict, params: UserApiParams) -> dict:
    t, p, k = body.get("temperature"), body.get("top_p"), body.get("top_k")
    return {"temperature": params.temperature if t is None else _temperature(t),
            "top_p": params.top_p if p is None else _top_p(p), "top_k": 0 if k is None else _top_k(k),
            "seed": _seed(body.get("seed")), "stop": _stop(body.get("stop"))}


def parse_completion(body: Any, params: UserApiParams = USER_API) -> AskSpec:
    """POST /v1/completions: one raw prompt, no chat template."""
    body = _check_fields(body, COMPLETION_FIELDS, COMPLETION_NEUTRAL)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise bad("prompt must be one string (token-id and batched prompts are not supported)", "prompt",
                  "unsupported_parameter" if isinstance(prompt, list) else None)
    if not prompt.strip():
        raise bad("prompt is empty", "prompt")
    _check_size(len(prompt.encode()))
    stream, usage = _stream(body)
    _private_string(body, "user")
    limit = body.get("max_tokens")
    return AskSpec(model=_model(body), prompt=prompt,
                   max_tokens=params.completion_max_tokens if limit is None else _max_tokens(limit, "max_tokens"),
                   **_sampling(body, params), stream=stream, include_usage=usage)


GT_ASK_FIELDS = {"prompt", "system", "session", "raw", "model", "stream", "max_tokens", "temperature", "top_p",
                 "seed", "node_id"}


def parse_gt_ask(body: Any, params: UserApiParams = USER_API) -> AskSpec:
    """POST /gt/ask (what `gt-user ask` sends): a question, an optional system prompt and
    session name; the session's history is added by the API (`SessionStore`)."""
    if not isinstance(body, dict):
        raise bad("the request body must be a JSON object")
    unknown = sorted(set(body) - GT_ASK_FIELDS)
    if unknown:
        raise bad(f"unknown field(s) {', '.join(unknown)}; /gt/ask takes {', '.join(sorted(GT_ASK_FIELDS))}",
                  unknown[0], "unknown_parameter")
    prompt = body.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        raise bad("'prompt' (a non-empty string) is required", "prompt")
    for name in ("system", "session", "node_id", "model"):
        if body.get(name) is not None and not isinstance(body[name], str):
            raise bad(f"{name} must be a string", name)
    session = body.get("session") or None
    if session is not None and len(session) > params.max_session_name_chars:
        raise bad(f"session names are at most {params.max_session_name_chars} characters", "session")
    raw = body.get("raw", False)
    if not isinstance(raw, bool) or (raw and (session or body.get("system"))):
        raise bad("raw must be true or false, and a raw prompt takes no session or system prompt", "raw")
    stream = body.get("stream", False)  # gt-user ask says which it wants (USER_API.stream is its default)
    if not isinstance(stream, bool):
        raise bad("stream must be true or false", "stream")
    system = body.get("system") or None
    messages = () if raw else ((("system", system),) if system else ()) + (("user", prompt),)
    _check_size(len(prompt.encode()) + len((system or "").encode()))
    limit = body.get("max_tokens")
    return AskSpec(model=body.get("model") or MODEL_NODE.default_model, messages=messages,
                   prompt=prompt if raw else None,
                   max_tokens=params.max_tokens if limit is None else _max_tokens(limit, "max_tokens"),
                   **_sampling(body, params), stream=stream, session=session, node_id=body.get("node_id") or None)


# --------------------------------------------------------------------------- conversations


def conversation_key(secret: bytes, spec: AskSpec) -> str | None:
    """A conversation's key on this node: a keyed hash of its model and opening (system
    prompt and first user message), so every turn of one conversation, asked by gt-user or
    by any OpenAI client resending the history, maps to the same key. None for raw prompts."""
    if not spec.messages:
        return None
    opening = [m for m in spec.messages if m[0] == "system"][:1] + [m for m in spec.messages if m[0] == "user"][:1]
    h = hmac.new(secret, spec.model.encode(), hashlib.sha256)
    for role, content in opening:
        h.update(b"\x00" + role.encode() + b"\x00" + hashlib.sha256(content.encode()).digest())
    return h.hexdigest()[: 2 * SESSION_ID_BYTES]


def wire_session(spec: AskSpec, key: str | None) -> str | None:
    """The session id the request carries: the conversation key on turns that carry history
    (a follow-up), none on a conversation's first question - the shape clients' asks have."""
    users = sum(1 for r, _ in spec.messages if r == "user")
    return key if key is not None and users > 1 else None


def with_history(spec: AskSpec, history: list[tuple[str, str]]) -> AskSpec:
    """A gt-user ask with its session's earlier turns put before the new question (a system
    prompt given now replaces the session's)."""
    if not history:
        return spec
    system = [m for m in spec.messages if m[0] == "system"] or [m for m in history if m[0] == "system"][:1]
    turns = [m for m in history if m[0] != "system"]
    return replace(spec, messages=tuple(system + turns + [m for m in spec.messages if m[0] != "system"]))
