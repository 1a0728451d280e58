"""Line coverage of a fuzz corpus over the target's modules, with the standard library's
`trace` (no extra dependency): replays every file of the corpus through the oracle.

    .venv/bin/python fuzz/coverage_report.py sida /tmp/gentorrent-fuzz/corpus/sida

Prints ONE JSON line: per module, executable lines, lines hit, percent.
"""

from __future__ import annotations

import importlib
import json
import sys
import trace
from pathlib import Path

from _harness import ROOT  # noqa: F401 - puts the repo root on sys.path

MODULES = {
    "sida": ["gentorrent.crypto.sida"],
    "onion": ["gentorrent.crypto.onion"],
    "settings": ["gentorrent.settings"],
    "abci_framing": ["verifier.abci.socket_server"],
    "hrtree": ["gentorrent.routing.hrtree"],
    "consensus": ["gentorrent.ledger.chain", "verifier.consensus.driver",
                  "verifier.consensus.state_machine", "verifier.consensus.votes"],
}


def main() -> None:
    import logging

    logging.disable(logging.CRITICAL)
    target, corpus = sys.argv[1], Path(sys.argv[2])
    from testkit.fuzzing import filtered_check

    files = sorted(p for p in corpus.iterdir() if p.is_file())
    tracer = trace.Trace(count=1, trace=0)
    check = tracer.runfunc(filtered_check, target)  # the import too: module-level lines count
    for path in files:
        tracer.runfunc(check, path.read_bytes())
    counts = tracer.results().counts
    report = {"target": target, "corpus_files": len(files), "modules": {}}
    for name in MODULES[target]:
        filename = importlib.import_module(name).__file__
        executable = set(trace._find_executable_linenos(filename))  # noqa: SLF001 - stdlib helper
        hit = {line for (f, line), n in counts.items() if f == filename and n} & executable
        report["modules"][name] = {"lines": len(executable), "hit": len(hit),
                                   "percent": round(100.0 * len(hit) / max(1, len(executable)), 1)}
    print(json.dumps(report))


if __name__ == "__main__":
    main()
