"""Kernels that round alike on every x86-64 CPU, for the golden check (docs/PIPELINE.md, "Bits across
machines").

Measured with tests/pipeline/op_trace.py (issue 41): under ATEN_CPU_CAPABILITY=default, MKL_CBWR=COMPATIBLE
and one thread, an Intel Xeon and an AMD EPYC still trained the tiny recipe to other bits, and on one Xeon the
only operations whose bits followed MKL's code path (MKL_CBWR=COMPATIBLE vs AVX512) were MKL's: its GEMM
(mm, addmm, bmm, the CPU flash attention, which calls it) and its vector maths, which ATen uses for exp, log,
sqrt, tanh, erf, atan, asin, acos, log2, log10 and erfc. MKL picks its kernels per CPU at run time; ATen's
own kernels at the `default` capability are one compiled code path on every machine, and their scalar maths
goes to glibc's libm, whose variant (FMA or SSE2) glibc pins here with GLIBC_TUNABLES.

PortableKernels reroutes every MKL operation the training reaches to ATen's own kernels: a matrix product
as an exact element-wise product and an ATen sum over the inner dimension (one order, fixed by the shapes),
the vector maths through libm-backed ATen functions in float64 (expm1, log1p, rsqrt). Any other MKL or
LAPACK operation fails loudly, naming itself, instead of rounding per machine. The bits differ from those of
the default kernels (a golden run is its own reference); what they still catch is any change to the order of
operations in the code under test: a sum reordered in the loss or the advantages changes them."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils._python_dispatch import TorchDispatchMode

PRODUCT_CHUNK = 1 << 16
"""Multiplications of a matrix product formed at once: its rows go in chunks of PRODUCT_CHUNK // (inner ×
columns), a 256 KB temporary that stays in cache. The chunk is part of the order of operations (a chunk of
one row is reduced otherwise: VinePPO's digests moved between 2^22 and 2^16), so changing it means
recording the digests anew. Of the forms tried on the tiny model (a rank-1 term at a time, inner blocks,
the inner dimension innermost), the fastest: 1.5x faster than with 2^22."""


def _matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a [..., n, k] @ b [..., k, m] (equal leading dims) -> [..., n, m]: each product exact, each sum ATen's
    reduction over k, in an order fixed by the shapes alone."""
    chunk = max(1, PRODUCT_CHUNK // max(1, a.shape[-1] * b.shape[-1]))
    parts = [
        (a[..., start : start + chunk, :, None] * b[..., None, :, :]).sum(-2)
        for start in range(0, a.shape[-2], chunk)
    ]
    return torch.cat(parts, dim=-2) if len(parts) > 1 else parts[0]


def _scaled_sum(product: torch.Tensor, bias: torch.Tensor, beta: float, alpha: float) -> torch.Tensor:
    """beta × bias + alpha × product, as BLAS defines it (beta 0 ignores the bias, NaNs included)."""
    if alpha != 1:
        product = product * alpha
    if beta == 0:
        return product
    return product + (bias if beta == 1 else bias * beta)


def _addmm(
    bias: torch.Tensor, a: torch.Tensor, b: torch.Tensor, *, beta: float = 1, alpha: float = 1
) -> torch.Tensor:
    """addmm and baddbmm: beta × bias + alpha × a @ b."""
    return _scaled_sum(_matmul(a, b), bias, beta, alpha)


def _mv(a: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return _matmul(a, v[:, None])[:, 0]


def _addmv(
    bias: torch.Tensor, a: torch.Tensor, v: torch.Tensor, *, beta: float = 1, alpha: float = 1
) -> torch.Tensor:
    return _scaled_sum(_mv(a, v), bias, beta, alpha)


def _dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a * b).sum()


def _in_float64(compute: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[torch.Tensor], torch.Tensor]:
    """A unary function computed in float64 by `compute` and rounded once to the input's dtype."""

    def unary(x: torch.Tensor) -> torch.Tensor:
        return compute(x.to(torch.float64)).to(x.dtype)

    return unary


def _log(x: torch.Tensor) -> torch.Tensor:
    mantissa, exponent = torch.frexp(x)  # x = m × 2^e, m in [0.5, 1): m - 1 is exact
    return torch.log1p(mantissa - 1) + exponent.to(x.dtype) * math.log(2)


def _tanh(x: torch.Tensor) -> torch.Tensor:
    grown = torch.expm1(-2 * x.abs())  # in (-1, 0]: no overflow for any x
    return torch.sign(x) * (-grown / (grown + 2))


UNARY: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "exp": _in_float64(lambda x: torch.expm1(x) + 1),
    "log": _in_float64(_log),
    "sqrt": _in_float64(lambda x: torch.rsqrt(x).reciprocal()),  # IEEE's sqrt, in ATen's own kernel
    "tanh": _in_float64(_tanh),
}
"""MKL's vector maths, the functions the training reaches: each through libm-backed ATen kernels instead."""

MKL_UNARY_WITHOUT_PORTABLE_FORM = ("erf", "erfc", "atan", "asin", "acos", "log2", "log10")
"""The other functions measured to follow MKL's code path (see the module docstring): refused until one is
given a portable form here."""

PRODUCTS: dict[str, Callable[..., torch.Tensor]] = {
    "mm": _matmul,
    "bmm": _matmul,
    "addmm": _addmm,
    "baddbmm": _addmm,
    "mv": _mv,
    "addmv": _addmv,
    "dot": _dot,
    "vdot": _dot,
}
"""The BLAS operations (MKL's GEMM and GEMV), as exact products summed by ATen."""

REFUSED_PREFIXES = ("_scaled_dot_product_flash", "_addmm_activation", "addbmm", "_linalg_", "_fft_")
REFUSED = frozenset(
    [
        "linalg_lu",
        "linalg_lu_factor_ex",
        "linalg_lu_solve",
        "linalg_cholesky_ex",
        "linalg_inv_ex",
        "linalg_qr",
        "linalg_eig",
        "linalg_lstsq",
        "linalg_solve_triangular",
        "linalg_householder_product",
        "linalg_ldl_factor_ex",
        "triangular_solve",
        "cholesky",
        "geqrf",
        "ormqr",
    ]
)
"""Operations whose CPU kernels call MKL's GEMM, LAPACK or MKL's FFT inside (ATen's own norms, such as
linalg_vector_norm, are not among them): refused, naming themselves."""


CPU_DEPENDENT = (
    "rounds differently per CPU (MKL, LAPACK or MKL's FFT): give it a portable form in "
    "tests/pipeline/portable.py before the golden run uses it"
)


class UnportableOperation(RuntimeError):
    """The golden run reached an operation whose rounding depends on the CPU it runs on."""


def _portable_unary(name: str, args: tuple, kwargs: dict) -> Any:
    compute = UNARY[name.rstrip("_")]
    out = kwargs.get("out")
    result = compute(args[0])
    if name.endswith("_"):  # in place
        return args[0].copy_(result)
    if out is not None:
        return out.copy_(result)
    return result


def _portable_foreach(name: str, args: tuple) -> Any:
    single = name.removeprefix("_foreach_")
    results = [_portable_unary(single, (tensor,), {}) for tensor in args[0]]
    return None if single.endswith("_") else results


class PortableKernels(TorchDispatchMode):
    """Routes MKL's operations to ATen's own kernels (see the module docstring); use it with the `math`
    attention backend (portable_kernels below), since the CPU flash attention calls MKL's GEMM inside."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        base = name.removeprefix("_foreach_").rstrip("_")
        if name in PRODUCTS and "out" not in kwargs:
            return PRODUCTS[name](*args, **kwargs)
        if base in UNARY:
            if name.startswith("_foreach_"):
                return _portable_foreach(name, args)
            return _portable_unary(name, args, kwargs)
        refused = name in PRODUCTS or name in REFUSED or name.startswith(REFUSED_PREFIXES)
        if refused or base in MKL_UNARY_WITHOUT_PORTABLE_FORM:
            raise UnportableOperation(f"{func} {CPU_DEPENDENT}")
        if torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), "CompositeImplicitAutograd"):
            with self:  # a composite seen whole (as under inference mode): its parts come back through here
                return func.decompose(*args, **kwargs)
        return func(*args, **kwargs)


@contextmanager
def portable_kernels() -> Iterator[None]:
    """Runs the block under PortableKernels and the `math` attention backend."""
    with sdpa_kernel(SDPBackend.MATH), PortableKernels():
        yield
