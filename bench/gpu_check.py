"""GPU check of the Hugging Face engines on R1-Distill-Qwen-1.5B's shape (random weights, nothing downloaded).

Measures, in bf16 on CUDA:
1. generation tokens/s: --prompts prompts × --samples samples × exactly --new-tokens tokens (no stop token);
2. probe tokens/s: --pivots prefixes per prompt (the prompt plus a random share of one of its samples),
   --samples continuations each, up to the same total length, with cutoff rescue;
3. score seconds: --score-rows sequences of --score-len tokens (a 256-token prompt, the rest response):
   log-probs and full-vocabulary entropies;
4. one optimizer step: PPO-clip on one mini-batch of --minibatch of those sequences (micro-batches of
   --microbatch, gradient checkpointing, fp32 AdamW with bf16 autocast);
and the peak GPU memory of each. Writes bench/results/gpu_check.json (machine, date, command) and prints its
markdown table (docs/BENCHMARKS.md's, which the site renders from that file). Needs torch and transformers
only (plus probepo itself).

Usage: python bench/gpu_check.py                      # on a CUDA machine
       python bench/gpu_check.py --device cpu --small  # a smoke run of the script on a tiny config
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from benchlib import machine

from probepo.config import AlgoConfig, OptimConfig
from probepo.engines.base import SamplingParams, TrainBatch
from probepo.engines.hf import HFGenerationEngine, HFTrainerEngine

RESULTS = Path(__file__).parent / "results"
R1_DISTILL_1_5B = {
    "hidden_size": 1536,
    "num_hidden_layers": 28,
    "num_attention_heads": 12,
    "num_key_value_heads": 2,
    "intermediate_size": 8960,
    "vocab_size": 151_936,
    "max_position_embeddings": 131_072,
    "rope_theta": 10_000.0,
    "tie_word_embeddings": False,
}
SMALL = {**R1_DISTILL_1_5B, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2}
SMALL.update(num_key_value_heads=1, intermediate_size=128)
SMALL_SIZES = {
    "prompts": 2,
    "samples": 2,
    "new_tokens": 8,
    "pivots": 2,
    "score_rows": 4,
    "score_len": 300,
    "minibatch": 4,
    "microbatch": 2,
}
PROMPT_LEN = 256


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument(
        "--small", action="store_true", help="a tiny model and sizes: a smoke run of the script"
    )
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=512)
    parser.add_argument("--pivots", type=int, default=5)
    parser.add_argument("--max-batch-rows", type=int, default=512)
    parser.add_argument("--score-rows", type=int, default=512)
    parser.add_argument("--score-len", type=int, default=2048)
    parser.add_argument("--score-batch-rows", type=int, default=16)
    parser.add_argument("--score-chunk-tokens", type=int, default=4096)
    parser.add_argument("--minibatch", type=int, default=64)
    parser.add_argument("--microbatch", type=int, default=4)
    parser.add_argument(
        "--out", type=Path, help="default: bench/results/gpu_check.json (_small with --small)"
    )
    args = parser.parse_args()
    if args.small:
        for name, value in SMALL_SIZES.items():
            setattr(args, name, value)
    return args


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measured(device: torch.device, run: Callable[[], Any]) -> tuple[Any, float, float | None]:
    """(result, seconds, peak GiB allocated during the call; None off CUDA)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    synchronize(device)
    start = time.perf_counter()
    result = run()
    synchronize(device)
    seconds = time.perf_counter() - start
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
    return result, seconds, peak


def build_model(shape: dict[str, Any], device: torch.device, dtype: torch.dtype) -> Any:
    """A randomly initialised Qwen2 causal LM, created directly on the device."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with device:
            return Qwen2ForCausalLM(Qwen2Config(**shape)).eval()
    finally:
        torch.set_default_dtype(default)


def random_ids(generator: torch.Generator, rows: int, length: int, vocab: int) -> list[list[int]]:
    return torch.randint(0, vocab, (rows, length), generator=generator).tolist()


def measure_generation(
    args: argparse.Namespace, shape: dict[str, Any], device: torch.device
) -> dict[str, Any]:
    """Sampling and probing tokens/s with bf16 weights."""
    vocab, rng = shape["vocab_size"], torch.Generator().manual_seed(0)
    engine = HFGenerationEngine(
        build_model(shape, device, torch.bfloat16), device=device, max_batch_rows=args.max_batch_rows
    )
    params = SamplingParams(temperature=1.0, max_tokens=args.new_tokens)
    prompts = random_ids(rng, args.prompts, PROMPT_LEN, vocab)
    engine.generate(prompts[:2], 2, SamplingParams(max_tokens=4), seed=1)  # CUDA context, kernels, allocator
    samples, seconds, peak = measured(device, lambda: engine.generate(prompts, args.samples, params, seed=0))
    tokens = sum(len(c.ids) for group in samples for c in group)
    results = {"generate": {"tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds}}
    results["generate"]["peak_gib"] = peak

    cuts = torch.randint(1, args.new_tokens, (args.prompts, args.pivots), generator=rng).tolist()
    prefixes = [
        prompt + samples[p][k % args.samples].ids[:cut]
        for p, prompt in enumerate(prompts)
        for k, cut in enumerate(cuts[p])
    ]
    limits = [PROMPT_LEN + args.new_tokens - len(prefix) for prefix in prefixes]
    rescue = {"rescue_ids": [1, 2], "rescue_tokens": 4}
    probes, seconds, peak = measured(
        device, lambda: engine.continue_from(prefixes, args.samples, params, 0, limits, **rescue)
    )
    tokens = sum(len(c.ids) for group in probes for c in group)
    results["probe"] = {"prefixes": len(prefixes), "tokens": tokens, "seconds": seconds}
    results["probe"].update(tokens_per_s=tokens / seconds, peak_gib=peak)
    return results


def measure_training(args: argparse.Namespace, shape: dict[str, Any], device: torch.device) -> dict:
    """Scoring and one optimizer step: fp32 weights and AdamW moments, bf16 autocast on CUDA."""
    vocab, rng = shape["vocab_size"], torch.Generator().manual_seed(1)
    model = build_model(shape, device, torch.float32)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    trainer = HFTrainerEngine(
        model,
        OptimConfig(lr=1e-6, minibatch_size=args.minibatch, microbatch_size=args.microbatch),
        AlgoConfig(),
        response_budget=args.score_len - PROMPT_LEN,
        score_batch_rows=args.score_batch_rows,
        score_chunk_tokens=args.score_chunk_tokens,
        autocast_dtype=torch.bfloat16 if device.type == "cuda" else None,
    )
    prompts = random_ids(rng, args.score_rows, PROMPT_LEN, vocab)
    responses = random_ids(rng, args.score_rows, args.score_len - PROMPT_LEN, vocab)
    (logp, _, mask), seconds, peak = measured(device, lambda: trainer.score(prompts, responses))
    tokens = args.score_rows * args.score_len
    results = {
        "score": {"sequences": args.score_rows, "tokens": tokens, "seconds": seconds, "peak_gib": peak}
    }
    rows = slice(0, args.minibatch)
    advantages = torch.randn(logp[rows].shape, generator=rng) * mask[rows]
    batch = TrainBatch(prompts[rows], responses[rows], logp[rows], advantages)
    metrics, seconds, peak = measured(device, lambda: trainer.train_step(batch, seed=0))
    results["optimizer_step"] = {
        "sequences": args.minibatch,
        "microbatch": args.microbatch,
        "seconds": seconds,
    }
    results["optimizer_step"].update(peak_gib=peak, loss=metrics["loss"])
    return results


def main() -> None:
    args = parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit(
            "gpu_check: CUDA is not available here. Run it on a GPU machine, or smoke-test the script with"
            " --device cpu --small."
        )
    shape = SMALL if args.small else R1_DISTILL_1_5B
    out = args.out or RESULTS / ("gpu_check_small.json" if args.small else "gpu_check.json")
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "none"

    def record(results: dict[str, Any]) -> None:
        """Written after each part, so a part that fails keeps the ones before it."""
        out.parent.mkdir(parents=True, exist_ok=True)
        described = {
            **results,
            "model": {"shape": shape, "random_init": True, "generation_dtype": "bfloat16"},
            "machine": f"{machine()}, GPU {gpu}",
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "command": "python " + " ".join(sys.argv),
        }
        out.write_text(json.dumps(described, indent=2) + "\n")
        print(json.dumps(results), flush=True)

    results = measure_generation(args, shape, device)
    record(results)
    if device.type == "cuda":
        torch.cuda.empty_cache()  # the bf16 policy is gone: leave its memory to the trainer
    results.update(measure_training(args, shape, device))
    record(results)
    print(markdown(results))
    print(f"\nwritten to {out}")


def markdown(results: dict[str, Any]) -> str:
    """The measurements as a markdown table: docs/BENCHMARKS.md's, which the site renders from
    bench/results/gpu_check.json (with the command, date and machine the file records)."""
    from benchlib import recorded, table  # here: the module's imports stay as bench/gpu_gate.py reads them

    def gib(entry: dict[str, Any]) -> str:
        return "–" if entry["peak_gib"] is None else f"{entry['peak_gib']:.1f}"

    generate, probe, score, step = (results[k] for k in ("generate", "probe", "score", "optimizer_step"))
    rows = [
        [
            "generate",
            f"{generate['tokens']:,} tokens",
            f"{generate['seconds']:.1f}",
            f"{generate['tokens_per_s']:,.0f} tok/s",
            gib(generate),
        ],
        [
            "probe",
            f"{probe['prefixes']:,} prefixes, cutoff rescue ({probe['tokens']:,} tokens)",
            f"{probe['seconds']:.1f}",
            f"{probe['tokens_per_s']:,.0f} tok/s",
            gib(probe),
        ],
        [
            "score",
            f"{score['sequences']:,} × {score['tokens'] // score['sequences']:,} tokens: log-probs and"
            " full-vocabulary entropies",
            f"{score['seconds']:.1f}",
            f"{score['tokens'] / score['seconds']:,.0f} tok/s",
            gib(score),
        ],
        [
            "optimizer step",
            f"{step['sequences']} sequences, micro-batch {step['microbatch']}",
            f"{step['seconds']:.1f}",
            "–",
            gib(step),
        ],
    ]
    lines = table(["measurement", "size", "seconds", "throughput", "peak GiB"], rows)
    if "machine" in results:
        lines = [recorded(results, "bench/results/gpu_check.json"), "", *lines]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
