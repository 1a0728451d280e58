"""A serving-cost model of one model node (vLLM with prefix caching) for the routing simulator.

Cost of one engine step (continuous batching with chunked prefill, as vLLM V1 schedules it):

    step = overhead + sqrt(F^2 + (k * tokens)^2)       linear layers: weight-read floor F at a
                                                       small batch, k s/token once compute-bound
         + per_seq * decoding sequences
         + kv_read * (sum of the decoding sequences' contexts)   decode attention reads the KV
         + attn * chunk * (mean context of the chunk's tokens)   prefill attention (quadratic)

where tokens = decoding sequences + the prefill chunk. So a fresh n-token prompt costs about
k*n + attn*n^2/2 of prefill, one with c cached tokens k*(n-c) + attn*(n^2-c^2)/2, and a decode
step never drops below the weight-read floor.

Profiles (`PROFILES`):
- `h100-llama3-8b`, `a100-llama3-8b`: Llama-3-8B in bf16 on one 80-GB GPU, from published
  figures. Linear layers: Vidur's measured per-operator profile (Agrawal et al., "Vidur: A
  Large-Scale Simulation Framework for LLM Inference", MLSys 2024; github.com/microsoft/vidur
  at 7d47513, data/profiling/compute/a100/meta-llama/Meta-Llama-3-8B/mlp.csv: the 32 layers'
  projection, MLP, norm and rope medians, fitted: F = 9.88 ms, k = 66.0 us/token on an
  A100-80GB). For the H100 the same model is scaled by Vidur's H100/A100 ratios for
  Llama-2-7B (data/profiling/compute/{a100,h100}/meta-llama/Llama-2-7b-hf/mlp.csv: 0.613 on
  F, 0.326 on k): F = 6.05 ms, k = 21.5 us/token. The LM head (1.05 GB of bf16 weights read
  once per step) adds 0.52 / 0.31 ms to F, and 1 ms per step of scheduler and sampler is
  assumed. Prefill attention: 4 * 32 layers * 4096 = 524,288 FLOPs per (query, key) pair at
  50 % of peak bf16 (A100 312 TFLOP/s, H100 989 TFLOP/s): FlashAttention-2 (Dao, 2023) reports
  50-73 % of peak on A100, FlashAttention-3 (Shah et al., 2024) up to 75 % on H100; the lower
  end is taken for causal attention over a paged cache. Decode attention: 128 KiB of KV per
  context token (32 layers * 8 KV heads * 128 * 2 * 2 bytes) read at 70 % of HBM bandwidth
  (2.04 / 3.35 TB/s). KV cache: 400k tokens (0.9 * 80 GB - 16 GB of weights - activations,
  / 128 KiB). Step token budget and sequence cap: vLLM 0.32's API-server defaults
  (engine/arg_utils.py): H100 8192 tokens / 1024 sequences, A100 2048 / 256. Block 64 tokens
  (vLLM uses 16; a coarser block only rounds hits down by < 64 tokens, and keeps the model fast).
- `cpu-smollm2`: SmolLM2-135M on this project's 2-core CPU machine with vLLM 0.32 (CPU build),
  MEASURED by `bench/engine_profile.py`, which writes results/engine_profile_cpu.json (raw
  points, fit and command); the profile is read from that file.

The engine is a fluid model: between events every rate is constant, so a node jumps from
event to event instead of stepping. Requests are admitted FIFO while sequences and KV memory
allow; one prefill at a time takes the step's budget left by the decoding sequences (its
chunk is at most its own uncached length); every decoding sequence gains one token per step.
A decoding sequence's context is counted as its prompt plus half its output. The prefix cache
is block-granular with LRU eviction and the KV capacity as its size (vLLM's automatic prefix
caching): a hit skips the cached blocks' prefill. Prompt blocks enter the cache when the
prefill ends, and the blocks of prompt + output when the request finishes (so the next turn of
a chat finds its history). Running requests' KV is budgeted separately for admission.
"""

from __future__ import annotations

import heapq
import json
import math
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

CPU_PROFILE_FILE = Path(__file__).resolve().parent.parent / "results" / "engine_profile_cpu.json"


@dataclass(frozen=True)
class EngineProfile:
    name: str
    floor_s: float  # F: linear layers (+ LM head) at a small batch: the weight-read floor
    linear_s_per_token: float  # k
    attn_s_per_pair: float  # prefill attention per (query token, context token) pair
    step_overhead_s: float
    decode_per_seq_s: float
    kv_read_s_per_token: float  # decode attention per context token per sequence per step
    token_budget: int  # tokens per engine step (vLLM max_num_batched_tokens)
    max_seqs: int
    kv_tokens: int
    capacity_score: int  # the 1..10 hardware score the directory publishes
    block_tokens: int = 64

    def step_s(self, n_decode: int, ctx_sum: float, chunk: int, chunk_ctx: float) -> float:
        """Seconds of one engine step (see the module docstring)."""
        lin = math.hypot(self.floor_s, self.linear_s_per_token * (n_decode + chunk))
        return (self.step_overhead_s + lin + self.decode_per_seq_s * n_decode
                + self.kv_read_s_per_token * ctx_sum + self.attn_s_per_pair * chunk * chunk_ctx)

    def prefill_s(self, n_tokens: int, cached: int = 0) -> float:
        """Prefill of one prompt alone on an idle engine (chunked by the token budget)."""
        new = max(0, n_tokens - cached)
        steps = max(1, math.ceil(new / self.token_budget))
        chunk = min(new, self.token_budget)
        return steps * self.step_s(0, 0.0, chunk, cached + new / 2) * new / max(1, steps * chunk)

    def decode_step_s(self, batch: int, context: float) -> float:
        return self.step_s(batch, batch * context, 0, 0.0)


def _gpu(name: str, floor: float, lm_head: float, k: float, peak_flops: float, hbm: float,
         budget: int, max_seqs: int, capacity: int) -> EngineProfile:
    return EngineProfile(
        name, floor_s=floor + lm_head, linear_s_per_token=k,
        attn_s_per_pair=524_288 / (0.5 * peak_flops), step_overhead_s=0.001,
        decode_per_seq_s=0.0, kv_read_s_per_token=131_072 / (0.7 * hbm),
        token_budget=budget, max_seqs=max_seqs, kv_tokens=400_000, capacity_score=capacity)


def cpu_profile(path: Path = CPU_PROFILE_FILE) -> EngineProfile | None:
    """The measured CPU profile (bench/engine_profile.py's fit), or None if not measured."""
    try:
        fit = json.loads(path.read_text())["fit"]
    except (OSError, ValueError, KeyError):
        return None
    return EngineProfile(
        "cpu-smollm2", floor_s=max(1e-4, fit["decode_floor_s"]),
        linear_s_per_token=fit["prefill_s_per_token"],
        attn_s_per_pair=max(0.0, fit["prefill_attn_s_per_token_pair"]), step_overhead_s=0.0,
        decode_per_seq_s=max(0.0, fit["decode_per_seq_s"]),
        kv_read_s_per_token=max(0.0, fit["decode_per_context_token_s"]),
        # the model node's settings on CPU (config.py ModelNodeParams): 16 running requests,
        # 1 GiB of KV (VLLM_CPU_KVCACHE_SPACE) = ~23k tokens of SmolLM2-135M in float32;
        # vLLM's CPU API-server token budget 2048; 128-token blocks
        token_budget=2048, max_seqs=16, kv_tokens=23_000, capacity_score=1, block_tokens=128)


PROFILES: dict[str, EngineProfile] = {
    "h100-llama3-8b": _gpu("h100-llama3-8b", 0.00605, 0.00031, 21.5e-6, 989e12, 3.35e12, 8192, 1024, 10),
    "a100-llama3-8b": _gpu("a100-llama3-8b", 0.00988, 0.00052, 66.0e-6, 312e12, 2.039e12, 2048, 256, 4),
}
_cpu = cpu_profile()
if _cpu is not None:
    PROFILES[_cpu.name] = _cpu


class PrefixCache:
    """Blocks of prompt prefixes (chained keys), least recently used evicted first."""

    def __init__(self, capacity_blocks: int) -> None:
        self.capacity = capacity_blocks
        self._lru: OrderedDict[int, None] = OrderedDict()

    def match(self, keys: list[int]) -> int:
        n = 0
        for k in keys:
            if k not in self._lru:
                break
            n += 1
        return n

    def insert(self, keys: list[int]) -> None:
        lru = self._lru
        for k in keys:
            if k in lru:
                lru.move_to_end(k)
            else:
                lru[k] = None
        while len(lru) > self.capacity:
            lru.popitem(last=False)

    def __len__(self) -> int:
        return len(self._lru)

    def __contains__(self, key: int) -> bool:
        return key in self._lru


_MULT = np.random.default_rng(12345).integers(1, 2**63, 1 << 17, dtype=np.uint64) | np.uint64(1)


def block_keys(tokens: np.ndarray, block: int) -> list[int]:
    """Chained keys of a sequence's full blocks: key j names tokens[:block*(j+1)]."""
    n = min((len(tokens) // block) * block, len(_MULT))
    if n == 0:
        return []
    with np.errstate(over="ignore"):
        acc = np.cumsum((tokens[:n].astype(np.uint64) + np.uint64(1)) * _MULT[:n], dtype=np.uint64)
    return acc[block - 1::block].tolist()


@dataclass
class Job:
    rid: int
    arrival: float  # at the system (user side)
    n_tokens: int
    out_len: int
    keys: list[int]  # prompt blocks
    block: int
    full_keys: list[int] | None = None  # prompt + output blocks (multi-turn chat)
    cached: int = 0
    first_token: float = math.nan
    finish: float = math.nan
    node: int = -1
    forwarded: bool = False
    hops: int = 0  # model-node hops made before being served


@dataclass
class SimNode:
    idx: int
    profile: EngineProfile
    cache: PrefixCache = field(init=False)
    queue: deque = field(default_factory=deque)
    cur: Job | None = None
    cur_rem: float = 0.0
    cur_chunk: int = 0
    cur_ctx: float = 0.0
    dec: list = field(default_factory=list)  # heap of (target progress, rid, job)
    ctx_sum: float = 0.0  # contexts of the decoding sequences
    progress: float = 0.0  # tokens generated by every decoding sequence since t=0
    t_last: float = 0.0
    kv_used: int = 0
    epoch: int = 0  # invalidates scheduled events when the state changes

    def __post_init__(self) -> None:
        self.cache = PrefixCache(self.profile.kv_tokens // self.profile.block_tokens)

    @property
    def active(self) -> int:
        """Outstanding requests: queued, prefilling and decoding (the paper's load metric)."""
        return len(self.queue) + (self.cur is not None) + len(self.dec)

    def _rates(self) -> tuple[float, float]:
        """(decode tokens/s per sequence, prefill tokens/s) under the current batch."""
        p = self.profile
        n = len(self.dec)
        chunk = 0
        if self.cur is not None:
            chunk = max(1, min(p.token_budget - n, self.cur_chunk))
        tau = p.step_s(n, self.ctx_sum, chunk, self.cur_ctx)
        return 1.0 / tau, chunk / tau

    def advance(self, t: float) -> None:
        dt = t - self.t_last
        if dt > 0:
            r_dec, r_pre = self._rates()
            if self.dec:
                self.progress += dt * r_dec
            if self.cur is not None:
                self.cur_rem -= dt * r_pre
            self.t_last = t

    def next_time(self) -> float:
        r_dec, r_pre = self._rates()
        t = math.inf
        if self.cur is not None:
            t = self.t_last + max(0.0, self.cur_rem) / r_pre
        if self.dec:
            t = min(t, self.t_last + max(0.0, self.dec[0][0] - self.progress) / r_dec)
        # at least a nanosecond ahead: a remainder too small to move t in floating point
        # would otherwise be rescheduled at the same instant for ever
        return max(t, self.t_last + 1e-9) if t < math.inf else t

    def arrive(self, job: Job, t: float) -> list[Job]:
        self.advance(t)
        job.node = self.idx
        self.queue.append(job)
        return self.process(t)

    def process(self, t: float) -> list[Job]:
        """Complete what is due at t, admit what fits; returns finished jobs."""
        self.advance(t)
        done: list[Job] = []
        if self.cur is not None and self.cur_rem <= 1e-6:
            job = self.cur
            self.cur = None
            job.first_token = t
            self.cache.insert(job.keys)
            if job.out_len <= 1:
                self._finish(job, t, done)
            else:
                heapq.heappush(self.dec, (self.progress + job.out_len - 1, job.rid, job))
                self.ctx_sum += job.n_tokens + job.out_len / 2
        while self.dec and self.dec[0][0] - self.progress <= 1e-6:
            _, _, job = heapq.heappop(self.dec)
            self.ctx_sum -= job.n_tokens + job.out_len / 2
            self._finish(job, t, done)
        if not self.dec:
            self.ctx_sum = 0.0  # no float drift
        self._admit()
        self.epoch += 1
        return done

    def _finish(self, job: Job, t: float, done: list[Job]) -> None:
        job.finish = t
        self.kv_used -= job.n_tokens + job.out_len
        if job.full_keys:
            self.cache.insert(job.full_keys)
        done.append(job)

    def _admit(self) -> None:
        p = self.profile
        if self.cur is not None or not self.queue:
            return
        job = self.queue[0]
        need = job.n_tokens + job.out_len
        if self.dec and (len(self.dec) + 1 > p.max_seqs or self.kv_used + need > p.kv_tokens):
            return
        self.queue.popleft()
        job.cached = min(self.cache.match(job.keys) * job.block, job.n_tokens - 1)
        new = job.n_tokens - job.cached
        self.cur = job
        self.cur_rem = float(new)
        self.cur_chunk = new
        self.cur_ctx = job.cached + new / 2
        self.kv_used += need

    def uncached_if_sent(self, keys: list[int], n_tokens: int, block: int) -> int:
        return n_tokens - min(self.cache.match(keys) * block, n_tokens - 1)
