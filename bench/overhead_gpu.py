"""The overhead bench's GPU mode: the per-rank rates the spend model states (probepo/spend/model.py
`Bandwidths`), measured on one GPU over a 7B policy's weights (DeepSeekMath-7B's bf16 state dict, random
values: the rates depend on bytes, not on what they hold).

    python bench/overhead_gpu.py                        # on a CUDA machine (torch and pydantic; ≈ 1 min)
    python bench/overhead_gpu.py --device cpu --small   # a smoke run of the script on a tiny shape

Measures, each over the whole state dict unless said:
1. device→host, pageable: each tensor `.to("cpu")` into new host memory (what a save does with what it
   writes; `Bandwidths.device_to_host`);
2. device→host, pinned: into page-locked buffers allocated beforehand (a save that kept them), over the
   first `--pinned-gb` GB;
3. the replay fingerprint (`weights_fingerprint`, engines/fingerprint.py) where the weights are, one rank
   hashing them all (`Bandwidths.device_hash`; a rank of 8 hashes an eighth), and whether it equals the
   fingerprint of the same tensors copied to the CPU (over the first `--agree-gb` GB);
4. the digest it replaced: sha256 of the host copy (over the first `--sha-gb` GB);
5. a host memcpy of the host copy into buffers allocated beforehand: the floor issue 44's in-memory hand-off
   is measured against.
Writes bench/results/overhead_gpu.json (machine, GPU, date, command) and prints its markdown table
(docs/BENCHMARKS.md's, which the site renders from that file).
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from benchlib import machine, recorded, table
from torch import Tensor

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from probepo.engines.fingerprint import weights_fingerprint
from probepo.spend.model import STATED

RESULTS = Path(__file__).parent / "results"
DEEPSEEKMATH_7B = {"vocab": 102_400, "hidden": 4096, "layers": 30, "intermediate": 11_008}
"""deepseek-math-7b's config.json: a Llama of 30 layers, full multi-head attention, an untied LM head."""
SMALL = {"vocab": 1000, "hidden": 64, "layers": 2, "intermediate": 128}
GB = 1e9


def state_shapes(shape: dict[str, int]) -> Iterator[tuple[str, tuple[int, ...]]]:
    """A Llama's state dict: (name, shape), in the order a checkpoint lists it."""
    vocab, hidden, inner = shape["vocab"], shape["hidden"], shape["intermediate"]
    yield "model.embed_tokens.weight", (vocab, hidden)
    for layer in range(shape["layers"]):
        prefix = f"model.layers.{layer}."
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            yield f"{prefix}self_attn.{name}.weight", (hidden, hidden)
        yield f"{prefix}mlp.gate_proj.weight", (inner, hidden)
        yield f"{prefix}mlp.up_proj.weight", (inner, hidden)
        yield f"{prefix}mlp.down_proj.weight", (hidden, inner)
        yield f"{prefix}input_layernorm.weight", (hidden,)
        yield f"{prefix}post_attention_layernorm.weight", (hidden,)
    yield "model.norm.weight", (hidden,)
    yield "lm_head.weight", (vocab, hidden)


def random_state(shape: dict[str, int], device: torch.device) -> dict[str, Tensor]:
    generator = torch.Generator(device).manual_seed(0)
    return {
        name: torch.randn(size, generator=generator, device=device, dtype=torch.bfloat16)
        for name, size in state_shapes(shape)
    }


def prefix(state: dict[str, Tensor], limit_bytes: float) -> dict[str, Tensor]:
    """The state's first tensors, up to `limit_bytes` (at least one)."""
    taken: dict[str, Tensor] = {}
    total = 0
    for name, tensor in state.items():
        if taken and total + tensor.nbytes > limit_bytes:
            break
        taken[name] = tensor
        total += tensor.nbytes
    return taken


def nbytes(state: dict[str, Tensor]) -> int:
    return sum(t.nbytes for t in state.values())


def timed(device: torch.device, run: Callable[[], Any]) -> tuple[Any, float]:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    result = run()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return result, time.perf_counter() - start


def rate(bytes_moved: int, seconds: float) -> dict[str, float]:
    return {
        "bytes": bytes_moved,
        "seconds": round(seconds, 4),
        "gb_per_s": round(bytes_moved / GB / seconds, 2),
    }


def measure(args: argparse.Namespace) -> dict[str, Any]:
    device = torch.device(args.device)
    state = random_state(SMALL if args.small else DEEPSEEKMATH_7B, device)
    total = nbytes(state)
    results: dict[str, Any] = {"weights_bytes": total, "tensors": len(state)}

    weights_fingerprint(prefix(state, 1).items())  # kernels and the multiplier table, once
    host, seconds = timed(device, lambda: {n: t.to("cpu") for n, t in state.items()})
    results["device_to_host_pageable"] = rate(total, seconds)
    host, seconds = timed(device, lambda: {n: t.to("cpu") for n, t in state.items()})
    results["device_to_host_pageable_again"] = rate(total, seconds)

    pinned_part = prefix(state, args.pinned_gb * GB)
    pinned = {
        n: torch.empty(t.shape, dtype=t.dtype, pin_memory=device.type == "cuda")
        for n, t in pinned_part.items()
    }
    _, seconds = timed(
        device, lambda: [pinned[n].copy_(t, non_blocking=True) for n, t in pinned_part.items()]
    )
    results["device_to_host_pinned"] = rate(nbytes(pinned_part), seconds)

    fingerprint, seconds = timed(device, lambda: weights_fingerprint(state.items()))
    results["fingerprint_on_device"] = rate(total, seconds) | {"fingerprint": fingerprint}
    agree = prefix(state, args.agree_gb * GB)
    on_device = weights_fingerprint(agree.items())
    on_cpu = weights_fingerprint((n, host[n]) for n in agree)
    results["fingerprint_same_on_cpu"] = {"bytes": nbytes(agree), "equal": on_device == on_cpu}

    sha_part = prefix(host, args.sha_gb * GB)
    digest = hashlib.sha256()
    _, seconds = timed(
        device, lambda: [digest.update(t.view(torch.uint8).numpy()) for t in sha_part.values()]
    )
    results["sha256_on_host"] = rate(nbytes(sha_part), seconds)

    destination = {n: torch.empty_like(t) for n, t in host.items()}
    for t in destination.values():  # touch every page: the copy below times memory, not page faults
        t.view(torch.uint8).fill_(0)
    _, seconds = timed(device, lambda: [destination[n].copy_(t) for n, t in host.items()])
    results["host_memcpy"] = rate(total, seconds)

    results["stated_vs_measured"] = {
        "device_to_host": {
            "stated_gb_per_s": STATED.device_to_host,
            "measured_gb_per_s": results["device_to_host_pageable"]["gb_per_s"],
        },
        "device_hash": {
            "stated_gb_per_s": STATED.device_hash,
            "measured_gb_per_s": results["fingerprint_on_device"]["gb_per_s"],
        },
    }
    return results


ROWS = (
    (
        'device→host into new pageable memory (`.to("cpu")`: what a save and `weights()` do)',
        "device_to_host_pageable",
    ),
    ("the same, again", "device_to_host_pageable_again"),
    ("device→host into pinned buffers allocated beforehand", "device_to_host_pinned"),
    ("the replay fingerprint on the device, one rank hashing all", "fingerprint_on_device"),
    ("sha256 of the host copy (the digest the fingerprint replaced)", "sha256_on_host"),
    ("host memcpy into touched buffers (issue 44's floor for a hand-off)", "host_memcpy"),
)
"""The table's rows: how it names each measurement, and the measurement's key."""
STATED_AS = {"device_to_host_pageable": "device_to_host", "fingerprint_on_device": "device_hash"}
"""The measurements that stand for a rate the spend model states (`stated_vs_measured`)."""


def markdown(results: dict[str, Any]) -> str:
    """docs/BENCHMARKS.md's table of the device rates, rendered from bench/results/overhead_gpu.json when
    the site is built: each measurement, and the rate the spend model states where it stands for one."""
    stated = results.get("stated_vs_measured", {})
    rows = []
    for label, key in ROWS:
        entry = results[key]
        rate = f"{entry['gb_per_s']:#.3g}"
        model = stated.get(STATED_AS.get(key, ""), {}).get("stated_gb_per_s")
        if model is not None:
            rate = f"**{rate}**"
        model = "" if model is None else f"{model:g}"
        rows.append([label, f"{entry['bytes'] / GB:.2f}", f"{entry['seconds']:.2f}", rate, model])
    header = ["measurement", "GB", "seconds", "GB/s", "the model states"]
    same = results["fingerprint_same_on_cpu"]
    lines = [*table(header, rows), ""]
    lines.append(
        f"The fingerprint on the device {'equals' if same['equal'] else 'does not equal'} the CPU's over the"
        f" first {same['bytes'] / GB:.2f} GB of tensors."
    )
    if "machine" in results:
        lines[:0] = [
            recorded(results, "bench/results/overhead_gpu.json")
            + f"; {results['model']}: {results['tensors']} tensors, {results['weights_bytes'] / GB:.1f} GB.",
            "",
        ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--small", action="store_true", help="a tiny state dict: a smoke run of the script")
    parser.add_argument("--pinned-gb", type=float, default=4.0)
    parser.add_argument("--agree-gb", type=float, default=1.0)
    parser.add_argument("--sha-gb", type=float, default=2.0)
    parser.add_argument(
        "--out", type=Path, help="default: bench/results/overhead_gpu.json (_small with --small)"
    )
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("overhead_gpu: CUDA is not available here; smoke-test the script with --device cpu --small.")
    results = measure(args)
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "none"
    record = {
        **results,
        "model": "DeepSeekMath-7B's state dict shapes, bf16, random values" if not args.small else "tiny",
        "machine": f"{machine()}, GPU {gpu}",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": "python " + " ".join(sys.argv),
    }
    out = args.out or RESULTS / ("overhead_gpu_small.json" if args.small else "overhead_gpu.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1) + "\n")
    print(markdown(record))
    print(f"\nwritten to {out}")


if __name__ == "__main__":
    main()
