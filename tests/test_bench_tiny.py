"""Every benchmark stays runnable: each bench/*.py runs its tiny mode here (seconds each), so a
changed interface breaks this test instead of the benchmark, months later, when someone needs
its figures. A new bench file fails here until it has a tiny mode listed below.

The tiny modes measure nothing worth reading; what is checked is that each runs to the end and
prints its one JSON line. Benches that start a vLLM engine run in the engine group
(tests/conftest.py), one at a time with the other engine tests; the rest run beside them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"

#: bench file -> (its tiny mode's arguments, seconds it may take, starts a vLLM engine)
TINY: dict[str, tuple[list[str], int, bool]] = {
    "abci_app.py": (["--tiny"], 120, False),
    "challenge_realism.py": (["--tiny"], 300, False),
    "consensus.py": (["--tiny"], 180, False),
    "dashboard.py": (["--tiny"], 300, False),
    "detection.py": (["--tiny"], 180, False),
    "engine.py": (["--tiny"], 300, True),
    "engine_profile.py": (["--tiny"], 300, True),
    "load.py": (["--tiny"], 180, False),
    "overlay.py": (["--tiny"], 240, False),
    "reliability.py": (["--tiny"], 240, False),
    "routing.py": (["--tiny"], 400, True),
    "sida.py": (["--tiny"], 60, False),
    "verify_throughput.py": (["--tiny"], 300, True),
}

FILES = sorted(p.name for p in BENCH.glob("*.py"))


def _param(name: str):
    engine = TINY.get(name, ([], 0, False))[2]
    marks = [pytest.mark.engine] if engine else [pytest.mark.network]
    return pytest.param(name, marks=marks, id=name[:-3])


@pytest.mark.parametrize("name", [_param(n) for n in FILES])
def test_every_bench_runs_its_tiny_mode_and_prints_one_json_line(name, tmp_path):
    assert name in TINY, f"bench/{name} has no tiny mode here: give it one (seconds) and list it in TINY"
    args, limit_s, _ = TINY[name]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp_path)}
    done = subprocess.run([sys.executable, str(BENCH / name), *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=limit_s, start_new_session=True)
    assert done.returncode == 0, f"bench/{name} {' '.join(args)} failed:\n{done.stderr[-4000:]}"
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert lines, f"bench/{name} printed no JSON line:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    figures = json.loads(lines[-1])
    assert figures.get("bench") == name[:-3], figures


def test_the_list_names_only_benches_that_exist():
    assert sorted(TINY) == FILES, "TINY lists a bench file that is gone (or misses one)"
