"""Golden bits: the tiny recipe's final policy under GRPO, ProbePO and VinePPO, as sha256 of its weights and
optimizer state. A change of these bits is a change of the maths or of its order of operations: when one is
meant, record the new digests here and say why in the commit.

The run happens in a process of its own under PORTABLE_NUMERICS (AVX2 kernels, MKL's reproducible mode, one
thread), because the default kernels round differently across CPUs: digests recorded on one machine failed
on an AVX-512 one with the same code and wheel. torch 2.13.0+cpu."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.pipeline.golden_run import PORTABLE_NUMERICS

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]

GOLDEN = {  # (model.safetensors, optimizer.safetensors) of the checkpoint of update 2
    # Recorded at 08dd9ad, before the training-rows refactor (issue 16), and unchanged after it.
    "grpo": (
        "9c63501737b7a301bd1f49ca7c30cb7bba07873074d92d77408a9c4fb643f492",
        "2b08efe3acde7cdb17d27e86a7f7cfb39fe4243544720906eaa5ec9eace1cd0a",
    ),
    "probepo": (
        "45a01db0d02e34742ce45741b8c9d193fcee211de822d815a8f0a941c64f040a",
        "6e791f9573a687c04b2b3be1ca69cbb006cfd4c683b35485c904a90cf8d5459e",
    ),
    "vineppo": (
        "2e03eae2013707972a819d4762f57fe772aa192fabad8ebaed47748e9065d5ca",
        "a09861f1fda72f5680030650d7b8587f470498def4065027ed83574d1842ba81",
    ),
}


@pytest.mark.parametrize("algorithm", sorted(GOLDEN))
def test_the_final_policy_has_the_recorded_bits(algorithm: str, tmp_path: Path) -> None:
    env = {**os.environ, **PORTABLE_NUMERICS, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "tests.pipeline.golden_run", algorithm, str(tmp_path / "store")]
    done = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert tuple(done.stdout.split()) == GOLDEN[algorithm], (
        "the bits changed: if the maths or its order of operations was meant to, record the new digests"
    )
