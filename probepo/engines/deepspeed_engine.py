"""TrainerEngine on DeepSpeed ZeRO-2 or ZeRO-3: the Hugging Face engine's score pass and PPO-clip steps
with the optimizer state (and, with ZeRO-3, the parameters) sharded over the ranks of the stage's job.

- Work is split by micro-batch: rank r takes micro-batches r, r + W, … of each mini-batch (W ranks), and
  every rank runs the same number of forward passes (one with no rows of its own runs a micro-batch with
  its loss multiplied by 0), because ZeRO-3 gathers parameters collectively in each forward. A
  micro-batch's loss is divided by the whole mini-batch's token count (all ranks know it: each reads the
  whole batch), then multiplied by W, since DeepSpeed averages gradients over ranks: the step equals one
  pass over the mini-batch. One `step()` per mini-batch, its accumulation boundary set by hand.
- Scoring splits the rows the same way; each rank fills its rows of the [N, T] tables and a sum over
  ranks assembles them (every other entry is 0, so the sum is exact).
- Checkpoints are never DeepSpeed's own (pickles). Rank 0 writes the Hugging Face folder (config.json,
  model.safetensors gathered from the shards, tokenizer) and trainer.json; every rank writes its ZeRO
  optimizer shard as `optimizer-rank-RRRRR-of-WWWWW.safetensors` (fp32 master partition and AdamW moments)
  plus a `.json` layout that rebuilds DeepSpeed's state dict around those tensors. Loading reads
  safetensors and JSON only and needs the same ZeRO stage and number of ranks; a resumed run is then
  bitwise equal to an uninterrupted one on the same ranks. Checkpoint 0 (no step yet) has no shards, so
  it may be written by a one-rank job and trained from by any number of ranks.

The ranks rendezvous through the job's rank environment (`probepo.run.distributed.join`): a group of one in a
single process. bf16 when the model's dtype is bfloat16 (the master weights and moments stay fp32).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors.torch import load_file
from torch import Tensor

from probepo import spend
from probepo.engines.base import TrainBatch, TrainerState
from probepo.engines.hf.trainer import HFTrainerEngine
from probepo.engines.trainer import TRAINER_FILE
from probepo.run import distributed
from probepo.run.schedule import optimizer_shard_name
from probepo.streamed_save import save_streamed, streamed_pretrained_saves

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from probepo.config import AlgoConfig, OptimConfig

ZERO_STAGES = (2, 3)


class DeepSpeedTrainerEngine(HFTrainerEngine):
    """TrainerEngine on a transformers causal LM under `deepspeed.initialize` (ZeRO stage `zero_stage`),
    with torch's AdamW as DeepSpeed's client optimizer and DeepSpeed's gradient clipping at
    `optim.grad_clip`. `gradient_checkpointing` recomputes each decoder layer's activations in the backward
    pass. The other arguments are HFTrainerEngine's."""

    def __init__(
        self,
        model: PreTrainedModel,
        optim: OptimConfig,
        algo: AlgoConfig | None = None,
        *,
        zero_stage: int,
        response_budget: int,
        temperature: float = 1.0,
        gradient_checkpointing: bool = False,
        score_batch_rows: int = 64,
        score_chunk_tokens: int = 1024,
        tokenizer: PreTrainedTokenizerBase | None = None,
    ) -> None:
        if zero_stage not in ZERO_STAGES:
            raise ValueError(f"zero_stage = {zero_stage}: DeepSpeed's trainer here runs ZeRO-2 or ZeRO-3")
        os.environ.setdefault("DS_ACCELERATOR", "cuda" if torch.cuda.is_available() else "cpu")
        import deepspeed

        if os.environ["DS_ACCELERATOR"] == "cpu":
            # DeepSpeed's CPU backend builds its shared-memory all-reduce when it joins the group (a C++
            # compile of ~70 CPU-seconds per TORCH_EXTENSIONS_DIR, then a load in every rank) for its one
            # caller, inference_all_reduce (AutoTP inference), which training never reaches; marked
            # incompatible, torch.distributed's all-reduce serves instead, as on machines without a compiler.
            deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
        distributed.join()
        super().__init__(
            model,
            optim,
            algo,
            response_budget=response_budget,
            temperature=temperature,
            score_batch_rows=score_batch_rows,
            score_chunk_tokens=score_chunk_tokens,
            tokenizer=tokenizer,
        )
        if gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.zero_stage = zero_stage
        config = {
            "train_micro_batch_size_per_gpu": optim.microbatch_size,
            "gradient_accumulation_steps": 1,
            "gradient_clipping": optim.grad_clip,
            "zero_optimization": {"stage": zero_stage},
            "bf16": {"enabled": model.dtype == torch.bfloat16},
            "steps_per_print": 2**62,
        }
        self.ds, self.ds_optimizer, _, _ = deepspeed.initialize(
            model=self.forward_scores, optimizer=self.optimizer, config=config
        )
        self.forward_scores = self.ds  # every forward through DeepSpeed's engine (ZeRO-3 hooks, micro-steps)
        self.device = self.ds.device

    def score(self, prompts: list[list[int]], responses: list[list[int]]) -> tuple[Tensor, Tensor, Tensor]:
        """(logp, entropy, mask), each [N, T] on CPU: each rank scores every W-th chunk of
        `score_batch_rows` rows, and a sum over ranks assembles the tables."""
        self.model.eval()
        n, world, rank = len(responses), distributed.world_size(), distributed.rank()
        T = max((len(r) for r in responses), default=0)
        logp, entropy, mask = torch.zeros(n, T), torch.zeros(n, T), torch.zeros(n, T)
        chunks = [slice(s, s + self.score_batch_rows) for s in range(0, n, self.score_batch_rows)]
        mine = chunks[rank::world]
        for index in range(math.ceil(len(chunks) / world)):
            rows = mine[index] if index < len(mine) else chunks[0]  # ZeRO-3: every rank runs each forward
            chunk_logp, chunk_entropy, chunk_mask = self.response_logp_entropy(prompts[rows], responses[rows])
            if index < len(mine):
                width = chunk_mask.shape[1] if T else 0
                mask[rows, :width] = chunk_mask[:, :width].cpu().float()
                logp[rows, :width] = chunk_logp[:, :width].cpu()
                entropy[rows, :width] = chunk_entropy[:, :width].cpu()
        logp, entropy = distributed.sum_over_ranks(logp), distributed.sum_over_ranks(entropy)
        return logp, entropy, distributed.sum_over_ranks(mask) > 0

    def _optimizer_step(self, batch: TrainBatch, rows: list[int]) -> dict[str, float]:
        """One ZeRO step on the mini-batch `rows`: this rank's micro-batches accumulated, then the
        gradients reduced over ranks, clipped and applied."""
        self.model.train()
        world, rank = distributed.world_size(), distributed.rank()
        totals = self._loss_totals(batch, rows)
        micros = self._microbatches(rows)
        mine = micros[rank::world]
        rounds = math.ceil(len(micros) / world)
        loss_sum, parts, weights = 0.0, [], []
        for index in range(rounds):
            own = index < len(mine)
            self.ds.set_gradient_accumulation_boundary(index == rounds - 1)
            loss, part, tokens = self._micro_loss(batch, mine[index] if own else micros[0], totals)
            # DeepSpeed averages gradients over ranks; the losses already sum to the mini-batch's mean
            self.ds.backward(loss * (world if own else 0.0), scale_wrt_gas=False)
            if own:
                loss_sum += loss.item()
            parts.append(part)
            weights.append(tokens if own else 0.0)
        self.ds.step()
        self.optimizer_steps += 1
        grad_norm = self.ds.get_global_grad_norm()
        metrics = _metrics_over_ranks(parts, weights, [index < len(mine) for index in range(rounds)])
        loss_total = float(distributed.sum_over_ranks(torch.tensor([loss_sum], dtype=torch.float64)))
        return {"loss": loss_total, "grad_norm": float(grad_norm), **metrics}

    @contextmanager
    def live_weights(self) -> Iterator[dict[str, Tensor]]:
        """Every rank's module holds the full weights under ZeRO-1 and 2 (the bf16 or fp32 copy it computes
        with); under ZeRO-3 they are gathered from the ranks' partitions for the block, on every rank (all
        ranks enter it together: `weights` and `weights_fingerprint` read them through it)."""
        import deepspeed

        with deepspeed.zero.GatheredParameters(list(self.model.parameters()), enabled=self.zero_stage == 3):
            yield self.model.state_dict()

    def state(self) -> TrainerState:
        """This rank's state: the full weights (`model.<name>`), its optimizer shard (`optim.<path>`), and
        metadata with the shard's layout (`layout`); copies."""
        tensors = {f"model.{k}": v for k, v in self.weights().items()}
        shard, layout = _flatten(self.ds_optimizer.state_dict())
        tensors.update({f"optim.{k}": v.detach().cpu().clone() for k, v in shard.items()})
        spend.count("host_copy", spend.tensor_bytes(shard.values()))
        return TrainerState(tensors=tensors, meta={**self._meta(), "layout": layout})

    def load_state(self, state: TrainerState) -> None:
        """Restores this rank's optimizer shard, the fp32 master weights with it, and the step count."""
        meta = state.meta
        self._check_layout(meta, "the given state")
        prefix = "optim."
        shard = {k[len(prefix) :]: v for k, v in state.tensors.items() if k.startswith(prefix)}
        saved = _unflatten(meta["layout"], shard, self.ds_optimizer.state_dict())
        world = distributed.world_size()
        self.ds_optimizer.load_state_dict(
            [saved] * world, load_optimizer_states=True, load_from_fp32_weights=True
        )
        self.optimizer_steps = int(meta["optimizer_steps"])

    def _meta(self) -> dict[str, Any]:
        group = {k: v for k, v in self.optimizer.param_groups[0].items() if k != "params"}
        return {
            "optimizer": f"DeepSpeed ZeRO-{self.zero_stage} over torch AdamW",
            "optimizer_steps": self.optimizer_steps,
            "zero_stage": self.zero_stage,
            "world_size": distributed.world_size(),
            "hyperparameters": group,
        }

    def _check_layout(self, meta: dict[str, Any], where: str) -> None:
        saved = (meta.get("zero_stage"), meta.get("world_size"))
        here = (self.zero_stage, distributed.world_size())
        if saved != here:
            raise ValueError(
                f"{where} holds ZeRO-{saved[0]} optimizer shards of {saved[1]} ranks; this job runs"
                f" ZeRO-{here[0]} on {here[1]}: resume with the recipe's zero_stage and the profile's"
                " ranks (nodes x tasks_per_node) of the run that saved it"
            )

    def save(self, directory: str | Path) -> None:
        """Rank 0: the Hugging Face folder (config, weights, tokenizer) and trainer.json; every rank: its
        optimizer shard and layout. Every tensor crosses to host memory through the process's pinned
        staging buffer, a chunk at a time as it is written (`save_streamed`; rank 0's weights by routing
        `save_pretrained`'s writer to it; under ZeRO-3 the weights are gathered on every rank, written by
        rank 0). Collective: all ranks call it, with the
        same (node-local, shared) directory, and it returns once every file is written."""
        import deepspeed

        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        gathered = deepspeed.zero.GatheredParameters(
            list(self.model.parameters()), enabled=self.zero_stage == 3
        )
        with gathered:
            if distributed.rank() == 0:
                tied = _tied_duplicates(self.model)  # a checkpoint holds each parameter once
                weights = {k: v.detach() for k, v in self.model.state_dict().items() if k not in tied}
                with streamed_pretrained_saves():
                    self.model.save_pretrained(directory, state_dict=weights)
                spend.count_written(weights.values())
        if distributed.rank() == 0:
            if self.tokenizer is not None:
                self.tokenizer.save_pretrained(directory)
            (directory / TRAINER_FILE).write_text(json.dumps(self._meta(), indent=2) + "\n")
        if self.optimizer_steps:  # a fresh optimizer (checkpoint 0) has no state: any ranks may start from it
            stem = optimizer_shard_name(distributed.rank(), distributed.world_size())
            shard, layout = _flatten(self.ds_optimizer.state_dict())
            save_streamed(
                {f"optim.{k}": v.detach().contiguous() for k, v in shard.items()},
                directory / f"{stem}.safetensors",
            )
            spend.count_written(shard.values())
            (directory / f"{stem}.json").write_text(json.dumps(layout) + "\n")
        distributed.barrier()

    def load(self, directory: str | Path) -> None:
        """Restores what `save` wrote for this rank (the weights were loaded with the model)."""
        directory = Path(directory)
        meta = json.loads((directory / TRAINER_FILE).read_text())
        if not meta["optimizer_steps"]:
            return  # saved before any step: a fresh optimizer, as this one is
        self._check_layout(meta, f"checkpoint {directory}")
        stem = optimizer_shard_name(distributed.rank(), distributed.world_size())
        if not (directory / f"{stem}.safetensors").is_file():
            raise FileNotFoundError(f"checkpoint {directory} has no optimizer shard {stem}.safetensors")
        meta["layout"] = json.loads((directory / f"{stem}.json").read_text())
        self.load_state(TrainerState(load_file(directory / f"{stem}.safetensors"), meta))


def _tied_duplicates(model: torch.nn.Module) -> set[str]:
    """Names under which a parameter appears a second time (tied weights, e.g. `lm_head.weight` tied to the
    input embedding): a checkpoint holds each parameter once, as `save_pretrained` writes it."""
    every = {name for name, _ in model.named_parameters(remove_duplicate=False)}
    return every - {name for name, _ in model.named_parameters()}


def _metrics_over_ranks(
    parts: list[dict[str, float]], weights: list[float], own: list[bool]
) -> dict[str, float]:
    """The token-weighted mean of each metric over every rank's micro-batches (`_max` keys: the max over
    those a rank ran on its own rows)."""
    means = [k for k in parts[0] if not k.endswith("_max")]
    tops = [k for k in parts[0] if k.endswith("_max")]
    weighted = [sum(w * p[k] for p, w in zip(parts, weights, strict=True)) for k in means]
    sums = distributed.sum_over_ranks(torch.tensor([*weighted, sum(weights)], dtype=torch.float64))
    highest = [max((p[k] for p, o in zip(parts, own, strict=True) if o), default=-math.inf) for k in tops]
    maxima = distributed.max_over_ranks(torch.tensor(highest, dtype=torch.float64))
    total = float(sums[-1])
    if total == 0:
        return {}
    return {
        **{k: float(v) / total for k, v in zip(means, sums[:-1], strict=True)},
        **{k: float(v) for k, v in zip(tops, maxima, strict=True)},
    }


# DeepSpeed's optimizer state dict as safetensors + JSON. The layout mirrors its nesting: {"dict": [[key,
# key kind, node], ...]}, {"list": [...]}, {"tuple": [...]}, and leaves {"tensor": name} (in the
# safetensors file), {"json": value}, or {"live": true}: an object that is not state but set-up (the loss
# scaler, the fragment maps of universal checkpoints), taken on load from the engine's own state dict.
def _flatten(tree: Any, path: str = "") -> tuple[dict[str, Tensor], Any]:
    if isinstance(tree, Tensor):
        return {path: tree}, {"tensor": path}
    if tree is None or type(tree) in (bool, int, float, str):
        return {}, {"json": tree}
    if type(tree) in (list, tuple):
        tensors, nodes = {}, []
        for index, item in enumerate(tree):
            found, node = _flatten(item, f"{path}/{index}" if path else str(index))
            tensors.update(found)
            nodes.append(node)
        return tensors, {type(tree).__name__: nodes}
    if isinstance(tree, dict) and all(type(k) in (int, str) for k in tree):
        tensors, entries = {}, []
        for key, item in tree.items():
            found, node = _flatten(item, f"{path}/{key}" if path else str(key))
            tensors.update(found)
            entries.append([key, type(key).__name__, node])
        return tensors, {"dict": entries}
    return {}, {"live": True}


def _unflatten(node: dict[str, Any], tensors: dict[str, Tensor], live: Any) -> Any:
    """The state dict `_flatten` described, its tensors from `tensors`, live objects from `live`."""
    kind, value = next(iter(node.items()))
    if kind == "tensor":
        return tensors[value]
    if kind == "json":
        return value
    if kind == "live":
        if live is None:
            raise ValueError("a saved optimizer state holds an object this engine's state does not have")
        return live
    if kind in ("list", "tuple"):
        items = [_unflatten(n, tensors, _child(live, i)) for i, n in enumerate(value)]
        return items if kind == "list" else tuple(items)
    return {
        (int(key) if key_kind == "int" else key): _unflatten(n, tensors, _child(live, key))
        for key, key_kind, n in value
    }


def _child(live: Any, key: int | str) -> Any:
    try:
        return live[key]
    except (KeyError, IndexError, TypeError):
        return None
