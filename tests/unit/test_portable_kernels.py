"""The golden run's portable kernels (tests/pipeline/portable.py) compute what torch's do, refuse what they
cannot pin, and the op tracer names the first operation two traces disagree on."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.pipeline.op_trace import OpTrace, first_difference
from tests.pipeline.portable import PortableKernels, UnportableOperation, portable_kernels


def test_products_and_vector_maths_match_torch_within_rounding() -> None:
    generator = torch.Generator().manual_seed(0)
    a, b = torch.randn(37, 70, generator=generator), torch.randn(70, 300, generator=generator)
    bias, batch = torch.randn(300, generator=generator), torch.randn(3, 5, 70, generator=generator)
    x = torch.randn(1000, generator=generator) * 4
    with PortableKernels():
        got = [a @ b, torch.addmm(bias, a, b, beta=0.5, alpha=2), batch @ b, a @ b[:, 0]]
        maths = [x.exp(), x.abs().log(), x.abs().sqrt(), x.tanh(), torch.tensor(0.0).sqrt()]
    expected = [a @ b, torch.addmm(bias, a, b, beta=0.5, alpha=2), batch @ b, a @ b[:, 0]]
    for portable, reference in zip(got, expected, strict=True):
        torch.testing.assert_close(portable, reference, rtol=1e-5, atol=1e-4)
    for portable, reference in zip(maths, [x.exp(), x.abs().log(), x.abs().sqrt(), x.tanh()], strict=False):
        torch.testing.assert_close(portable, reference, rtol=2e-7, atol=0)
    assert maths[-1].item() == 0.0


def test_a_layer_trains_to_the_same_gradients_under_portable_kernels() -> None:
    torch.manual_seed(0)
    layer = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
    inputs = torch.randn(8, 5, 16)
    layer(inputs).square().mean().backward()
    reference = [parameter.grad.clone() for parameter in layer.parameters()]
    layer.zero_grad()
    with portable_kernels():
        layer(inputs).square().mean().backward()
        attended = torch.nn.functional.scaled_dot_product_attention(inputs, inputs, inputs, is_causal=True)
    for parameter, expected in zip(layer.parameters(), reference, strict=True):
        torch.testing.assert_close(parameter.grad, expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(
        attended, torch.nn.functional.scaled_dot_product_attention(inputs, inputs, inputs, is_causal=True)
    )


def test_an_operation_it_cannot_pin_is_refused_by_name() -> None:
    with PortableKernels(), pytest.raises(UnportableOperation, match="linalg_inv_ex"):
        torch.linalg.inv(torch.eye(3))
    with PortableKernels(), pytest.raises(UnportableOperation, match="erf"):
        torch.special.erf(torch.ones(3))


def test_the_tracer_names_the_first_operation_whose_outputs_differ(tmp_path: Path) -> None:
    def trace(path: Path, scale: float) -> None:
        with path.open("w") as out, OpTrace(out):
            x = torch.arange(6.0).reshape(2, 3)
            y = (x * 2).sum(dim=1)
            (y * scale).exp()

    trace(tmp_path / "a", 1.0)
    trace(tmp_path / "b", 1.0)
    trace(tmp_path / "c", 3.0)
    assert first_difference(tmp_path / "a", tmp_path / "b") == "no difference in the ops both traces hold"
    assert "aten.mul.Tensor" in first_difference(tmp_path / "a", tmp_path / "c")
    assert "with inputs already different" in first_difference(tmp_path / "a", tmp_path / "c")
