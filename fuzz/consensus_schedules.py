"""Long campaign of adversarial consensus schedules (testkit/schedules.py), in chunks.

Every family of testkit.schedules.FAMILIES in turn (network faults; crashes at any step with
torn write-ahead logs; crashes inside the sign-state write, a WAL rotation and the boot counter;
per-node clocks skewed to the drift bound that step at restarts; Byzantine validators and Twins;
far-future proposals and false proof-of-lock rounds; old messages of any height replayed;
committees that change through the chain; all at once), for committees of 4, 7, 10 and 31 validators (by default 45 : 35 : 19 : 1: a schedule of
31 costs some twenty of 4), each run on the real driver, state machine, vote keeper, signer and
WAL, safety checked always and liveness after GST. Schedule k of a campaign is family
FAMILIES[k % 9] with seed k // 9, so a campaign is the sequence of its indices and runs in chunks:
each chunk appends one JSON line to the ledger (--ledger) and the next one resumes where the
last ended (--resume). Progress goes to stderr; at the end ONE JSON line to stdout. A schedule
that runs past --schedule-limit-s of wall time, or past the worker's --worker-memory-gib, is an
overrun: a finding like a violation (a hang or a runaway of the explorer or of the nodes; two
once held a campaign at 8 GB for good), saved, and the campaign goes on. Every failing
schedule is saved as a replayable file (default tests/data/consensus_schedules/, which
tests/test_consensus_schedules.py replays: a finding becomes a regression test).

    .venv/bin/python fuzz/consensus_schedules.py --minutes 25 --jobs 2 --resume    # one chunk
    .venv/bin/python fuzz/consensus_schedules.py --summary                       # the ledger's totals
    .venv/bin/python fuzz/consensus_schedules.py --replay tests/data/consensus_schedules/n4-seed7.json --trace
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import resource
import signal
import sys
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from testkit.schedules import FAMILIES, SIZES, Plan, judge, load_failure, run_plan, save_failure  # noqa: E402

SAVE_DIR = ROOT / "tests" / "data" / "consensus_schedules"
LEDGER = ROOT / "results" / "consensus_campaign.jsonl"
WEIGHTS = (45, 35, 19, 1)
SCHEDULE_LIMIT_S = 300.0  # wall time of one schedule before it is an overrun (the slowest, n=31, take ~10 s)
WORKER_MEMORY_GIB = 4.0  # address space of one worker process


class Overrun(BaseException):
    """A schedule ran past its wall time (a BaseException: `judge` counts every Exception out of
    the engine as a violation of its own, and this one must reach `_run`)."""


@contextlib.contextmanager
def bounded(limit_s: float):
    """Raise Overrun in this (main) thread once `limit_s` of wall time has passed: the explorer
    runs in virtual time, so a schedule that does not end is a loop that never blocks, which a
    signal interrupts."""
    def overrun(*_):
        raise Overrun()

    previous = signal.signal(signal.SIGALRM, overrun)
    signal.setitimer(signal.ITIMER_REAL, limit_s)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _limit_memory(gib: float) -> None:
    """A worker's initializer: a runaway schedule meets MemoryError, not the machine's OOM killer."""
    if gib:
        soft = int(gib * (1 << 30))
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        resource.setrlimit(resource.RLIMIT_AS, (soft if hard == resource.RLIM_INFINITY else min(soft, hard), hard))


def size_cycle(sizes: tuple[int, ...], weights: tuple[int, ...]) -> list[int]:
    """Committee sizes interleaved in proportion to `weights` (a fixed, spread-out order)."""
    cycle: list[int] = []
    credit = [0.0] * len(sizes)
    for _ in range(sum(weights)):
        credit = [c + w for c, w in zip(credit, weights)]
        k = max(range(len(sizes)), key=lambda i: credit[i])
        credit[k] -= sum(weights)
        cycle.append(sizes[k])
    return cycle


def unit(index: int, cycle: list[int]) -> tuple[str, int, int]:
    """(family, committee size, seed) of schedule `index` of a campaign."""
    family, seed = FAMILIES[index % len(FAMILIES)], index // len(FAMILIES)
    return family, cycle[seed % len(cycle)], seed


def _run(index: int, family: str, n: int, seed: int, limit_s: float = SCHEDULE_LIMIT_S) -> dict:
    logging.disable(logging.CRITICAL)
    t = time.process_time()
    plan = Plan.random(seed, n, family)
    virtual_s = 0.0
    try:
        with bounded(limit_s):
            verdict = judge(plan)
        violations, virtual_s = verdict.violations, verdict.virtual_s
    except Overrun:  # (out of memory is judge's: "exception: MemoryError")
        violations = [f"overrun: no verdict within {limit_s:g} s of wall time (a hang of the explorer or the nodes)"]
    return {"index": index, "family": family, "n": n, "seed": seed, "violations": violations,
            "virtual_s": virtual_s, "cpu_s": time.process_time() - t,
            "plan": plan.to_json() if violations else None}


def campaign(args) -> dict:
    sizes = tuple(int(v) for v in args.validators.split(","))
    weights = tuple(int(v) for v in args.weights.split(","))
    if len(sizes) != len(weights):
        raise SystemExit("--validators and --weights need as many entries")
    cycle = size_cycle(sizes, weights)
    start = _resume_index(args.ledger) if args.resume else args.start
    stop_at = time.monotonic() + args.minutes * 60 if args.minutes else float("inf")
    stopping: list[int] = []
    signal.signal(signal.SIGINT, lambda *_: stopping.append(1))
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))
    t0 = last = time.monotonic()
    by_family = {f: 0 for f in FAMILIES}
    by_size = {str(n): 0 for n in sizes}
    done_indices: set[int] = set()
    failures: list[dict] = []
    virtual = cpu = 0.0
    nxt = start
    with ProcessPoolExecutor(max_workers=args.jobs, initializer=partial(_limit_memory, args.worker_memory_gib)) as pool:
        running = set()
        while True:
            while (not stopping and time.monotonic() < stop_at and nxt < start + args.schedules
                   and len(running) < 2 * args.jobs):
                running.add(pool.submit(_run, nxt, *unit(nxt, cycle), args.schedule_limit_s))
                nxt += 1
            if not running:
                break
            finished, running = wait(running, timeout=1.0, return_when=FIRST_COMPLETED)
            for fut in finished:
                r = fut.result()
                done_indices.add(r["index"])
                by_family[r["family"]] += 1
                by_size[str(r["n"])] += 1
                virtual += r["virtual_s"]
                cpu += r["cpu_s"]
                if r["violations"]:
                    plan = Plan.from_json(r["plan"])
                    path = save_failure(_Verdict(plan, r["violations"]), args.save_dir)
                    failures.append({"family": r["family"], "n": r["n"], "seed": r["seed"], "file": str(path),
                                     "violations": r["violations"][:3]})
                    print(f"VIOLATION {r['family']} n={r['n']} seed={r['seed']}: {r['violations'][:3]} -> {path}",
                          file=sys.stderr, flush=True)
            if time.monotonic() - last >= args.progress_s:
                last = time.monotonic()
                n_done = len(done_indices)
                print(f"[{last - t0:7.0f} s] {n_done} schedules ({', '.join(f'n={k}: {c}' for k, c in by_size.items())}), "
                      f"{n_done / (last - t0):.1f}/s, {len(failures)} violations, next index {nxt}",
                      file=sys.stderr, flush=True)
    elapsed = time.monotonic() - t0
    end = start + len(done_indices)  # (every index below nxt ran: in-flight work is awaited)
    out = {"bench": "consensus_schedules", "schedules": len(done_indices), "by_family": by_family,
           "by_validators": by_size, "violations": len(failures), "failures": failures,
           "indices": [start, end - 1], "jobs": args.jobs, "seconds": round(elapsed, 1),
           "schedules_per_s": round(len(done_indices) / max(elapsed, 1e-9), 2), "cpu_s": round(cpu, 1),
           "virtual_s": round(virtual, 1), "weights": dict(zip(map(str, sizes), weights)),
           "date": time.strftime("%Y-%m-%d %H:%M:%S"), "commit": _commit()}
    if args.ledger and done_indices:
        args.ledger.parent.mkdir(parents=True, exist_ok=True)
        with open(args.ledger, "a") as f:
            f.write(json.dumps(out, sort_keys=True) + "\n")
    return out


class _Verdict:
    def __init__(self, plan: Plan, violations: list[str]) -> None:
        self.plan, self.violations = plan, violations


def _resume_index(ledger: Path) -> int:
    if not ledger or not Path(ledger).exists():
        return 0
    ends = [json.loads(line)["indices"][1] for line in Path(ledger).read_text().splitlines() if line.strip()]
    return max(ends, default=-1) + 1


def summary(ledger: Path) -> dict:
    """The totals of every chunk in the ledger."""
    rows = [json.loads(line) for line in Path(ledger).read_text().splitlines() if line.strip()]
    total: dict = {"bench": "consensus_schedules", "summary": str(ledger), "chunks": len(rows),
                   "schedules": 0, "violations": 0, "by_family": {}, "by_validators": {}, "seconds": 0.0,
                   "cpu_s": 0.0, "commits": sorted({r.get("commit", "?") for r in rows})}
    for r in rows:
        for key in ("schedules", "violations", "seconds", "cpu_s"):
            total[key] += r.get(key, 0)
        for key in ("by_family", "by_validators"):
            for k, v in r[key].items():
                total[key][k] = total[key].get(k, 0) + v
    total["seconds"], total["cpu_s"] = round(total["seconds"], 1), round(total["cpu_s"], 1)
    total["indices"] = [min((r["indices"][0] for r in rows), default=0), max((r["indices"][1] for r in rows), default=-1)]
    return total


def replay(path: Path, trace: bool) -> dict:
    plan, recorded = load_failure(path)
    verdict = run_plan(plan, trace=trace)
    if trace:
        print("\n".join(verdict.trace), file=sys.stderr)
    return {"bench": "consensus_schedules", "replay": str(path), "recorded": recorded,
            "violations": verdict.violations, "heights": verdict.heights}


def _commit() -> str:
    """The code's commit (GT_CAMPAIGN_COMMIT names it for a copy outside git)."""
    import os
    import subprocess
    if os.environ.get("GT_CAMPAIGN_COMMIT"):
        return os.environ["GT_CAMPAIGN_COMMIT"]
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return out.stdout.strip() or "?"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=0.0, help="stop after this long (0: no time limit)")
    ap.add_argument("--schedules", type=int, default=10**12, help="stop after this many schedules")
    ap.add_argument("--validators", default=",".join(map(str, SIZES)), help="committee sizes (default 4,7,10,31)")
    ap.add_argument("--weights", default=",".join(map(str, WEIGHTS)), help="their shares (default 45,35,19,1)")
    ap.add_argument("--start", type=int, default=0, help="first schedule index")
    ap.add_argument("--resume", action="store_true", help="start after the last index in the ledger")
    ap.add_argument("--jobs", type=int, default=1, help="worker processes")
    ap.add_argument("--ledger", type=Path, default=LEDGER, help="append each chunk's JSON line here")
    ap.add_argument("--save-dir", type=Path, default=SAVE_DIR, help="where failing schedules are written")
    ap.add_argument("--progress-s", type=float, default=30.0)
    ap.add_argument("--schedule-limit-s", type=float, default=SCHEDULE_LIMIT_S,
                    help="wall time one schedule may take before it counts as an overrun (a finding)")
    ap.add_argument("--worker-memory-gib", type=float, default=WORKER_MEMORY_GIB,
                    help="address space of each worker (0: unlimited); past it a schedule is an overrun")
    ap.add_argument("--summary", action="store_true", help="print the ledger's totals and exit")
    ap.add_argument("--replay", type=Path, help="run one saved schedule and report it")
    ap.add_argument("--trace", action="store_true", help="with --replay: print every message to stderr")
    args = ap.parse_args()
    if args.summary:
        print(json.dumps(summary(args.ledger)))
        return
    if not args.replay and not args.minutes and args.schedules == 10**12:
        ap.error("give --minutes or --schedules (or --replay FILE, or --summary)")
    logging.disable(logging.CRITICAL)
    print(json.dumps(replay(args.replay, args.trace) if args.replay else campaign(args)))


if __name__ == "__main__":
    main()
