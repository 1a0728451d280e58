"""Synthetic request streams with the shapes of the paper's four workloads (§5.1).

Token ids are synthetic (random per segment, fixed by the seed); what matters for routing is
which prompts share which prefixes, how long they are and how much they generate:

- ToolUse-like (ToolBench): a shared system prompt, then one of `tools` tool documents
  picked by Zipf(1.1), then a unique user query; ~7,200 prompt tokens, 100 output tokens.
- Coding-like (APPS): a short shared instruction, one of 10,000 problems picked by Zipf(0.8)
  (little sharing), a unique request; ~1,800 tokens, 100..1,000 output tokens.
- LongDoc-like (LooGLE): one of `docs` long documents picked by Zipf(0.6), then a question;
  ~12,000 tokens (the paper's figure is garbled; LooGLE documents run 10k-20k+), 100 output.
- Mixed: ToolUse : Coding : LongDoc = 3 : 6 : 1.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np

VOCAB = 49_152  # SmolLM2's vocabulary size; any value works


@dataclass(frozen=True)
class Request:
    rid: int
    arrival: float
    tokens: np.ndarray  # int32 token ids
    out_len: int
    kind: str


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


WORKLOADS = {
    "tooluse": WorkloadShape("ToolUse-like", (("tooluse", 1.0),)),
    "coding": WorkloadShape("Coding-like", (("coding", 1.0),)),
    "longdoc": WorkloadShape("LongDoc-like", (("longdoc", 1.0),)),
    "mixed": WorkloadShape("Mixed 3:6:1", (("tooluse", 0.3), ("coding", 0.6), ("longdoc", 0.1))),
}


class RequestFactory:
    """Builds requests of each kind; shared segment lengths are fixed per id by the seed."""

    TOOLS = 300
    PROBLEMS = 10_000
    DOCS = 200

    def __init__(self, seed: int) -> None:
        self.seg = _Segments(seed)
        rng = np.random.default_rng([seed, 7])
        self.tool_len = np.clip(rng.lognormal(np.log(6400), 0.35, self.TOOLS), 2000, 14000).astype(int)
        self.problem_len = np.clip(rng.lognormal(np.log(1450), 0.4, self.PROBLEMS), 300, 5000).astype(int)
        self.doc_len = rng.integers(8000, 16000, self.DOCS)
        self.p_tool = _zipf_probs(self.TOOLS, 1.1)
        self.p_problem = _zipf_probs(self.PROBLEMS, 0.8)
        self.p_doc = _zipf_probs(self.DOCS, 0.6)

    def make(self, kind: str, rng: np.random.Generator) -> tuple[np.ndarray, int]:
        if kind == "tooluse":
            t = int(rng.choice(self.TOOLS, p=self.p_tool))
            parts = [self.seg.get("sys_tool", 0, 420), self.seg.get("tool", t, int(self.tool_len[t])),
                     rng.integers(0, VOCAB, int(rng.integers(150, 500)), dtype=np.int32)]
            return np.concatenate(parts), 100
        if kind == "coding":
            p = int(rng.choice(self.PROBLEMS, p=self.p_problem))
            parts = [self.seg.get("sys_code", 0, 180), self.seg.get("problem", p, int(self.problem_len[p])),
                     rng.integers(0, VOCAB, int(rng.integers(50, 250)), dtype=np.int32)]
            return np.concatenate(parts), int(rng.integers(100, 1001))
        if kind == "longdoc":
            d = int(rng.choice(self.DOCS, p=self.p_doc))
            parts = [self.seg.get("doc", d, int(self.doc_len[d])),
                     rng.integers(0, VOCAB, int(rng.integers(30, 120)), dtype=np.int32)]
            return np.concatenate(parts), 100
        raise ValueError(f"unknown request kind {kind!r}")


def generate(workload: str, rate: float, n_requests: int, seed: int,
             factory: RequestFactory | None = None) -> list[Request]:
    """A Poisson stream of `n_requests` requests at `rate` per second."""
    shape = WORKLOADS[workload]
    factory = factory or RequestFactory(seed)
    rng = np.random.default_rng([seed, 11, int(rate * 1000)])
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
