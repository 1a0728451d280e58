"""Run the tiny modes of the benches that measure a vLLM engine in this process, on ONE engine.

Each such bench (bench/engine.py, bench/engine_profile.py, bench/verify_throughput.py) starts
its own engine when run by hand; an engine takes 30 s to 2 min to start on 2 cores, so make
test (tests/test_bench_tiny.py) starts one here and hands it to each bench's `with_engine`
with the arguments its `--tiny` gives. Prints one JSON line per bench:
{"file": NAME, "result": {...}} or {"file": NAME, "error": "..."}.

    python -m testkit.bench_engines engine.py engine_profile.py verify_throughput.py
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import sys
import traceback
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench"


def load(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name[:-3]}", BENCH / name)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


async def run(names: list[str], model: str = "smollm2-135m") -> list[dict]:
    from model_node import catalogue
    from model_node.engine import Engine

    engine = await Engine.start(catalogue.resolve(model))
    out = []
    try:
        for name in names:
            try:
                module = load(name)
                args = module.tiny_args(module.parser().parse_args(["--tiny"]))
                out.append({"file": name, "result": await module.with_engine(args, engine)})
            except Exception:  # noqa: BLE001 - one bench's failure is its row, the others still run
                out.append({"file": name, "error": traceback.format_exc()[-3000:]})
    finally:
        engine.shutdown()
    return out


def main(argv: list[str] | None = None) -> int:
    names = argv if argv is not None else sys.argv[1:]
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    for row in asyncio.run(run(names)):
        print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
