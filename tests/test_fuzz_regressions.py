"""Replays every input the fuzzers ever crashed on (tests/data/fuzz_regressions/<target>/),
and checks that each atheris harness under fuzz/ starts and runs.

An input of a bug that is still open (testkit.fuzzing.KNOWN_OPEN) is a strict
xfail: it must still fail, and the day it passes the entry is deleted (the fix landed).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from testkit.fuzzing import KNOWN_OPEN, REGRESSIONS, TARGETS, oracle, regression_inputs

ROOT = Path(__file__).resolve().parents[1]
CASES = [(target, path) for target in TARGETS for path in regression_inputs(target)]


def _open_bug(target: str, path: Path):
    return next((b for b in KNOWN_OPEN if b.target == target and path.name.startswith(b.regression)), None)


def _params():
    for target, path in CASES:
        bug = _open_bug(target, path)
        marks = [pytest.mark.xfail(strict=True, reason=f"open bug: {bug.summary}")] if bug else []
        yield pytest.param(target, path, id=f"{target}/{path.name}", marks=marks)


@pytest.mark.parametrize("target,path", list(_params()))
def test_regression_input_passes_the_oracle(target: str, path: Path, monkeypatch) -> None:
    module = oracle(target)
    for budget in [name for name in vars(module) if name.endswith("_CPU_S")]:
        monkeypatch.setattr(module, budget, 0.5)  # the hangs found cost hours: 0.5 s tells them apart
    module.check(path.read_bytes())


def test_every_known_open_bug_has_a_regression_input() -> None:
    for bug in KNOWN_OPEN:
        assert bug.target in TARGETS
        files = [p for p in regression_inputs(bug.target) if p.name.startswith(bug.regression)]
        assert files, f"no input under {REGRESSIONS / bug.target} for {bug.summary}"


def test_every_target_has_a_harness_and_a_property_test() -> None:
    for target in TARGETS:
        assert (ROOT / "fuzz" / f"{target}.py").is_file()
        assert (ROOT / "tests" / f"test_fuzz_{target}.py").is_file()


@pytest.mark.skipif(importlib.util.find_spec("atheris") is None, reason="atheris is not installed")
@pytest.mark.parametrize("target", TARGETS)
def test_atheris_harness_runs(target: str, tmp_path: Path) -> None:
    """A short libFuzzer run per harness: instrumentation, oracle and flags all work."""
    proc = subprocess.run(
        [sys.executable, str(ROOT / "fuzz" / f"{target}.py"), "-runs=40", "-seed=1",
         f"-artifact_prefix={tmp_path}/"],
        capture_output=True, text=True, timeout=240, cwd=ROOT, env={**os.environ, "PYTHONHASHSEED": "0"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Done 40 runs" in proc.stderr
    assert not list(tmp_path.iterdir()), "the harness wrote a crash artifact"
