"""The evaluate stage's shards (stages/evaluate.py: the recipe's engine calls cut to EVAL_SHARD_TOKENS): a
unit of commit, not of maths. Whatever their size the evaluation is the same bits, and one stopped mid-suite
keeps the shards it committed and resumes making only the others, ending where an uninterrupted one ends."""

from __future__ import annotations

import os
import signal
import threading

import pytest

from probepo.config import RunConfig
from probepo.presets import with_overrides
from probepo.run.faults import PAUSE_ENV, PAUSE_MARK_ENV
from probepo.run.pipeline import train
from probepo.run.preemption import Preempted
from probepo.stages import evaluate
from probepo.store import ArtifactStore
from tests.pipeline.conftest import tiny_config
from tests.pipeline.test_driver import _wait_for_mark

SHARDS = "evaluate.heldout.shard-"


def _evaluation_only(**sampling: object) -> RunConfig:
    """Checkpoint 0 and its evaluation alone (no update): 16 held-out problems in chunks of 4 (batch rows 4,
    one sample each), `sampling` on top."""
    overrides = {
        "sampling.batch_rows": 4,
        "eval.greedy": False,
        **{f"sampling.{k}": v for k, v in sampling.items()},
    }
    return with_overrides(tiny_config("grpo", num_updates=0), **overrides)


def _chunk_tokens(config: RunConfig) -> int:
    """The most tokens one chunk's rows decode: 4 problems of one sample, max_tokens each."""
    return 4 * config.sampling.max_tokens


def _evaluation(store: ArtifactStore, run_id: str) -> tuple[bytes, dict]:
    """The evaluate stage's table and its numbers (its wall time aside)."""
    summary = dict(store.marker(run_id, 0, "evaluate")["summary"])
    summary.pop("wall_s")
    return store.read_stage(run_id, 0, "evaluate")["eval.parquet"], summary


def _shards(store: ArtifactStore, run_id: str) -> list[str]:
    return sorted(name for name in store.committed_stages(run_id, 0) if name.startswith(SHARDS))


def test_an_evaluation_is_the_same_bits_whatever_its_shard_size(warm_store, monkeypatch):
    """The recipe's one engine call (sampling.shards 1) of 4 chunks, cut to 1, 2 and 4 chunks a shard."""
    config = _evaluation_only(shards=1)
    made = {}
    for chunks in (4, 2, 1):
        monkeypatch.setattr(evaluate, "EVAL_SHARD_TOKENS", chunks * _chunk_tokens(config))
        run_id = f"eval-shards-{chunks}"
        train(config, run_id, store=warm_store)
        made[chunks] = _evaluation(warm_store, run_id)
        assert len(_shards(warm_store, run_id)) == 4 // chunks
    assert made[2] == made[4] and made[1] == made[4]
    assert made[4][1]["problems"] == 16


def test_an_evaluation_stopped_mid_suite_resumes_making_only_its_missing_shards(
    warm_store, monkeypatch, tmp_path
):
    """Stopped (SIGUSR2, as SLURM sends at a preemption or the time limit) once its second shard of four is
    committed, the stage raises Preempted at the next one; the next attempt makes the last two alone, and
    the evaluation equals an uninterrupted one's whose shards were the recipe's whole call."""
    config = _evaluation_only(shards=1)
    train(config, "eval-whole", store=warm_store)  # its call whole: one shard
    assert _shards(warm_store, "eval-whole") == [f"{SHARDS}0000"]
    monkeypatch.setattr(evaluate, "EVAL_SHARD_TOKENS", _chunk_tokens(config))  # a shard a chunk: four
    mark = tmp_path / "paused"
    monkeypatch.setenv(PAUSE_ENV, f"0:{SHARDS}0001:after-commit")
    monkeypatch.setenv(PAUSE_MARK_ENV, str(mark))
    sender = threading.Thread(target=lambda: os.kill(_wait_for_mark(mark), signal.SIGUSR2), daemon=True)
    sender.start()
    with pytest.raises(Preempted, match=r"during evaluate\.heldout of update 0: 2 of 4 shards committed"):
        train(config, "eval-stopped", store=warm_store)
    sender.join()
    monkeypatch.delenv(PAUSE_ENV)
    kept = {name: warm_store.marker("eval-stopped", 0, name) for name in _shards(warm_store, "eval-stopped")}
    assert sorted(kept) == [f"{SHARDS}0000", f"{SHARDS}0001"]
    assert not warm_store.committed("eval-stopped", 0, "evaluate")

    train(config, "eval-stopped", store=warm_store)
    made = sorted(set(_shards(warm_store, "eval-stopped")) - set(kept))
    assert made == [f"{SHARDS}0002", f"{SHARDS}0003"]
    assert {name: warm_store.marker("eval-stopped", 0, name) for name in kept} == kept  # not made again
    attempts = warm_store.attempts("eval-stopped", 0, "evaluate")
    assert [a["outcome"] for a in attempts] == ["preempted", "committed"]
    assert (attempts[-1]["resumed_shards"], attempts[-1]["shards_run"]) == (2, 2)
    assert _evaluation(warm_store, "eval-stopped") == _evaluation(warm_store, "eval-whole")
