"""The CPU trainer engine: scoring (old log-probs and entropies) and PPO-clip optimisation, in plain torch.

One optimizer step per mini-batch; a mini-batch is split into micro-batches whose gradients accumulate,
each loss divided by the mini-batch's global token (or sequence) count, so the step equals one pass over
the whole mini-batch. Everything resumable lives in `state()`: safetensors-able tensors plus JSON.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from torch import Tensor

from probepo import spend
from probepo.algo.loss import ppo_clip_loss
from probepo.config import AlgoConfig, OptimConfig
from probepo.engines.base import MinibatchCallback, TrainBatch, TrainerState
from probepo.engines.fingerprint import weights_fingerprint
from probepo.engines.packing import response_logits, token_logp_entropy
from probepo.models.gpt import GPT, load_model, save_model
from probepo.run.schedule import OPTIMIZER_STATE_PREFIX
from probepo.streamed_save import save_streamed

OPTIMIZER_FILE = f"{OPTIMIZER_STATE_PREFIX}.safetensors"
TRAINER_FILE = "trainer.json"


class TorchTrainerEngine:
    """TrainerEngine on a GPT in this process. `temperature` is the sampling temperature (logits are
    divided by it when scoring and training); `response_budget` the most tokens a response may have (the
    constant divisor of Dr.GRPO's `seq-mean-token-sum-norm`: the same every update, whatever the update's
    longest response); `score_batch_rows` caps rows per scoring forward pass."""

    def __init__(
        self,
        model: GPT,
        optim: OptimConfig,
        algo: AlgoConfig | None = None,
        *,
        response_budget: int,
        temperature: float = 1.0,
        score_batch_rows: int = 256,
    ) -> None:
        algo = algo or AlgoConfig()
        if algo.kl_coef > 0:
            raise ValueError(f"kl_coef = {algo.kl_coef}: the torch trainer keeps no reference policy; use 0")
        if temperature <= 0:
            raise ValueError(f"temperature = {temperature}: scoring needs a positive sampling temperature")
        if response_budget < 1:
            raise ValueError(f"response_budget = {response_budget}: must be >= 1")
        self.model = model
        self.optim = optim
        self.algo = algo
        self.temperature = temperature
        self.response_budget = response_budget
        self.score_batch_rows = score_batch_rows
        self.optimizer = torch.optim.AdamW(
            model.parameters(),
            lr=optim.lr,
            betas=(optim.beta1, optim.beta2),
            eps=optim.eps,
            weight_decay=optim.weight_decay,
        )
        self.optimizer_steps = 0

    def score(self, prompts: list[list[int]], responses: list[list[int]]) -> tuple[Tensor, Tensor, Tensor]:
        """(logp, entropy, mask), each [N, T], T the longest response; zeros where mask is False."""
        T = max((len(r) for r in responses), default=0)
        dtype = self.model.tok_emb.weight.dtype
        logp = torch.zeros(len(responses), T, dtype=dtype)
        entropy = torch.zeros(len(responses), T, dtype=dtype)
        mask = torch.zeros(len(responses), T, dtype=torch.bool)
        with torch.no_grad():
            for start in range(0, len(responses), self.score_batch_rows):
                rows = slice(start, start + self.score_batch_rows)
                logits, targets, chunk_mask = response_logits(self.model, prompts[rows], responses[rows])
                chunk_logp, chunk_entropy = token_logp_entropy(logits, targets, self.temperature)
                width = chunk_mask.shape[1] if T else 0
                mask[rows, :width] = chunk_mask[:, :width]
                logp[rows, :width] = torch.where(chunk_mask, chunk_logp, 0)[:, :width]
                entropy[rows, :width] = torch.where(chunk_mask, chunk_entropy, 0)[:, :width]
        return logp, entropy, mask

    def minibatches(self, n_responses: int, seed: int) -> list[list[int]]:
        """Row indices of each mini-batch of an update, all epochs in order: a pure function of the seed."""
        size = self.optim.minibatch_size
        generator = torch.Generator().manual_seed(seed)
        batches = []
        for _ in range(self.optim.epochs):
            order = torch.randperm(n_responses, generator=generator).tolist()
            batches += [order[i : i + size] for i in range(0, n_responses, size)]
        return batches

    def train_step(
        self,
        batch: TrainBatch,
        *,
        seed: int,
        start_minibatch: int = 0,
        on_minibatch_done: MinibatchCallback | None = None,
    ) -> dict[str, float]:
        """PPO-clip over the mini-batches of `minibatches(N, seed)`, from index start_minibatch on.

        Returns the mean of the per-mini-batch metrics (loss, grad_norm, entropy, clip_fraction,
        approx_kl, ratio_mean; ratio_max as a max) and `minibatches`, the number run.
        """
        n = len(batch.responses)
        if len(batch.prompts) != n or batch.old_logp.shape[0] != n or batch.advantages.shape[0] != n:
            raise ValueError(
                f"batch sizes disagree: {len(batch.prompts)} prompts, {n} responses, old_logp"
                f" {tuple(batch.old_logp.shape)}, advantages {tuple(batch.advantages.shape)}"
            )
        longest = max((len(r) for r in batch.responses), default=0)
        if min(batch.old_logp.shape[1], batch.advantages.shape[1]) < longest:
            raise ValueError(f"old_logp/advantages have fewer than {longest} columns (the longest response)")
        plan = self.minibatches(n, seed)
        if not 0 <= start_minibatch <= len(plan):
            raise ValueError(f"start_minibatch = {start_minibatch}: the update has {len(plan)} mini-batches")
        history = []
        for index in range(start_minibatch, len(plan)):
            metrics = self._optimizer_step(batch, plan[index])
            history.append(metrics)
            if on_minibatch_done is not None:
                on_minibatch_done(index, metrics)
        return {**combine_metrics(history), "minibatches": float(len(history))}

    def _optimizer_step(self, batch: TrainBatch, rows: list[int]) -> dict[str, float]:
        """One AdamW step on the mini-batch `rows`, gradients accumulated over micro-batches, each loss
        divided by the mini-batch's global token (or sequence) count."""
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        totals = self._loss_totals(batch, rows)
        total_loss, parts, weights = 0.0, [], []
        for micro in self._microbatches(rows):
            loss, part, tokens = self._micro_loss(batch, micro, totals)
            loss.backward()
            total_loss += loss.item()
            parts.append(part)
            weights.append(tokens)
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.optim.grad_clip)
        self.optimizer.step()
        self.optimizer_steps += 1
        return {"loss": total_loss, "grad_norm": float(grad_norm), **combine_metrics(parts, weights)}

    def _microbatches(self, rows: list[int]) -> list[list[int]]:
        size = self.optim.microbatch_size
        return [rows[start : start + size] for start in range(0, len(rows), size)]

    def _loss_totals(self, batch: TrainBatch, rows: list[int]) -> dict[str, float]:
        """The divisors of the mini-batch `rows`' loss (its tokens, its non-empty sequences, Dr.GRPO's
        constant), the same for each of its micro-batches."""
        if batch.loss_mask is None:
            lengths = [len(batch.responses[i]) for i in rows]
        else:
            lengths = batch.loss_mask[rows].sum(dim=1).tolist()
        return {
            "global_tokens": float(max(sum(lengths), 1)),
            "global_seqs": float(max(sum(x > 0 for x in lengths), 1)),
            "norm_len": float(self.response_budget),
        }

    def _micro_loss(
        self, batch: TrainBatch, micro: list[int], totals: dict[str, float]
    ) -> tuple[Tensor, dict[str, float], float]:
        """(loss with its graph, metrics, token count) of one micro-batch, the loss divided by the
        mini-batch's `totals`."""
        logp, entropy, mask = self.training_logp_entropy(
            [batch.prompts[i] for i in micro], [batch.responses[i] for i in micro]
        )
        T = mask.shape[1]
        device = logp.device
        if batch.loss_mask is not None:
            mask = mask & batch.loss_mask[micro, :T].to(device)
        loss, metrics = ppo_clip_loss(
            logp,
            batch.old_logp[micro, :T].to(device, logp.dtype),
            batch.advantages[micro, :T].to(device, logp.dtype),
            mask,
            clip_low=self.algo.clip_low,
            clip_high=self.algo.clip_high,
            agg=self.algo.loss_agg,
            logratio_clamp=self.algo.logratio_clamp,
            **totals,
        )
        tokens = mask.sum()
        entropy_mean = float((entropy * mask).sum() / tokens.clamp_min(1))
        return loss, {**metrics, "entropy": entropy_mean}, float(tokens)

    def training_logp_entropy(
        self, prompts: list[list[int]], responses: list[list[int]]
    ) -> tuple[Tensor, Tensor, Tensor]:
        """(logp, entropy, mask) of one micro-batch, each [B, T]: logp carries the gradient, entropy does
        not. The seam an engine on another model family overrides."""
        logits, targets, mask = response_logits(self.model, prompts, responses)
        logp, entropy = token_logp_entropy(logits, targets, self.temperature)
        return logp, entropy.detach(), mask

    def weights(self) -> dict[str, Tensor]:
        """A copy of the policy's state dict on the host, taken from `live_weights` (so an engine that
        gathers its weights, as ZeRO-3 does, copies them once gathered)."""
        with self.live_weights() as live:
            copy = {k: v.detach().to("cpu", copy=True) for k, v in live.items()}
        spend.count("host_copy", spend.tensor_bytes(copy.values()))
        return copy

    @contextmanager
    def live_weights(self) -> Iterator[dict[str, Tensor]]:
        yield self.model.state_dict()  # detached views of the parameters, no copy

    def weights_fingerprint(self) -> str:
        """The fingerprint of `live_weights`, where they are (collective where gathering is)."""
        with self.live_weights() as live:
            return weights_fingerprint(live.items())

    def state(self) -> TrainerState:
        """Model weights (`model.<name>`), AdamW moments and step counts (`optim.<param>.<key>`), and
        metadata; copies, so later steps don't change them."""
        tensors = {f"model.{k}": v for k, v in self.weights().items()}
        optimizer = self.optimizer_tensors()
        tensors.update({k: v.detach().clone() for k, v in optimizer.items()})
        spend.count("host_copy", spend.tensor_bytes(optimizer.values()))
        return TrainerState(tensors=tensors, meta=self.meta())

    def optimizer_tensors(self) -> dict[str, Tensor]:
        """AdamW's moments and step counts as `optim.<param>.<key>`: the optimizer's own tensors, not copies
        (what a save writes as they are)."""
        names = [name for name, _ in self.model.named_parameters()]
        saved = self.optimizer.state_dict()["state"]
        return {
            f"optim.{names[index]}.{key}": value.detach()
            for index, entries in saved.items()
            for key, value in entries.items()
        }

    def meta(self) -> dict[str, Any]:
        """trainer.json: the optimizer, its step count and hyperparameters."""
        group = self.optimizer.state_dict()["param_groups"][0]
        hyper = {k: v for k, v in group.items() if k != "params"}
        return {"optimizer": "AdamW", "optimizer_steps": self.optimizer_steps, "hyperparameters": hyper}

    def load_state(self, state: TrainerState) -> None:
        """Restores weights, AdamW moments and step counts (hyperparameters stay this engine's config)."""
        prefix = "model."
        self.model.load_state_dict(
            {k[len(prefix) :]: v for k, v in state.tensors.items() if k.startswith(prefix)}
        )
        names = [name for name, _ in self.model.named_parameters()]
        optim_state: dict[int, dict[str, Tensor]] = {}
        for index, name in enumerate(names):
            head = f"optim.{name}."
            entries = {k[len(head) :]: v.clone() for k, v in state.tensors.items() if k.startswith(head)}
            if entries:
                optim_state[index] = entries
        groups = self.optimizer.state_dict()["param_groups"]
        self.optimizer.load_state_dict({"state": optim_state, "param_groups": groups})
        self.optimizer_steps = int(state.meta["optimizer_steps"])

    def save(self, directory: str | Path) -> None:
        """model.safetensors + config.json (the policy), optimizer.safetensors + trainer.json (the rest); the
        tensors streamed to the files one at a time (`save_streamed`), never all in host memory at once."""
        directory = Path(directory)
        save_model(self.model, directory)
        optimizer = self.optimizer_tensors()
        save_streamed({k: v.contiguous() for k, v in optimizer.items()}, directory / OPTIMIZER_FILE)
        spend.count_written([*self.model.state_dict().values(), *optimizer.values()])
        (directory / TRAINER_FILE).write_text(json.dumps(self.meta(), indent=2) + "\n")

    def load(self, directory: str | Path) -> None:
        """Restores what `save` wrote (the model config must match this engine's model)."""
        directory = Path(directory)
        saved = load_model(directory)
        if saved.config != self.model.config:
            raise ValueError(
                f"checkpoint {directory} holds a {saved.config}, this engine a {self.model.config}"
            )
        tensors = {f"model.{k}": v for k, v in saved.state_dict().items()}
        tensors.update(load_file(directory / OPTIMIZER_FILE))
        self.load_state(TrainerState(tensors, json.loads((directory / TRAINER_FILE).read_text())))


def combine_metrics(parts: list[dict[str, float]], weights: list[float] | None = None) -> dict[str, float]:
    """Weighted (default: plain) mean of each metric over parts; keys ending in `_max` take the max."""
    weights = weights or [1.0] * len(parts)
    total = sum(weights)
    if not parts or total == 0:
        return {}
    return {
        key: max(p[key] for p in parts)
        if key.endswith("_max")
        else sum(w * p[key] for p, w in zip(parts, weights, strict=True)) / total
        for key in parts[0]
    }
