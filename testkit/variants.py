"""Dishonest weight variants, for the verification tests and the cheater-detection benchmark.

A cheating volunteer saves compute by serving something cheaper than the model it claims.
These functions make such models from an honest HF folder, deterministically (seeded), so
the committee's scoring can be measured against realistic cheaters rather than strawmen:

- `prune_layers`: keep every other decoder layer (half the compute, still fluent-ish text);
- `add_noise`: Gaussian noise on every weight matrix, scaled to each tensor's own spread.

Behavioural cheaters (random tokens, replaying answers, a different model claiming this one,
a selective cheater) need no weights of their own; they live in `cheaters.py`.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from pathlib import Path

_LAYER = re.compile(r"^(model\.layers\.)(\d+)(\..*)$")
_WEIGHT_FILES = ("model.safetensors",)


def _load(src: Path) -> tuple[dict, dict]:
    from safetensors.torch import load_file

    config = json.loads((src / "config.json").read_text())
    tensors: dict = {}
    for path in sorted(src.glob("*.safetensors")):
        tensors.update(load_file(str(path)))
    if not tensors:
        raise FileNotFoundError(f"no safetensors weights in {src}")
    return config, tensors


def _save(src: Path, dst: Path, config: dict, tensors: dict) -> Path:
    """Write a complete HF folder atomically: tokenizer files copied, weights replaced."""
    from safetensors.torch import save_file

    dst = Path(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=dst.name + ".", dir=dst.parent))
    for item in src.iterdir():
        if item.is_file() and item.suffix != ".safetensors" and item.name != "model.safetensors.index.json":
            shutil.copy2(item, tmp / item.name)
    (tmp / "config.json").write_text(json.dumps(config, indent=2))
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp / _WEIGHT_FILES[0]),
              metadata={"format": "pt"})
    if dst.exists():
        shutil.rmtree(dst)
    tmp.rename(dst)
    return dst


def prune_layers(src: Path, dst: Path, keep_every: int = 2) -> Path:
    """Keep decoder layers 0, keep_every, 2*keep_every, …, renumbered contiguously."""
    if keep_every < 2:
        raise ValueError("keep_every must be >= 2 to prune anything")
    config, tensors = _load(Path(src))
    layers = config["num_hidden_layers"]
    kept = list(range(0, layers, keep_every))
    renumber = {old: new for new, old in enumerate(kept)}
    pruned = {}
    for name, tensor in tensors.items():
        match = _LAYER.match(name)
        if match is None:
            pruned[name] = tensor
        elif int(match.group(2)) in renumber:
            pruned[f"{match.group(1)}{renumber[int(match.group(2))]}{match.group(3)}"] = tensor
    config["num_hidden_layers"] = len(kept)
    for key in ("layer_types", "max_window_layers"):
        if isinstance(config.get(key), list):
            config[key] = [config[key][i] for i in kept]
    return _save(Path(src), Path(dst), config, pruned)


def add_noise(src: Path, dst: Path, relative_sigma: float = 0.1, seed: int = 0) -> Path:
    """Add N(0, (relative_sigma * std(W))^2) to every matrix W; norms and biases untouched."""
    import torch

    config, tensors = _load(Path(src))
    gen = torch.Generator().manual_seed(seed)
    noisy = {}
    for name in sorted(tensors):
        tensor = tensors[name]
        if tensor.ndim >= 2 and tensor.is_floating_point():
            work = tensor.float()
            noise = torch.randn(work.shape, generator=gen) * (relative_sigma * work.std())
            noisy[name] = (work + noise).to(tensor.dtype)
        else:
            noisy[name] = tensor
    return _save(Path(src), Path(dst), config, noisy)
