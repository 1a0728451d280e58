"""S-IDA split/combine latency at n=4, k=3 (ARCHITECTURE.md §7): prints ONE JSON line.

Goal: 1 KB <= 50 us p50 each, 100 KB <= 1 ms p50 each. combine() is given all n cloves
in shuffled order (the usual case: the first k-window decodes).

    .venv/bin/python bench/sida.py [REPS]     # default 2000
    .venv/bin/python bench/sida.py --tiny     # 20 reps: what make test runs
"""

from __future__ import annotations

import json
import os
import random
import sys
import time

import numpy as np

from gentorrent.config import CLOVES
from gentorrent.crypto import sida

SIZES = {"1KB": 1000, "29KB": 29_000, "100KB": 100_000}


def _measure(fn, reps: int) -> tuple[float, float]:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter_ns()
        fn()
        times.append(time.perf_counter_ns() - t0)
    arr = np.array(times) / 1000.0
    return float(np.percentile(arr, 50)), float(np.percentile(arr, 99))


def main() -> None:
    n, k = CLOVES.n, CLOVES.k
    reps = 20 if sys.argv[1:] == ["--tiny"] else int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    rng = random.Random(0)
    out: dict[str, object] = {"bench": "sida", "n": n, "k": k, "unit": "us", "reps": reps, "cpus": os.cpu_count()}
    for label, size in SIZES.items():
        data = os.urandom(size)
        for _ in range(50):  # warm caches (inverse matrices, pair tables)
            cl = sida.split(data, n, k)
            rng.shuffle(cl)
            assert sida.combine(cl) == data
        s50, s99 = _measure(lambda: sida.split(data, n, k), reps)
        cloves = sida.split(data, n, k)
        rng.shuffle(cloves)
        c50, c99 = _measure(lambda: sida.combine(cloves), reps)
        out[label] = {"split_p50": round(s50, 1), "split_p99": round(s99, 1),
                      "combine_p50": round(c50, 1), "combine_p99": round(c99, 1),
                      "clove_bytes": len(cloves[0])}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
