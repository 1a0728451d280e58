"""How often does the committee's scorer call an HONEST reply abnormal? Replies of an honest node
on the engine settings a volunteer may run, scored by the reference as the committee scores them.

    # recording (real engines, slow, resumable; run under the heavy lock, in chunks):
    flock /tmp/gt-heavy.lock nice -n 5 .venv/bin/python bench/honest_noise.py generate --setting bf16 --count 100
    flock /tmp/gt-heavy.lock nice -n 5 .venv/bin/python bench/honest_noise.py score
    # analysis (pure, seconds; re-scores the cached token scores with today's scorer):
    .venv/bin/python bench/honest_noise.py analyse [--tiny]
    .venv/bin/python bench/honest_noise.py simulate [--n 1500]   # exact honest sampling, synthetic
    .venv/bin/python bench/honest_noise.py --tiny                # seconds: what make test runs

Stage 1, `generate`: requests drawn exactly as the committee draws challenges (the traffic model
over the corpus's challenge pool: shapes, client profiles, sampling, max_tokens 128-1,024) go to
an honest engine started with one SETTING (dtype bf16 or fp32, max batch size, chunked prefill
forced by a small token budget, prefix caching on or off) through LocalGenerator's own path
(parse, chat template, the same Sampling). Requests are sent together, so they are decoded in
batches of varying size as on a busy node. Output token ids go to results/honest_noise/.
Stage 2, `score`: the reference engine (the committee's: fp32, vLLM defaults) scores every
reply not yet scored in one teacher-forced pass, top-k as SCORING.top_k; the compact token
scores are cached (results/honest_noise/, gitignored: tens of MB) and a per-reply summary is
committed (results/honest_noise.json) so the figures can be checked without the cache.
Stage 3, `analyse`: every cached reply through verifier.epochs.scoring.score_reply (today's
scorer), the abnormal rate (credibility < tau) per setting and overall, with its 95 % Wilson
and Clopper-Pearson intervals, counted over replies of 32-1,024 tokens; the lowest replies with
their z-scores (what made them abnormal). Prints ONE JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from detection import wilson  # noqa: E402  (bench/ is scripts: one 95 % Wilson interval for both)

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / "results" / "honest_noise"  # gitignored: output tokens and raw token scores
SUMMARY = ROOT / "results" / "honest_noise.json"  # committed: per-reply statistics
MODEL = "smollm2-135m"
MIN_TOKENS, MAX_TOKENS = 32, 1024  # the reply lengths the rate is stated for
SEED = b"gentorrent/bench/honest-noise/v1"

#: what a volunteer may run: vLLM engine arguments over the node's own (model_node.engine)
SETTINGS: dict[str, dict] = {
    "fp32": {},  # the node's defaults on a CPU: fp32, prefix caching on, up to 16 sequences a batch
    "bf16": {"dtype": "bfloat16"},
    "fp32-no-prefix-cache": {"enable_prefix_caching": False},
    "fp32-chunked-256": {"max_num_batched_tokens": 256},  # long prompts prefilled in 256-token chunks
    "bf16-batch-1": {"dtype": "bfloat16", "max_num_seqs": 1},
    "fp32-batch-4-no-prefix-cache": {"max_num_seqs": 4, "enable_prefix_caching": False},
}


def _progress(msg: str) -> None:
    print(f"[bench/honest_noise] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- requests


def requests(setting: str, count: int, offset: int = 0) -> list[dict]:
    """Challenge-like requests #offset.. of one setting (the committee's own draw, seeded by the
    setting and index: each setting answers prompts of its own)."""
    from gentorrent.traffic.corpus import load_corpus
    from gentorrent.traffic.model import TrafficPool
    from verifier.epochs.challenges import ChallengeError, draw_challenge

    pool = TrafficPool.build(load_corpus().challenge)
    out = []
    for i in range(offset, offset + count):
        attempt = 0
        while True:
            try:
                request = draw_challenge(pool, SEED, f"{setting}/{i}", attempt)
                break
            except ChallengeError:
                attempt += 1
        out.append({"i": i, "request": request.to_dict()})
    return out


def _jsonl(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


async def _engine(overrides: dict):
    """An Engine of the node's own arguments with `overrides` (the same shell the node uses)."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    from gentorrent.config import MODEL_NODE
    from model_node import catalogue
    from model_node import engine as eng

    eng._offline_environment(MODEL_NODE)
    model = catalogue.resolve(MODEL)
    stats = eng.LoadStats()
    args = {**eng.engine_arguments(model, MODEL_NODE, None, on_cpu=True), **overrides}
    llm = await asyncio.to_thread(lambda: AsyncLLM.from_engine_args(AsyncEngineArgs(**args),
                                                                    stat_loggers=[eng._stat_logger_factory(stats)]))
    engine = eng.Engine(llm, model.name, llm.model_config.max_model_len, stats, MODEL_NODE)
    await engine._warm_up()
    return engine


async def generate(setting: str, count: int) -> dict:
    """Generate the next `count` replies of `setting` not yet cached."""
    from gentorrent import generation
    from gentorrent.config import MODEL_NODE
    from gentorrent.traffic.model import ChatRequest

    CACHE.mkdir(parents=True, exist_ok=True)
    path = CACHE / f"gen-{setting}.jsonl"
    done = {r["i"] for r in _jsonl(path)}
    offset = (max(done) + 1) if done else 0
    todo = [r for r in requests(setting, count, offset) if r["i"] not in done]
    started = time.monotonic()
    engine = await _engine(SETTINGS[setting])
    _progress(f"{setting}: engine up in {time.monotonic() - started:.0f} s; {len(todo)} requests")
    out, tokens_total = path.open("a"), 0

    async def one(row: dict) -> None:
        nonlocal tokens_total
        wire = ChatRequest.from_dict(row["request"]).to_generate_request(MODEL)
        job = generation.parse_generate(wire, MODEL, MODEL_NODE)
        ids = engine.encode(job.prompt)
        engine.check_fits(ids)
        tokens, reason = [], ""
        async for d in engine.generate(ids, job.sampling):
            tokens.extend(d.token_ids)
            reason = d.finish_reason or reason
        tokens_total += len(tokens)
        out.write(json.dumps({"i": row["i"], "setting": setting, "request": row["request"], "tokens": tokens,
                              "finish_reason": reason, "prompt_tokens": len(ids)}) + "\n")
        out.flush()
        _progress(f"{setting} #{row['i']}: {len(tokens)} tokens ({reason}; T={row['request']['temperature']})")

    wall = await _on_engine(engine, [one(r) for r in todo], out.close)
    return {"setting": setting, "generated": len(todo), "tokens": tokens_total, "seconds": round(wall, 1),
            "tokens_per_s": round(tokens_total / max(wall, 1e-9), 1)}


async def score(concurrency: int = 8) -> dict:
    """Score every generated reply not yet scored, on the reference (fp32, the node's defaults)."""
    from gentorrent import generation
    from gentorrent.config import MODEL_NODE, SCORING
    from gentorrent.traffic.model import ChatRequest

    scored_path = CACHE / "scores.jsonl"
    scored = {(r["setting"], r["i"]) for r in _read_scores()}
    todo = [r for p in sorted(CACHE.glob("gen-*.jsonl")) for r in _jsonl(p)
            if r["tokens"] and (r["setting"], r["i"]) not in scored]
    if not todo:
        return {"scored": 0}
    engine = await _engine({})
    gate = asyncio.Semaphore(concurrency)
    rows: list[dict] = []
    out = scored_path.open("a")  # one line a reply as it is scored, so a stopped run keeps them

    async def one(row: dict) -> None:
        async with gate:
            wire = ChatRequest.from_dict(row["request"]).to_generate_request(MODEL)
            job = generation.parse_generate(wire, MODEL, MODEL_NODE)
            result = await engine.score(job.prompt, token_ids=row["tokens"], top_k=SCORING.top_k)
            compact = [[round(t.logprob, 5), t.rank or 1, [round(v, 5) for _, v in t.top] or [round(t.logprob, 5)]]
                       for t in result.tokens]
            rows.append({"i": row["i"], "setting": row["setting"], "request": row["request"],
                         "finish_reason": row["finish_reason"], "scores": compact})
            out.write(json.dumps(rows[-1]) + "\n")
            out.flush()
            _progress(f"scored {row['setting']} #{row['i']} ({len(compact)} tokens)")

    wall = await _on_engine(engine, [one(r) for r in todo], out.close)
    return {"scored": len(rows), "seconds": round(wall, 1)}


async def _on_engine(engine, jobs: list, finally_do) -> float:
    """Run the jobs together on the engine (batched as on a busy node), then stop it; seconds taken."""
    t0 = time.monotonic()
    try:
        await asyncio.gather(*jobs)
    finally:
        engine.shutdown()
        finally_do()
    return time.monotonic() - t0


def _read_scores() -> list[dict]:
    """Every scored reply (a line cut short by a stop is left out)."""
    rows = []
    for line in (CACHE / "scores.jsonl").read_text().splitlines() if (CACHE / "scores.jsonl").exists() else ():
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue
    return rows


# --------------------------------------------------------------------------- analysis (pure)


def clopper_pearson(k: int, n: int, alpha: float = 0.05) -> tuple[float, float]:
    """Exact two-sided (1 - alpha) interval of k / n (beta quantiles)."""
    from scipy.stats import beta

    if n == 0:
        return (0.0, 1.0)
    lo = 0.0 if k == 0 else float(beta.ppf(alpha / 2, k, n - k + 1))
    hi = 1.0 if k == n else float(beta.ppf(1 - alpha / 2, k + 1, n - k))
    return (lo, hi)


def replies_needed(upper: float, alpha: float = 0.05) -> int:
    """Clean replies (0 abnormal) for a two-sided (1 - alpha) Clopper-Pearson upper bound <= `upper`."""
    return math.ceil(math.log(alpha / 2) / math.log(1 - upper))


def score_rows(rows: list[dict]) -> list[dict]:
    """Today's scorer on every cached reply (the committee's own function and parameters)."""
    from verifier.epochs.scoring import SamplingSpec, TokenScores, score_reply

    out = []
    for r in rows:
        s = r["scores"]
        scores = TokenScores([t[0] for t in s], [t[1] for t in s], [dict(enumerate(t[2])) for t in s])
        req = r["request"]
        report = score_reply(scores, SamplingSpec(req["temperature"], req["top_p"]))
        out.append({"i": r["i"], "setting": r["setting"], "tokens": len(s), "temperature": req["temperature"],
                    "top_p": req["top_p"], "max_tokens": req["max_tokens"], "finish_reason": r["finish_reason"],
                    "credibility": round(report.credibility, 4),
                    "z": {k: round(v, 2) for k, v in report.z.items()},
                    "factors": {k: round(v, 3) for k, v in report.factors.items() if v < 0.999}})
    return out


def analyse(rows: list[dict]) -> dict:
    from gentorrent.config import REPUTATION

    tau = REPUTATION.abnormal_threshold
    counted = [r for r in rows if MIN_TOKENS <= r["tokens"] <= MAX_TOKENS]

    def rate(group: list[dict]) -> dict:
        k, n = sum(r["credibility"] < tau for r in group), len(group)
        return {"abnormal": k, "of": n, "rate": round(k / max(1, n), 4),
                "wilson95": [round(v, 4) for v in wilson(k, n)],
                "clopper_pearson95": [round(v, 4) for v in clopper_pearson(k, n)]}

    by_setting = {s: rate([r for r in counted if r["setting"] == s]) for s in sorted({r["setting"] for r in rows})}
    worst = sorted(rows, key=lambda r: r["credibility"])[:8]
    lengths = sorted(r["tokens"] for r in counted)
    return {"bench": "honest_noise", "tau": tau, "replies": len(rows), "counted_32_to_1024_tokens": len(counted),
            "overall": rate(counted), "by_setting": by_setting,
            "below_0.9": sum(r["credibility"] < 0.9 for r in counted),
            "tokens": {"median": lengths[len(lengths) // 2] if lengths else 0, "max": lengths[-1] if lengths else 0,
                       "over_512": sum(t > 512 for t in lengths)},
            "goal": {"upper_bound_max": 0.005, "clean_replies_needed": replies_needed(0.005)},
            "lowest": worst}


# --------------------------------------------------------------------------- simulation (pure)


def simulate(n: int, seed: int, clip: float | None = None) -> list[dict]:
    """Honest replies drawn token by token from synthetic next-token distributions (a vocabulary
    of 2,000, Zipf-like logits of random sharpness: 55 % confident, 35 % a few choices, 10 % flat
    with much mass beyond the top-20) at the traffic model's temperatures and top_p, 32-1,024
    tokens, scored by today's scorer (or with `dispersion_clip_nats` = `clip`). No engine: it
    measures the scorer's own false alarms under exact honest sampling, not an engine's numerics."""
    import random
    from dataclasses import replace

    import numpy as np

    from gentorrent.config import SCORING
    from verifier.epochs.scoring import SamplingSpec, TokenScores, score_reply

    params = SCORING if clip is None else replace(SCORING, dispersion_clip_nats=clip)
    rng, pick = np.random.default_rng(seed), random.Random(seed)
    ranks_log = np.log(np.arange(1, 2001))
    rows = []
    for i in range(n):
        temperature = pick.choice((0.0, 0.2, 0.5, 0.7, 0.7, 0.8, 1.0, 1.0, 1.0, 1.2))
        top_p, length = pick.choice((1.0, 1.0, 0.9, 0.95)), pick.choice((32, 48, 64, 96, 128, 256, 512, 1024))
        sharp = np.where(rng.random(length) < 0.55, rng.uniform(4, 12, length),
                         np.where(rng.random(length) < 0.78, rng.uniform(1.2, 3, length), rng.uniform(0.6, 1.1, length)))
        logits = -sharp[:, None] * ranks_log[None, :] + rng.normal(0, 0.3, (length, ranks_log.size))
        logp = logits - np.logaddexp.reduce(logits, axis=1, keepdims=True)
        order = np.argsort(-logp, axis=1)
        sorted_lp = np.take_along_axis(logp, order, axis=1)
        if temperature < 1e-5:
            ranks = np.zeros(length, dtype=int)
        else:
            w = np.exp((sorted_lp - sorted_lp[:, :1]) / temperature)
            q = w / w.sum(axis=1, keepdims=True)
            if top_p < 1.0:
                keep = (np.cumsum(q, axis=1) - q) < top_p
                q = np.where(keep, q, 0.0)
                q /= q.sum(axis=1, keepdims=True)
            ranks = (np.cumsum(q, axis=1) < rng.random((length, 1))).sum(axis=1)
        lp = sorted_lp[np.arange(length), ranks]
        top = [dict(enumerate(row)) for row in sorted_lp[:, :SCORING.top_k].tolist()]
        report = score_reply(TokenScores(lp.tolist(), (ranks + 1).tolist(), top), SamplingSpec(temperature, top_p),
                             params)
        rows.append({"i": i, "setting": "simulated", "tokens": length, "temperature": temperature, "top_p": top_p,
                     "credibility": round(report.credibility, 4), "z": {k: round(v, 2) for k, v in report.z.items()},
                     "factors": {k: round(v, 3) for k, v in report.factors.items() if v < 0.999}})
    return rows


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("generate")
    g.add_argument("--setting", choices=sorted(SETTINGS), required=True)
    g.add_argument("--count", type=int, default=100)
    s = sub.add_parser("score")
    s.add_argument("--concurrency", type=int, default=8)
    m = sub.add_parser("simulate", help="the scorer on exact honest sampling from synthetic distributions (pure)")
    m.add_argument("--n", type=int, default=2000)
    m.add_argument("--seed", type=int, default=1)
    m.add_argument("--compare-unclipped", action="store_true", help="also score with the dispersion clip off")
    a = sub.add_parser("analyse")
    a.add_argument("--tiny", action="store_true", help="the committed summary's first 40 replies' figures only")
    argv = sys.argv[1:] if argv is None else argv
    if argv == ["--tiny"]:  # make test's run (tests/test_bench_tiny.py): seconds, no engine
        argv = ["simulate", "--n", "20"]
    args = p.parse_args(argv)
    if args.cmd == "generate":
        return asyncio.run(generate(args.setting, args.count))
    if args.cmd == "score":
        return asyncio.run(score(args.concurrency))
    if args.cmd == "simulate":
        result = {**analyse(simulate(args.n, args.seed)), "mode": "simulate", "seed": args.seed}
        if args.compare_unclipped:
            result["dispersion_unclipped"] = analyse(simulate(args.n, args.seed, clip=0.0))["overall"]
        return result
    raw = _read_scores()
    if raw:
        rows = score_rows(raw)
        SUMMARY.write_text(json.dumps({"note": "per-reply credibilities of honest replies (bench/honest_noise.py)",
                                       "replies": rows}, separators=(",", ":")))
    elif SUMMARY.exists():  # a checkout without the (gitignored) token scores: the committed summary
        rows = json.loads(SUMMARY.read_text())["replies"]
    else:  # nothing recorded yet: the figures of no replies (intervals [0, 1]), said so
        _progress("no recorded replies: run `generate` and `score` first (engines, under the heavy lock)")
        rows = []
    if args.tiny:
        rows = rows[:40]
    return analyse(rows)


if __name__ == "__main__":
    print(json.dumps(main()), flush=True)
