"""Every benchmark stays runnable: each bench/*.py runs its tiny mode here (seconds each), so a
changed interface breaks this test instead of the benchmark, months later, when someone needs
its figures. A new bench file fails here until it has a tiny mode listed below.

The tiny modes measure nothing worth reading; what is checked is that each runs to the end and
prints its one JSON line. Benches that need a vLLM engine run in the engine group
(tests/conftest.py) without starting engines of their own: the ones that drive an engine in
their own process share ONE (testkit/bench_engines.py), bench/routing.py uses the session's
model node as a group of one. The rest run beside the engine tests.
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
PLAIN, SHARED_ENGINE, SESSION_NODE = "plain", "shared engine", "session model node"

#: bench file -> (how its tiny mode runs, seconds it may take); arguments: --tiny, and EXTRA
EXTRA = {"overlay.py": ["--deployment"]}  # the committee, audits and gossip too
TINY: dict[str, tuple[str, int]] = {
    "abci_app.py": (PLAIN, 120),
    "challenge_realism.py": (PLAIN, 300),
    "consensus.py": (PLAIN, 180),
    "dashboard.py": (PLAIN, 300),
    "detection.py": (PLAIN, 180),
    "engine.py": (SHARED_ENGINE, 600),
    "engine_profile.py": (SHARED_ENGINE, 600),
    "load.py": (PLAIN, 180),
    "overlay.py": (PLAIN, 240),
    "reliability.py": (PLAIN, 240),
    "reply_timing.py": (PLAIN, 60),
    "routing.py": (SESSION_NODE, 300),
    "sida.py": (PLAIN, 60),
    "verify_throughput.py": (SHARED_ENGINE, 600),
}

FILES = sorted(p.name for p in BENCH.glob("*.py"))


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def _figures(name: str, done: subprocess.CompletedProcess) -> dict:
    assert done.returncode == 0, f"bench/{name} --tiny failed:\n{done.stderr[-4000:]}"
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert lines, f"bench/{name} printed no JSON line:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    return json.loads(lines[-1])


@pytest.fixture(scope="module")
def shared_engine_runs() -> dict[str, dict]:
    """The shared-engine benches' tiny runs, all on one engine started once."""
    names = [n for n, (kind, _) in TINY.items() if kind == SHARED_ENGINE]
    done = subprocess.run([sys.executable, "-m", "testkit.bench_engines", *names], cwd=ROOT,
                          env=_env(), capture_output=True, text=True,
                          timeout=max(TINY[n][1] for n in names), start_new_session=True)
    assert done.returncode == 0, done.stderr[-4000:]
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith('{"file"')]
    return {row["file"]: row for row in rows}


def _param(name: str):
    kind = TINY.get(name, (PLAIN, 0))[0]
    marks = [pytest.mark.engine] if kind != PLAIN else [pytest.mark.network]
    return pytest.param(name, marks=marks, id=name[:-3])


@pytest.mark.parametrize("name", [_param(n) for n in FILES])
def test_every_bench_runs_its_tiny_mode_and_prints_one_json_line(name, request):
    assert name in TINY, f"bench/{name} has no tiny mode here: give it one (seconds) and list it in TINY"
    kind, limit_s = TINY[name]
    if kind == SHARED_ENGINE:
        row = request.getfixturevalue("shared_engine_runs").get(name)
        assert row is not None and "error" not in row, row
        figures = row["result"]
    else:
        args = ["--tiny", *EXTRA.get(name, [])]
        if kind == SESSION_NODE:
            args += ["--node-info", str(request.getfixturevalue("model_node").home / "node.json")]
        done = subprocess.run([sys.executable, str(BENCH / name), *args], cwd=ROOT, env=_env(),
                              capture_output=True, text=True, timeout=limit_s, start_new_session=True)
        figures = _figures(name, done)
    assert figures.get("bench") == name[:-3], figures


def test_the_list_names_only_benches_that_exist():
    assert sorted(TINY) == FILES, "TINY lists a bench file that is gone"
