"""A model is its weights: the digest of a checkpoint's weights files, and their real size.

What the committee's catalogue lists for a model name (gentorrent.ledger.catalogue), computed
the same way by a model node (`gt-model serve --weights DIR`) and a committee member listing a
checkpoint (`gt-verifier catalogue add --weights DIR`).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path


class WeightsError(ValueError):
    """A folder that holds no checkpoint."""


#: the files that make a checkpoint's behaviour: its weights (any format vLLM loads, quantized
#: ones included) and the configuration that says how to run them
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
CONFIG_FILES = ("config.json", "quantize_config.json", "quant_config.json")
DIGEST_CHUNK = 1 << 20


def weight_files(folder: Path) -> list[Path]:
    """The checkpoint's weights and configuration files, in a fixed order."""
    folder = Path(folder)
    files = [p for p in folder.rglob("*") if p.is_file() and not p.name.startswith(".")
             and (p.suffix in WEIGHT_SUFFIXES or p.name in CONFIG_FILES)]
    return sorted(files, key=lambda p: p.relative_to(folder).as_posix())


def weights_digest(folder: Path) -> str:
    """`sha256:` + SHA-256 over each weights file's relative path, size and SHA-256, in order.

    Two folders have one digest exactly when they hold the same weights under the same
    names (the tokenizer and chat template are not part of it: they are the prompt's, which
    receipts cover). This is what the committee's catalogue lists for a model name."""
    folder = Path(folder)
    files = weight_files(folder)
    if not any(p.suffix in WEIGHT_SUFFIXES for p in files):
        raise WeightsError(f"{folder} holds no weights files ({', '.join(WEIGHT_SUFFIXES)})")
    outer = hashlib.sha256(b"gentorrent/weights/v1\x00")
    for path in files:
        inner = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(DIGEST_CHUNK), b""):
                inner.update(block)
        rel = path.relative_to(folder).as_posix().encode()
        outer.update(len(rel).to_bytes(4, "big") + rel + path.stat().st_size.to_bytes(8, "big") + inner.digest())
    return "sha256:" + outer.hexdigest()


def cached_weights_digest(folder: Path, cache: Path) -> str:
    """weights_digest, remembered in `cache` (a node's home) while no file's size or mtime
    changed: hashing 15 GiB of weights takes a minute, and a node restarts often."""
    folder = Path(folder)
    stamp = [[p.relative_to(folder).as_posix(), p.stat().st_size, p.stat().st_mtime_ns] for p in weight_files(folder)]
    try:
        known = json.loads(Path(cache).read_text())
        if known.get("folder") == str(folder.resolve()) and known.get("files") == stamp:
            return str(known["digest"])
    except (OSError, ValueError, KeyError, AttributeError):
        pass
    digest = weights_digest(folder)
    tmp = Path(cache).with_suffix(".tmp")
    tmp.write_text(json.dumps({"folder": str(folder.resolve()), "files": stamp, "digest": digest}))
    os.replace(tmp, cache)
    return digest


def weights_bytes(folder: Path) -> int:
    """The real size of the checkpoint's weights (what the fit check counts: a quantized
    checkpoint is smaller than bf16 would be)."""
    return sum(p.stat().st_size for p in weight_files(folder) if p.suffix in WEIGHT_SUFFIXES)
