"""HFTrainerEngine on the tiny Qwen2 model: chunked scoring against a direct computation, PPO steps with the
global token count, bitwise resume after save/load, and checkpoints in Hugging Face layout."""

from __future__ import annotations

import json

import pytest
import torch

from probepo.config import AlgoConfig, OptimConfig
from probepo.engines.base import TrainBatch
from probepo.engines.hf import HFGenerationEngine, HFTrainerEngine
from probepo.engines.trainer import OPTIMIZER_FILE, TRAINER_FILE

PROMPTS = [[16, 17, 10, 22, 28], [18, 10, 19], [20], [17, 10, 16, 28, 18, 13], [19, 19], [21, 10]]
RESPONSES = [[16, 24, 13], [20, 20, 28, 17, 13, 220, 16], [10], [], [28, 16, 16, 13, 198], [18, 17]]


def trainer(model, *, minibatch: int = 6, microbatch: int = 6, **kwargs) -> HFTrainerEngine:
    optim = OptimConfig(lr=1e-3, minibatch_size=minibatch, microbatch_size=microbatch)
    return HFTrainerEngine(model, optim, AlgoConfig(), response_budget=8, **kwargs)


def direct_logp_entropy(model, temperature: float) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Reference: each row alone, the full [T, V] logits at once."""
    logps, entropies = [], []
    with torch.no_grad():
        for prompt, response in zip(PROMPTS, RESPONSES, strict=True):
            logits = model(torch.tensor([prompt + response])).logits[0, len(prompt) - 1 : -1] / temperature
            table = logits.log_softmax(-1)
            logps.append(table.gather(-1, torch.tensor(response, dtype=torch.long)[:, None])[:, 0])
            entropies.append(-(table.exp() * table).sum(-1))
    return logps, entropies


def batch_for(engine: HFTrainerEngine, seed: int = 0) -> TrainBatch:
    logp, _, mask = engine.score(PROMPTS, RESPONSES)
    advantages = torch.randn(mask.shape, generator=torch.Generator().manual_seed(seed)) * mask
    return TrainBatch(PROMPTS, RESPONSES, logp, advantages)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_chunked_scores_equal_a_direct_computation(model, temperature):
    engine = trainer(model, temperature=temperature, score_batch_rows=4, score_chunk_tokens=3)
    head_rows = []
    hook = model.get_output_embeddings().register_forward_hook(
        lambda m, args, out: head_rows.append(args[0].shape[0])
    )
    try:
        logp, entropy, mask = engine.score(PROMPTS, RESPONSES)
    finally:
        hook.remove()
    assert logp.shape == entropy.shape == mask.shape == (len(PROMPTS), max(map(len, RESPONSES)))
    assert max(head_rows) == 3  # never [all response tokens, V] at once
    assert sum(head_rows) == sum(map(len, RESPONSES))  # padding never reaches the head
    for row, (ref_logp, ref_entropy) in enumerate(zip(*direct_logp_entropy(model, temperature), strict=True)):
        n = len(RESPONSES[row])
        assert mask[row].tolist() == [True] * n + [False] * (mask.shape[1] - n)
        torch.testing.assert_close(logp[row, :n], ref_logp, rtol=0, atol=1e-5)
        torch.testing.assert_close(entropy[row, :n], ref_entropy, rtol=0, atol=1e-5)
        assert not logp[row, n:].any() and not entropy[row, n:].any()
    assert entropy[mask].max() < 4  # the trained model is far from flat: ln(151,936) = 11.9


def test_two_micro_batches_make_the_step_of_one(model):
    whole, split = trainer(model), trainer(type(model).from_pretrained(model.name_or_path), microbatch=2)
    batch = batch_for(whole)
    metrics = [whole.train_step(batch, seed=0), split.train_step(batch, seed=0)]
    split_weights = split.weights()
    for name, value in whole.weights().items():
        torch.testing.assert_close(split_weights[name], value, rtol=0, atol=1e-5)
    assert metrics[0]["loss"] == pytest.approx(metrics[1]["loss"], abs=1e-6)
    assert metrics[0]["grad_norm"] == pytest.approx(metrics[1]["grad_norm"], rel=1e-5)


def test_resume_from_a_saved_minibatch_is_bitwise(model, tokenizer, tmp_path):
    first = trainer(model, minibatch=2, microbatch=1, tokenizer=tokenizer)
    batch = batch_for(first)

    def save_after_first(index: int, metrics: dict[str, float]) -> None:
        if index == 0:
            first.save(tmp_path / "ckpt")

    first.train_step(batch, seed=3)  # an earlier update: AdamW moments and step counts are non-trivial
    done = first.train_step(batch, seed=4, on_minibatch_done=save_after_first)
    assert done["minibatches"] == 3

    resumed = trainer(type(model).from_pretrained(model.name_or_path), minibatch=2, microbatch=1)
    resumed.load(tmp_path / "ckpt")
    assert resumed.train_step(batch, seed=4, start_minibatch=1)["minibatches"] == 2
    assert resumed.optimizer_steps == first.optimizer_steps == 6
    expected, got = first.state().tensors, resumed.state().tensors  # weights and AdamW moments
    assert set(got) == set(expected)
    for name, value in expected.items():
        assert torch.equal(got[name], value), name


def test_checkpoint_is_a_hugging_face_folder_without_pickle(model, tokenizer, tmp_path):
    from transformers import AutoModelForCausalLM

    engine = trainer(model, tokenizer=tokenizer)
    engine.train_step(batch_for(engine), seed=0)
    engine.save(tmp_path)
    names = {path.name for path in tmp_path.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", OPTIMIZER_FILE, TRAINER_FILE} <= names
    for path in tmp_path.iterdir():
        assert path.suffix in (".json", ".safetensors", ".jinja", ".txt"), path.name
        assert path.read_bytes()[:2] not in (b"\x80\x02", b"\x80\x04", b"PK"), path.name  # pickle, torch zip
    assert json.loads((tmp_path / TRAINER_FILE).read_text())["optimizer_steps"] == 1

    trained = engine.weights()
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).state_dict()
    generation = HFGenerationEngine(type(model).from_pretrained(model.name_or_path))
    generation.load_weights(tmp_path)
    switched = generation.model.state_dict()
    for name, value in trained.items():
        assert torch.equal(loaded[name], value) and torch.equal(switched[name], value), name


def test_the_trainers_weights_in_memory_generate_the_bits_of_its_saved_folder(model, tokenizer, tmp_path):
    """The hand-off (live_weights lent to the generator, no host copy) against the file path it replaced:
    the same greedy and sampled tokens, and the trainer's tensors untouched by the generator's copy."""
    from probepo.engines.base import SamplingParams

    engine = trainer(model, tokenizer=tokenizer)
    engine.train_step(batch_for(engine), seed=0)
    engine.save(tmp_path)
    before = engine.weights()
    by_file = HFGenerationEngine(type(model).from_pretrained(model.name_or_path))
    by_file.load_weights(tmp_path)
    in_memory = HFGenerationEngine(type(model).from_pretrained(model.name_or_path))
    with engine.live_weights() as live:
        in_memory.load_weights(live)
    for temperature in (0.0, 1.0):
        params = SamplingParams(temperature=temperature, max_tokens=6)
        assert in_memory.generate(PROMPTS, 2, params, 5) == by_file.generate(PROMPTS, 2, params, 5)
    with torch.no_grad():  # the generator holds its own copy: changing it leaves the trainer's weights be
        for parameter in in_memory.model.parameters():
            parameter.zero_()
    assert all(torch.equal(value, engine.weights()[name]) for name, value in before.items())


def test_models_with_transformed_logits_are_refused(model):
    model.config.final_logit_softcapping = 30.0
    with pytest.raises(ValueError, match="transforms its logits"):
        trainer(model)
