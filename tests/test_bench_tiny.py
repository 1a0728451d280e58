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
    "honest_noise.py": (PLAIN, 120),
    "load.py": (PLAIN, 180),
    "overlay.py": (PLAIN, 240),
    "reliability.py": (PLAIN, 240),
    "reply_timing.py": (PLAIN, 60),
    "routing.py": (SESSION_NODE, 300),
    "scale.py": (PLAIN, 280),  # the real app, real proofs, and a few seconds of running nodes
    "sida.py": (PLAIN, 60),
    "verify_throughput.py": (SHARED_ENGINE, 600),
    "wan.py": (PLAIN, 480),  # a WAN devnet in namespaces (root), ~95 s
}

FILES = sorted(p.name for p in BENCH.glob("*.py"))


def _scale_figures(figures: dict) -> None:
    """bench/scale.py: every figure of the directory at scale, and the ones a goal rests on."""
    for key in ("commit_1000_ms", "renewals_block_ms", "sample_bytes", "peer_record_bytes", "roster_bytes",
                "roster_changes_bytes", "user_bytes_per_min", "model_member_bytes_per_min", "first_view_bytes",
                "first_view_cpu_ms", "flood", "sybil"):
        assert key in figures, key
    assert figures["sample_relays"] == 18 and figures["roster_members"] == 20
    assert figures["roster_changes_bytes"] < figures["roster_bytes"]  # unchanged members come as hashes
    flood = figures["flood"]
    assert flood["honest_committed_after_blocks"] in (1, 2)  # honest registrations still commit within 2 blocks
    assert flood["refused"] >= flood["registrations"] - 4  # one /24: the genesis' cap of 4 relays at most
    live = figures["live"]
    assert live["asks_answered"] > 0 and live["member_per_min"]["roster"][0] > 0  # nodes ran and followed


#: bench file -> what its tiny figures must show beyond running (one run serves both)
FIGURE_CHECKS = {"scale.py": _scale_figures}


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
    FIGURE_CHECKS.get(name, lambda figures: None)(figures)


def test_the_list_names_only_benches_that_exist():
    assert sorted(TINY) == FILES, "TINY lists a bench file that is gone"
