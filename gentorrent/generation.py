"""The GenerateRequest: built by askers (`make_request`), checked once by model nodes (`parse_*`).

Users and verifiers build their asks with the same function, so a challenge is byte-for-byte
an ordinary ask. Everything a client controls is bounded here, in plain code with no engine attached, so bad
input is refused with a message that says what is wrong and the engine never sees it (vLLM
would raise deep inside its own stack, or worse, accept a temperature of 1e9). Proto3 has no
"unset" for scalars: 0 means "default" for top_p and max_tokens, and temperature 0 is greedy.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from gentorrent.config import AUDIT_COMMITMENT_BYTES, MODEL_NODE, WIRE, ModelNodeParams, WireLimits
from gentorrent.wire import gentorrent_pb2 as pb

ROLES = frozenset({"system", "user", "assistant"})


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
    max_tokens: int = MODEL_NODE.default_max_tokens
    seed: int | None = None
    stop: tuple[str, ...] = ()


@dataclass(frozen=True)
class Prompt:
    """A raw prompt or a chat transcript (the chat template is applied by the engine)."""

    text: str = ""
    messages: tuple[tuple[str, str], ...] = ()

    @property
    def is_chat(self) -> bool:
        return bool(self.messages)


def check_model(requested: str, served: str) -> None:
    if requested and requested != served:
        raise WrongModelError(f"this node serves {served!r}, not {requested!r}")


def parse_prompt(prompt: str, messages, params: ModelNodeParams = MODEL_NODE,
                 wire: WireLimits = WIRE) -> Prompt:
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
        if not any(m.content.strip() for m in msgs):
            raise BadRequestError("all chat messages are empty")
        return Prompt(messages=tuple((m.role, m.content) for m in msgs))
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
    return Sampling(
        temperature=float(t), top_p=float(p) if p > 0 else 1.0, top_k=max(s.top_k, 0),
        max_tokens=s.max_tokens or params.default_max_tokens,
        seed=int(s.seed) if s.has_seed else None, stop=tuple(s.stop),
    )


@dataclass(frozen=True)
class GenerateJob:
    prompt: Prompt
    sampling: Sampling


def parse_generate(req: pb.GenerateRequest, served_model: str,
                   params: ModelNodeParams = MODEL_NODE) -> GenerateJob:
    """Validate a GenerateRequest; raises BadRequestError (or WrongModelError)."""
    check_model(req.model, served_model)
    if len(req.request_id) > 128 or len(req.session_id) > 128:
        raise BadRequestError("request_id and session_id are at most 128 characters")
    if len(req.audit_commitment) not in (0, AUDIT_COMMITMENT_BYTES):
        raise BadRequestError(f"audit_commitment is empty or {AUDIT_COMMITMENT_BYTES} bytes")
    return GenerateJob(parse_prompt(req.prompt, req.messages, params), parse_sampling(req.sampling, params))


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


def make_request(prompt: str | None = None, messages: list[dict] | None = None,
                 model: str = MODEL_NODE.default_model, max_tokens: int = 64, temperature: float = 0.0,
                 top_p: float = 1.0, seed: int | None = None, stop: list[str] | None = None,
                 session: str | None = None, stream: bool = False, top_k: int = 0,
                 audit_commitment: bytes | None = None) -> pb.GenerateRequest:
    """The GenerateRequest an ask carries (the same for users and verifiers' challenges).

    Every ask carries an audit commitment: the asker's (gentorrent/audits.py) or, when it will
    never audit, 32 random bytes that look the same, so a commitment marks no ask."""
    if (prompt is None) == (messages is None):
        raise ValueError("give exactly one of prompt or messages")
    sampling = pb.SamplingParams(temperature=temperature, top_p=top_p, max_tokens=max_tokens, top_k=top_k,
                                 has_seed=seed is not None, seed=seed or 0, stop=stop or [])
    commitment = os.urandom(AUDIT_COMMITMENT_BYTES) if audit_commitment is None else audit_commitment
    request = pb.GenerateRequest(model=model, sampling=sampling, session_id=session or "", stream=stream,
                                 audit_commitment=commitment)
    if prompt is not None:
        request.prompt = prompt
    else:
        request.messages.extend(pb.ChatMessage(role=m["role"], content=m["content"]) for m in messages)
    return request
