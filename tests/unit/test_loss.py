"""probepo.algo.loss: PPO-clip gradients, clipping, aggregation, micro-batching, k3 KL (ALGORITHM.md §5)."""

from __future__ import annotations

import math

import pytest
import torch

from probepo.algo.loss import kl_k3, ppo_clip_loss

F64 = torch.float64


def ragged_mask(lengths: list[int], n_positions: int) -> torch.Tensor:
    return torch.arange(n_positions) < torch.tensor(lengths)[:, None]


def test_gradient_at_ratio_one_is_reinforce():
    # logp = old_logp: ratio 1, nothing clipped, d loss / d logp_t = −A_t / n_tokens on valid tokens.
    gen = torch.Generator().manual_seed(0)
    mask = ragged_mask([5, 2, 7], 7)
    old = -torch.rand(3, 7, generator=gen, dtype=F64)
    adv = torch.randn(3, 7, generator=gen, dtype=F64)
    logp = old.clone().requires_grad_()
    loss, metrics = ppo_clip_loss(logp, old, adv, mask)
    loss.backward()
    torch.testing.assert_close(logp.grad, torch.where(mask, -adv / 14, 0))
    torch.testing.assert_close(loss, -(adv * mask).sum() / 14)
    assert metrics == {"clip_fraction": 0.0, "approx_kl": 0.0, "ratio_mean": 1.0, "ratio_max": 1.0}


def test_clipping_zeroes_the_gradient_exactly_where_it_should():
    # Columns: ratio 1.5 / 0.5 / 1.25 / 0.75; rows: A = +1, A = −1. ε_lo = 0.2, ε_hi = 0.3: [0.8, 1.3].
    # A > 0: clipped only at ratio 1.5 (> 1.3); ratio 0.5 keeps its gradient (min picks the unclipped term).
    # A < 0: clipped at ratios 0.5 and 0.75 (< 0.8); ratio 1.5 keeps its gradient.
    ratios = torch.tensor([1.5, 0.5, 1.25, 0.75], dtype=F64)
    old = torch.full((2, 4), -1.0, dtype=F64)
    logp = (old + ratios.log()).requires_grad_()
    adv = torch.tensor([1.0, -1.0], dtype=F64)
    mask = torch.ones(2, 4, dtype=torch.bool)
    loss, metrics = ppo_clip_loss(logp, old, adv, mask, clip_low=0.2, clip_high=0.3)
    loss.backward()
    # Where unclipped, d(−ratio · A)/d logp = −ratio · A, divided by the 8 tokens.
    expected_grad = torch.tensor([[0.0, -0.5, -1.25, -0.75], [1.5, 0.0, 1.25, 0.0]], dtype=F64) / 8
    torch.testing.assert_close(logp.grad, expected_grad)
    # Loss: −[1.3, 0.5, 1.25, 0.75] for A = +1 and +[1.5, 0.8, 1.25, 0.8] for A = −1, over 8 tokens.
    torch.testing.assert_close(loss, torch.tensor((-3.8 + 4.35) / 8, dtype=F64))
    assert metrics["clip_fraction"] == pytest.approx(3 / 8)
    assert metrics["ratio_max"] == pytest.approx(1.5)
    assert metrics["ratio_mean"] == pytest.approx(4.0 / 4)
    # k3 of KL(old ‖ new) = mean of r − 1 − log r over the 8 tokens.
    k3 = sum(r - 1 - math.log(r) for r in ratios.tolist()) / 4
    assert metrics["approx_kl"] == pytest.approx(k3)


def test_aggregation_modes_hand_values():
    # Ratio 1: token loss = −A. Sequence 0: T = 3, A = [1, 2, 3]; sequence 1: T = 1, A = [4]; T = 4.
    # token-mean: −(6 + 4) / 4 = −2.5. seq-mean-token-mean: −(2 + 4) / 2 = −3.
    # seq-mean-token-sum-norm: −(6 / 4 + 4 / 4) / 2 = −1.25; with norm_len 2: −(3 + 2) / 2 = −2.5.
    mask = ragged_mask([3, 1], 4)
    adv = torch.tensor([[1.0, 2, 3, 99], [4, 99, 99, 99]], dtype=F64)
    logp = torch.zeros(2, 4, dtype=F64)

    def loss(**kwargs):
        return ppo_clip_loss(logp, logp, adv, mask, **kwargs)[0].item()

    assert loss(agg="token-mean") == pytest.approx(-2.5)
    assert loss(agg="seq-mean-token-mean") == pytest.approx(-3.0)
    assert loss(agg="seq-mean-token-sum-norm") == pytest.approx(-1.25)
    assert loss(agg="seq-mean-token-sum-norm", norm_len=2) == pytest.approx(-2.5)
    with pytest.raises(ValueError, match="agg"):
        loss(agg="sum")


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_all_padding_rows_do_not_count(agg):
    # A row without tokens (padding of a micro-batch) changes no mode's loss.
    gen = torch.Generator().manual_seed(4)
    mask = ragged_mask([3, 2, 0], 4)
    old = -torch.rand(3, 4, generator=gen, dtype=F64)
    logp = old + 0.2 * torch.randn(3, 4, generator=gen, dtype=F64)
    adv = torch.randn(3, generator=gen, dtype=F64)
    with_padding_row, _ = ppo_clip_loss(logp, old, adv, mask, agg=agg)
    without, _ = ppo_clip_loss(logp[:2], old[:2], adv[:2], mask[:2], agg=agg)
    torch.testing.assert_close(with_padding_row, without)


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_micro_batches_sum_to_the_full_batch_loss(agg):
    gen = torch.Generator().manual_seed(1)
    mask = ragged_mask([6, 1, 4, 3, 6], 6)
    old = -torch.rand(5, 6, generator=gen, dtype=F64)
    logp = old + 0.3 * torch.randn(5, 6, generator=gen, dtype=F64)  # some tokens clip
    adv = torch.randn(5, generator=gen, dtype=F64)
    full, _ = ppo_clip_loss(logp, old, adv, mask, agg=agg)
    totals = {"global_tokens": float(mask.sum()), "global_seqs": 5.0}
    parts = [
        ppo_clip_loss(logp[rows], old[rows], adv[rows], mask[rows], agg=agg, **totals)[0]
        for rows in (slice(0, 2), slice(2, 5))
    ]
    torch.testing.assert_close(sum(parts), full)


def test_sequence_advantages_broadcast_like_token_advantages():
    gen = torch.Generator().manual_seed(2)
    mask = ragged_mask([4, 2], 4)
    old = -torch.rand(2, 4, generator=gen)
    logp = old + 0.5 * torch.randn(2, 4, generator=gen)
    adv = torch.tensor([0.7, -1.2])
    per_seq = ppo_clip_loss(logp, old, adv, mask)
    per_token = ppo_clip_loss(logp, old, adv[:, None].expand(2, 4), mask)
    torch.testing.assert_close(per_seq[0], per_token[0])
    assert per_seq[1] == per_token[1]


def test_log_ratio_is_clamped():
    mask = torch.ones(1, 2, dtype=torch.bool)
    logp = torch.tensor([[0.0, -500.0]], requires_grad=True)
    loss, metrics = ppo_clip_loss(logp, torch.tensor([[-500.0, 0.0]]), torch.tensor([-1.0]), mask)
    assert math.isfinite(loss.item()) and metrics["ratio_max"] == pytest.approx(math.exp(20), rel=1e-5)
    loss.backward()
    assert torch.isfinite(logp.grad).all()


def test_padding_does_not_count():
    mask = ragged_mask([2], 4)
    old = torch.zeros(1, 4)
    logp = torch.tensor([[0.0, 0.0, 5.0, -5.0]])  # huge ratios on padding only
    loss, metrics = ppo_clip_loss(logp, old, torch.tensor([[1.0, 1.0, 1e6, 1e6]]), mask)
    assert loss.item() == pytest.approx(-1.0)
    assert metrics == {"clip_fraction": 0.0, "approx_kl": 0.0, "ratio_mean": 1.0, "ratio_max": 1.0}


def test_kl_k3_values_and_gradient():
    # d = ref − logp: d = 0 → 0; d = log 2 → 2 − 1 − log 2; d = −log 2 → 0.5 − 1 + log 2. Padding 0.
    logp = torch.tensor([[0.0, 0.0, 0.0, 3.0]], dtype=F64, requires_grad=True)
    ref = torch.tensor([[0.0, math.log(2), -math.log(2), 0.0]], dtype=F64)
    kl = kl_k3(logp, ref, ragged_mask([3], 4))
    expected = [0.0, 1 - math.log(2), -0.5 + math.log(2), 0.0]
    torch.testing.assert_close(kl, torch.tensor([expected], dtype=F64))
    # d kl / d logp = −(e^d − 1): pulls logp toward ref_logp.
    kl.sum().backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[0.0, -1.0, 0.5, 0.0]], dtype=F64))


def test_kl_k3_is_non_negative():
    gen = torch.Generator().manual_seed(3)
    logp, ref = torch.randn(2, 50, 8, generator=gen)
    assert (kl_k3(logp, ref, torch.ones(50, 8, dtype=torch.bool)) >= 0).all()


def test_loss_leaves_inputs_unchanged_and_supports_bfloat16():
    mask = ragged_mask([3, 2], 3)
    logp = torch.tensor([[-1.0, -2.0, -0.5], [-0.1, -3.0, 0.0]], dtype=torch.bfloat16)
    old = logp - 0.1
    before = logp.clone(), old.clone()
    loss, metrics = ppo_clip_loss(logp, old, torch.tensor([1.0, -1.0], dtype=torch.bfloat16), mask)
    assert loss.dtype == torch.bfloat16 and math.isfinite(loss.item())
    assert all(isinstance(v, float) for v in metrics.values())
    assert torch.equal(logp, before[0]) and torch.equal(old, before[1])
