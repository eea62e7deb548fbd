#!/usr/bin/env bash
# The vLLM tier (docs/guides/real-models.md, "vLLM"): makes .venv-vllm (scripts/venv.sh vllm; ~3.5 GB, a few
# minutes the first time) and runs tests/vllm there — the vLLM engine against the Hugging Face engine on the
# tiny Qwen2 model, and a killed and resumed run generating with vLLM. No services needed.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/venv.sh vllm
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" VLLM_LOGGING_LEVEL="${VLLM_LOGGING_LEVEL:-WARNING}"
.venv-vllm/bin/python -m pytest tests/vllm "$@"
