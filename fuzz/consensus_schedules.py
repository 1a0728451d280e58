"""Long campaign of adversarial consensus schedules (testkit/schedules.py).

Draws seeded plans for committees of 4 and 7 validators in turn (Byzantine validators and
Twins up to f, equivocation, junk votes, poisoned bodies, lying round states, drops,
duplicates, reordering, partitions that heal, crashes at any step with torn write-ahead logs),
runs each on the real driver, state machine, vote keeper, signer and WAL, and checks safety
always and liveness after GST. Progress goes to stderr; at the end ONE JSON line to stdout.
Every failing schedule is saved as a replayable file (default tests/data/consensus_schedules/,
which tests/test_consensus_schedules.py replays: a finding becomes a regression test).

    .venv/bin/python fuzz/consensus_schedules.py --minutes 60            # an hour
    .venv/bin/python fuzz/consensus_schedules.py --schedules 100000 --start 0
    .venv/bin/python fuzz/consensus_schedules.py --replay tests/data/consensus_schedules/n4-seed7.json --trace
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from testkit.schedules import Plan, judge, load_failure, run_plan, save_failure  # noqa: E402

SAVE_DIR = ROOT / "tests" / "data" / "consensus_schedules"


def campaign(args) -> dict:
    sizes = [int(v) for v in args.validators.split(",")]
    stop_at = time.monotonic() + args.minutes * 60 if args.minutes else float("inf")
    stopping = []
    signal.signal(signal.SIGINT, lambda *_: stopping.append(1))
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))
    t0 = last = time.monotonic()
    runs = {n: 0 for n in sizes}
    virtual = 0.0
    failures: list[dict] = []
    seed = args.start
    while not stopping and time.monotonic() < stop_at and sum(runs.values()) < args.schedules:
        for n in sizes:
            verdict = judge(Plan.random(seed, n))
            runs[n] += 1
            virtual += verdict.virtual_s
            if not verdict.ok:
                path = save_failure(verdict, args.save_dir)
                failures.append({"n": n, "seed": seed, "file": str(path), "violations": verdict.violations[:3]})
                print(f"VIOLATION n={n} seed={seed}: {verdict.violations[:3]} -> {path}", file=sys.stderr, flush=True)
        seed += 1
        if time.monotonic() - last >= args.progress_s:
            last = time.monotonic()
            done = sum(runs.values())
            print(f"[{last - t0:7.0f} s] {done} schedules ({', '.join(f'n={n}: {c}' for n, c in runs.items())}), "
                  f"{done / (last - t0):.1f}/s, {len(failures)} violations, next seed {seed}",
                  file=sys.stderr, flush=True)
    elapsed = time.monotonic() - t0
    done = sum(runs.values())
    return {"bench": "consensus_schedules", "schedules": done, "by_validators": {str(n): c for n, c in runs.items()},
            "violations": len(failures), "failures": failures, "seeds": [args.start, seed - 1],
            "seconds": round(elapsed, 1), "schedules_per_s": round(done / max(elapsed, 1e-9), 2),
            "virtual_s": round(virtual, 1)}


def replay(path: Path, trace: bool) -> dict:
    plan, recorded = load_failure(path)
    verdict = run_plan(plan, trace=trace)
    if trace:
        print("\n".join(verdict.trace), file=sys.stderr)
    return {"bench": "consensus_schedules", "replay": str(path), "recorded": recorded,
            "violations": verdict.violations, "heights": verdict.heights}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=0.0, help="stop after this long (0: no time limit)")
    ap.add_argument("--schedules", type=int, default=10**12, help="stop after this many schedules")
    ap.add_argument("--validators", default="4,7", help="committee sizes, in turn (default 4,7)")
    ap.add_argument("--start", type=int, default=0, help="first seed")
    ap.add_argument("--save-dir", type=Path, default=SAVE_DIR, help="where failing schedules are written")
    ap.add_argument("--progress-s", type=float, default=30.0)
    ap.add_argument("--replay", type=Path, help="run one saved schedule and report it")
    ap.add_argument("--trace", action="store_true", help="with --replay: print every message to stderr")
    args = ap.parse_args()
    if not args.replay and not args.minutes and args.schedules == 10**12:
        ap.error("give --minutes or --schedules (or --replay FILE)")
    logging.disable(logging.WARNING)
    print(json.dumps(replay(args.replay, args.trace) if args.replay else campaign(args)))


if __name__ == "__main__":
    main()
