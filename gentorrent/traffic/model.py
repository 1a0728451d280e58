"""The traffic model: requests shaped and parametrised the way real clients send them (pure).

A request is a request shape (what the messages are) filled from real conversations, plus a
client profile (how the client samples). The committee draws challenges from it and the
selective cheater of the cheater zoo uses the same public model to label its own training
data, so everything here is seeded and deterministic: the same rng draws the same request.

Shapes (weights in TrafficParams.shape_weights):
    single    one user question (a conversation's first turn)
    system    a system prompt, then one user question
    session   a later user turn with the conversation's history before it (72 % of ShareGPT's
              user turns); the request carries a 16-hex session id, as the user node sends on
              follow-ups (user_client/api_requests.wire_session)
    document  a first user turn longer than long_document_chars (pasted text, logs, papers)
    code      a first user turn that contains code
Client profiles (weights in TrafficParams.client_weights), each from the client's own defaults:
    chat_ui        chat front-ends: streamed, temperature 0.7-1.0, top_p 0.9-1, max_tokens unset or large
    openai_sdk     a script that sets nothing: temperature 1, top_p 1, the API's max_tokens, rarely streamed
    gt_user        `gt-user ask` (USER_API): temperature 1, top_p 1, USER_API.max_tokens, streamed
    deterministic  apps that want repeatable output: temperature 0, not streamed
    tuned          callers who set their own numbers: temperature 0.2-1.2, max_tokens 128-1000
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass, replace
from typing import Sequence

from gentorrent.config import MODEL_NODE, TRAFFIC, USER_API, TrafficParams
from gentorrent.generation import ROLES, make_request
from gentorrent.traffic.corpus import Conversation
from gentorrent.wire import gentorrent_pb2 as pb

__all__ = ["ChatRequest", "TrafficPool", "Drawn", "draw", "SHAPES", "CLIENTS", "COMMON_SYSTEM_PROMPTS",
           "looks_like_code", "TrafficError", "weighted_choice", "client_sampling"]

SHAPES = ("session", "single", "system", "document", "code")
CLIENTS = ("chat_ui", "openai_sdk", "gt_user", "deterministic", "tuned")
SESSION_ID_HEX = 16  # the length of the session id user nodes put on follow-ups

#: system prompts clients ship as defaults (OpenAI's documentation examples, chat front-ends'
#: presets); the pool adds the system turns and "act as" openings found in the corpus
COMMON_SYSTEM_PROMPTS = (
    "You are a helpful assistant.",
    "You are a helpful assistant. Answer as concisely as possible.",
    "You are a helpful, respectful and honest assistant.",
    "You are an AI assistant that helps people find information.",
    "You are a friendly assistant. Keep your answers short.",
    "You are an expert programmer. Answer with code and brief explanations.",
    "You are a helpful assistant that answers in Markdown.",
    "Answer the user's question truthfully. If you don't know, say so.",
)

_CODE = re.compile(r"```|^\s*(def |class |import |from \S+ import |#include|public |private |function |const |"
                   r"let |var |SELECT |CREATE TABLE|<\?php|<div|<html|package |using |fn |func )|[;{}]\s*$",
                   re.M)
_PERSONA = re.compile(r"^\s*(you are|i want you to act as|act as|you will act as|pretend you are)\b", re.I)


class TrafficError(ValueError):
    """A request description that is malformed or out of bounds."""


def looks_like_code(text: str) -> bool:
    """A fenced block, or at least two lines that read like source code."""
    return "```" in text or len(_CODE.findall(text)) >= 2


@dataclass(frozen=True)
class ChatRequest:
    """Everything a client decides about one ask: messages, sampling, streaming, session id."""

    messages: tuple[tuple[str, str], ...]
    temperature: float = USER_API.temperature
    top_p: float = USER_API.top_p
    max_tokens: int = USER_API.max_tokens
    stream: bool = USER_API.stream
    session_id: str = ""

    @classmethod
    def question(cls, text: str, **sampling) -> "ChatRequest":
        """One user message with the user API's defaults (or the given sampling)."""
        return cls(messages=(("user", text),), **sampling)

    @property
    def text(self) -> str:
        """All message contents, for uniqueness checks."""
        return "\n".join(content for _, content in self.messages)

    def to_dict(self) -> dict:
        return {"messages": [list(m) for m in self.messages], "temperature": self.temperature, "top_p": self.top_p,
                "max_tokens": self.max_tokens, "stream": self.stream, "session_id": self.session_id}

    @classmethod
    def from_dict(cls, body: object, params: TrafficParams = TRAFFIC) -> "ChatRequest":
        """The request a dict describes; TrafficError on any malformed or out-of-bounds field."""
        try:
            messages = tuple((str(r), str(c)) for r, c in body["messages"])  # type: ignore[index]
            request = cls(messages, float(body["temperature"]), float(body["top_p"]),  # type: ignore[index]
                          int(body["max_tokens"]), body["stream"], str(body["session_id"]))  # type: ignore[index]
        except (KeyError, TypeError, ValueError) as exc:
            raise TrafficError(f"malformed request: {exc}") from exc
        request.check(params)
        return request

    @classmethod
    def from_wire(cls, request: pb.GenerateRequest, params: TrafficParams = TRAFFIC) -> "ChatRequest":
        """The chat request a wire request carries (a donated audit's: verifier/epochs/donations.py),
        without its session id; TrafficError for a raw prompt or anything out of bounds."""
        if not request.messages:
            raise TrafficError("a raw prompt is no chat request")
        s = request.sampling
        chat = cls(tuple((m.role, m.content) for m in request.messages), round(float(s.temperature), 4),
                   round(float(s.top_p), 4), int(s.max_tokens), bool(request.stream))
        chat.check(params)
        return chat

    def with_session(self, rng: random.Random) -> "ChatRequest":
        """A fresh session id when the request carries history (as user nodes send follow-ups), else none."""
        users = sum(role == "user" for role, _ in self.messages)
        session = "%0*x" % (SESSION_ID_HEX, rng.getrandbits(4 * SESSION_ID_HEX)) if users > 1 else ""
        return replace(self, session_id=session)

    def check(self, params: TrafficParams = TRAFFIC) -> None:
        if not self.messages or self.messages[-1][0] != "user":
            raise TrafficError("a request ends with a user message")
        if any(role not in ROLES for role, _ in self.messages):
            raise TrafficError("unknown role")
        if sum(len(c.encode("utf-8")) for _, c in self.messages) > params.max_prompt_bytes:
            raise TrafficError(f"transcript over {params.max_prompt_bytes} bytes")
        if not (0.0 <= self.temperature <= MODEL_NODE.max_temperature and 0.0 < self.top_p <= 1.0):
            raise TrafficError("sampling parameters out of range")
        if not 1 <= self.max_tokens <= params.max_tokens_cap or not isinstance(self.stream, bool):
            raise TrafficError("max_tokens out of range or stream not a boolean")
        if len(self.session_id) not in (0, SESSION_ID_HEX) or not all(ch in "0123456789abcdef" for ch in self.session_id):
            raise TrafficError("session id is 16 lower-case hex characters or empty")

    def canonical(self) -> bytes:
        """The bytes a commitment covers: one serialization for one request."""
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")

    def to_generate_request(self, model: str) -> pb.GenerateRequest:
        """The wire request, built by the same function every user ask goes through."""
        return make_request(messages=[{"role": r, "content": c} for r, c in self.messages], model=model,
                            max_tokens=self.max_tokens, temperature=self.temperature, top_p=self.top_p,
                            session=self.session_id or None, stream=self.stream)


# --------------------------------------------------------------------------- pools


def _size(turns: Sequence[tuple[str, str]]) -> int:
    return sum(len(c.encode("utf-8")) for _, c in turns)


@dataclass(frozen=True)
class TrafficPool:
    """The conversations of one pool, indexed by the shape each turn can fill."""

    singles: tuple[str, ...]
    documents: tuple[str, ...]
    code: tuple[str, ...]
    systems: tuple[str, ...]
    sessions: tuple[tuple[tuple[str, str], ...], ...]  # history + asked user turn, already trimmed

    @classmethod
    def build(cls, conversations: Sequence[Conversation], params: TrafficParams = TRAFFIC) -> "TrafficPool":
        singles, documents, code, systems, sessions = [], [], [], list(COMMON_SYSTEM_PROMPTS), []
        for conv in conversations:
            turns = [t for t in conv.turns if t[0] != "system"]
            systems += [c for r, c in conv.turns if r == "system" and len(c) <= 2000]
            while turns and turns[0][0] != "user":
                turns.pop(0)
            if not turns:
                continue
            first = turns[0][1]
            if _PERSONA.match(first):
                systems.append(first.split("\n\n")[0][:1000])
            if len(first) >= params.min_user_chars and len(first.encode("utf-8")) <= params.max_prompt_bytes:
                if looks_like_code(first):
                    code.append(first)
                elif len(first) > params.long_document_chars:
                    documents.append(first)
                else:
                    singles.append(first)
            for i, (role, content) in enumerate(turns[1:], start=1):
                if role == "user" and len(content) >= params.min_user_chars:
                    history = _trim(turns[max(0, i - params.max_history_turns):i + 1], params)
                    if history is not None and sum(r == "user" for r, _ in history) > 1:
                        sessions.append(tuple(history))
        if not (singles and documents and code and sessions):
            raise TrafficError("the pool lacks a shape (too few conversations)")
        return cls(tuple(singles), tuple(documents), tuple(code), tuple(dict.fromkeys(systems)), tuple(sessions))

    def user_messages(self) -> list[str]:
        """Every distinct user message a request drawn from this pool may ask: what a node that
        stored the public corpus would look an incoming prompt up in."""
        return list(dict.fromkeys([*self.singles, *self.documents, *self.code,
                                   *(c for s in self.sessions for r, c in s if r == "user")]))


def _trim(turns: list[tuple[str, str]], params: TrafficParams) -> list[tuple[str, str]] | None:
    """Oldest turns dropped until the transcript fits, starting with a user turn (as chat
    clients trim history); None when the asked turn alone does not fit."""
    turns = list(turns)
    while turns and (_size(turns) > params.max_prompt_bytes or turns[0][0] != "user"):
        turns.pop(0)
    return turns or None


# --------------------------------------------------------------------------- drawing


@dataclass(frozen=True)
class Drawn:
    shape: str
    client: str
    request: ChatRequest


def weighted_choice(rng: random.Random, weights: tuple[tuple[str, float], ...]) -> str:
    names, w = zip(*weights)
    return rng.choices(names, weights=w)[0]


def _messages(shape: str, pool: TrafficPool, rng: random.Random) -> tuple[tuple[str, str], ...]:
    if shape == "session":
        return rng.choice(pool.sessions)
    if shape == "system":
        return (("system", rng.choice(pool.systems)), ("user", rng.choice(pool.singles)))
    source = {"single": pool.singles, "document": pool.documents, "code": pool.code}[shape]
    return (("user", rng.choice(source)),)


def client_sampling(client: str, rng: random.Random, params: TrafficParams) -> dict:
    """Sampling, max_tokens and streaming as the client sets them."""
    if client == "chat_ui":
        s = dict(temperature=rng.choice((0.7, 0.7, 0.8, 1.0)), top_p=rng.choice((1.0, 1.0, 0.9, 0.95)),
                 max_tokens=rng.choice((USER_API.max_tokens, 512, 1024, 1024)), stream=True)
    elif client == "openai_sdk":
        s = dict(temperature=1.0, top_p=1.0, max_tokens=USER_API.max_tokens, stream=rng.random() < 0.3)
    elif client == "gt_user":
        s = dict(temperature=USER_API.temperature, top_p=USER_API.top_p, max_tokens=USER_API.max_tokens,
                 stream=USER_API.stream)
    elif client == "deterministic":
        s = dict(temperature=0.0, top_p=1.0, max_tokens=rng.choice((256, 512, 1024)), stream=False)
    elif client == "tuned":
        s = dict(temperature=rng.choice((0.2, 0.3, 0.5, 0.6, 0.9, 1.2)), top_p=rng.choice((1.0, 0.9, 0.8)),
                 max_tokens=rng.choice((128, 200, 300, 500, 800, 1000)), stream=rng.random() < 0.5)
    else:
        raise TrafficError(f"unknown client profile {client!r}")
    s["max_tokens"] = min(s["max_tokens"], params.max_tokens_cap, MODEL_NODE.max_new_tokens)
    return s


def draw(rng: random.Random, pool: TrafficPool, params: TrafficParams = TRAFFIC) -> Drawn:
    """One request as a real client would send it."""
    shape = weighted_choice(rng, params.shape_weights)
    client = weighted_choice(rng, params.client_weights)
    messages = _messages(shape, pool, rng)
    sampling = client_sampling(client, rng, params)
    request = ChatRequest(messages, **sampling).with_session(rng)
    request.check(params)
    return Drawn(shape, client, request)
