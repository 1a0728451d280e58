"""Shared main() of the atheris harnesses: instrument the target's modules, run libFuzzer.

Each fuzz/<target>.py calls `main(target, modules)`; the oracle (what counts as a bug) is
testkit.fuzzing.<target>.check, shared with the hypothesis tests. Any libFuzzer
flag passes through (-max_total_time=600, -runs=N, -timeout=S, a corpus folder, a crash
file to replay, ...). Crash files go to -artifact_prefix (default /tmp/gentorrent-fuzz/<target>/).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def main(target: str, modules: list[str]) -> None:
    import logging

    import atheris

    logging.disable(logging.CRITICAL)  # decoders log what they reject; millions of lines otherwise

    with atheris.instrument_imports(include=modules + [f"testkit.fuzzing.{target}"]):
        from testkit.fuzzing import filtered_check, oracle

        # GT_FUZZ_STRICT=1: stop on known open bugs too (to reproduce them)
        check = oracle(target).check if os.environ.get("GT_FUZZ_STRICT") else filtered_check(target)
    argv = list(sys.argv)
    if not any(a.startswith("-artifact_prefix=") for a in argv):
        artifacts = Path(os.environ.get("TMPDIR", "/tmp")) / "gentorrent-fuzz" / target
        artifacts.mkdir(parents=True, exist_ok=True)
        argv.insert(1, f"-artifact_prefix={artifacts}/")
    if not any(a.startswith("-timeout=") for a in argv):
        # libFuzzer's wall-clock hang detector; generous, because a shared machine can stall a
        # process for many seconds (the oracles' CPU-time budgets are the real hang detector)
        argv.insert(1, "-timeout=120")
    atheris.Setup(argv, check)
    atheris.Fuzz()
