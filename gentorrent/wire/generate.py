"""Regenerate the Python code of proto/*.proto into gentorrent/wire/ (`make proto`).

Generated modules import each other as ``gentorrent.wire.X``; grpc_tools emits bare
``import X_pb2`` lines, so they are rewritten to package-relative imports here. The output
is deterministic, which lets tests/test_proto.py detect committed code that is stale.
"""

from __future__ import annotations

import re
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROTO_DIR = ROOT / "proto"
OUT_DIR = Path(__file__).resolve().parent


def proto_files() -> list[Path]:
    return sorted(PROTO_DIR.rglob("*.proto"))


def generate(out_dir: Path) -> list[Path]:
    """Compile every .proto under proto/ into out_dir; returns the files written."""
    from grpc_tools import protoc  # dev dependency, only needed to regenerate

    files = [str(p.relative_to(PROTO_DIR)) for p in proto_files()]
    args = ["protoc", f"-I{PROTO_DIR}", f"--python_out={out_dir}", f"--grpc_python_out={out_dir}", *files]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed on {files}")
    written = sorted(p for p in out_dir.rglob("*_pb2*.py"))
    for path in written:
        _make_imports_relative(path, out_dir)
    for sub in {p.parent for p in written if p.parent != out_dir}:
        (sub / "__init__.py").touch()
    return written


def _make_imports_relative(path: Path, out_dir: Path) -> None:
    text = path.read_text()
    text = re.sub(r"^import (\w+_pb2) as", r"from gentorrent.wire import \1 as", text, flags=re.M)
    text = re.sub(r"^from (?!gentorrent\.wire)(\w+(?:\.\w+)*) import (\w+_pb2) as",
                  lambda m: f"from gentorrent.wire.{m.group(1)} import {m.group(2)} as", text, flags=re.M)
    path.write_text(text)


def main() -> int:
    for path in generate(OUT_DIR):
        print(f"wrote {path.relative_to(ROOT)}")
    return 0


def generated_matches_committed() -> list[str]:
    """Names of generated files that differ from (or are missing in) gentorrent/wire/."""
    with tempfile.TemporaryDirectory() as tmp:
        fresh = generate(Path(tmp))
        stale = []
        for path in fresh:
            rel = path.relative_to(tmp)
            committed = OUT_DIR / rel
            if not committed.exists() or committed.read_text() != path.read_text():
                stale.append(str(rel))
        return stale


if __name__ == "__main__":
    sys.exit(main())
