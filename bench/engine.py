"""Model-node engine benchmark: start-up, TTFT, decode speed, and prefix caching at work.

    .venv/bin/python bench/engine.py [--model smollm2-135m] [--trials 3]
    .venv/bin/python bench/engine.py --tiny        # short prompts and decodes: what make test runs

Prints ONE JSON line (progress goes to stderr). Figures, all wall-clock on this machine:
  startup_s              Engine.start (vLLM engine process, weights, KV cache)
  ttft_p50_s             time to first token of short distinct chat prompts
  decode_tok_s           one stream's decode speed (tokens after the first / their time)
  batch4_tok_s           aggregate output tokens/s of 4 concurrent streams
  ttft_uncached_2k_s / ttft_cached_2k_s / prefix_cache_speedup
                         TTFT of a prompt whose 2,000-token prefix is new vs already cached
  prefill_s_per_token / decode_s_per_token
                         the cost model the routing simulator needs (prefill from the slope of
                         TTFT between 500- and 2,000-token uncached prompts)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

WORDS = ("river stone cloud market engine silver garden letter window thunder paper orange "
         "mountain signal harbor candle meadow bridge lantern forest copper velvet island "
         "winter ladder circus falcon marble pepper saddle timber voyage walnut").split()


def _progress(msg: str) -> None:
    print(f"[bench/engine] {msg}", file=sys.stderr, flush=True)


def _filler_ids(engine, n: int, rng: random.Random) -> list[int]:
    """Exactly n token ids of random prose (new each call: nothing cached shares it)."""
    ids: list[int] = []
    while len(ids) < n:
        text = " ".join(rng.choice(WORDS) for _ in range(400)) + ". "
        ids += engine.tokenizer.encode(text, add_special_tokens=False)
    return ids[:n]


async def _ttft_and_decode(engine, prompt, sampling) -> tuple[float, float, int]:
    """(time to first token, time of the rest, tokens generated); `prompt` a Prompt or token ids
    (the engine generates from ids since 2026-11: this bench passed Prompts until the tiny run
    that make test runs found it)."""
    from gentorrent.generation import Prompt

    ids = engine.encode(prompt) if isinstance(prompt, Prompt) else list(prompt)
    t0 = time.perf_counter()
    first = None
    n = 0
    async for d in engine.generate(ids, sampling):
        if d.token_ids and first is None:
            first = time.perf_counter()
        n += len(d.token_ids)
    end = time.perf_counter()
    first = first or end
    return first - t0, end - first, n


async def run(model_name: str, trials: int, tiny: bool = False, engine=None) -> dict:
    """`tiny`: one prompt per figure and 16-token decodes (the code path in seconds, not figures).
    `engine`: a started engine to measure (make test shares one among the engine benches);
    by default one is started, and shut down after."""
    from model_node import catalogue
    from model_node.engine import Engine
    from gentorrent.generation import Prompt, Sampling

    rng = random.Random(1234)
    model = catalogue.resolve(model_name)
    own = engine is None
    if own:
        _progress(f"starting the engine on {model.path}")
        engine = await Engine.start(model)
        _progress(f"engine up in {engine.startup_s:.1f} s")
    try:
        one = Sampling(temperature=0.0, max_tokens=1)
        await _ttft_and_decode(engine, Prompt(text="Warm up."), Sampling(max_tokens=8))

        ttfts = []
        for i in range(1 if tiny else 8):
            q = f"In one sentence, why is the {rng.choice(WORDS)} {rng.choice(WORDS)} number {i} important?"
            ttft, _, _ = await _ttft_and_decode(engine, Prompt(messages=(("user", q),)), one)
            ttfts.append(ttft)
        _progress(f"TTFT p50 {statistics.median(ttfts):.3f} s")

        decode = Sampling(temperature=0.0, max_tokens=16 if tiny else 128)
        count = Prompt(text="Count from 1 to 100, separated by commas: 1, 2, 3,")
        _, rest, n = await _ttft_and_decode(engine, count, decode)
        decode_s_per_token = rest / max(n - 1, 1)
        _progress(f"decode {n} tokens, {1 / decode_s_per_token:.1f} tok/s")

        t0 = time.perf_counter()
        results = await asyncio.gather(*[
            _ttft_and_decode(engine, Prompt(text=f"Count from {k} to {k + 100}, separated by commas:"), decode)
            for k in (1, 200, 400, 600)])
        batch4 = sum(r[2] for r in results) / (time.perf_counter() - t0)
        _progress(f"4 streams: {batch4:.1f} tok/s")

        uncached, cached, short = [], [], []
        question = engine.tokenizer.encode("\nQuestion: which word came first?", add_special_tokens=False)
        for t in range(trials):
            prefix = _filler_ids(engine, 200 if tiny else 2000, rng)
            uncached.append((await _ttft_and_decode(engine, prefix + question, one))[0])
            other = engine.tokenizer.encode(f"\nQuestion {t}: which word came last?", add_special_tokens=False)
            cached.append((await _ttft_and_decode(engine, prefix + other, one))[0])
            short.append((await _ttft_and_decode(engine, _filler_ids(engine, 50 if tiny else 500, rng) + question, one))[0])
            _progress(f"2k prefix trial {t}: uncached {uncached[-1]:.3f} s, cached {cached[-1]:.3f} s, "
                      f"500-token {short[-1]:.3f} s")
        u, c, s = statistics.median(uncached), statistics.median(cached), statistics.median(short)
        load = engine.load()
        return {
            "bench": "engine", "model": model_name, "device": "cpu" if _is_cpu() else "gpu",
            "cpus": os.cpu_count(), "load_avg_1m": round(os.getloadavg()[0], 2),
            "startup_s": round(engine.startup_s, 2),
            "ttft_p50_s": round(statistics.median(ttfts), 4),
            "decode_tok_s": round(1 / decode_s_per_token, 2),
            "batch4_tok_s": round(batch4, 2),
            "ttft_uncached_2k_s": round(u, 4), "ttft_cached_2k_s": round(c, 4),
            "prefix_cache_speedup": round(u / c, 2),
            "prefill_s_per_token": round((u - s) / 1500, 6),
            "decode_s_per_token": round(decode_s_per_token, 5),
            "prefix_queries": load.prefix_queries, "prefix_hits": load.prefix_hits,
            "trials": trials,
        }
    finally:
        if own:
            engine.shutdown()


def _is_cpu() -> bool:
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--tiny", action="store_true", help="seconds after start-up, figures meaningless: what make test runs")
    return ap


def tiny_args(args: argparse.Namespace) -> argparse.Namespace:
    if args.tiny:
        args.trials = 1
    return args


async def main_async(args: argparse.Namespace, engine=None) -> dict:
    return await run(args.model, args.trials, args.tiny, engine)


def main() -> None:
    args = tiny_args(parser().parse_args())
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    print(json.dumps(asyncio.run(main_async(args))), flush=True)



async def with_engine(args: argparse.Namespace, engine) -> dict:
    """This bench on an engine someone else started (testkit/bench_engines.py: make test's tiny
    runs share one)."""
    return await main_async(args, engine)

if __name__ == "__main__":
    main()
