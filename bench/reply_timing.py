"""What a relay learns from reply timing, and what it costs: the old clock vs replies by content.

A relay on a reply path sees when each reply message of an answer passes (sizes are padded to
classes). Three rules for when a model node sends one, each fed the same token arrival times:

    per chunk   one message per token (no defence): the relay counts tokens and times each
    tick 50 ms  the old rule: first at once, then one message every 50 ms, empty or not, the
                last at once: the relay learns the start and the duration, nothing else
    content     the shipped rule (gentorrent/overlay/reply_pacing.ReplyPacer, window 250 ms):
                first at once, then what came since on a 250 ms grid, never an empty message,
                the last at once: the relay learns the start, the duration and which 250 ms
                slots held tokens

Traces: steady generation at R tokens/s (a decode rate with a little jitter) for answers of L
tokens, and the same with stalls (a 1-3 s pause, as a loaded engine or a long prefill of a
batched request shows). For each rule: messages per answer (the cost: each one is a sealing,
an S-IDA split and a layer at every hop both ways), and what the relay can read: whether the
message count gives the token count away (messages == L: every token alone in its
message; for the tick a coincidence, since its count is a function of the duration alone).

    .venv/bin/python bench/reply_timing.py [--seed 1]
    .venv/bin/python bench/reply_timing.py --tiny

Prints one JSON line. Pure (no network, no clock): the rules run in virtual time.

`cover` (in the same line): what the proxies' cover holds cost and hide
(gentorrent/overlay/cover_timing.py, bound `OverlayParams.position_cover_s`): each of the n
proxies holds its query clove and its reply cloves for uniform draws in [0, bound]; the model
node decodes at the k-th query clove, the user rebuilds each reply message at its k-th clove
(every message of one ask waits the same on one route, so the answer keeps its pace). Reported:
the time to first token they add (mean, p50, p99, max), and what one observation of a lone
relay then tells about its position, 1/2 + d / (2 bound) for a hop latency d.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gentorrent.config import CLOVES, OVERLAY  # noqa: E402
from gentorrent.overlay.reply_pacing import ReplyPacer  # noqa: E402
from gentorrent.wire import gentorrent_pb2 as pb  # noqa: E402

TICK_S = 0.05  # the old reply_cadence_s
RATES = (2.0, 5.0, 20.0, 50.0)  # tokens per second: a busy CPU engine .. a GPU
LENGTHS = (16, 64, 256, 500)


def trace(tokens: int, rate: float, rng: random.Random, stall: bool = False) -> list[float]:
    """Arrival times of `tokens` tokens at about `rate` per second (and one 1-3 s stall)."""
    t, out = 0.0, []
    stall_at = rng.randrange(1, tokens) if stall and tokens > 1 else -1
    for i in range(tokens):
        if i:
            t += rng.uniform(0.8, 1.2) / rate
        if i == stall_at:
            t += rng.uniform(1.0, 3.0)
        out.append(t)
    return out


def per_chunk(arrivals: list[float]) -> list[float]:
    return list(arrivals)


def tick(arrivals: list[float], step: float = TICK_S) -> list[float]:
    """The old rule: a message at the first token, every `step` after it, and at the last."""
    start, end = arrivals[0], arrivals[-1]
    times = [start]
    t = start + step
    while t < end:
        times.append(t)
        t += step
    return times + [end]


def content(arrivals: list[float], window: float = OVERLAY.reply_window_s) -> list[float]:
    """The shipped rule, run by the pacer itself in virtual time."""
    pacer, times, i = ReplyPacer(window), [], 0
    while not pacer.finished:
        due = pacer.due_at()
        if due is not None and (i == len(arrivals) or due <= arrivals[i]):
            assert pacer.take(due) is not None
            times.append(due)
            continue
        pacer.add(pb.GenerateChunk(token_ids=[i], final=i == len(arrivals) - 1), arrivals[i])
        i += 1
    return times


RULES = {"per_chunk": per_chunk, "tick_50ms": tick, "content_250ms": content}


def measure(seed: int, lengths=LENGTHS, rates=RATES, samples: int = 20) -> dict:
    rng = random.Random(seed)
    table = []
    for stall in (False, True):
        for rate in rates:
            for length in lengths:
                row = {"rate_tok_s": rate, "tokens": length, "stall": stall}
                for name, rule in RULES.items():
                    counts, exact = [], 0
                    for _ in range(samples):
                        times = rule(trace(length, rate, rng, stall))
                        counts.append(len(times))
                        exact += len(times) == length  # each token alone in its message: the count is the length
                    row[name] = {"messages": round(sum(counts) / samples, 1), "count_gives_tokens": exact / samples}
                table.append(row)
    summary = {}
    for name in RULES:
        steady = [r for r in table if not r["stall"]]
        summary[name] = {
            "messages_longest_at_fastest": next(r[name]["messages"] for r in steady
                                                    if r["tokens"] == max(lengths) and r["rate_tok_s"] == max(rates)),
            "answers_whose_count_gives_the_tokens": round(sum(r[name]["count_gives_tokens"] for r in table) / len(table), 3),
            "steady_slower_than_window": round(sum(r[name]["count_gives_tokens"] for r in steady
                                                  if r["rate_tok_s"] * OVERLAY.reply_window_s < 1)
                                              / max(1, sum(1 for r in steady if r["rate_tok_s"] * OVERLAY.reply_window_s < 1)), 3),
            "steady_faster_than_window": round(sum(r[name]["count_gives_tokens"] for r in steady
                                                  if r["rate_tok_s"] * OVERLAY.reply_window_s >= 1)
                                              / max(1, sum(1 for r in steady if r["rate_tok_s"] * OVERLAY.reply_window_s >= 1)), 3),
        }
    return {"bench": "reply_timing", "window_s": OVERLAY.reply_window_s, "tick_s": TICK_S, "seed": seed,
            "samples_per_cell": samples, "summary": summary, "table": table}


def cover(seed: int, samples: int = 20_000, n: int = CLOVES.n, k: int = CLOVES.k,
          bound: float = OVERLAY.position_cover_s) -> dict:
    """Added time to first token of the proxies' holds, and the position advantage they leave."""
    rng = random.Random(seed)
    added = sorted(sorted(rng.uniform(0, bound) for _ in range(n))[k - 1]
                   + sorted(rng.uniform(0, bound) for _ in range(n))[k - 1] for _ in range(samples))
    return {"bound_s": bound, "n": n, "k": k, "samples": samples,
            "ttft_added_s": {"mean": round(sum(added) / samples, 4), "p50": round(added[samples // 2], 4),
                             "p99": round(added[int(samples * 0.99)], 4), "max": round(added[-1], 4),
                             "expected_mean": round(2 * k / (n + 1) * bound, 4)},
            "later_tokens_added_s": "the same as the first: one hold per route and ask",
            "position_guessed_right_at_most": {f"hop_latency_{int(d * 1000)}ms": round(0.5 + d / (2 * bound), 3)
                                               for d in (0.001, 0.01, 0.05)} if bound else None}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--tiny", action="store_true", help="two lengths, two rates, 3 samples")
    args = ap.parse_args()
    if args.tiny:
        out = measure(args.seed, lengths=(16, 64), rates=(2.0, 20.0), samples=3)
        out["cover"] = cover(args.seed, samples=200)
    else:
        out = measure(args.seed)
        out["cover"] = cover(args.seed)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
