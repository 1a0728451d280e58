"""What the user node's API accepts, decided before anything leaves the node (pure).

Every body that `user_client.openai_api` receives is checked here, field by field, the way
vLLM's OpenAI server checks it: the sampling parameters vLLM accepts are taken and bounded with
the same limits the model node applies (`gentorrent.config`, `gentorrent.generation`), so a
request that a model node would refuse never crosses the overlay; tools, tool_choice and
response_format (JSON object, JSON schema) and vLLM's `structured_outputs` go to the model node,
which does them with vLLM's own code (model_node/tools.py); a field vLLM would not use is ignored
and named in `AskSpec.ignored` (the API logs it as a warning, as vLLM does). Errors are
`ApiError`s carrying OpenAI's error JSON (`ApiError.body`).

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
from gentorrent.generation import ROLES, Structured, canonical_json

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
    extras: tuple[tuple[str, object], ...] = ()  # vLLM's further sampling parameters (generation.SAMPLING_EXTRAS)
    logit_bias: tuple[tuple[int, float], ...] = ()
    logprobs: bool = False
    structured: tuple[int, str] | None = None
    tools: str = ""  # canonical JSON
    tool_choice: str = ""
    parallel_tool_calls: bool = True
    message_extras: tuple[str, ...] = ()  # per message: canonical JSON of tool_calls / tool_call_id, or ""
    n: int = 1
    ignored: tuple[str, ...] = ()  # fields present but not used (logged, as vLLM does)

    def message_dicts(self) -> list[dict]:
        out = []
        for i, (role, content) in enumerate(self.messages):
            message: dict = {"role": role, "content": content}
            extra = self.message_extras[i] if i < len(self.message_extras) else ""
            if extra:
                message.update(json.loads(extra))
            out.append(message)
        return out

    def sampling(self) -> dict:
        """Keyword arguments of generation.make_request."""
        return {"max_tokens": self.max_tokens, "temperature": self.temperature, "top_p": self.top_p,
                "top_k": self.top_k, "seed": self.seed, "stop": list(self.stop), **dict(self.extras),
                "logit_bias": dict(self.logit_bias) or None, "logprobs": self.logprobs,
                "structured": self.structured, "tools": self.tools, "tool_choice": self.tool_choice,
                "parallel_tool_calls": self.parallel_tool_calls if self.tools else False}

    def choice(self, index: int) -> "AskSpec":
        """The ask of choice `index` of n (each choice is an ask of its own; a seed moves on by one)."""
        return replace(self, n=1, seed=None if self.seed is None else (self.seed + index) % 2 ** 63)


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


def _number_in(body: dict, name: str, low: float, high: float, default: float, low_open: bool = False) -> float:
    value = body.get(name)
    if value is None:
        return default
    if not _is_number(value) or not (low < value if low_open else low <= value) or value > high:
        raise bad(f"{name} must be a number in {'(' if low_open else '['}{low:g}, {high:g}], got {value!r}", name)
    return float(value)


def _int_in(body: dict, name: str, low: int, high: int, default: int = 0) -> int:
    value = body.get(name)
    if value is None:
        return default
    if not _is_int(value) or not low <= value <= high:
        raise bad(f"{name} must be an integer from {low} to {high}, got {value!r}", name)
    return value


def _bool(body: dict, name: str, default: bool = False) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise bad(f"{name} must be true or false, got {value!r}", name)
    return value


def _vllm_extras(body: dict) -> tuple[tuple[str, object], ...]:
    """vLLM's further sampling parameters, in vLLM's ranges (0 / empty: off)."""
    bound = MODEL_NODE.max_penalty
    out = {
        "presence_penalty": _number_in(body, "presence_penalty", -bound, bound, 0.0),
        "frequency_penalty": _number_in(body, "frequency_penalty", -bound, bound, 0.0),
        "repetition_penalty": _number_in(body, "repetition_penalty", 0, bound, 1.0, low_open=True),
        "min_p": _number_in(body, "min_p", 0, 1, 0.0),
        "min_tokens": _int_in(body, "min_tokens", 0, MODEL_NODE.max_new_tokens),
        "ignore_eos": _bool(body, "ignore_eos"),
    }
    ids = body.get("stop_token_ids")
    if ids is not None:
        if not isinstance(ids, list) or len(ids) > MODEL_NODE.max_stop_token_ids \
                or not all(_is_int(t) and t >= 0 for t in ids):
            raise bad(f"stop_token_ids must be a list of at most {MODEL_NODE.max_stop_token_ids} token ids",
                      "stop_token_ids")
        out["stop_token_ids"] = list(ids)
    if out["repetition_penalty"] == 1.0:
        out["repetition_penalty"] = 0.0  # the wire's "off"
    return tuple((k, v) for k, v in out.items() if v)


def _logit_bias(body: dict) -> tuple[tuple[int, float], ...]:
    value = body.get("logit_bias")
    if value is None:
        return ()
    if not isinstance(value, dict) or len(value) > MODEL_NODE.max_logit_bias:
        raise bad(f"logit_bias must map at most {MODEL_NODE.max_logit_bias} token ids to biases", "logit_bias")
    out = []
    for token, bias in value.items():
        if not (str(token).isascii() and str(token).isdigit()) or not _is_number(bias) or not -100 <= bias <= 100:
            raise bad("logit_bias maps token ids (as strings) to numbers in [-100, 100]", "logit_bias")
        out.append((int(token), float(bias)))
    return tuple(sorted(out))


def _logprobs(body: dict, chat: bool) -> tuple[bool, int]:
    """Chat: logprobs true/false plus top_logprobs 0..20; completions: logprobs 0..20 (OpenAI's int)."""
    limit = MODEL_NODE.max_logprobs
    if chat:
        wanted = _bool(body, "logprobs")
        top = _int_in(body, "top_logprobs", 0, limit)
        if top and not wanted:
            raise bad("top_logprobs needs logprobs: true", "top_logprobs")
        return wanted, top
    value = body.get("logprobs")
    if value is None or value is False:
        return False, 0
    if not _is_int(value) or not 0 <= value <= limit:
        raise bad(f"logprobs must be an integer from 0 to {limit}, got {value!r}", "logprobs")
    return True, value


def _structured(body: dict) -> tuple[int, str] | None:
    """response_format (text, json_object, json_schema) or vLLM's structured_outputs."""
    fmt, so = body.get("response_format"), body.get("structured_outputs")
    if fmt is not None and so is not None:
        raise bad("give response_format or structured_outputs, not both", "structured_outputs")
    if so is not None:
        return _structured_outputs(so)
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return (Structured.JSON_OBJECT, "")
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise bad("response_format json_schema needs json_schema.schema (a JSON schema object)",
                      "response_format")
        return (Structured.JSON_SCHEMA, _bounded_json(schema, "response_format"))
    raise bad("response_format type must be text, json_object or json_schema", "response_format")


def _structured_outputs(so: Any) -> tuple[int, str]:
    kinds = {"json": Structured.JSON_SCHEMA, "regex": Structured.REGEX, "choice": Structured.CHOICE,
             "grammar": Structured.GRAMMAR, "json_object": Structured.JSON_OBJECT}
    given = [k for k in kinds if isinstance(so, dict) and so.get(k) not in (None, False)]
    if len(given) != 1:
        raise bad(f"structured_outputs takes exactly one of {', '.join(kinds)}", "structured_outputs")
    key, value = given[0], so[given[0]]
    if key == "json_object":
        return (Structured.JSON_OBJECT, "")
    if key == "json":
        value = json.loads(value) if isinstance(value, str) else value
        if not isinstance(value, dict):
            raise bad("structured_outputs.json is a JSON schema", "structured_outputs")
        return (Structured.JSON_SCHEMA, _bounded_json(value, "structured_outputs"))
    if key == "choice":
        if not isinstance(value, list) or not value or not all(isinstance(c, str) for c in value):
            raise bad("structured_outputs.choice is a non-empty list of strings", "structured_outputs")
        return (Structured.CHOICE, _bounded_json(value, "structured_outputs"))
    if not isinstance(value, str) or not value:
        raise bad(f"structured_outputs.{key} is a non-empty string", "structured_outputs")
    return (kinds[key], _bounded(value, "structured_outputs"))


def _bounded(text: str, name: str) -> str:
    if len(text.encode()) > MODEL_NODE.max_tools_bytes:
        raise bad(f"{name} is larger than {MODEL_NODE.max_tools_bytes} bytes", name)
    return text


def _bounded_json(value: Any, name: str) -> str:
    return _bounded(canonical_json(value), name)


def _tools(body: dict) -> tuple[str, str, bool]:
    """tools (function tools), tool_choice and parallel_tool_calls, as OpenAI defines them."""
    tools, choice = body.get("tools"), body.get("tool_choice")
    parallel = _bool(body, "parallel_tool_calls", True)
    if not tools:
        if choice not in (None, "none", "auto"):
            raise bad("tool_choice needs tools", "tool_choice")
        return "", "", parallel
    if not isinstance(tools, list) or len(tools) > MODEL_NODE.max_tool_calls:
        raise bad(f"tools must be a list of at most {MODEL_NODE.max_tool_calls} function tools", "tools")
    names = []
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type", "function") != "function" or not isinstance(fn, dict) \
                or not isinstance(fn.get("name"), str) or not 1 <= len(fn["name"]) <= 256 \
                or not isinstance(fn.get("parameters", {}), dict):
            raise bad(f"tools[{i}] must be {{'type': 'function', 'function': {{'name': ..., 'parameters': {{...}}}}}}",
                      f"tools[{i}]")
        names.append(fn["name"])
    canonical = _bounded_json([{"type": "function", "function": t["function"]} for t in tools], "tools")
    if choice is None:
        choice = "auto"
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name") if choice.get("type") == "function" else None
        if name not in names:
            raise bad("tool_choice names a function that is not among the tools", "tool_choice")
        choice = name
    elif choice not in ("none", "auto", "required"):
        raise bad("tool_choice is none, auto, required or {'type': 'function', 'function': {'name': ...}}",
                  "tool_choice")
    return canonical, choice, parallel


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


# --------------------------------------------------------------------------- fields taken

#: what each kind of request takes; any other field is ignored and named (AskSpec.ignored), as vLLM
#: ignores fields it does not use (OpenAIBaseModel: "The following fields were present ... ignored")
SAMPLING_FIELDS = {"temperature", "top_p", "top_k", "seed", "stop", "presence_penalty", "frequency_penalty",
                   "repetition_penalty", "min_p", "min_tokens", "stop_token_ids", "ignore_eos", "logit_bias", "n",
                   "stream", "stream_options", "user", "model", "structured_outputs", "response_format"}
CHAT_FIELDS = SAMPLING_FIELDS | {"messages", "max_tokens", "max_completion_tokens", "logprobs", "top_logprobs",
                                 "tools", "tool_choice", "parallel_tool_calls", "safety_identifier"}
COMPLETION_FIELDS = SAMPLING_FIELDS | {"prompt", "max_tokens", "logprobs"}


def _check_fields(body: Any, supported: set[str]) -> tuple[dict, tuple[str, ...]]:
    if not isinstance(body, dict):
        raise bad("the request body must be a JSON object")
    return body, tuple(sorted(name for name in body if name not in supported))


def _n(body: dict, params: UserApiParams) -> int:
    return _int_in(body, "n", 1, params.max_choices, 1)


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


def parse_messages(messages: Any) -> tuple[tuple[tuple[str, str], ...], tuple[str, ...]]:
    """(role, content) per message, and what tool calling adds to each (canonical JSON or "")."""
    if not isinstance(messages, list) or not messages:
        raise bad("messages must be a non-empty list of {role, content} objects", "messages")
    if len(messages) > MODEL_NODE.max_chat_messages:
        raise bad(f"{len(messages)} messages; at most {MODEL_NODE.max_chat_messages}", "messages")
    out, extras = [], []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise bad(f"{where} must be an object with role and content", where)
        role = m.get("role")
        role = ROLE_ALIASES.get(role, role) if isinstance(role, str) else None
        if role not in ROLES:
            raise bad(f"{where}.role {m.get('role')!r} is not supported; use one of "
                      f"{', '.join(sorted(ROLES | set(ROLE_ALIASES)))}", f"{where}.role")
        extra = _message_tools(m, role, where)
        content = m.get("content")
        if content is None and not extra.get("tool_calls"):
            raise bad(f"{where}.content is required", f"{where}.content")
        out.append((role, "" if content is None else _content(content, f"{where}.content")))
        extras.append(canonical_json(extra) if extra else "")
    if not any(c.strip() for _, c in out) and not any(extras):
        raise bad("every message is empty", "messages")
    _check_size(sum(len(r) + len(c.encode()) + len(e) for (r, c), e in zip(out, extras)))
    return tuple(out), tuple(extras) if any(extras) else ()


def _message_tools(m: dict, role: str, where: str) -> dict:
    """An assistant message's tool_calls and a tool message's tool_call_id (OpenAI's shapes)."""
    extra: dict = {}
    calls = m.get("tool_calls")
    if calls:
        if role != "assistant" or not isinstance(calls, list) or len(calls) > MODEL_NODE.max_tool_calls:
            raise bad(f"{where}.tool_calls: a list of at most {MODEL_NODE.max_tool_calls} calls, on assistant "
                      "messages", f"{where}.tool_calls")
        out = []
        for c in calls:
            fn = c.get("function") if isinstance(c, dict) else None
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"] \
                    or not isinstance(fn.get("arguments", ""), str) or not isinstance(c.get("id", ""), str):
                raise bad(f"{where}.tool_calls: each is {{'id', 'type': 'function', 'function': {{'name', "
                          "'arguments'}}}}", f"{where}.tool_calls")
            out.append({"id": c.get("id", ""), "type": "function",
                        "function": {"name": fn["name"], "arguments": fn.get("arguments", "")}})
        extra["tool_calls"] = out
    call_id = m.get("tool_call_id")
    if call_id is not None:
        if role != "tool" or not isinstance(call_id, str) or len(call_id) > 256:
            raise bad(f"{where}.tool_call_id (a string) goes with role tool", f"{where}.tool_call_id")
        extra["tool_call_id"] = call_id
    name = m.get("name")
    if name and isinstance(name, str) and role == "tool":
        extra["name"] = name[:256]
    return extra


def _check_size(size: int) -> None:
    if size > WIRE.max_prompt_bytes:
        raise ApiError(413, f"the prompt is {size} bytes; at most {WIRE.max_prompt_bytes} can be sent",
                       param="messages", code="request_too_large")


# --------------------------------------------------------------------------- request kinds


def parse_chat(body: Any, params: UserApiParams = USER_API) -> AskSpec:
    """POST /v1/chat/completions."""
    body, ignored = _check_fields(body, CHAT_FIELDS)
    messages, extras = parse_messages(body.get("messages"))
    stream, usage = _stream(body)
    for name in ("user", "safety_identifier"):
        _private_string(body, name)
    limits = [_max_tokens(body[name], name) for name in ("max_completion_tokens", "max_tokens")
              if body.get(name) is not None]
    logprobs, top = _logprobs(body, chat=True)
    tools, choice, parallel = _tools(body)
    return AskSpec(
        model=_model(body), messages=messages, message_extras=extras,
        max_tokens=limits[0] if limits else params.max_tokens, **_sampling(body, params), stream=stream,
        include_usage=usage, logprobs=logprobs, extras=_with_top(_vllm_extras(body), top), tools=tools,
        tool_choice=choice, parallel_tool_calls=parallel, n=_n(body, params), ignored=ignored)


def _with_top(extras: tuple, top: int) -> tuple:
    return extras + ((("top_logprobs", top),) if top else ())


def _sampling(body: dict, params: UserApiParams) -> dict:
    t, p, k = body.get("temperature"), body.get("top_p"), body.get("top_k")
    return {"temperature": params.temperature if t is None else _temperature(t),
            "top_p": params.top_p if p is None else _top_p(p), "top_k": 0 if k is None else _top_k(k),
            "seed": _seed(body.get("seed")), "stop": _stop(body.get("stop")), "logit_bias": _logit_bias(body),
            "structured": _structured(body)}


def parse_completion(body: Any, params: UserApiParams = USER_API) -> AskSpec:
    """POST /v1/completions: one raw prompt, no chat template."""
    body, ignored = _check_fields(body, COMPLETION_FIELDS)
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
    logprobs, top = _logprobs(body, chat=False)
    return AskSpec(model=_model(body), prompt=prompt,
                   max_tokens=params.completion_max_tokens if limit is None else _max_tokens(limit, "max_tokens"),
                   **_sampling(body, params), stream=stream, include_usage=usage, logprobs=logprobs,
                   extras=_with_top(_vllm_extras(body), top), n=_n(body, params), ignored=ignored)


RESPONSES_FIELDS = {"model", "input", "instructions", "max_output_tokens", "temperature", "top_p", "top_k", "seed",
                    "stream", "user", "safety_identifier", "store", "text"}


def parse_responses(body: Any, params: UserApiParams = USER_API) -> tuple[AskSpec, str | None, int | None]:
    """POST /v1/responses, for text: `input` (a string or a list of messages whose content is a
    string or input_text parts), `instructions` as the system message. Returns the ask, the
    instructions and max_output_tokens as given (echoed in the response object)."""
    body, ignored = _check_fields(body, RESPONSES_FIELDS)
    if body.get("previous_response_id") is not None or body.get("conversation") is not None:
        raise bad("this node keeps no responses: send the whole conversation in `input` (previous_response_id and "
                  "conversation are not supported)", "previous_response_id", "unsupported_parameter")
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise bad("instructions must be a string", "instructions")
    raw = body.get("input")
    if isinstance(raw, str):
        raw = [{"role": "user", "content": raw}]
    if not isinstance(raw, list) or not raw:
        raise bad("input must be a string or a non-empty list of messages", "input")
    messages = [{"role": m.get("role"), "content": _response_content(m.get("content"), f"input[{i}].content")}
                if isinstance(m, dict) and m.get("type", "message") == "message" else _not_a_message(i)
                for i, m in enumerate(raw)]
    if instructions:
        messages = [{"role": "system", "content": instructions}] + messages
    parsed, _ = parse_messages(messages)
    stream, _ = _stream({"stream": body.get("stream")})
    _private_string(body, "user")
    fmt = (body.get("text") or {}).get("format") if isinstance(body.get("text"), dict) else None
    if fmt not in (None, {"type": "text"}):
        ignored += ("text.format",)
    limit = body.get("max_output_tokens")
    spec = AskSpec(model=_model(body), messages=parsed,
                   max_tokens=params.max_tokens if limit is None else _max_tokens(limit, "max_output_tokens"),
                   **_sampling({k: body.get(k) for k in ("temperature", "top_p", "top_k", "seed")}, params),
                   stream=stream, ignored=ignored)
    return spec, instructions, limit


def _response_content(value: Any, where: str) -> str:
    if isinstance(value, list):  # input_text / output_text parts (what the SDK sends back)
        value = [{"type": "text", "text": p.get("text")} if isinstance(p, dict) and p.get("type") in
                 ("input_text", "output_text", "text") else p for p in value]
    return _content(value, where)


def _not_a_message(i: int):
    raise bad(f"input[{i}]: only messages are supported (text in, text out)", f"input[{i}]", "unsupported_parameter")


TOKENIZE_FIELDS = {"model", "prompt", "messages", "add_special_tokens", "add_generation_prompt"}


def parse_tokenize(body: Any) -> AskSpec:
    """POST /tokenize (vLLM's): a prompt, or chat messages (the chat template applies)."""
    body, ignored = _check_fields(body, TOKENIZE_FIELDS)
    if ("prompt" in body) == ("messages" in body):
        raise bad("give prompt or messages", "prompt")
    if "prompt" in body:
        if not isinstance(body["prompt"], str) or not body["prompt"]:
            raise bad("prompt must be a non-empty string", "prompt")
        _check_size(len(body["prompt"].encode()))
        return AskSpec(model=_model(body), prompt=body["prompt"], ignored=ignored)
    messages, extras = parse_messages(body["messages"])
    return AskSpec(model=_model(body), messages=messages, message_extras=extras, ignored=ignored)


def parse_detokenize(body: Any) -> tuple[str, list[int]]:
    """POST /detokenize (vLLM's): {"model", "tokens": [ids]}."""
    body, _ = _check_fields(body, {"model", "tokens"})
    tokens = body.get("tokens")
    if not isinstance(tokens, list) or len(tokens) > MODEL_NODE.max_detokenize_ids \
            or not all(_is_int(t) and 0 <= t < 2 ** 31 for t in tokens):
        raise bad(f"tokens must be a list of at most {MODEL_NODE.max_detokenize_ids} token ids", "tokens")
    return _model(body), tokens


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
