"""The guard in tests/conftest.py, run on a tiny suite of its own: a session fixture's engine
(the model node) outliving the engine tests is the fixture's, not the next test's; an engine a
test starts without the `engine` mark is still caught.

The vLLM engine is played by a process that calls itself `VLLM::EngineCore` (what the guard
looks for), so this needs no engine: the guard is what is under test."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

FAKE_ENGINE = '["bash", "-c", "exec -a VLLM::EngineCore sleep 120"]'

SUITE = textwrap.dedent(f"""
    import subprocess, time
    import pytest

    @pytest.fixture(scope="session")
    def engine():
        proc = subprocess.Popen({FAKE_ENGINE})
        yield proc
        proc.kill()
        proc.wait()

    @pytest.mark.engine
    def test_a_uses_the_session_engine(engine):
        assert engine.poll() is None

    def test_b_runs_while_the_session_engine_lives():
        time.sleep(5)  # the guard samples every 2 s
    """)

UNMARKED = textwrap.dedent(f"""
    import subprocess, time
    import pytest

    @pytest.mark.network
    def test_starts_an_engine_of_its_own():
        proc = subprocess.Popen({FAKE_ENGINE})
        try:
            time.sleep(5)
        finally:
            proc.kill()
            proc.wait()
    """)


def _run_suite(tmp_path: Path, source: str) -> subprocess.CompletedProcess:
    shutil.copy(ROOT / "tests" / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    engine: e\n    network: n\n")
    (tmp_path / "test_suite.py").write_text(source)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                           str(tmp_path)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


def test_a_session_fixtures_engine_is_not_charged_to_the_unmarked_test_after_it(tmp_path):
    result = _run_suite(tmp_path, SUITE)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 passed" in result.stdout


def test_an_unmarked_test_that_starts_an_engine_fails_naming_the_marker(tmp_path):
    result = _run_suite(tmp_path, UNMARKED)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "but is not marked `engine`" in result.stdout
