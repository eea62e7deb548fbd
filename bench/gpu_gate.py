"""The GPU gate (issue 65): the whole pipeline on one GPU, preempted and resumed, under both settings of the
recipe's `determinism`, checking that `bitwise` keeps its promise there (docs/DETERMINISM.md).

    bash bench/gpu_gate_wheels.sh                  # here, first: what a GPU call carries (out/gpu-gate)
    python bench/gpu_gate.py --benchmarks out/gpu-gate/benchmarks   # on the GPU (docs/DETERMINISM.md)
    python bench/gpu_gate.py --device cpu --small  # the same gate on the CPU (tests/bench/test_gpu_gate.py)

On one device: ProbePO on the maths task, on a few hundred MATH problems whose gold is one digit (staged from
../shared/benchmarks by `--stage-benchmarks DIR`, or into `--work`), the policy of bench/gpu_gate_policy.py
(R1-Distill-Qwen-1.5B's width, heads and vocabulary with GPU_LAYERS of its layers, random weights but for its
fitted answer rows, bf16; a tiny float32 one with --small) on Qwen's tokenizer, the Hugging Face generator,
the DeepSpeed trainer (ZeRO-2 on one rank, over NCCL or gloo, torch's AdamW: no JIT-built op), the inline
executor and a local store. For `bitwise`, then `fast`, each leg a process of its own (gpu_gate_leg.py):
  a. 3 updates with checkpoint_every 2, uninterrupted;
  b. the same run stopped by USR2 (PROBEPO_STOP_AT) in the middle of update 0's optimize (policy 1 is never
     committed in full, so the stop commits nothing and the optimize reruns whole), resumed in a new
     process, stopped again inside update 1's probe after its first shard (the next process rebuilds policy
     1 by replaying optimize 0, checked against the fingerprint it committed, and hands it to the
     generator), resumed to the end.
Updates count from 0, as fault points do (the issue's updates 1 and 2). Checks: every leg ends where it
should; under `bitwise` every file of every stage (a) committed is (b)'s, bit for bit, and every replay
reproduced its weights; under `fast` the files that differ are listed, and (b) must have committed every stage
(a) did (nothing lost); in both the updates must have moved the weights (else nothing was tested). A leg
that fails (an op that refuses deterministic mode, say) is recorded with the end of its stderr.

Writes bench/results/gpu_gate.json (`--out`): the device, per stage seconds and peak memory, the hand-off's
seconds, bitwise ÷ fast wall time of (a) (same machine, same call), the learning signal, the equalities; exits
1 if a check fails. The record is written after the policy's fit, after every leg and after every mode, so
that a call killed at its time limit still returns the figures of what ran (`complete` false, `passed` false
until every check has run). Each run's store is removed once read (a full checkpoint holds GBs of optimizer
state).
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # before the bench modules: gpu_check and gpu_gate_policy import probepo

from benchlib import machine  # noqa: E402
from gpu_check import R1_DISTILL_1_5B, SMALL  # noqa: E402
from gpu_gate_policy import build_policy  # noqa: E402

from probepo.config import RunConfig  # noqa: E402
from probepo.data.benchmarks import AVG6_BENCHMARKS, BENCHMARKS, benchmarks_root, load_benchmark  # noqa: E402
from probepo.data.contamination import math_training_set  # noqa: E402
from probepo.run.faults import STOP_ENV  # noqa: E402
from probepo.run.pipeline import resume_point  # noqa: E402
from probepo.stages.replay import FINGERPRINT  # noqa: E402
from probepo.store import ArtifactStore, open_store  # noqa: E402

RESULTS = ROOT / "bench" / "results"
LEG = Path(__file__).with_name("gpu_gate_leg.py")
MODES = ("bitwise", "fast")
STOPS = (("0:optimize.minibatch-0000:done", (0, "optimize")), ("1:probe.shard-0001:claimed", (1, "probe")))
"""Where (b) is stopped, and where each stop leaves the run to resume."""
SIZES = {
    "full": {"problems": 300, "prompts": 8, "group": 8, "max_tokens": 24, "batch_rows": 8,
             "minibatch": 32, "microbatch": 16, "eval_problems": 16, "dtype": "bfloat16"},
    "small": {"problems": 64, "prompts": 4, "group": 4, "max_tokens": 16, "batch_rows": 4,
              "minibatch": 8, "microbatch": 4, "eval_problems": 4, "dtype": "float32"},
}  # fmt: skip
"""The recipe's sizes on a GPU and with --small: at least two mini-batches per update (a stop falls between
them: 8 prompts × 8 samples = 64 responses, 2 mini-batches of 32) and two probe shards (one is committed
before the second stop): ProbePO probes at most max_pivots (2) prefixes per group, 16 an update on a GPU,
and a probe shard holds batch_rows // continuations_per_pivot = 4 of them, so any 5 prefixes make 2 shards
(groups whose rewards are all equal are not probed; the CPU gate's fitted policy answers 44-75 % right).
Kept small on a GPU for time: the gate's minutes go to starting its 8 leg processes and writing its 8 full
checkpoints, not to computing (docs/DETERMINISM.md, "The gate on a GPU")."""
SIGNAL = (
    "sample/reward_mean",
    "sample/uniform_group_fraction",
    "advantage/token_adv_abs_mean",
    "optimize/grad_norm",
)
"""What (a)'s metrics say of the learning signal, update by update (rewards must vary within groups)."""
GPU_LAYERS = 2
"""Decoder layers of the gate's model on a GPU: R1-Distill-Qwen-1.5B's width, heads, vocabulary and untied
head with 2 of its 28 layers (560 M parameters, 467 M of them the embedding and the head). Every kernel the
gate checks runs at the real shapes (depth repeats them; two layers still pass one layer's output to the
next), and a full checkpoint (bf16 weights, ZeRO's fp32 master weights and moments: 14 bytes a parameter,
counted, not measured) is 7.8 GB instead of 24.9 GB: one run's store at a time fits the lent machines' 64 GiB
of disk, and the gate's eight full checkpoints take ~100 s of its ~4.7 minutes (estimated from bytes and
measured rates, not run: docs/DETERMINISM.md, "The gate on a GPU"). `--layers 28` is the whole model, where
the disk and time allow (3.2 times the checkpoint bytes)."""
EVAL_ROWS = 16
"""Rows staged of each evaluation set."""
LEG_TIMEOUT_S = 600
ERROR_TAIL = 3000
"""Characters of a failed leg's stderr the record keeps."""


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--small", action="store_true", help="a tiny model and sizes (the CPU gate)")
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES), help="default: both")
    parser.add_argument("--layers", type=int, default=GPU_LAYERS, help="decoder layers on a GPU (R1 has 28)")
    parser.add_argument("--benchmarks", type=Path, help="staged problems (default: staged into --work)")
    parser.add_argument("--stage-benchmarks", type=Path, metavar="DIR", help="only stage the problems in DIR")
    parser.add_argument("--work", type=Path, help="the stores and the policy (default: a temporary folder)")
    parser.add_argument("--out", type=Path, default=RESULTS / "gpu_gate.json")
    return parser.parse_args()


def stage_benchmarks(destination: Path, problems: int) -> None:
    """Stage the gate's problems from ../shared/benchmarks (the offline copies, never committed) into
    `destination`, which a GPU call carries: the first `problems` MATH test problems with a one-digit gold
    that are training problems (none is, or restates, a problem of the six evaluation sets, checked against
    their whole files here), and the first EVAL_ROWS rows of each evaluation set (the recipe evaluates on
    math500's; the task's loader checks the training problems against all six again)."""
    source = benchmarks_root()
    wanted = {p.id for p in math_training_set(source) if len(p.golds[0]) == 1 and p.golds[0].isdigit()}
    rows = zip(load_benchmark("math_test", source), _rows(source, "math_test"), strict=True)
    staged = {"math_test": [row for problem, row in rows if problem.id in wanted][:problems]}
    staged.update({name: _rows(source, name)[:EVAL_ROWS] for name in AVG6_BENCHMARKS})
    for name, lines in staged.items():
        spec = BENCHMARKS[name]
        (destination / spec.folder).mkdir(parents=True, exist_ok=True)
        (destination / spec.folder / spec.file).write_text("\n".join(lines) + "\n")


def _rows(root: Path, name: str) -> list[str]:
    """A benchmark file's rows (its non-blank lines), as load_benchmark reads them."""
    spec = BENCHMARKS[name]
    return [line for line in (root / spec.folder / spec.file).read_text().splitlines() if line.strip()]


def gate_config(
    sizes: dict[str, Any], determinism: str, benchmarks: Path, policy: Path, store: Path
) -> RunConfig:
    """ProbePO on the staged problems: 3 updates, a full checkpoint every 2 (policy 1 only in memory)."""
    task = {
        "kind": "math",
        "source": "benchmarks",
        "benchmarks_root": str(benchmarks),
        "family": "r1-distill",
    }
    model = {"kind": "hf", "pretrained": str(policy), "dtype": sizes["dtype"], "trainer": "deepspeed"}
    algo = {"margin": 1, "min_spacing": 2, "max_pivots": 2, "continuations_per_pivot": 2, "rescue_tokens": 4}
    optim = {"lr": 1e-4, "minibatch_size": sizes["minibatch"], "microbatch_size": sizes["microbatch"]}
    return RunConfig.model_validate(
        {
            "store": str(store),
            "num_updates": 3,
            "checkpoint_every": 2,
            "prompts_per_update": sizes["prompts"],
            "group_size": sizes["group"],
            "determinism": determinism,
            "task": task,
            "model": {**model, "generator": "hf", "zero_stage": 2},
            "sampling": {"max_tokens": sizes["max_tokens"], "batch_rows": sizes["batch_rows"]},
            "algo": algo,
            "optim": optim,
            "eval": {"every": 3, "problems": sizes["eval_problems"], "greedy": False},
        }
    )


def run_leg(
    config: Path, store: ArtifactStore, run_id: str, record: Path, stop_at: str | None, device: str
) -> dict[str, Any]:
    """One leg in a process of its own (bench/gpu_gate_leg.py), stopped at `stop_at` if given: its record, or
    for a leg that failed (an op that refuses under `bitwise`, say) its exit status and the end of its
    stderr. Its output goes beside its record (`<record>.log`)."""
    env = {key: value for key, value in os.environ.items() if key != STOP_ENV}
    if stop_at:
        env[STOP_ENV] = stop_at
    if device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""  # the legs build their engines where torch sees a GPU
    command = [sys.executable, str(LEG), str(config), store.url, run_id, str(record)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=LEG_TIMEOUT_S)
    record.with_suffix(".log").write_text(done.stdout + done.stderr)
    if done.returncode:
        return {"outcome": "failed", "returncode": done.returncode, "error": done.stderr[-ERROR_TAIL:]}
    return json.loads(record.read_text())


def committed(store: ArtifactStore, run_id: str) -> dict[str, dict[str, str]]:
    """Every committed stage of a run (`<update>/<stage>`) → its files' sha256, and for an optimize that kept
    its policy in memory the fingerprint of the weights it made (its only output)."""
    stages = {}
    for update, names in store.ledger_entries(run_id).items():
        for stage in names:
            marker = store.marker(run_id, update, stage) or {}
            files = {name: entry["sha256"] for name, entry in marker.get("files", {}).items()}
            if FINGERPRINT in marker.get("summary", {}):
                files[FINGERPRINT] = marker["summary"][FINGERPRINT]
            stages[f"{update}/{stage}"] = files
    return stages


def compare(a: dict[str, dict[str, str]], b: dict[str, dict[str, str]]) -> dict[str, Any]:
    """What (b) committed against (a) (each as `committed` reads it): the stages (a) has that (b) lacks, those
    only (b) has, and the files (or fingerprints) of common stages that differ."""
    common = a.keys() & b.keys()
    differing = [
        f"{stage}/{name}"
        for stage in sorted(common)
        for name in sorted(a[stage].keys() | b[stage].keys())
        if a[stage].get(name) != b[stage].get(name)
    ]
    return {
        "stages": len(a),
        "files": sum(len(files) for files in a.values()),
        "lost": sorted(a.keys() - b.keys()),
        "extra": sorted(b.keys() - a.keys()),
        "differing": differing,
    }


def summarized(store: ArtifactStore, run_id: str) -> dict[str, Any]:
    """What the gate keeps of a finished run, whose store then goes (a full checkpoint of the 1.5B shape holds
    ~20 GB of optimizer state): its commits, its replays (each checked against the fingerprint it committed),
    the seconds it spent handing weights to a generator, and its learning signal update by update."""
    attempts = store.attempts(run_id)
    spent = [a.get("spend", {}).get("seconds", {}).get("handoff", 0.0) for a in attempts]
    return {
        "committed": committed(store, run_id),
        "replays": {
            "checked": sum(int(a.get("replayed_updates", 0)) for a in attempts),
            "diverged": sorted({u for a in attempts for u in a.get("replay_diverged", [])}),
        },
        "handoff_s": round(sum(spent), 3),
        "signal": [
            {key: m.get(key) for key in ("update", *SIGNAL)}
            for m in store.read_metrics(run_id)
            if SIGNAL[0] in m
        ],
    }


def gate_mode(
    mode: str,
    sizes: dict[str, Any],
    benchmarks: Path,
    policy: Path,
    work: Path,
    device: str,
    progress: Callable[[dict[str, Any]], None],
) -> dict:
    """(a) and (b) under one determinism setting, each in a store of its own (removed once summarized), and
    what they show. A leg that fails ends its run there; what was committed is compared all the same.
    `progress` gets what has run so far after every leg (the gate writes it down)."""
    folder = work / mode
    folder.mkdir()
    config = gate_config(sizes, mode, benchmarks, policy, folder / "a")
    config_file = folder / "config.json"
    config_file.write_text(config.model_dump_json())
    straight = open_store(folder / "a")
    uninterrupted = run_leg(config_file, straight, "a", folder / "a.json", None, device)
    a = summarized(straight, "a")
    shutil.rmtree(folder / "a")
    legs: list[dict[str, Any]] = []
    result = {
        "uninterrupted": {**uninterrupted, "handoff_s": a["handoff_s"], "signal": a["signal"]},
        "preempted": {"legs": legs},
    }
    progress(result)
    preempted = open_store(folder / "b")
    for index, (stop_at, expected) in enumerate((*STOPS, (None, None))):
        leg = run_leg(config_file, preempted, "b", folder / f"b{index}.json", stop_at, device)
        start = resume_point(preempted, "b", config)
        resumes_at = None if start.done else [start.update, str(start.stage)]
        planned = resumes_at == list(expected) if expected else start.done
        legs.append({**leg, "stop_at": stop_at, "resumes_at": resumes_at, "stopped_as_planned": planned})
        progress(result)
        if leg["outcome"] == "failed":
            break
    b = summarized(preempted, "b")
    shutil.rmtree(folder / "b")
    policies = [
        a["committed"].get(f"{u}/checkpoint", {}).get("model.safetensors") for u in (0, config.num_updates)
    ]
    result["preempted"].update(replays=b["replays"], handoff_s=b["handoff_s"])
    result["files"] = compare(a["committed"], b["committed"])
    result["weights_moved"] = None not in policies and policies[0] != policies[1]
    return result


def finished(results: dict[str, dict]) -> dict[str, dict]:
    """The modes whose legs have all run (or ended at a failed one) and whose runs were compared."""
    return {mode: result for mode, result in results.items() if "files" in result}


def checks(results: dict[str, dict]) -> dict[str, bool]:
    """The gate's verdicts on finished modes (`finished`), named as they read."""
    verdicts = {}
    for mode, result in results.items():
        legs, files = result["preempted"]["legs"], result["files"]
        verdicts[f"{mode}: (a) completes"] = result["uninterrupted"]["outcome"] == "complete"
        planned = len(legs) == len(STOPS) + 1 and all(leg["stopped_as_planned"] for leg in legs)
        verdicts[f"{mode}: (b) stops where told and completes"] = planned
        verdicts[f"{mode}: (b) lost nothing (a) committed"] = not files["lost"]
        verdicts[f"{mode}: the updates moved the weights"] = result["weights_moved"]
    bitwise = results.get("bitwise")
    if bitwise is not None:
        verdicts["bitwise: every committed file of (b) equals (a)'s"] = not bitwise["files"]["differing"]
        replayed = bitwise["preempted"]["replays"]
        verdicts["bitwise: (b) replayed, and every replay matched"] = (
            replayed["checked"] > 0 and not replayed["diverged"]
        )
    return verdicts


def time_ratio(results: dict[str, dict]) -> float | None:
    """(a)'s wall time under `bitwise` over `fast` (same machine, same call); None unless both completed."""
    runs = [results.get(mode, {}).get("uninterrupted", {}) for mode in MODES]
    if any(run.get("outcome") != "complete" for run in runs):
        return None
    return round(runs[0]["seconds"] / runs[1]["seconds"], 3)


def write_record(out: Path, head: dict[str, Any], results: dict[str, dict], modes: list[str]) -> dict:
    """The gate's record as far as it got (`head`: the device, model, sizes, stops, machine and command),
    written to `out` whole or not at all (a temporary file renamed) after the fit, every leg and every mode,
    so that a call killed at its time limit still returns what ran. `checks` and the time ratio cover the
    finished modes; `complete` stays false until every mode asked for has finished, and `passed` until then
    and every check holds."""
    done = finished(results)
    verdicts = checks(done)
    complete = set(done) == set(modes)
    record = {
        **head,
        "complete": complete,
        "bitwise_over_fast": time_ratio(done),
        "checks": verdicts,
        "passed": complete and all(verdicts.values()),
        "modes": results,
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(out.name + ".partial")
    partial.write_text(json.dumps(record, indent=2) + "\n")
    partial.replace(out)
    return record


def main() -> None:
    args = parse_args()
    sizes = SIZES["small" if args.small else "full"]
    if args.stage_benchmarks:
        stage_benchmarks(args.stage_benchmarks, sizes["problems"])
        return
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("gpu_gate: CUDA is not available here; on the CPU run it with --device cpu --small")
    torch.set_num_threads(1)
    work = args.work or Path(tempfile.mkdtemp(prefix="gpu-gate-"))
    benchmarks = args.benchmarks or work / "benchmarks"
    if args.benchmarks is None:
        stage_benchmarks(benchmarks, sizes["problems"])
    shape = SMALL if args.small else {**R1_DISTILL_1_5B, "num_hidden_layers": args.layers}
    policy = work / "policy"
    device = torch.device(args.device)
    fit_loss = build_policy(gate_config(sizes, "bitwise", benchmarks, policy, work), shape, device)
    if device.type == "cuda":
        torch.cuda.empty_cache()  # the legs' GPU, not this process's
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "none"
    head = {
        "device": gpu if device.type == "cuda" else "cpu",
        "model": {"shape": shape, "dtype": sizes["dtype"], "answer_fit_loss": round(fit_loss, 4)},
        "sizes": sizes,
        "stops": [stop for stop, _ in STOPS],
        "machine": f"{machine()}, GPU {gpu}",
        "command": "python " + " ".join(sys.argv),
    }
    results: dict[str, dict] = {}

    def progress(mode: str, result: dict[str, Any]) -> None:
        results[mode] = result
        write_record(args.out, head, results, args.modes)

    record = write_record(args.out, head, results, args.modes)
    for mode in args.modes:
        step = functools.partial(progress, mode)
        results[mode] = gate_mode(mode, sizes, benchmarks, policy, work, args.device, step)
        record = write_record(args.out, head, results, args.modes)
    verdicts = record["checks"]
    for mode, result in results.items():
        for leg in [result["uninterrupted"], *result["preempted"]["legs"]]:
            if leg["outcome"] == "failed":
                print(f"{mode}: a leg failed (exit {leg['returncode']}):\n{leg['error']}")
    for name, verdict in verdicts.items():
        print(f"{'PASS' if verdict else 'FAIL'}  {name}")
    print(f"bitwise / fast wall time of (a): {record['bitwise_over_fast']}; written to {args.out}")
    if not record["passed"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
