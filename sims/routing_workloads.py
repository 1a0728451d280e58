"""Synthetic request streams: the paper's workloads (§5.1) and the ones operators meet.

Token ids are synthetic (random per segment, fixed by the seed); what matters for routing is
which prompts share which prefixes, how long they are and how much they generate.

Paper-like:
- ToolUse (ToolBench-like): a shared 420-token system prompt, one of 300 tool documents picked
  Zipf(1.1), a distinct query; ~7,200 prompt tokens, 100 out.
- Coding (APPS-like): a short shared instruction, one of 10,000 problems picked Zipf(0.8)
  (little sharing), a distinct request; ~1,800 tokens, 100..1,000 out.
- LongDoc (LooGLE-like): one of 200 long documents (8k-16k tokens) picked Zipf(0.6), then a
  question; 100 out.
- Mixed: ToolUse : Coding : LongDoc = 3 : 6 : 1.

Operators':
- Chat: multi-turn sessions. A session starts with one of 4 system prompts (300-1,200
  tokens, Zipf(1.0)); each turn appends a user message (30-300 tokens) to the whole history,
  and the reply (50-500 tokens) becomes part of the next turn's prompt. Geometric(1/4)
  turns (mean 4, at most 12); the next turn is sent a think time (exponential, mean 10 s,
  at least 1 s) after the previous reply ends, so sessions are closed loops.
- SysPrompt: many users sharing a few long system prompts: one of 6 application prompts
  (1,500-6,000 tokens, Zipf(1.0): the hottest carries ~40 % of the traffic), then a distinct
  user message of 50-400 tokens; 50-400 out.
- RAG: shared documents. A 300-token instruction, then the top-m passages (m = 2..5) of one
  of 400 topics (Zipf(0.9)), each topic's passages in a fixed relevance order (500-1,000
  tokens each), then a question of 20-100 tokens; 100-300 out. Queries on one topic share the
  instruction and their common leading passages.

Arrivals are Poisson at the given rate (for Chat: sessions start Poisson at rate / mean turns,
so the request rate is about `rate`).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field

import numpy as np

VOCAB = 49_152  # SmolLM2's vocabulary size; any value works


@dataclass
class Request:
    rid: int
    arrival: float  # for a follow-up chat turn: set when it is sent (closed loop)
    tokens: np.ndarray  # int32 token ids
    out_len: int
    kind: str
    reply: np.ndarray | None = None  # the output, when a later prompt contains it
    follow_up: "Request | None" = field(default=None, repr=False)
    think_s: float = 0.0  # before the follow-up is sent, after this request ends


class _Segments:
    """Token arrays of shared segments, generated once per (kind, id) from the seed."""

    def __init__(self, seed: int) -> None:
        self._seed = seed
        self._cache: dict[tuple[str, int], np.ndarray] = {}

    def get(self, kind: str, idx: int, length: int) -> np.ndarray:
        key = (kind, idx)
        arr = self._cache.get(key)
        if arr is None:
            rng = np.random.default_rng([self._seed, zlib.crc32(kind.encode()), idx])
            arr = rng.integers(0, VOCAB, length, dtype=np.int32)
            self._cache[key] = arr
        return arr


def _zipf_probs(n: int, s: float) -> np.ndarray:
    w = 1.0 / np.arange(1, n + 1) ** s
    return w / w.sum()


@dataclass(frozen=True)
class WorkloadShape:
    name: str
    mix: tuple[tuple[str, float], ...]
    shared_prefixes: bool = True  # the "≥ 50 % better than no forwarding" goal applies


WORKLOADS = {
    "tooluse": WorkloadShape("ToolUse", (("tooluse", 1.0),)),
    "coding": WorkloadShape("Coding", (("coding", 1.0),)),
    "longdoc": WorkloadShape("LongDoc", (("longdoc", 1.0),)),
    "mixed": WorkloadShape("Mixed 3:6:1", (("tooluse", 0.3), ("coding", 0.6), ("longdoc", 0.1))),
    "chat": WorkloadShape("Chat sessions", (("chat", 1.0),)),
    "sysprompt": WorkloadShape("Shared system prompts", (("sysprompt", 1.0),)),
    "rag": WorkloadShape("RAG, shared documents", (("rag", 1.0),)),
}

CHAT_MEAN_TURNS = 4.0


class RequestFactory:
    """Builds requests of each kind; shared segment lengths are fixed per id by the seed."""

    TOOLS = 300
    PROBLEMS = 10_000
    DOCS = 200
    CHAT_SYSTEMS = 4
    APPS = 6
    TOPICS = 400
    PASSAGES = 5

    def __init__(self, seed: int) -> None:
        self.seg = _Segments(seed)
        rng = np.random.default_rng([seed, 7])
        self.tool_len = np.clip(rng.lognormal(np.log(6400), 0.35, self.TOOLS), 2000, 14000).astype(int)
        self.problem_len = np.clip(rng.lognormal(np.log(1450), 0.4, self.PROBLEMS), 300, 5000).astype(int)
        self.doc_len = rng.integers(8000, 16000, self.DOCS)
        self.chat_sys_len = rng.integers(300, 1200, self.CHAT_SYSTEMS)
        self.app_len = rng.integers(1500, 6000, self.APPS)
        self.passage_len = rng.integers(500, 1000, (self.TOPICS, self.PASSAGES))
        self.p_tool = _zipf_probs(self.TOOLS, 1.1)
        self.p_problem = _zipf_probs(self.PROBLEMS, 0.8)
        self.p_doc = _zipf_probs(self.DOCS, 0.6)
        self.p_chat_sys = _zipf_probs(self.CHAT_SYSTEMS, 1.0)
        self.p_app = _zipf_probs(self.APPS, 1.0)
        self.p_topic = _zipf_probs(self.TOPICS, 0.9)

    @staticmethod
    def _fresh(rng: np.random.Generator, lo: int, hi: int) -> np.ndarray:
        return rng.integers(0, VOCAB, int(rng.integers(lo, hi)), dtype=np.int32)

    def make(self, kind: str, rng: np.random.Generator) -> tuple[np.ndarray, int]:
        """One single-turn request: (prompt tokens, output length)."""
        seg = self.seg.get
        if kind == "tooluse":
            t = int(rng.choice(self.TOOLS, p=self.p_tool))
            parts = [seg("sys_tool", 0, 420), seg("tool", t, int(self.tool_len[t])), self._fresh(rng, 150, 500)]
            return np.concatenate(parts), 100
        if kind == "coding":
            p = int(rng.choice(self.PROBLEMS, p=self.p_problem))
            parts = [seg("sys_code", 0, 180), seg("problem", p, int(self.problem_len[p])), self._fresh(rng, 50, 250)]
            return np.concatenate(parts), int(rng.integers(100, 1001))
        if kind == "longdoc":
            d = int(rng.choice(self.DOCS, p=self.p_doc))
            return np.concatenate([seg("doc", d, int(self.doc_len[d])), self._fresh(rng, 30, 120)]), 100
        if kind == "sysprompt":
            a = int(rng.choice(self.APPS, p=self.p_app))
            parts = [seg("app", a, int(self.app_len[a])), self._fresh(rng, 50, 400)]
            return np.concatenate(parts), int(rng.integers(50, 401))
        if kind == "rag":
            topic = int(rng.choice(self.TOPICS, p=self.p_topic))
            m = int(rng.integers(2, self.PASSAGES + 1))
            parts = [seg("sys_rag", 0, 300)]
            parts += [seg("passage", topic * self.PASSAGES + j, int(self.passage_len[topic, j])) for j in range(m)]
            parts.append(self._fresh(rng, 20, 100))
            return np.concatenate(parts), int(rng.integers(100, 301))
        raise ValueError(f"unknown request kind {kind!r}")

    def session(self, rng: np.random.Generator, max_turns: int) -> list[tuple[np.ndarray, int, np.ndarray, float]]:
        """A chat session: per turn (prompt, output length, reply tokens, think time after)."""
        s = int(rng.choice(self.CHAT_SYSTEMS, p=self.p_chat_sys))
        history = self.seg.get("chat_sys", s, int(self.chat_sys_len[s]))
        turns = min(max_turns, int(rng.geometric(1 / CHAT_MEAN_TURNS)), 12)
        out = []
        for _ in range(max(1, turns)):
            prompt = np.concatenate([history, self._fresh(rng, 30, 300)])
            reply = self._fresh(rng, 50, 500)
            out.append((prompt, len(reply), reply, max(1.0, float(rng.exponential(10.0)))))
            history = np.concatenate([prompt, reply])
        return out


def generate(workload: str, rate: float, n_requests: int, seed: int,
             factory: RequestFactory | None = None) -> list[Request]:
    """`n_requests` requests at `rate` per second (rid order = first-send order of sessions)."""
    shape = WORKLOADS[workload]
    factory = factory or RequestFactory(seed)
    rng = np.random.default_rng([seed, 11, int(rate * 1000)])
    if workload == "chat":
        return _chat(factory, rng, rate, n_requests)
    kinds = [k for k, _ in shape.mix]
    probs = np.array([p for _, p in shape.mix])
    t = 0.0
    out = []
    for rid in range(n_requests):
        t += float(rng.exponential(1.0 / rate))
        kind = kinds[int(rng.choice(len(kinds), p=probs))]
        tokens, out_len = factory.make(kind, rng)
        out.append(Request(rid, t, tokens, out_len, kind))
    return out


def _chat(factory: RequestFactory, rng: np.random.Generator, rate: float, n_requests: int) -> list[Request]:
    t = 0.0
    out: list[Request] = []
    while len(out) < n_requests:
        t += float(rng.exponential(CHAT_MEAN_TURNS / rate))
        prev = None
        for prompt, out_len, reply, think in factory.session(rng, n_requests - len(out)):
            req = Request(len(out), t if prev is None else float("nan"), prompt, out_len, "chat",
                          reply=reply, think_s=think)
            if prev is not None:
                prev.follow_up = req
            out.append(req)
            prev = req
    return out
