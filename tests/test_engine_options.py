"""GPU engine options, checked without a GPU: what reaches vLLM's engine arguments on a CPU
and on a GPU machine, and what the catalogue says each model needs.

No test here starts an engine: `engine_arguments` is the whole difference between the two
platforms, and vLLM's own AsyncEngineArgs is built from it to show that vLLM takes every
argument as given (a renamed or mistyped one raises there)."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from gentorrent.config import MODEL_NODE
from model_node import catalogue
from model_node.cli import build_parser, load_config
from model_node.engine import engine_arguments

ROOT = Path(__file__).resolve().parents[1]
MODEL = catalogue.ResolvedModel("smollm2-135m", Path("/nonexistent/smollm2"))


def test_cpu_engines_run_eager_and_gpu_engines_keep_cuda_graphs_with_the_gpu_options():
    params = replace(MODEL_NODE, tensor_parallel_size=2, gpu_memory_utilization=0.8)
    cpu = engine_arguments(MODEL, params, None, on_cpu=True)
    gpu = engine_arguments(MODEL, params, None, on_cpu=False)
    assert cpu["enforce_eager"] is True and "tensor_parallel_size" not in cpu and cpu["dtype"] == MODEL_NODE.cpu_dtype
    assert gpu["enforce_eager"] is False and gpu["dtype"] == MODEL_NODE.gpu_dtype
    assert (gpu["tensor_parallel_size"], gpu["gpu_memory_utilization"]) == (2, 0.8)
    from vllm.engine.arg_utils import AsyncEngineArgs

    args = AsyncEngineArgs(**gpu)  # vLLM takes every argument by this name
    assert (args.enforce_eager, args.tensor_parallel_size, args.gpu_memory_utilization) == (False, 2, 0.8)


def test_command_line_options_reach_the_engine_arguments(tmp_path):
    args = build_parser().parse_args(["serve", "--tensor-parallel-size", "4", "--gpu-memory-utilization", "0.7"])
    params = load_config(tmp_path, args)["model_node"]
    gpu = engine_arguments(MODEL, params, None, on_cpu=False)
    assert (gpu["tensor_parallel_size"], gpu["gpu_memory_utilization"]) == (4, 0.7)
    (tmp_path / "config.toml").write_text("[model_node]\ngpu_memory_utilization = 0.5\n")
    defaults = load_config(tmp_path, build_parser().parse_args(["serve"]))["model_node"]
    assert (defaults.tensor_parallel_size, defaults.gpu_memory_utilization) == (1, 0.5)  # the home's setting


@pytest.mark.parametrize("argv,words", [
    (["--tensor-parallel-size", "0"], "0 is not from 1 to 64"),
    (["--gpu-memory-utilization", "1.5"], "not in (0, 1]"),
    (["--tensor-parallel-size", "2"], "needs 2 GPUs; this machine has none"),  # this machine has no GPU
])
def test_bad_engine_options_stop_before_anything_starts(tmp_path, argv, words):
    out = subprocess.run([sys.executable, "-m", "model_node.cli", "serve", "--home", str(tmp_path),
                          "--listen", "127.0.0.1:0", *argv], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 2 and words in out.stderr, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr
    assert not (tmp_path / "node.json").exists()


def test_the_catalogue_says_what_each_model_needs_and_refuses_what_cannot_fit():
    llama, small = catalogue.lookup("llama3-8b"), catalogue.lookup("smollm2-135m")
    assert small.cpu_ok and "CPU" in small.needs and not llama.cpu_ok and "--tensor-parallel-size 2" in llama.needs
    catalogue.check_hardware(small, [], 1, 0.9)  # CPU machine, small model
    catalogue.check_hardware(llama, [80.0], 1, 0.9)  # one H100
    catalogue.check_hardware(llama, [16.0, 16.0], 2, 0.9)  # split over two 16 GiB GPUs
    with pytest.raises(catalogue.CatalogueError, match="use --tensor-parallel-size 2"):
        catalogue.check_hardware(llama, [16.0, 16.0], 1, 0.9)
    with pytest.raises(catalogue.CatalogueError, match="more memory"):
        catalogue.check_hardware(llama, [8.0], 1, 0.9)
    with pytest.raises(catalogue.CatalogueError, match="needs 4 GPUs; this machine has 2"):
        catalogue.check_hardware(llama, [24.0, 24.0], 4, 0.9)
    for entry in catalogue.CATALOGUE.values():
        assert entry.weights_gib > 0 and entry.context >= 2048, entry.name


def test_vllms_engine_options_reach_the_engine_arguments_from_the_command_line(tmp_path):
    args = build_parser().parse_args(["serve", "--max-model-len", "4096", "--dtype", "bfloat16", "--quantization",
                                      "fp8", "--kv-cache-dtype", "fp8"])
    params = load_config(tmp_path, args)["model_node"]
    for on_cpu in (True, False):
        out = engine_arguments(MODEL, params, None, on_cpu=on_cpu)
        assert (out["max_model_len"], out["dtype"], out["quantization"], out["kv_cache_dtype"]) == \
            (4096, "bfloat16", "fp8", "fp8")
    from vllm.engine.arg_utils import AsyncEngineArgs

    built = AsyncEngineArgs(**engine_arguments(MODEL, params, None, on_cpu=False))  # vLLM's own names
    assert (built.max_model_len, built.dtype, built.quantization, built.kv_cache_dtype) == \
        (4096, "bfloat16", "fp8", "fp8")
    plain = engine_arguments(MODEL, load_config(tmp_path, build_parser().parse_args(["serve"]))["model_node"], None,
                             on_cpu=True)
    assert (plain["dtype"], plain["quantization"], plain["kv_cache_dtype"]) == (MODEL_NODE.cpu_dtype, None, "auto")


def _checkpoint(folder: Path, weights: dict[str, bytes], config: str = '{"max_position_embeddings": 4096}') -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(config)
    for name, data in weights.items():
        (folder / name).write_bytes(data)
    return folder


def test_a_model_is_its_weights_digest(tmp_path):
    """One digest for the same weights under the same names, another for any change of a byte,
    a file's name or the configuration; the tokenizer and chat template are not part of it."""
    a = _checkpoint(tmp_path / "a", {"model-1.safetensors": b"x" * 1000, "model-2.safetensors": b"y" * 10})
    b = _checkpoint(tmp_path / "b", {"model-1.safetensors": b"x" * 1000, "model-2.safetensors": b"y" * 10})
    (b / "tokenizer.json").write_text("{}")
    digest = catalogue.weights_digest(a)
    assert digest.startswith("sha256:") and len(digest) == 71 and catalogue.weights_digest(b) == digest
    variants = [_checkpoint(tmp_path / "c", {"model-1.safetensors": b"x" * 999 + b"z", "model-2.safetensors": b"y" * 10}),
                _checkpoint(tmp_path / "d", {"model-1.safetensors": b"x" * 1000, "model-3.safetensors": b"y" * 10}),
                _checkpoint(tmp_path / "e", {"model-1.safetensors": b"x" * 1000, "model-2.safetensors": b"y" * 10},
                            config='{"max_position_embeddings": 2048}')]
    assert len({catalogue.weights_digest(v) for v in variants} | {digest}) == 4
    assert catalogue.weights_bytes(a) == 1010
    with pytest.raises(catalogue.WeightsError, match="no weights"):
        catalogue.weights_digest(_checkpoint(tmp_path / "empty", {}))


def test_any_checkpoint_is_served_by_its_folder_and_the_fit_check_counts_its_real_bytes(tmp_path):
    """--weights DIR with a name the built-in list lacks is that checkpoint (its context from its
    config); the fit check counts the weights' real bytes (a sparse 20 GiB file here), so a
    quantized checkpoint fits where bf16 would not, and online fp8 halves 16-bit weights."""
    folder = _checkpoint(tmp_path / "ckpt", {})
    with open(folder / "model.safetensors", "wb") as f:
        f.truncate(20 * 2 ** 30)  # sparse: 20 GiB on paper, nothing on disk
    entry = catalogue.lookup("my-20gib-model", folder)
    assert entry.context == 4096 and round(entry.weights_gib) == 20
    with pytest.raises(catalogue.UnknownModelError, match="--weights DIR"):
        catalogue.lookup("my-20gib-model")
    real = catalogue.weights_in_memory_gib(entry, folder, None)
    with pytest.raises(catalogue.CatalogueError, match="needs ~"):
        catalogue.check_hardware(entry, [24.0], 1, 0.9, real)
    catalogue.check_hardware(entry, [24.0], 1, 0.9, catalogue.weights_in_memory_gib(entry, folder, "fp8"))
    llama = catalogue.lookup("llama3-8b")  # bf16 15 GiB by the catalogue; a 4-bit checkpoint of it is ~5 GiB
    small = _checkpoint(tmp_path / "awq", {})
    with open(small / "model.safetensors", "wb") as f:
        f.truncate(5 * 2 ** 30)
    with pytest.raises(catalogue.CatalogueError):
        catalogue.check_hardware(llama, [8.0], 1, 0.9)
    catalogue.check_hardware(llama, [8.0], 1, 0.9, catalogue.weights_in_memory_gib(llama, small, None))
