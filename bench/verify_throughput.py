"""Verification throughput: one teacher-forced pass vs. the paper's token-by-token scoring.

    .venv/bin/python bench/verify_throughput.py [--model smollm2-135m] [--replies 6] [--tokens 128]
    .venv/bin/python bench/verify_throughput.py --tiny     # what make test runs

Both methods score the same replies (sampled by the same engine at the challenge temperature)
on the same vLLM engine in this process, on this machine:

  single pass       one request per reply: prompt + reply, prompt_logprobs with the top-20
                    alternatives (what verifier.epochs.reference / the Score RPC do)
  token by token    the paper's Algorithm 3: one 1-token request per reply token with the top-20
                    next-token log-probabilities after prompt + reply[:i] (the floor when the reply
                    token is not among them); measured sequentially (as the algorithm is written)
                    and with all of a reply's requests submitted at once (vLLM batches them,
                    prefix caching on: the strongest form of the baseline)

and, for a committee of 4 members sharing this one engine (the devnet's and the tests' set-up),
each of another set of replies scored by all 4 at once:

  shared passes     the members' identical calls share one pass (model_node.engine.SharedPasses)
  one pass each     each member's call runs its own pass (the engine's pass called directly)

Prints ONE JSON line: verifications per minute of each method and the speed-ups
(goal: single pass >= 20x token-by-token), the committee's seconds both ways and their ratio,
plus the largest |logprob| difference between the two methods (they must compute the same
numbers). Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

QUESTIONS = (
    "Why do volcanoes erupt, and can scientists predict it?",
    "What should a beginner know about sourdough starters?",
    "How does compound interest work in a savings account?",
    "Can you explain how vaccines train the immune system?",
    "What are good ways to keep houseplants alive in winter?",
    "Which is better for a small team, SQL or a document database?",
    "How long does it take to train for a first marathon?",
    "What happens if the Moon suddenly disappeared?",
)


def _progress(msg: str) -> None:
    print(f"[bench/verify_throughput] {msg}", file=sys.stderr, flush=True)


async def _sample_replies(engine, n: int, tokens: int):
    from gentorrent.config import USER_API
    from gentorrent.generation import Prompt, Sampling

    out = []
    for i in range(n):
        prompt = Prompt(messages=(("user", QUESTIONS[i % len(QUESTIONS)]),))
        ids = engine.encode(prompt)
        sampling = Sampling(temperature=USER_API.temperature, max_tokens=tokens, seed=i)  # what most asks use
        reply = [t async for d in engine.generate(ids, sampling) for t in d.token_ids]
        out.append((ids, reply))
    return out


async def _single_pass(engine, replies, top_k: int):
    results = []
    t0 = time.perf_counter()
    for ids, reply in replies:
        results.append(await engine.score(ids, token_ids=reply, top_k=top_k))
    return time.perf_counter() - t0, results


async def _next_token_logprob(engine, prefix: list[int], token: int, top_k: int) -> float:
    """Algorithm 3's step: one 1-token request after `prefix`; the logprob of `token` if the
    engine's top-k holds it, else the paper's floor (no prompt logprobs are computed)."""
    from vllm import SamplingParams

    from verifier.epochs.scoring import LOGPROB_FLOOR

    sp = SamplingParams(max_tokens=1, temperature=0.0, logprobs=top_k, detokenize=False)
    final = None
    async for out in engine._run(prefix, sp, None):
        final = out
    row = final.outputs[0].logprobs[0]
    return float(row[token].logprob) if token in row else LOGPROB_FLOOR


async def _token_by_token(engine, replies, top_k: int, batched: bool):
    """One request per reply token (prefix = prompt + reply[:i]), as the paper's Algorithm 3."""
    logprobs = []
    t0 = time.perf_counter()
    for ids, reply in replies:
        calls = [_next_token_logprob(engine, ids + reply[:i], reply[i], top_k) for i in range(len(reply))]
        if batched:
            got = await asyncio.gather(*calls)
        else:
            got = [await c for c in calls]
        logprobs.append(list(got))
    return time.perf_counter() - t0, logprobs


async def _committee(engine, replies, top_k: int, shared: bool, members: int = 4) -> float:
    """Seconds for `members` verifiers to score every reply at once on this one engine."""
    t0 = time.perf_counter()
    for ids, reply in replies:
        if shared:
            calls = [engine.score(ids, token_ids=reply, top_k=top_k) for _ in range(members)]
        else:
            calls = [engine._score_pass(list(ids), list(reply), top_k) for _ in range(members)]
        await asyncio.gather(*calls)
    return time.perf_counter() - t0


async def main(args, engine=None) -> dict:
    """`engine`: a started engine to measure (make test shares one among the engine benches);
    by default one is started, and shut down after."""
    from gentorrent.config import SCORING
    from model_node import catalogue
    from model_node.engine import Engine

    own = engine is None
    if own:
        engine = await Engine.start(catalogue.resolve(args.model))
    try:
        _progress(f"engine up in {engine.startup_s:.0f} s; sampling 2 x {args.replies} replies of {args.tokens} tokens")
        sampled = await _sample_replies(engine, 2 * args.replies, args.tokens)  # half for the committee
        replies, others = sampled[:args.replies], sampled[args.replies:]
        n_tokens = sum(len(r) for _, r in replies)
        await engine.score(replies[0][0], token_ids=replies[0][1][:4], top_k=SCORING.top_k)  # warm-up
        single_s, single = await _single_pass(engine, replies, SCORING.top_k)
        _progress(f"single pass: {single_s:.2f} s for {len(replies)} replies")
        k = max(1, args.replies // 2)  # the baselines are slow: fewer replies, per-reply rates
        seq_s, seq_lp = await _token_by_token(engine, replies[:k], SCORING.top_k, batched=False)
        _progress(f"token by token, sequential: {seq_s:.2f} s for {k} replies")
        bat_s, bat_lp = await _token_by_token(engine, replies[:k], SCORING.top_k, batched=True)
        _progress(f"token by token, batched: {bat_s:.2f} s for {k} replies")
        own_s = await _committee(engine, others, SCORING.top_k, shared=False)  # first: keeps nothing
        shared_s = await _committee(engine, others, SCORING.top_k, shared=True)
        _progress(f"committee of 4: {own_s:.2f} s one pass each, {shared_s:.2f} s shared, {len(others)} replies")
    finally:
        if own:
            engine.shutdown()
    # where the reply token is in the top-k both methods must compute the same log-probability
    diff = max((abs(a - b.logprob) for lps, res in zip(seq_lp, single) for a, b in zip(lps, res.tokens)
                if b.rank <= SCORING.top_k), default=0.0)
    per_min = lambda seconds, count: 60.0 * count / seconds  # noqa: E731
    single_rate = per_min(single_s, len(replies))
    seq_rate, bat_rate = per_min(seq_s, k), per_min(bat_s, k)
    return {
        "bench": "verify_throughput", "model": args.model, "reply_tokens_mean": round(n_tokens / len(replies), 1),
        "single_pass_per_min": round(single_rate, 1),
        "token_by_token_sequential_per_min": round(seq_rate, 2),
        "token_by_token_batched_per_min": round(bat_rate, 2),
        "speedup_vs_sequential": round(single_rate / seq_rate, 1),
        "speedup_vs_batched": round(single_rate / bat_rate, 1),
        "goal_speedup": 20.0,
        "committee_of_4_one_pass_each_s": round(own_s, 2), "committee_of_4_shared_s": round(shared_s, 2),
        "shared_pass_speedup": round(own_s / shared_s, 2),
        "max_logprob_diff": round(diff, 5),
        "replies_single": len(replies), "replies_token_by_token": k,
        "machine_load_1min": round(os.getloadavg()[0], 2),
    }


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--replies", type=int, default=6)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--tiny", action="store_true", help="2 replies of 12 tokens: what make test runs")
    return p


def tiny_args(args: argparse.Namespace) -> argparse.Namespace:
    if args.tiny:
        args.replies, args.tokens = 2, 12
    return args



async def with_engine(args: argparse.Namespace, engine) -> dict:
    """This bench on an engine someone else started (testkit/bench_engines.py: make test's tiny
    runs share one)."""
    return await main(args, engine)

if __name__ == "__main__":
    args = tiny_args(parser().parse_args())
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")  # stdout carries the one JSON line
    print(json.dumps(asyncio.run(main(args))), flush=True)
