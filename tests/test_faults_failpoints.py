"""gentorrent.failpoints: the spec parser, the no-op default, a real self-kill in a child
process, and that every declared failpoint has exactly one call site (and vice versa)."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from gentorrent import failpoints
from gentorrent.failpoints import Arm, FailpointSpecError, parse

ROOT = Path(__file__).resolve().parents[1]


def test_parse_terms_counts_and_round_trip():
    armed = parse(" verifier.after_finalize=kill@3 ; verifier.before_sign=exit ;")
    assert armed == {"verifier.after_finalize": Arm("kill", 3), "verifier.before_sign": Arm("exit", 1)}
    assert parse(failpoints.spec(armed)) == armed
    assert parse("") == {} and parse(" ; ") == {}


@pytest.mark.parametrize("bad, says", [
    ("verifier.after_finalize", "name=action"),
    ("=kill", "name=action"),
    ("verifier.after_finalize=", "name=action"),
    ("verifier.after_finalise=kill", "unknown failpoint"),
    ("verifier.after_finalize=panic", "action 'panic'"),
    ("verifier.after_finalize=kill@0", "positive hit number"),
    ("verifier.after_finalize=kill@x", "positive hit number"),
    ("verifier.after_finalize=kill@-2", "positive hit number"),
    ("verifier.after_finalize=kill;verifier.after_finalize=exit", "armed twice"),
])
def test_malformed_specs_are_clear_errors(bad, says):
    with pytest.raises(FailpointSpecError, match=re.escape(says)):
        parse(bad)


def test_hit_is_a_no_op_when_nothing_is_armed():
    assert failpoints.armed() == {}  # the test process runs without GT_FAILPOINTS
    for name in failpoints.POINTS:
        failpoints.hit(name)  # would kill this very process if it did anything


def _child(spec: str, hits: int) -> subprocess.CompletedProcess:
    code = ("import sys\nfrom gentorrent import failpoints\n"
            f"for i in range({hits}):\n"
            "    print('before', i + 1, flush=True)\n"
            "    failpoints.hit('verifier.after_finalize')\n"
            "print('survived', flush=True)\n")
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env={"GT_FAILPOINTS": spec, "PATH": "/usr/bin:/bin"})


def test_armed_failpoint_kills_the_process_on_the_nth_hit_and_says_so():
    out = _child("verifier.after_finalize=kill@3", 5)
    assert out.returncode == -signal.SIGKILL, out
    assert out.stdout.split() == ["before", "1", "before", "2", "before", "3"]  # nothing after the 3rd
    assert "failpoint verifier.after_finalize fired (kill on hit 3)" in out.stderr
    out = _child("verifier.after_finalize=exit@2", 5)
    assert out.returncode == failpoints.EXIT_CODE and "survived" not in out.stdout
    assert _child("verifier.after_finalize=kill@9", 5).stdout.strip().endswith("survived")


def test_malformed_env_stops_the_process_at_start():
    out = _child("verifier.nowhere=kill", 1)
    assert out.returncode == 1 and "unknown failpoint 'verifier.nowhere'" in out.stderr
    assert "before" not in out.stdout


def test_every_declared_failpoint_has_one_call_site():
    sites: dict[str, int] = {}
    for path in list((ROOT / "verifier").rglob("*.py")) + list((ROOT / "gentorrent").rglob("*.py")):
        for name in re.findall(r"failpoints\.hit\(\"([^\"]+)\"\)", path.read_text()):
            sites[name] = sites.get(name, 0) + 1
    assert sites == {name: 1 for name in failpoints.POINTS}
