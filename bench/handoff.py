"""The weight hand-off to vLLM: in memory (a weights iterator by reference) against the file it replaced,
and both against a host memcpy of the same bytes (issue 44's `handoff_ratio`).

    .venv-vllm/bin/python bench/handoff.py     # the vLLM tier (scripts/venv.sh vllm); ≈ 2 min on 2 cores

A random-init Qwen2 of 100.4 M parameters (bench/checkpoint.py's QWEN_100M, float32, its LM head tied: the
state dict is 713 MB, the weights 401 MB) in a VLLMGenerationEngine on this CPU; each way of loading the
trainer's state dict is timed `--repeats` times (median), alternated:
- `memory`: `load_weights(state_dict)`, the tensors by reference into vLLM's `reload_weights` (rename,
  fuse q/k/v and gate/up, the backend's post-load processing), the tied head tied again;
- `file`: what it replaced, the state dict written to a safetensors file in the node's scratch, then
  reloaded from it (the path still taken when vLLM's worker lives in another process);
- `reload_from_folder`: vLLM reloading a committed checkpoint folder (the read without our write);
- `host_memcpy`: the state dict's bytes copied once into touched host memory.
Writes bench/results/handoff.json and prints its markdown table (docs/BENCHMARKS.md's, which the site renders
from that file).
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import torch
from benchlib import machine, recorded, seconds_of, table
from checkpoint import QWEN_100M

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.hf.tiny_qwen import qwen_tokenizer  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "handoff.json"
REPEATS = 5


def main() -> None:
    torch.set_num_threads(1)
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from probepo.engines.vllm_engine import VLLMGenerationEngine

    with tempfile.TemporaryDirectory(prefix="bench-handoff-") as tmp:
        folder = Path(tmp) / "model"
        torch.manual_seed(0)
        tokenizer = qwen_tokenizer()
        model = Qwen2ForCausalLM(Qwen2Config(**QWEN_100M, eos_token_id=tokenizer.eos_token_id))
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        weights = model.state_dict()  # the trainer's tensors, the tied head under both names
        state_bytes = sum(t.numel() * t.element_size() for t in weights.values())
        engine = VLLMGenerationEngine(
            folder, scratch=Path(tmp) / "scratch", seed=0, enforce_eager=True, gpu_memory_utilization=0.25
        )  # on CPU the share of host memory vLLM reserves
        assert engine.handoff == "handoff_memory"

        def through_a_file() -> None:
            engine.handoff = "handoff_file"
            try:
                engine.load_weights(weights)
            finally:
                engine.handoff = "handoff_memory"

        source = torch.ones(state_bytes // 4)
        target = torch.zeros_like(source)
        ways: dict[str, Callable[[], object]] = {
            "memory": lambda: engine.load_weights(weights),
            "file": through_a_file,
            "reload_from_folder": lambda: engine.load_weights(folder),
            "host_memcpy": lambda: target.copy_(source),
        }
        for run in ways.values():  # warm: first-call allocations and caches
            run()
        seconds: dict[str, list[float]] = {name: [] for name in ways}
        for _ in range(REPEATS):
            for name, run in ways.items():
                seconds[name].append(seconds_of(run))  # alternated: a slow spell hits every way
        engine.close()
    medians = {name: statistics.median(values) for name, values in seconds.items()}
    memcpy = medians["host_memcpy"]
    record = {
        "model": "random-init Qwen2, 100.4 M parameters, float32, tied head (bench/checkpoint.py QWEN_100M)",
        "state_dict_bytes": state_bytes,
        "seconds": {name: round(value, 4) for name, value in medians.items()},
        "ratio_to_host_memcpy": {name: round(value / memcpy, 2) for name, value in medians.items()},
        "handoff_ratio": round(medians["memory"] / memcpy, 2),
        "repeats": REPEATS,
        "machine": machine(),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": ".venv-vllm/bin/python bench/handoff.py",
    }
    RESULTS.write_text(json.dumps(record, indent=1) + "\n")
    print(markdown(record))


WAYS = {
    "memory": "in memory: the trainer's tensors by reference into vLLM's `reload_weights` (weights iterator)",
    "file": "through a file, as before: written to the node's scratch, then reloaded",
    "reload_from_folder": "vLLM reloading a committed folder (its own reload, no write)",
    "host_memcpy": "host memcpy of the state dict's bytes",
}
"""How the table names each way of loading the state dict."""


def markdown(record: dict) -> str:
    """docs/BENCHMARKS.md's handoff table, rendered from bench/results/handoff.json when the site is built:
    each way's median seconds and its ratio to a host memcpy (the hand-off's in bold)."""
    rows = []
    for name, seconds in record["seconds"].items():
        ratio = f"{round(record['ratio_to_host_memcpy'][name], 1):g}"
        shown = f"{seconds:.2f}" if seconds >= 0.1 else f"{seconds:.2g}"
        rows.append([WAYS.get(name, name), shown, f"**{ratio}**" if name == "memory" else ratio])
    head = (
        recorded(record, "bench/results/handoff.json")
        + f"; {record['model']}; medians of {record['repeats']}."
    )
    return "\n".join([head, "", *table(["way", "seconds", "÷ host memcpy"], rows)])


if __name__ == "__main__":
    main()
