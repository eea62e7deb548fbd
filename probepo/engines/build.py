"""Engines on a run's policy, built as its config says: a trainer (the testbed's torch engine, Hugging Face's,
or DeepSpeed's) on a model or a saved policy, and a generation engine (the testbed's, Hugging Face's or
vLLM's) on a policy folder, refused where the model cannot fit one GPU (probepo.run.devices), each in a
process
set up for the run's determinism first (probepo.run.determinism). Where the policy comes from is the stages'
(probepo.stages.policy); this module only builds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from probepo import spend
from probepo.config import ModelConfig, RunConfig
from probepo.engines.base import GenerationEngine, TrainerEngine
from probepo.engines.sampler import TorchGenerationEngine
from probepo.engines.trainer import TorchTrainerEngine
from probepo.models.gpt import GPT, load_model
from probepo.run.determinism import apply_determinism
from probepo.run.devices import check_fits_one_gpu, gpu_index, torch_device, weights_bytes
from probepo.spend.model import GB, generation_share

CPU_VLLM_MEMORY = 0.9
"""vLLM's share of the machine's RAM on its CPU backend where the recipe sets no `model.vllm_memory`: the
whole stage process, trainer included, is counted against it (ModelConfig.vllm_memory)."""
HF_GENERATOR_SHARE = "the Hugging Face engine's: the whole GPU"


def model_dtype(model: ModelConfig) -> torch.dtype:
    """A Hugging Face policy's parameter dtype."""
    return getattr(torch, model.dtype)


def new_trainer(config: RunConfig, model: Any, tokenizer: Any = None) -> TrainerEngine:
    """A trainer engine on `model` with a fresh optimizer, as the run's config sets it up (for `model.kind:
    hf` the Hugging Face engine, or DeepSpeed's with `model.trainer: deepspeed`, saving `tokenizer` with
    each checkpoint)."""
    apply_determinism(config)
    settings = {"response_budget": config.sampling.max_tokens, "temperature": config.sampling.temperature}
    if config.model.kind == "hf" and config.model.trainer == "deepspeed":
        from probepo.engines.deepspeed_engine import DeepSpeedTrainerEngine

        return DeepSpeedTrainerEngine(
            model,
            config.optim,
            config.algo,
            zero_stage=config.model.zero_stage,
            gradient_checkpointing=config.model.gradient_checkpointing,
            tokenizer=tokenizer,
            **settings,
        )
    if config.model.kind == "hf":
        from probepo.engines.hf import HFTrainerEngine

        return HFTrainerEngine(model, config.optim, config.algo, tokenizer=tokenizer, **settings)
    return TorchTrainerEngine(model, config.optim, config.algo, **settings)


def load_trainer(config: RunConfig, folder: Path, *, optimizer_state: bool = True) -> TrainerEngine:
    """A trainer engine on the policy saved in `folder`, its optimizer state included; without
    `optimizer_state` (scoring) the weights alone under a fresh optimizer, which must not train."""
    apply_determinism(config)  # before the weights reach the GPU
    model = config.model
    with spend.timed("load"):
        if model.kind == "hf":
            from probepo.engines.hf import load_policy

            # DeepSpeed places (and under ZeRO-3 partitions) the model on this rank's device itself
            device = "cpu" if model.trainer == "deepspeed" else torch_device()
            engine = new_trainer(config, *load_policy(folder, dtype=model_dtype(model), device=device))
        else:
            engine = new_trainer(config, GPT(model) if optimizer_state else load_model(folder))
        if optimizer_state:
            engine.load(folder)
    return engine


def new_generator(config: RunConfig, layout: Path | None, scratch: Path) -> GenerationEngine:
    """A generation engine for the run's model, not yet holding any policy's weights but what it is built
    on: a Hugging Face model's `layout` (a full checkpoint's folder: config, tokenizer, weights); the
    testbed's takes none. vLLM keeps its own files in `scratch`."""
    apply_determinism(config)
    batching = {"max_batch_rows": config.sampling.batch_rows, "shards": config.sampling.shards}
    model = config.model
    if model.kind == "testbed":
        return TorchGenerationEngine(GPT(model), **batching)
    if layout is None:
        raise ValueError("a Hugging Face generation engine is built on a checkpoint folder")
    share, setting = vllm_memory(config, layout) if model.generator == "vllm" else (1.0, HF_GENERATOR_SHARE)
    check_fits_one_gpu(weights_bytes(layout), share, setting)
    if model.generator == "vllm":
        from probepo.engines.vllm_engine import VLLMGenerationEngine

        return VLLMGenerationEngine(
            layout,
            dtype=model.dtype,
            **batching,
            seed=config.seed,
            scratch=scratch,
            gpu_memory_utilization=share,
        )
    from probepo.engines.hf import HFGenerationEngine

    return HFGenerationEngine(layout, dtype=model_dtype(model), device=torch_device(), **batching)


def vllm_memory(config: RunConfig, layout: Path) -> tuple[float, str]:
    """vLLM's share of this rank's GPU (its `gpu_memory_utilization`) and where it comes from: the recipe's
    `model.vllm_memory`, else computed (spend/model.py `generation_share`) from this GPU's memory and what the
    trainer beside it keeps resident, taken to run on every rank of the process group (a generation-only job
    is counted as if it had one: room left over, never too little). Without a GPU, CPU_VLLM_MEMORY."""
    model = config.model
    if model.vllm_memory is not None:
        return model.vllm_memory, "model.vllm_memory"
    if not torch.cuda.is_available():
        return CPU_VLLM_MEMORY, "model.vllm_memory unset: the CPU backend's default"
    gpu_gb = torch.cuda.get_device_properties(gpu_index()).total_memory / GB
    ranks = 1
    if model.trainer == "deepspeed" and torch.distributed.is_initialized():
        ranks = torch.distributed.get_world_size()
    parameters = weights_bytes(layout) // model_dtype(model).itemsize  # the files' headers are noise
    share = generation_share(config, parameters, gpu_gb, ranks)
    return share, f"model.vllm_memory unset: {share:.2f} computed beside a trainer of {ranks} rank(s)"


def hand_off(generator: GenerationEngine, weights: Path | dict[str, Tensor]) -> None:
    """Policy weights into a generation engine, counted: a state dict as the engine takes it (in memory,
    or through a file: `handoff`), a checkpoint folder as the file it reads."""
    with spend.timed("handoff"):
        generator.load_weights(weights)
    if isinstance(weights, dict):
        spend.count(generator.handoff, spend.tensor_bytes(weights.values()))
    else:
        spend.count(
            "handoff_file", weights_bytes(weights) or sum(f.stat().st_size for f in weights.glob("*"))
        )
