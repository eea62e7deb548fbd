"""Which kind of CPU trained each run of the science bench. A run's bits are its CPU kind's (torch's kernels
round per CPU: docs/PIPELINE.md, "Bits across machines"), and the bench's runs span sessions on machines
drawn by chance, so every run is stamped in the store by the process that begins it; a run is finished on
the kind that began it, a testbed's runs are one kind's (its arms pair seed by seed), or the bench refuses."""

from __future__ import annotations

import json
from collections.abc import Iterable

from benchlib import cpu_kind, machine

from probepo.store import ArtifactStore

STAMPS = "science/cpu/"
"""Store prefix of the stamps: one JSON object a run, {"cpu": cpu_kind(), "machine": machine()}."""


def stamp(store: ArtifactStore, run: str) -> None:
    """Record that this machine trains `run`, or refuse (RuntimeError) where another kind of CPU began it."""
    mine = {"cpu": cpu_kind(), "machine": machine()}
    if store.objects.put_if_absent(STAMPS + run, json.dumps(mine).encode()) is not None:
        return
    began = json.loads(store.objects.get_bytes(STAMPS + run))
    if began["cpu"] != mine["cpu"]:
        raise RuntimeError(
            f"run {run} was begun on {began['cpu']} and this is {mine['cpu']}: its bits would be two kinds"
            f" of CPU's. Finish it on that kind, or delete it (runs/{run}/ and {STAMPS}{run} in {store.url})"
            " to train it whole here"
        )


def stamps(store: ArtifactStore, runs: Iterable[str]) -> dict[str, dict[str, str]]:
    """The stamps of those of `runs` that have one (runs trained before the stamps have none)."""
    found = {run: store.objects.get_versioned(STAMPS + run) for run in runs}
    return {run: json.loads(got.data) for run, got in found.items() if got is not None}


def one_kind(what: str, stamped: dict[str, dict[str, str]], expected: str | None = None) -> str | None:
    """The machine that trained the stamped runs of `what` (a testbed or an arm), None if none is stamped;
    SystemExit if they are two kinds of CPU's, or another kind than `expected`."""
    kinds = {s["cpu"] for s in stamped.values()} | ({expected} if expected and stamped else set())
    if len(kinds) > 1:
        by_kind = {kind: sorted(run for run, s in stamped.items() if s["cpu"] == kind) for kind in kinds}
        raise SystemExit(
            f"{what}: its runs are of {len(kinds)} kinds of CPU ({by_kind}); a testbed's runs pair seed by"
            " seed, so they are one kind's: finish it on the kind that began it, or rerun it whole in a"
            " fresh store (--store)"
        )
    return next(iter(stamped.values()))["machine"] if stamped else None


def trained_on(what: str, stamped: dict[str, dict[str, str]]) -> str:
    """The machine that trained `what`'s runs, by their stamps (SystemExit if they are of two kinds of CPU);
    this machine for runs trained before the stamps, which the analysis ran beside."""
    return one_kind(what, stamped) or machine()
