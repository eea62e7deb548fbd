"""Evidence: GRPO vs ProbePO vs VinePPO-dense, SPO-tree and TreePO on the CPU testbeds, over seeds.

    .venv/bin/python bench/science.py                 # every arm of PLAN (resumable: rerun to continue)
    .venv/bin/python bench/science.py --analyse-only  # tables, plots and results from the store as it is
    .venv/bin/python bench/science.py --testbeds pointer --arms grpo:1 treepo   # some arms, some seeds

The plan is in bench/science_plan.py, the analysis in science_report.py, the outputs in science_output.py.

Each (testbed, arm, seed) is one `pipeline.train` run in its own process (one torch thread; `--jobs` at
once) in one store (`--store`, default out/science/store). Runs are named by their recipe, so a rerun
skips finished runs and resumes interrupted ones. All seeds of a testbed start from one shared warm-up
checkpoint and are evaluated on the same 1,024 held-out prompts at temperature 1 and greedily.

The committed results are the bench's memory: bench/results/science.json holds every run's whole curve,
and an arm whose runs this store lacks is carried from it (marked * in the tables). Any seed of such an
arm rerun in the store must give the committed curve exactly (accuracies and sampled tokens at every
evaluation; wall time is the machine's, its ratio is recorded), or the analysis stops: then the engine's
results changed and the arm must be rerun whole. Once an arm of a testbed has been rerun and changed (on
another machine torch's kernels may round differently, and a different warm-up checkpoint changes every
run after it), that testbed's committed arms are withheld, not carried: they stay in the results file,
noted in the tables, out of every comparison, until rerun. `--fresh` analyses the store alone.

Pairing: seed s of every arm samples the same prompt batches and starts from the same checkpoint, so
arm differences are paired by seed (paired-t interval, and the paired bootstrap beside it).

Equal sampled tokens: the GRPO arm runs GRPO_HORIZON × the updates. Its first N updates are exactly a
run of N updates (prompt batches and stage seeds derive from (seed, update), nothing depends on the
horizon), so it gives the equal-updates comparison at update N, and its accuracy where its cumulative
sampled tokens equal another arm's at update N gives that arm's equal-tokens one (linear between
evaluations).

This plan runs on the engine after the audit's fixes (900f164: the RL prompts no longer replay the
warm-up's batches, the warm-up no longer depends on the run that made it). The tables measured before
them, exploratory arms included, are kept as they were in docs/science/prefix-f30d05b.md and
bench/results/science-prefix-f30d05b.json.

STATED IN ADVANCE, before any of these runs (issue 10, not to be changed): the primary comparison is
ProbePO with its defaults (configs/cpu-demo.yaml after the engine fixes) minus GRPO, on modchain, 80
updates, temperature-1 accuracy after update 80 on the fixed 1,024 held-out prompts, over the 30 fresh
paired seeds 10-39 (`modchain-replication`), reported with the paired-t 95 % interval (primary) and the
bootstrap beside it; the GRPO arm of the replication runs 80 updates. With the measured SD of paired
differences (2.2 points) this has about 80 % power for +1.2. It is reported whatever it says.

Also re-measured on the fixed engine, 10 seeds (0-9) each, as the confirmatory comparisons of the earlier
plan: ProbePO − GRPO at update 80 on `modchain` and on `pointer`, with GRPO run to 4× the updates for the
equal-token comparison; VinePPO-dense (5 seeds) and GRPO with 4× the responses per prompt (modchain, 5
seeds), which docs/RESULTS.md quotes.

Added after those runs (issue 16): SPO-tree and TreePO at their presets' trees, 10 seeds (0-9) each on
`modchain` and `pointer`, paired with GRPO's and ProbePO's seeds, compared with GRPO at equal updates and
at equal sampled tokens and with ProbePO at equal updates. Their tree sizes were fixed in the presets
(ede201a: a tree samples about GRPO's tokens per prompt) before any of these runs, and not tuned on them;
they are reported whatever they say.

Added in issue 27, before its runs: RLOO, 10 seeds (0-9) each on `modchain` and `pointer`, paired with GRPO's
and ProbePO's seeds, rerun beside them on the chunk-seeded engine (science_plan.ENGINE; every arm is labelled
with the engine that measured it, and the arms of the earlier engine are withheld until rerun); reported
whatever it says.

Added in issue 48, before its runs: every arm of PLAN rerun on the chunk-seeded engine, each testbed's arms
in one run of this bench on one kind of CPU (each arm records the machine that measured it), so that all
six methods pair again: GRPO (4× the updates), ProbePO, RLOO, VinePPO-dense, SPO-tree and TreePO, 10
paired seeds (0-9) each on `modchain` and `pointer`, GRPO with G = 32 on `modchain`, and the 30-seed
replication (seeds 10-39, its statement above unchanged). VinePPO-dense and G = 32 had 5 seeds and get 10
now (seeds 0-9, the same arms otherwise). Settings as before: nothing tuned toward any result; the
comparisons are those stated above, each reported whatever it says.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from multiprocessing import get_context
from pathlib import Path

from benchlib import cpu_kind
from science_cpu import one_kind, stamp, stamps
from science_output import markdown, plot, write_outputs
from science_plan import PLAN, ROOT, Testbed, arm_config, run_id
from science_report import analyse, collect, committed_arms

from probepo.config import RunConfig
from probepo.stages.warmup import STAGE as WARMUP_STAGE
from probepo.stages.warmup import warmup_run_id
from probepo.store import open_store


def _log_to(log: str) -> None:
    """Send this worker process's output (its own and its libraries') to `log`."""
    with open(log, "a") as out:
        os.dup2(out.fileno(), 1)
        os.dup2(out.fileno(), 2)


def _train(config_json: str, run: str, log: str) -> str:
    """One run in a worker process, its output in `log`; returns the run id."""
    _log_to(log)
    from probepo.run.pipeline import train

    config = RunConfig.model_validate_json(config_json)
    stamp(open_store(config.store), run)
    train(config, run)
    return run


def _warmup(config_json: str, log: str) -> str:
    """A testbed's warm-up in a worker process; returns the warm-up run's id."""
    _log_to(log)
    from probepo.run.pipeline import ensure_warmup

    config = RunConfig.model_validate_json(config_json)
    store, warmup = open_store(config.store), warmup_run_id(config)
    if not store.committed(warmup, 0, WARMUP_STAGE):  # a finished one is only read, on any kind of CPU
        stamp(store, warmup)
    return ensure_warmup(config, store)


def execute(
    plan: Sequence[Testbed], store_url: str, jobs: int, logs: Path, arms: dict[str, int | None] | None = None
) -> None:
    """Run every missing (testbed, arm, seed), `jobs` processes at a time: warm-ups first, then the runs,
    longest first. `arms` limits the runs to those arms (name → at most that many seeds, None: all). A
    failed run is reported with its log and the others go on."""
    from probepo.run.pipeline import resume_point

    store = open_store(store_url)
    logs.mkdir(parents=True, exist_ok=True)
    todo = []
    for testbed in plan:
        planned = []
        for arm in testbed.arms:
            chosen = arm.seed_range if arms is None else arm.seed_range[: arms.get(arm.name, 0)]
            for seed in arm.seed_range:
                config = arm_config(testbed, arm, seed, store_url)
                planned.append(run := run_id(testbed, arm, config))
                if seed in chosen and not resume_point(store, run, config).done:
                    todo.append((config, run, testbed.name, arm.cost))
        if any(item[2] == testbed.name for item in todo):
            one_kind(f"testbed {testbed.name}", stamps(store, planned), cpu_kind())  # before any run of it
    order = {t.name: i for i, t in enumerate(plan)}  # testbed by testbed, the longest runs first in each
    todo.sort(key=lambda item: (order[item[2]], -item[3]))
    print(f"{len(todo)} runs to do in {store_url} ({jobs} at a time); logs in {logs}", flush=True)
    context = get_context("spawn")
    started = time.perf_counter()
    with ProcessPoolExecutor(jobs, mp_context=context, max_tasks_per_child=1) as pool:
        # One process per warm-up (testbeds may share one), none for a testbed with nothing left to do.
        needed: dict[str, tuple[RunConfig, list[str]]] = {}
        for t in plan:
            if any(item[2] == t.name for item in todo):
                config = arm_config(t, t.arms[0], t.arms[0].first_seed, store_url)
                needed.setdefault(warmup_run_id(config), (config, []))[1].append(t.name)
        warmups = {
            pool.submit(_warmup, config.model_dump_json(), str(logs / f"{key}.log")): names
            for key, (config, names) in needed.items()
        }
        failed = set()
        for future in wait(warmups).done:
            names = ", ".join(warmups[future])
            if future.exception() is None:
                print(f"warm-up of {names}: {future.result()} ready", flush=True)
            else:  # the other testbeds go on
                failed.update(warmups[future])
                print(f"warm-up of {names} FAILED, its runs skipped: {future.exception()}", flush=True)
        todo = [item for item in todo if item[2] not in failed]
        pending = {
            pool.submit(_train, c.model_dump_json(), r, str(logs / f"{r}.log")): r for c, r, _, _ in todo
        }
        finished = 0
        while pending:
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for future in done:
                run = pending.pop(future)
                finished += 1
                error = future.exception()
                status = f"FAILED ({error}; see {logs / f'{run}.log'})" if error else "done"
                elapsed = time.perf_counter() - started
                print(f"[{elapsed:7.0f}s] {finished}/{len(todo)} {run}: {status}", flush=True)


def _arm_limit(text: str) -> tuple[str, int | None]:
    """`grpo:1` → ("grpo", 1); `treepo` → ("treepo", None)."""
    name, _, seeds = text.partition(":")
    known = {arm.name for testbed in PLAN for arm in testbed.arms}
    if name not in known or (seeds and not seeds.isdigit()):
        raise SystemExit(f"--arms {text!r}: expected ARM or ARM:SEEDS with ARM one of {sorted(known)}")
    return name, int(seeds) if seeds else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", default=str(ROOT / "out" / "science" / "store"))
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="runs at once (one core each)")
    parser.add_argument("--testbeds", nargs="*", help="only these testbeds (default: all of PLAN)")
    parser.add_argument(
        "--arms",
        nargs="*",
        metavar="ARM[:SEEDS]",
        help="only these arms, each with at most SEEDS of its seeds (default: every arm, every seed)",
    )
    parser.add_argument("--analyse-only", action="store_true", help="no training: analyse what is stored")
    parser.add_argument(
        "--fresh", action="store_true", help="analyse the store alone (carry nothing from science.json)"
    )
    args = parser.parse_args()
    arms = None if args.arms is None else dict(_arm_limit(text) for text in args.arms)
    plan = [t for t in PLAN if not args.testbeds or t.name in args.testbeds]
    os.environ.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")  # inherited by the spawned workers
    started = time.perf_counter()
    if not args.analyse_only:
        execute(plan, args.store, args.jobs, ROOT / "out" / "science" / "logs", arms)
    wall = None if args.analyse_only else round(time.perf_counter() - started, 1)
    collected, withheld = collect(PLAN, open_store(args.store), {} if args.fresh else committed_arms())
    results = analyse(PLAN, collected, withheld)
    plot(PLAN, collected, ROOT / "docs" / "science")
    write_outputs(results, wall, "python " + " ".join(sys.argv[0:1] + sys.argv[1:]))
    print(markdown(results))


if __name__ == "__main__":
    main()
