"""Sampler benchmark: the CPU generation engine's throughput against Hugging Face `generate`, and what
probing costs next to backbone sampling.

1. tokens/s: 16 prompts × 8 samples of exactly --new-tokens tokens (no stop token), our engine vs
   transformers' GPT-2 built from a config of the same width, depth, heads, vocabulary and context
   (random weights, nothing downloaded), both on one thread.
2. probe cost: backbone = 16 prompts × 8 responses (stop at EOS); probes = 5 pivots per group chosen by
   the entropy selector on those responses × 8 continuations each (cutoff rescue on). Reports the probe /
   backbone wall-time ratio next to their generated-token ratio (target: time ≤ 1.2 × tokens).

The model is first warmed up with --sft-steps supervised steps so responses have realistic lengths.
Usage: .venv/bin/python bench/sampler.py [--sft-steps 300] [--reps 5]
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import sys
from pathlib import Path

import torch
from benchlib import machine, median_seconds, recorded, table

from probepo.algo.pivots import select_pivots, step_candidates, window_max
from probepo.config import ModelConfig, OptimConfig
from probepo.data import ModChainTask
from probepo.data.task import RL_STREAM
from probepo.engines.base import SamplingParams
from probepo.engines.sampler import TorchGenerationEngine
from probepo.engines.sft import sft_steps
from probepo.engines.trainer import TorchTrainerEngine
from probepo.models import GPT

RESULTS = Path(__file__).parent / "results" / "sampler.json"
PROMPTS, SAMPLES, PIVOTS, CONTINUATIONS = 16, 8, 5, 8


def warm_median_seconds(fn, reps):
    """Median wall time of fn() over reps runs, after one untimed warm-up run."""
    fn()
    return median_seconds(fn, reps)


def hf_generate_seconds(config: ModelConfig, prompts, new_tokens, reps):
    """Median time of transformers' sampling of len(prompts) rows × new_tokens on an equivalent GPT-2."""
    from transformers import GPT2Config, GPT2LMHeadModel  # slow import: only here

    hf_config = GPT2Config(
        vocab_size=config.vocab_size,
        n_positions=config.context,
        n_embd=config.d_model,
        n_layer=config.n_layers,
        n_head=config.n_heads,
        n_inner=config.mlp_ratio * config.d_model,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    model = GPT2LMHeadModel(hf_config).eval()
    ids = torch.tensor(prompts)

    def run():
        with torch.inference_mode():
            out = model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                do_sample=True,
                temperature=1.0,
                top_k=0,
                top_p=1.0,
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
            )
        assert out.shape == (len(prompts), ids.shape[1] + new_tokens)

    return warm_median_seconds(run, reps), sum(p.numel() for p in model.parameters())


def probe_requests(task, trainer, prompts, groups, max_tokens):
    """Prefixes and token limits of the probes the entropy selector places on the backbone groups."""
    flat_prompts = [p for p in prompts for _ in range(SAMPLES)]
    responses = [c.ids for group in groups for c in group]
    _, entropy, mask = trainer.score(flat_prompts, responses)
    step_end = torch.zeros_like(mask)
    for i, ids in enumerate(responses):
        step_end[i, : len(ids)] = torch.tensor(task.step_end(ids), dtype=torch.bool)
    candidates = step_candidates(step_end, mask, margin=2)
    group = torch.arange(len(prompts)).repeat_interleave(SAMPLES)
    pivots = select_pivots(
        window_max(entropy, mask, window=8), candidates, group, max_pivots=PIVOTS, min_spacing=6
    )
    prefixes, limits = [], []
    for i, t in (pivots >= 0).nonzero().tolist():
        cut = int(pivots[i, t])
        prefixes.append(flat_prompts[i] + responses[i][:cut])
        limits.append(max_tokens - cut)
    return prefixes, limits


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sft-steps", type=int, default=300)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--rescue-tokens", type=int, default=4)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)

    task = ModChainTask(steps=6, modulus=10)
    config = ModelConfig(vocab_size=task.tokenizer.vocab_size)
    model = GPT(config)
    for _ in itertools.islice(sft_steps(model, task, seed=0), args.sft_steps):
        pass
    engine = TorchGenerationEngine(model)
    prompts = [task.prompt_ids(p) for p in task.batch(RL_STREAM, 0, 0, PROMPTS)]

    # 1. throughput at fixed lengths
    fixed = SamplingParams(temperature=1.0, max_tokens=args.new_tokens)
    generated = PROMPTS * SAMPLES * args.new_tokens
    ours_s = warm_median_seconds(lambda: engine.generate(prompts, SAMPLES, fixed, 0), args.reps)
    rows = [p for p in prompts for _ in range(SAMPLES)]
    hf_s, hf_params = hf_generate_seconds(config, rows, args.new_tokens, args.reps)

    # 2. probe cost next to backbone sampling
    params = SamplingParams(
        temperature=1.0, max_tokens=args.new_tokens, stop_token_ids=(task.tokenizer.eos_id,)
    )
    groups = engine.generate(prompts, SAMPLES, params, seed=1)
    backbone_s = warm_median_seconds(lambda: engine.generate(prompts, SAMPLES, params, 1), args.reps)
    backbone_tokens = sum(len(c.ids) for g in groups for c in g)
    trainer = TorchTrainerEngine(model, OptimConfig(), response_budget=args.new_tokens, temperature=1.0)
    prefixes, limits = probe_requests(task, trainer, prompts, groups, args.new_tokens)
    rescue = {"rescue_ids": task.tokenizer.encode(task.rescue_suffix), "rescue_tokens": args.rescue_tokens}
    probes = engine.continue_from(prefixes, CONTINUATIONS, params, 2, limits, **rescue)
    probe_s = warm_median_seconds(
        lambda: engine.continue_from(prefixes, CONTINUATIONS, params, 2, limits, **rescue), args.reps
    )
    probe_tokens = sum(len(c.ids) for g in probes for c in g)

    results = {
        "tokens_per_s": round(generated / ours_s),
        "hf_generate_tokens_per_s": round(generated / hf_s),
        "speedup_vs_hf": round(hf_s / ours_s, 2),
        "probe_time_ratio": round(probe_s / backbone_s, 3),
        "probe_token_ratio": round(probe_tokens / backbone_tokens, 3),
        "probe_time_over_token_ratio": round((probe_s / backbone_s) / (probe_tokens / backbone_tokens), 3),
        "details": {
            "rows": PROMPTS * SAMPLES,
            "new_tokens_per_row": args.new_tokens,
            "model_params": sum(p.numel() for p in model.parameters()),
            "hf_model_params": hf_params,
            "sft_steps": args.sft_steps,
            "backbone_s": round(backbone_s, 4),
            "backbone_tokens": backbone_tokens,
            "probe_s": round(probe_s, 4),
            "probe_prefixes": len(prefixes),
            "probe_continuations": len(prefixes) * CONTINUATIONS,
            "probe_tokens": probe_tokens,
            "probe_rescued_fraction": round(
                sum(c.rescued for g in probes for c in g) / max(len(prefixes) * CONTINUATIONS, 1), 3
            ),
            "timing": f"median of {args.reps} runs after one warm-up, 1 torch thread",
        },
        "machine": machine(),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": " ".join([".venv/bin/python", *sys.argv]),
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))
    print(markdown(results))


def markdown(results: dict) -> str:
    """docs/BENCHMARKS.md's sampler table, rendered from bench/results/sampler.json when the site is built."""
    d = results["details"]
    rows = [
        [
            f"our sampler, {d['rows']} rows × {d['new_tokens_per_row']} tokens (no stop)",
            f"{results['tokens_per_s']:,} tokens/s",
        ],
        [
            f"`transformers` `generate` on a GPT-2 built from the same shape (random weights,"
            f" {d['hf_model_params']:,} parameters), same rows and lengths",
            f"{results['hf_generate_tokens_per_s']:,} tokens/s (ours {results['speedup_vs_hf']:g}× faster)",
        ],
        [
            f"backbone: {d['rows']} responses, stop at EOS",
            f"{d['backbone_s']:.3f} s, {d['backbone_tokens']:,} tokens",
        ],
        [
            f"probes: {d['probe_prefixes']} entropy-selected pivots ×"
            f" {d['probe_continuations'] // max(d['probe_prefixes'], 1)} continuations, rescue on",
            f"{d['probe_s']:.3f} s, {d['probe_tokens']:,} tokens, {d['probe_continuations']:,} continuations",
        ],
        ["probe / backbone wall time", f"{results['probe_time_ratio']:.2f}"],
        ["probe / backbone generated tokens", f"{results['probe_token_ratio']:.2f}"],
        ["time ratio / token ratio (target ≤ 1.2)", f"{results['probe_time_over_token_ratio']:.2f}"],
    ]
    lines = [recorded(results, "bench/results/sampler.json"), "", *table(["measure", "value"], rows)]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
