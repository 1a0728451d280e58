"""The GenerateRequest: built by askers (`make_request`), checked once by model nodes (`parse_*`).

Users and verifiers build their asks with the same function, so a challenge is byte-for-byte
an ordinary ask. Everything a client controls is bounded here, in plain code with no engine attached, so bad
input is refused with a message that says what is wrong and the engine never sees it (vLLM
would raise deep inside its own stack, or worse, accept a temperature of 1e9). Proto3 has no
"unset" for scalars: 0 means "default" for top_p and repetition_penalty (1), max_tokens 0 means
"until the context ends" (vLLM's default), and temperature 0 is greedy.

Beyond temperature, top_p, top_k, seed and stop, a request may carry what vLLM's OpenAI server
accepts and the engine does itself: penalties, min_p, min_tokens, stop token ids, ignore_eos,
logit bias, top logprobs, guided decoding (`StructuredOutput`: a JSON schema, any JSON object,
a regex, a choice, a grammar), tools with a tool choice, and two operations that run no
generation (TOKENIZE, DETOKENIZE). `is_plain` says whether a request is one whose reply the
committee can score by teacher forcing (gentorrent/audits.py: only those are audited).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, replace

from gentorrent.config import AUDIT_COMMITMENT_BYTES, MODEL_NODE, WIRE, ModelNodeParams, WireLimits
from gentorrent.wire import gentorrent_pb2 as pb

ROLES = frozenset({"system", "user", "assistant", "tool"})
Structured = pb.StructuredOutput


class BadRequestError(ValueError):
    """The request is malformed or out of bounds (gRPC INVALID_ARGUMENT).

    `code` names the kind of mistake in OpenAI's error vocabulary; it travels back to the
    asker in the reply (`reply_error`), so the user's node answers 400 at once instead of
    trying other model nodes that would refuse the same request the same way."""

    code = "invalid_request"


class WrongModelError(BadRequestError):
    """The request names a model this node does not serve (gRPC NOT_FOUND)."""

    code = "model_not_found"


class ContextLengthError(BadRequestError):
    """The prompt (plus what must follow it) does not fit the model's context."""

    code = "context_length_exceeded"


#: reply error codes that mean "the request is wrong", not "this node failed"
CLIENT_ERROR_CODES = frozenset({"invalid_request", "model_not_found", "context_length_exceeded"})


def reply_error(exc: BaseException) -> str:
    """The text of a failed reply (GenerateChunk.error): "code: message", where the code says
    whether the request or the node is to blame (`client_error_code` reads it back)."""
    code = getattr(exc, "code", None)
    if isinstance(code, str):  # BadRequestError and its kinds; the model node's BusyError ("busy")
        return f"{code}: {exc}"[:300]
    return f"engine_error: {type(exc).__name__}: {exc}"[:300]


def client_error_code(error: str) -> str | None:
    """The client-error code of a reply error, or None when the node (not the request) failed."""
    code, sep, _ = error.partition(": ")
    return code if sep and code in CLIENT_ERROR_CODES else None


@dataclass(frozen=True)
class Sampling:
    """Validated sampling parameters, in the engine's terms."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0  # 0: disabled
    max_tokens: int | None = None  # None: until the context ends
    seed: int | None = None
    stop: tuple[str, ...] = ()
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_p: float = 0.0
    min_tokens: int = 0
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logit_bias: tuple[tuple[int, float], ...] = ()
    top_logprobs: int = 0
    structured: tuple[int, str] | None = None  # (StructuredOutput.Kind, spec)

    @property
    def reshapes_distribution(self) -> bool:
        """Whether tokens are drawn from anything but the model's own (tempered, truncated)
        distribution: a teacher-forced score of the reply would not measure the model."""
        return (self.presence_penalty != 0 or self.frequency_penalty != 0 or self.repetition_penalty != 1.0
                or self.min_tokens > 0 or self.ignore_eos or bool(self.logit_bias) or self.structured is not None)


@dataclass(frozen=True)
class Prompt:
    """A raw prompt or a chat transcript (the chat template is applied by the engine), with the
    tools the template shows the model (canonical JSON) and, per message, what a tool-calling
    conversation adds to it (`extras`: canonical JSON of tool_calls / tool_call_id, or "")."""

    text: str = ""
    messages: tuple[tuple[str, str], ...] = ()
    tools: str = ""
    extras: tuple[str, ...] = ()

    @property
    def is_chat(self) -> bool:
        return bool(self.messages)

    def template_messages(self) -> list[dict]:
        """The messages as a chat template takes them (tool calls as OpenAI's JSON)."""
        out = []
        for i, (role, content) in enumerate(self.messages):
            message: dict = {"role": role, "content": content}
            extra = self.extras[i] if i < len(self.extras) else ""
            if extra:
                message.update(json.loads(extra))
            out.append(message)
        return out

    def template_tools(self) -> list[dict] | None:
        return json.loads(self.tools) if self.tools else None


def check_model(requested: str, served: str) -> None:
    if requested and requested != served:
        raise WrongModelError(f"this node serves {served!r}, not {requested!r}")


def canonical_json(value) -> str:
    """One JSON text per value (sorted keys, no spaces): what hashes and the wire carry."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _tool_calls(calls, params: ModelNodeParams) -> list[dict]:
    if len(calls) > params.max_tool_calls:
        raise BadRequestError(f"{len(calls)} tool calls in one message; at most {params.max_tool_calls}")
    out = []
    for c in calls:
        if not c.name or len(c.name) > 256 or len(c.id) > 256:
            raise BadRequestError("a tool call names its function (1..256 characters) and an id of at most 256")
        out.append({"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}})
    return out


def _message_extras(m, params: ModelNodeParams) -> str:
    extra: dict = {}
    if m.tool_calls:
        if m.role != "assistant":
            raise BadRequestError("only assistant messages carry tool calls")
        extra["tool_calls"] = _tool_calls(m.tool_calls, params)
    if m.tool_call_id:
        if m.role != "tool" or len(m.tool_call_id) > 256:
            raise BadRequestError("tool_call_id (at most 256 characters) goes with role tool only")
        extra["tool_call_id"] = m.tool_call_id
    if m.name:
        if len(m.name) > 256:
            raise BadRequestError("a message's name is at most 256 characters")
        extra["name"] = m.name
    return canonical_json(extra) if extra else ""


def parse_tools(tools_json: str, params: ModelNodeParams = MODEL_NODE) -> str:
    """OpenAI's `tools` (a JSON list of function tools), bounded; returned canonical."""
    if not tools_json:
        return ""
    if len(tools_json.encode()) > params.max_tools_bytes:
        raise BadRequestError(f"tools are larger than {params.max_tools_bytes} bytes")
    try:
        tools = json.loads(tools_json)
    except ValueError as exc:
        raise BadRequestError(f"tools are not JSON: {exc}") from None
    if not isinstance(tools, list) or not 1 <= len(tools) <= params.max_tool_calls:
        raise BadRequestError(f"tools must be a list of 1 to {params.max_tool_calls} function tools")
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(fn, dict) \
                or not isinstance(fn.get("name"), str) or not 1 <= len(fn["name"]) <= 256 \
                or not isinstance(fn.get("parameters", {}), dict):
            raise BadRequestError(f"tools[{i}] must be {{'type': 'function', 'function': {{'name': ..., "
                                  "'parameters': {...}}}")
    return canonical_json(tools)


def tool_names(tools: str) -> list[str]:
    return [t["function"]["name"] for t in json.loads(tools)] if tools else []


def parse_prompt(prompt: str, messages, params: ModelNodeParams = MODEL_NODE,
                 wire: WireLimits = WIRE, tools_json: str = "") -> Prompt:
    msgs = list(messages)
    if prompt and msgs:
        raise BadRequestError("give either a prompt or chat messages, not both")
    if len(msgs) > params.max_chat_messages:
        raise BadRequestError(f"{len(msgs)} chat messages; at most {params.max_chat_messages}")
    size = len(prompt.encode()) + sum(len(m.content.encode()) + len(m.role.encode()) for m in msgs)
    if size > wire.max_prompt_bytes:
        raise BadRequestError(f"prompt is {size} bytes; at most {wire.max_prompt_bytes}")
    if msgs:
        for i, m in enumerate(msgs):
            if m.role not in ROLES:
                raise BadRequestError(f"message {i}: role {m.role!r} is not one of {sorted(ROLES)}")
        if not any(m.content.strip() or m.tool_calls for m in msgs):
            raise BadRequestError("all chat messages are empty")
        extras = tuple(_message_extras(m, params) for m in msgs)
        return Prompt(messages=tuple((m.role, m.content) for m in msgs), tools=parse_tools(tools_json, params),
                      extras=extras if any(extras) else ())
    if tools_json:
        raise BadRequestError("tools go with chat messages, not with a raw prompt")
    if not prompt.strip():
        raise BadRequestError("empty prompt")
    return Prompt(text=prompt)


def parse_sampling(s: pb.SamplingParams, params: ModelNodeParams = MODEL_NODE) -> Sampling:
    t, p = s.temperature, s.top_p
    if not math.isfinite(t) or not 0.0 <= t <= params.max_temperature:
        raise BadRequestError(f"temperature {t} is outside [0, {params.max_temperature}]")
    if not math.isfinite(p) or not 0.0 <= p <= 1.0:
        raise BadRequestError(f"top_p {p} is outside (0, 1] (0 means 1)")
    if s.top_k < -1 or s.top_k > params.max_top_k:
        raise BadRequestError(f"top_k {s.top_k} is outside [-1, {params.max_top_k}] (0 or -1: off)")
    if s.max_tokens < 0 or s.max_tokens > params.max_new_tokens:
        raise BadRequestError(f"max_tokens {s.max_tokens} is outside [1, {params.max_new_tokens}] (0: default)")
    if len(s.stop) > params.max_stop_strings:
        raise BadRequestError(f"{len(s.stop)} stop strings; at most {params.max_stop_strings}")
    for x in s.stop:
        if not x or len(x) > params.max_stop_chars:
            raise BadRequestError(f"stop strings must have 1..{params.max_stop_chars} characters")
    _check_vllm_sampling(s, params)
    return Sampling(
        temperature=float(t), top_p=float(p) if p > 0 else 1.0, top_k=max(s.top_k, 0),
        max_tokens=s.max_tokens or None, seed=int(s.seed) if s.has_seed else None, stop=tuple(s.stop),
        presence_penalty=float(s.presence_penalty), frequency_penalty=float(s.frequency_penalty),
        repetition_penalty=float(s.repetition_penalty) or 1.0, min_p=float(s.min_p), min_tokens=s.min_tokens,
        stop_token_ids=tuple(s.stop_token_ids), ignore_eos=s.ignore_eos,
        logit_bias=tuple((b.token_id, float(b.bias)) for b in s.logit_bias), top_logprobs=s.top_logprobs,
    )


def _check_vllm_sampling(s: pb.SamplingParams, params: ModelNodeParams) -> None:
    """vLLM's further sampling parameters, within vLLM's own ranges."""
    bound = params.max_penalty
    for name in ("presence_penalty", "frequency_penalty"):
        v = getattr(s, name)
        if not math.isfinite(v) or not -bound <= v <= bound:
            raise BadRequestError(f"{name} {v} is outside [-{bound:g}, {bound:g}]")
    r = s.repetition_penalty
    if not math.isfinite(r) or not 0 <= r <= bound:
        raise BadRequestError(f"repetition_penalty {r} is outside (0, {bound:g}] (0 means 1: off)")
    if not math.isfinite(s.min_p) or not 0 <= s.min_p <= 1:
        raise BadRequestError(f"min_p {s.min_p} is outside [0, 1]")
    if s.max_tokens and s.min_tokens > s.max_tokens:
        raise BadRequestError(f"min_tokens {s.min_tokens} is above max_tokens {s.max_tokens}")
    if s.min_tokens > params.max_new_tokens:
        raise BadRequestError(f"min_tokens {s.min_tokens} is above {params.max_new_tokens}")
    if len(s.stop_token_ids) > params.max_stop_token_ids or any(t < 0 for t in s.stop_token_ids):
        raise BadRequestError(f"at most {params.max_stop_token_ids} stop token ids, each non-negative")
    if len(s.logit_bias) > params.max_logit_bias:
        raise BadRequestError(f"{len(s.logit_bias)} logit biases; at most {params.max_logit_bias}")
    for b in s.logit_bias:
        if b.token_id < 0 or not math.isfinite(b.bias) or not -100 <= b.bias <= 100:
            raise BadRequestError("a logit bias names a token id >= 0 and a bias in [-100, 100]")
    if s.top_logprobs > params.max_logprobs:
        raise BadRequestError(f"top_logprobs {s.top_logprobs} is above {params.max_logprobs}")


def parse_structured(st: pb.StructuredOutput, params: ModelNodeParams = MODEL_NODE) -> tuple[int, str] | None:
    """Guided decoding, bounded: a schema or a choice must be JSON of the right shape."""
    if st.kind == Structured.NONE:
        if st.spec:
            raise BadRequestError("a structured output spec needs its kind")
        return None
    if st.kind not in Structured.Kind.values():
        raise BadRequestError(f"unknown structured output kind {st.kind}")
    if len(st.spec.encode()) > params.max_tools_bytes:
        raise BadRequestError(f"a structured output spec is at most {params.max_tools_bytes} bytes")
    if st.kind == Structured.JSON_OBJECT:
        return (st.kind, "")
    if not st.spec:
        raise BadRequestError("a structured output of this kind needs its spec (schema, regex, choices, grammar)")
    if st.kind in (Structured.JSON_SCHEMA, Structured.CHOICE):
        try:
            value = json.loads(st.spec)
        except ValueError as exc:
            raise BadRequestError(f"the structured output spec is not JSON: {exc}") from None
        if st.kind == Structured.JSON_SCHEMA and not isinstance(value, dict):
            raise BadRequestError("a JSON schema is a JSON object")
        if st.kind == Structured.CHOICE and (not isinstance(value, list) or not value
                                             or not all(isinstance(c, str) for c in value)):
            raise BadRequestError("a choice is a non-empty JSON list of strings")
    return (st.kind, st.spec)


def parse_tool_choice(choice: str, tools: str) -> str:
    """"", none, auto (without tools: no effect), required or the name of a given tool."""
    if choice in ("", "none", "auto"):
        return choice
    if tools and (choice == "required" or choice in tool_names(tools)):
        return choice
    raise BadRequestError(f"tool_choice {choice[:80]!r} is none, auto, required or the name of a given tool"
                          + ("" if tools else " (and needs tools)"))


@dataclass(frozen=True)
class GenerateJob:
    prompt: Prompt
    sampling: Sampling
    operation: int = pb.GenerateRequest.GENERATE
    tool_choice: str = ""
    parallel_tool_calls: bool = False
    token_ids: tuple[int, ...] = ()  # DETOKENIZE's input

    @property
    def calls_tools(self) -> bool:
        """The reply may be tool calls (the model node's tool parser reads the output)."""
        return bool(self.prompt.tools) and self.tool_choice != "none"


def parse_generate(req: pb.GenerateRequest, served_model: str,
                   params: ModelNodeParams = MODEL_NODE) -> GenerateJob:
    """Validate a GenerateRequest; raises BadRequestError (or WrongModelError)."""
    check_model(req.model, served_model)
    if len(req.request_id) > 128 or len(req.session_id) > 128:
        raise BadRequestError("request_id and session_id are at most 128 characters")
    if len(req.audit_commitment) not in (0, AUDIT_COMMITMENT_BYTES):
        raise BadRequestError(f"audit_commitment is empty or {AUDIT_COMMITMENT_BYTES} bytes")
    if req.operation not in pb.GenerateRequest.Operation.values():
        raise BadRequestError(f"unknown operation {req.operation}")
    if req.operation == pb.GenerateRequest.DETOKENIZE:
        if len(req.prompt_token_ids) > params.max_detokenize_ids or any(t < 0 for t in req.prompt_token_ids):
            raise BadRequestError(f"detokenize takes at most {params.max_detokenize_ids} non-negative token ids")
        return GenerateJob(Prompt(), Sampling(), req.operation, token_ids=tuple(req.prompt_token_ids))
    if req.prompt_token_ids:
        raise BadRequestError("prompt_token_ids go with the detokenize operation only")
    prompt = parse_prompt(req.prompt, req.messages, params, tools_json=req.tools_json)
    sampling = parse_sampling(req.sampling, params)
    structured = parse_structured(req.structured, params)
    if structured is not None:
        sampling = replace(sampling, structured=structured)
    return GenerateJob(prompt, sampling, req.operation, parse_tool_choice(req.tool_choice, prompt.tools),
                       req.parallel_tool_calls)


def is_plain(req: pb.GenerateRequest) -> bool:
    """A request whose reply the committee can score by teacher forcing with the reference
    model: a generation from the model's own distribution (temperature, top_p, top_k, seed,
    stop shape it, which the scoring allows for), no tools in the prompt, no guided decoding,
    penalties, logit bias or forced length. Guided decoding and penalties change each token's
    distribution by rules the scoring pass does not apply (a grammar mask, counts of earlier
    tokens), so an honest reply could score as a cheater's; such replies are never audited
    (gentorrent/audits.py), and challenges are never drawn with them."""
    s = req.sampling
    return (req.operation == pb.GenerateRequest.GENERATE and not req.tools_json
            and req.structured.kind == Structured.NONE and not any(m.tool_calls or m.tool_call_id
                                                                   for m in req.messages)
            and s.presence_penalty == 0 and s.frequency_penalty == 0 and s.repetition_penalty in (0, 1)
            and s.min_tokens == 0 and not s.ignore_eos and not s.logit_bias)


@dataclass(frozen=True)
class ScoreJob:
    prompt: Prompt
    text: str
    token_ids: tuple[int, ...]
    top_k: int


def parse_score(req: pb.ScoreRequest, served_model: str,
                params: ModelNodeParams = MODEL_NODE, wire: WireLimits = WIRE) -> ScoreJob:
    check_model(req.model, served_model)
    prompt = parse_prompt(req.prompt, req.messages, params, wire)
    if bool(req.text) == bool(req.token_ids):
        raise BadRequestError("give exactly one of text or token_ids to score")
    if len(req.text.encode()) > wire.max_prompt_bytes:
        raise BadRequestError(f"text to score is larger than {wire.max_prompt_bytes} bytes")
    if req.top_k > params.max_score_top_k:
        raise BadRequestError(f"top_k {req.top_k} is above {params.max_score_top_k}")
    if any(t < 0 for t in req.token_ids):
        raise BadRequestError("token ids are non-negative")
    return ScoreJob(prompt, req.text, tuple(req.token_ids), req.top_k)


#: the vLLM sampling extras make_request takes (keyword -> SamplingParams field); 0/empty: off
SAMPLING_EXTRAS = ("presence_penalty", "frequency_penalty", "repetition_penalty", "min_p", "min_tokens",
                   "stop_token_ids", "ignore_eos", "top_logprobs")


def make_request(prompt: str | None = None, messages: list[dict] | None = None,
                 model: str = MODEL_NODE.default_model, max_tokens: int | None = 64, temperature: float = 0.0,
                 top_p: float = 1.0, seed: int | None = None, stop: list[str] | None = None,
                 session: str | None = None, stream: bool = False, top_k: int = 0,
                 audit_commitment: bytes | None = None, logprobs: bool = False,
                 logit_bias: dict[int, float] | None = None, structured: tuple[int, str] | None = None,
                 tools: str = "", tool_choice: str = "", parallel_tool_calls: bool = False,
                 operation: int = pb.GenerateRequest.GENERATE, token_ids: list[int] | None = None,
                 **extras) -> pb.GenerateRequest:
    """The GenerateRequest an ask carries (the same for users and verifiers' challenges).

    `max_tokens` None: until the context ends. `messages` are OpenAI's chat messages (role,
    content, and for tool calling `tool_calls` / `tool_call_id`); `tools` is canonical JSON.
    `extras` are the vLLM sampling parameters in SAMPLING_EXTRAS.
    Every ask carries an audit commitment: the asker's (gentorrent/audits.py) or, when it will
    never audit, 32 random bytes that look the same, so a commitment marks no ask."""
    if operation != pb.GenerateRequest.DETOKENIZE and (prompt is None) == (messages is None):
        raise ValueError("give exactly one of prompt or messages")
    unknown = set(extras) - set(SAMPLING_EXTRAS)
    if unknown:
        raise TypeError(f"unknown sampling parameters {sorted(unknown)}")
    sampling = pb.SamplingParams(temperature=temperature, top_p=top_p, max_tokens=max_tokens or 0, top_k=top_k,
                                 has_seed=seed is not None, seed=seed or 0, stop=stop or [],
                                 **{k: v for k, v in extras.items() if v})
    sampling.logit_bias.extend(pb.LogitBias(token_id=int(t), bias=float(b)) for t, b in (logit_bias or {}).items())
    commitment = os.urandom(AUDIT_COMMITMENT_BYTES) if audit_commitment is None else audit_commitment
    request = pb.GenerateRequest(model=model, sampling=sampling, session_id=session or "", stream=stream,
                                 audit_commitment=commitment, return_logprobs=logprobs, tools_json=tools,
                                 tool_choice=tool_choice, parallel_tool_calls=parallel_tool_calls,
                                 operation=operation, prompt_token_ids=token_ids or [])
    if structured is not None:
        request.structured.kind, request.structured.spec = structured
    if prompt is not None:
        request.prompt = prompt
    elif messages is not None:
        request.messages.extend(chat_message(m) for m in messages)
    return request


def chat_message(m: dict) -> pb.ChatMessage:
    """An OpenAI chat message as the wire carries it."""
    calls = [pb.ToolCall(id=c.get("id", ""), name=c["function"]["name"], arguments=c["function"].get("arguments", ""))
             for c in m.get("tool_calls") or ()]
    return pb.ChatMessage(role=m["role"], content=m.get("content") or "", tool_calls=calls,
                          tool_call_id=m.get("tool_call_id") or "", name=m.get("name") or "")
