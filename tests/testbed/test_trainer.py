"""The CPU trainer engine: scoring, PPO steps, gradient accumulation, bitwise resume, checkpoints."""

import json

import pytest
import torch

from probepo.config import AlgoConfig, ModelConfig, OptimConfig
from probepo.engines.base import SamplingParams, TrainBatch
from probepo.engines.sampler import TorchGenerationEngine
from probepo.engines.trainer import TorchTrainerEngine
from probepo.models import GPT

CONFIG = ModelConfig(vocab_size=19, d_model=32, n_layers=2, n_heads=4, context=64)
BUDGET = 10  # the responses' generation limit


def make_trainer(seed=0, dtype=torch.float32, algo=None, **optim):
    torch.manual_seed(seed)
    model = GPT(CONFIG).to(dtype)
    return TorchTrainerEngine(
        model, OptimConfig(**{"lr": 1e-3, **optim}), algo, response_budget=BUDGET, temperature=0.8
    )


def rollouts(trainer, k=6, n=4):
    rng = torch.Generator().manual_seed(3)
    prompts = [[1, *torch.randint(3, 19, (4 + i % 3,), generator=rng).tolist()] for i in range(k)]
    params = SamplingParams(temperature=0.8, max_tokens=BUDGET, stop_token_ids=(2,))
    groups = TorchGenerationEngine(trainer.model).generate(prompts, n, params, seed=0)
    return [p for p in prompts for _ in range(n)], [c.ids for g in groups for c in g]


def make_batch(trainer, seed=0):
    prompts, responses = rollouts(trainer)
    old_logp, _, mask = trainer.score(prompts, responses)
    adv = torch.randn(len(responses), generator=torch.Generator().manual_seed(seed)).to(old_logp.dtype)
    return TrainBatch(prompts, responses, old_logp, adv[:, None].expand_as(old_logp) * mask)


def test_score_matches_a_direct_computation():
    trainer = make_trainer()
    prompts, responses = rollouts(trainer)
    logp, entropy, mask = trainer.score(prompts, responses)
    assert logp.shape == entropy.shape == mask.shape == (len(responses), max(map(len, responses)))
    for i in (0, 5, 17):
        seq = torch.tensor([prompts[i] + responses[i]])
        with torch.no_grad():
            dist = torch.softmax(trainer.model(seq)[0] / 0.8, dim=-1)[len(prompts[i]) - 1 : -1]
        T = len(responses[i])
        assert mask[i].tolist() == [True] * T + [False] * (mask.shape[1] - T)
        direct_logp = dist[torch.arange(T), torch.tensor(responses[i])].log()
        direct_entropy = -(dist * dist.log()).sum(-1)
        torch.testing.assert_close(logp[i, :T], direct_logp, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(entropy[i, :T], direct_entropy, rtol=1e-5, atol=1e-5)
        assert (logp[i, T:] == 0).all() and (entropy[i, T:] == 0).all()


def test_train_step_lowers_the_loss_on_a_fixed_batch():
    trainer = make_trainer(minibatch_size=24, microbatch_size=8)
    batch = make_batch(trainer)
    seen = []
    first = trainer.train_step(batch, seed=0, on_minibatch_done=lambda j, m: seen.append(j))
    for step in range(1, 15):
        last = trainer.train_step(batch, seed=step)
    assert seen == [0] and first["minibatches"] == 1
    assert last["loss"] < first["loss"] - 0.05
    assert {"loss", "grad_norm", "entropy", "clip_fraction", "approx_kl", "ratio_max"} <= first.keys()


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_micro_batch_accumulation_equals_one_pass(agg):
    results = []
    for micro in (24, 5):
        trainer = make_trainer(dtype=torch.float64, minibatch_size=24, microbatch_size=micro)
        trainer.algo = AlgoConfig(loss_agg=agg)
        metrics = trainer.train_step(make_batch(trainer), seed=1)
        results.append((metrics, trainer.weights()))
    (full, w_full), (accum, w_accum) = results
    assert full["loss"] == pytest.approx(accum["loss"], rel=1e-10)
    assert full["grad_norm"] == pytest.approx(accum["grad_norm"], rel=1e-10)
    for name in w_full:
        torch.testing.assert_close(w_full[name], w_accum[name], rtol=1e-12, atol=1e-12)


def test_state_round_trip_gives_bitwise_identical_steps(tmp_path):
    trainer = make_trainer(minibatch_size=8, microbatch_size=4)
    batch = make_batch(trainer)
    trainer.train_step(batch, seed=0)
    state = trainer.state()
    trainer.save(tmp_path / "ckpt")
    trainer.train_step(batch, seed=1)
    expected = trainer.weights()
    for restore in (lambda t: t.load_state(state), lambda t: t.load(tmp_path / "ckpt")):
        fresh = make_trainer(seed=7, minibatch_size=8, microbatch_size=4)
        restore(fresh)
        assert fresh.optimizer_steps == 3
        fresh.train_step(batch, seed=1)
        assert all(torch.equal(expected[k], v) for k, v in fresh.weights().items())
    names = [n for n, _ in trainer.model.named_parameters()]
    optim_keys = {k for k in state.tensors if k.startswith("optim.")}
    assert optim_keys == {f"optim.{n}.{key}" for n in names for key in ("step", "exp_avg", "exp_avg_sq")}
    assert json.loads(json.dumps(state.meta))["optimizer_steps"] == 3


def test_resume_mid_update_from_a_committed_minibatch():
    trainer = make_trainer(minibatch_size=5, microbatch_size=3, epochs=2)
    batch = make_batch(trainer)
    start = trainer.state()
    committed = {}
    trainer.train_step(batch, seed=4, on_minibatch_done=lambda j, m: committed.setdefault(j, trainer.state()))
    assert sorted(committed) == list(range(10))  # 24 responses / 5 = 5 mini-batches × 2 epochs
    expected = trainer.weights()
    trainer.load_state(start)
    trainer.train_step(batch, seed=4, on_minibatch_done=lambda j, m: None)
    assert all(torch.equal(expected[k], v) for k, v in trainer.weights().items())
    resumed = make_trainer(seed=9, minibatch_size=5, microbatch_size=3, epochs=2)
    resumed.load_state(committed[6])
    metrics = resumed.train_step(batch, seed=4, start_minibatch=7)
    assert metrics["minibatches"] == 3
    assert all(torch.equal(expected[k], v) for k, v in resumed.weights().items())


def test_minibatch_plan_covers_every_response_each_epoch():
    trainer = make_trainer(minibatch_size=4, epochs=3)
    plan = trainer.minibatches(10, seed=2)
    assert plan == trainer.minibatches(10, seed=2) and len(plan) == 9
    for epoch in range(3):
        assert sorted(i for mb in plan[epoch * 3 : epoch * 3 + 3] for i in mb) == list(range(10))


def test_bad_batches_and_settings_are_named():
    trainer = make_trainer()
    batch = make_batch(trainer)
    short = TrainBatch(batch.prompts, batch.responses, batch.old_logp[:, :2], batch.advantages)
    with pytest.raises(ValueError, match="fewer than"):
        trainer.train_step(short, seed=0)
    with pytest.raises(ValueError, match="start_minibatch"):
        trainer.train_step(batch, seed=0, start_minibatch=5)
    with pytest.raises(ValueError, match="kl_coef"):
        TorchTrainerEngine(trainer.model, OptimConfig(), AlgoConfig(kl_coef=0.1), response_budget=BUDGET)
    with pytest.raises(ValueError, match="temperature"):
        TorchTrainerEngine(trainer.model, OptimConfig(), response_budget=BUDGET, temperature=0.0)


def test_dr_grpo_divides_by_the_generation_budget_not_the_longest_response():
    """Dr.GRPO's constant: at ratio 1 a token's loss is −A, so with A = 1 on every token the loss of one
    mini-batch is −Σ lengths / (responses × budget) whatever the update's longest response."""
    trainer = make_trainer(algo=AlgoConfig(loss_agg="seq-mean-token-sum-norm"), minibatch_size=1000)
    prompts, responses = rollouts(trainer)
    responses = [r[: 1 + i % 4] for i, r in enumerate(responses)]  # all shorter than the budget of 10
    old_logp, _, mask = trainer.score(prompts, responses)
    metrics = trainer.train_step(TrainBatch(prompts, responses, old_logp, mask.double()), seed=0)
    expected = -sum(map(len, responses)) / (len(responses) * BUDGET)
    assert metrics["loss"] == pytest.approx(expected, rel=1e-5)
