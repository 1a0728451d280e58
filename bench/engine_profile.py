"""The serving-cost profile of this machine's engine, for the routing simulator.

    flock /tmp/gt-heavy.lock .venv/bin/python bench/engine_profile.py \
        [--model smollm2-135m] [--out results/engine_profile_cpu.json]
    .venv/bin/python bench/engine_profile.py --tiny    # short prompts, a temporary record: what make test runs

Starts one real vLLM engine (the CPU build here, SmolLM2-135M) in this process and measures,
with prompts of random token ids (so nothing is cached unless a phase caches it on purpose):

- prefill: time to first token of fresh prompts of 32 .. 7,680 tokens (max_tokens = 1);
- prefill after a prefix-cache hit: a cached prefix of P tokens followed by s new ones;
- decode: seconds per step with b = 1, 4, 8, 16 concurrent streams of short context, and
  one stream behind a long context (the KV read grows with the context).

It fits the cost model of `sims/routing_engine.py` (`EngineProfile`) by least squares:
    TTFT(new, cached) = t0 + k_lin * new + k_attn * new * (cached + new / 2)
    decode step        = d_floor + d_seq * b + d_ctx * (sum of the b contexts)
and writes the raw points, the fit and the command to `--out` (a JSON data file kept in the
repository, the source of the `cpu-smollm2` profile). Prints ONE JSON line (the fit);
progress goes to stderr. Run it under the shared heavy lock: other load on the 2 cores shows
up directly in the figures (the load average is recorded next to them).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

FRESH_LENGTHS = (32, 128, 512, 1024, 2048, 4096, 7680)
CACHED = ((1024, 64), (4096, 64), (4096, 512), (7168, 64))  # (cached prefix, new tokens)
DECODE_BATCHES = (1, 4, 8, 16)
DECODE_TOKENS = 48
LONG_CONTEXT = 6144


def _progress(msg: str) -> None:
    print(f"[bench/engine_profile] {msg}", file=sys.stderr, flush=True)


class Prober:
    """Times prompts on one engine; every prompt is new random ids unless reused on purpose."""

    def __init__(self, engine, seed: int) -> None:
        self.engine = engine
        self.rng = np.random.default_rng(seed)
        vocab = len(engine.tokenizer)
        self.lo, self.hi = 1000, min(vocab - 1, 40_000)  # plain tokens, no specials

    def ids(self, n: int) -> list[int]:
        return self.rng.integers(self.lo, self.hi, n).tolist()

    async def run(self, ids: list[int], max_tokens: int) -> tuple[float, list[float]]:
        """(TTFT, arrival time of every token) of one request."""
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        sp = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True,
                            output_kind=RequestOutputKind.DELTA)
        t0 = time.perf_counter()
        times: list[float] = []
        async for out in self.engine.llm.generate({"prompt_token_ids": ids}, sp, uuid.uuid4().hex):
            now = time.perf_counter()
            times += [now] * len(out.outputs[0].token_ids)
        return (times[0] if times else time.perf_counter()) - t0, times


#: --tiny: the same phases on prompts small enough for seconds (what make test runs)
TINY = {"fresh": (32, 128), "cached": ((128, 32),), "batches": (1, 2), "decode_tokens": 8, "long_context": 256}


async def measure(engine, seed: int, trials: int, tiny: bool = False) -> dict:
    p = Prober(engine, seed)
    lengths, cached_shapes, batches = ((TINY["fresh"], TINY["cached"], TINY["batches"]) if tiny
                                       else (FRESH_LENGTHS, CACHED, DECODE_BATCHES))
    decode_tokens, long_context = (TINY["decode_tokens"], TINY["long_context"]) if tiny else (DECODE_TOKENS, LONG_CONTEXT)
    fresh = []
    for n in lengths:
        for t in range(trials if n <= 4096 else max(1, trials - 1)):
            ttft, _ = await p.run(p.ids(n), 1)
            fresh.append({"new": n, "cached": 0, "ttft_s": ttft})
        _progress(f"fresh {n:5d} tokens: TTFT {statistics.median(r['ttft_s'] for r in fresh if r['new'] == n):.3f} s")
    cached = []
    for prefix_len, new in cached_shapes:
        for t in range(trials):
            prefix = p.ids(prefix_len)
            first, _ = await p.run(prefix + p.ids(new), 1)  # caches the prefix
            ttft, _ = await p.run(prefix + p.ids(new), 1)
            cached.append({"new": new, "cached": prefix_len, "ttft_s": ttft,
                           "uncached_ttft_s": first})
        rows = [r for r in cached if (r["cached"], r["new"]) == (prefix_len, new)]
        _progress(f"cached {prefix_len} + new {new}: TTFT {statistics.median(r['ttft_s'] for r in rows):.3f} s "
                  f"(uncached {statistics.median(r['uncached_ttft_s'] for r in rows):.3f} s)")
    decode = []
    for b in batches:
        for t in range(trials):
            runs = await asyncio.gather(*(p.run(p.ids(64), decode_tokens) for _ in range(b)))
            decode.append({"batch": b, "context": 64 + decode_tokens // 2,
                           "step_s": _step_time(runs)})
        _progress(f"decode batch {b:2d}: {statistics.median(r['step_s'] for r in decode if r['batch'] == b) * 1e3:.1f} ms/step")
    for t in range(trials):
        runs = [await p.run(p.ids(long_context), decode_tokens)]
        decode.append({"batch": 1, "context": long_context + decode_tokens // 2, "step_s": _step_time(runs)})
    _progress(f"decode behind {long_context} tokens: {decode[-1]['step_s'] * 1e3:.1f} ms/step")
    return {"fresh": fresh, "cached": cached, "decode": decode}


def _step_time(runs: list[tuple[float, list[float]]]) -> float:
    """Seconds per decode step while all streams run: from the last first token to the first
    last token (every stream is decoding in that window)."""
    start = max(times[0] for _, times in runs)
    end = min(times[-1] for _, times in runs)
    steps = min(sum(1 for x in times if start < x <= end) for _, times in runs)
    return (end - start) / max(1, steps)


def fit(points: dict) -> dict:
    """Least-squares fit of the cost model (see the module docstring)."""
    rows = points["fresh"] + points["cached"]
    a = np.array([[1.0, r["new"], r["new"] * (r["cached"] + r["new"] / 2)] for r in rows])
    y = np.array([r["ttft_s"] for r in rows])
    (t0, k_lin, k_attn), *_ = np.linalg.lstsq(a, y, rcond=None)
    d = points["decode"]
    a = np.array([[1.0, r["batch"], r["batch"] * r["context"]] for r in d])
    y = np.array([r["step_s"] for r in d])
    (d_floor, d_seq, d_ctx), *_ = np.linalg.lstsq(a, y, rcond=None)
    pred = lambda new, c: t0 + k_lin * new + k_attn * new * (c + new / 2)  # noqa: E731
    resid = [abs(pred(r["new"], r["cached"]) - r["ttft_s"]) / r["ttft_s"] for r in rows]
    return {"ttft_overhead_s": float(t0), "prefill_s_per_token": float(k_lin),
            "prefill_attn_s_per_token_pair": float(k_attn),
            "decode_floor_s": float(d_floor), "decode_per_seq_s": float(d_seq),
            "decode_per_context_token_s": float(d_ctx),
            "ttft_fit_median_rel_error": float(np.median(resid))}


async def run(args, engine=None) -> dict:
    """`engine`: a started engine to profile (make test shares one among the engine benches);
    by default one is started, and shut down after."""
    from model_node import catalogue
    from model_node.engine import Engine

    model = catalogue.resolve(args.model)
    own = engine is None
    if own:
        _progress(f"starting the engine on {model.path}")
        engine = await Engine.start(model)
        _progress(f"engine up in {engine.startup_s:.1f} s (max_model_len {engine.max_model_len})")
    load_before = os.getloadavg()[0]
    try:
        t0 = time.perf_counter()
        points = await measure(engine, args.seed, args.trials, args.tiny)
        wall = time.perf_counter() - t0
    finally:
        if own:
            engine.shutdown()
    result = {"bench": "engine_profile", "model": args.model, "device": "cpu", "cpus": os.cpu_count(),
              "load_avg_1m_before": round(load_before, 2), "load_avg_1m_after": round(os.getloadavg()[0], 2),
              "wall_s": round(wall, 1), "trials": args.trials, **fit(points)}
    record = {"command": "flock /tmp/gt-heavy.lock .venv/bin/python bench/engine_profile.py "
                         + " ".join(sys.argv[1:]),
              "fit": result, "points": points,
              "model_form": {"ttft": "t0 + k_lin*new + k_attn*new*(cached + new/2)",
                             "decode_step": "d_floor + d_seq*b + d_ctx*sum(context)"}}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1) + "\n")
    return result


def tiny_args(args: argparse.Namespace) -> argparse.Namespace:
    if args.tiny:
        args.trials = 1
        args.out = str(Path(tempfile.mkdtemp(prefix="gt-engine-profile-")) / "profile.json")
    return args


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--out", default="results/engine_profile_cpu.json")
    ap.add_argument("--tiny", action="store_true",
                    help="short prompts, one trial, the record in a temporary file: what make test runs")
    return ap


def main() -> None:
    args = tiny_args(parser().parse_args())
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    print(json.dumps(asyncio.run(run(args))), flush=True)



async def with_engine(args: argparse.Namespace, engine) -> dict:
    """This bench on an engine someone else started (testkit/bench_engines.py: make test's tiny
    runs share one)."""
    return await run(args, engine)

if __name__ == "__main__":
    main()
