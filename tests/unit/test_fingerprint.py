"""The replay check's fingerprint (probepo/engines/fingerprint.py): any flipped bit of any weight changes
it, it does not depend on the order of the state dict or on copies, and names, dtypes and shapes count."""

from __future__ import annotations

import torch

from probepo.engines.fingerprint import ROW, weights_fingerprint


def state_dict() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return {
        "embed.weight": torch.randn(3, 5, generator=generator),
        "norm.weight": torch.randn(7, generator=generator).bfloat16(),  # 14 bytes
        "steps": torch.arange(3, dtype=torch.uint8),  # an odd byte count
        "long": torch.randn(ROW + 3, generator=generator).half(),  # past one row of words
    }


def test_every_flipped_bit_changes_the_fingerprint():
    weights = state_dict()
    reference = weights_fingerprint(weights.items())
    for name, tensor in weights.items():
        raw = tensor.reshape(-1).view(torch.uint8)
        positions = range(raw.numel()) if raw.numel() < 64 else (0, 1, 2 * ROW - 1, 2 * ROW, raw.numel() - 1)
        for position in positions:
            for bit in range(8):
                flipped = {k: v.clone() for k, v in weights.items()}
                flipped[name].reshape(-1).view(torch.uint8)[position] ^= 1 << bit
                assert weights_fingerprint(flipped.items()) != reference, (name, position, bit)


def test_order_and_copies_do_not_matter_but_names_dtypes_and_shapes_do():
    weights = state_dict()
    reference = weights_fingerprint(weights.items())
    assert weights_fingerprint(reversed([(k, v.clone()) for k, v in weights.items()])) == reference
    renamed = {("head.weight" if k == "embed.weight" else k): v for k, v in weights.items()}
    assert weights_fingerprint(renamed.items()) != reference
    reshaped = {**weights, "embed.weight": weights["embed.weight"].reshape(5, 3)}
    assert weights_fingerprint(reshaped.items()) != reference
    retyped = {**weights, "norm.weight": weights["norm.weight"].view(torch.float16)}  # the same bytes
    assert weights_fingerprint(retyped.items()) != reference
    swapped = {**weights, "embed.weight": weights["embed.weight"].flip(0)}  # the same words, reordered
    assert weights_fingerprint(swapped.items()) != reference
