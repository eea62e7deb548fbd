"""`probepo check`'s model and data checks on the tiny Qwen recipe: a missing tokenizer file, a missing
weight shard and a missing benchmark file each refused with one line naming the file, without loading a
model; a context too short for the longest prompt and its response refused naming the field."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from probepo.data.benchmarks import AVG6_BENCHMARKS
from slurm.check import check_launch
from tests.hf.tiny_qwen import TinyQwen, qwen_config

pytestmark = pytest.mark.integration


def _copy(tiny_qwen: TinyQwen, tmp_path: Path) -> Path:
    folder = tmp_path / "model"
    shutil.copytree(tiny_qwen.folder, folder)
    return folder


def _failures(folder: Path, tmp_path: Path, **fields: object) -> list[str]:
    recipe = qwen_config(folder, store=str(tmp_path / "store"), **fields).model_dump(mode="json")
    return check_launch(recipe, "inline", None).findings.failures


def test_a_missing_tokenizer_file(tiny_qwen, tmp_path):
    folder = _copy(tiny_qwen, tmp_path)
    (folder / "tokenizer.json").unlink()
    (failure,) = _failures(folder, tmp_path)
    assert failure == (
        f"model.pretrained = {folder}: {folder} lacks a tokenizer (tokenizer.json, tokenizer.model, or"
        " vocab.json with merges.txt): copy the model's complete folder (a download interrupted midway"
        " leaves shards out)"
    )


def test_a_missing_weight_shard(tiny_qwen, tmp_path):
    folder = _copy(tiny_qwen, tmp_path)
    first, second = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
    (folder / "model.safetensors").rename(folder / first)
    index = {"metadata": {}, "weight_map": {"model.embed_tokens.weight": first, "lm_head.weight": second}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    (failure,) = _failures(folder, tmp_path)
    assert failure.startswith(f"model.pretrained = {folder}: {folder} lacks {second}: copy the model's")


def test_a_missing_benchmark_file(tiny_qwen, tmp_path):
    empty = tmp_path / "benchmarks"
    empty.mkdir()
    task = {"kind": "math", "source": "benchmarks", "eval_set": "math500", "benchmarks_root": str(empty)}
    failures = _failures(tiny_qwen.folder, tmp_path, task=task)
    # the eval split, the training source, and the evaluation sets its contamination check reads
    named = [failure.split(":")[0] for failure in failures]
    assert named == [f"benchmark {name}" for name in ("math500", "math_test", *AVG6_BENCHMARKS[1:])]
    assert failures[0].startswith(f"benchmark math500: {empty / 'math500' / 'test.jsonl'} not found: set")
    assert all("\n" not in failure for failure in failures)


def test_a_context_too_short(tiny_qwen, tmp_path):
    folder = _copy(tiny_qwen, tmp_path)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 16}))
    (failure,) = _failures(folder, tmp_path)
    assert failure.startswith("sampling.max_tokens = 12: the longest prompt (")
    assert failure.endswith("past the model's context of 16: lower sampling.max_tokens or algo.rescue_tokens")


def test_the_tiny_qwen_recipe_passes_inline(tiny_qwen, tmp_path):
    recipe = qwen_config(tiny_qwen.folder, store=str(tmp_path / "store")).model_dump(mode="json")
    found = check_launch(recipe, "inline", None).findings
    assert (found.failures, found.warnings) == ([], [])
    assert [line.split(":")[0] for line in found.passed] == [
        "recipe",
        "model",
        "data",
        "context",
        "store",
        "spend",
    ]


def test_check_says_what_an_update_moves_and_warns_of_a_per_stage_executor(tiny_qwen, tmp_path):
    recipe = qwen_config(tiny_qwen.folder, store=str(tmp_path / "store")).model_dump(mode="json")
    inline = check_launch(recipe, "inline", None).findings
    (line,) = [p for p in inline.passed if p.startswith("spend: ")]
    assert (
        "s of state movement blocking each update under inline (1 trainer rank(s), amortised over"
        " checkpoint_every 1: " in line
    )
    assert " s beside the updates (commit " in line and "each checkpoint's upload" in line
    assert "in a checkpoint update" in line and "uploaded" in line and "at stated bandwidths" in line
    per_stage = check_launch(recipe, "local", None).findings
    (warning,) = [w for w in per_stage.warnings if w.startswith("spend: ")]
    assert "the local executor moves" in warning and warning.endswith(
        "`--executor resident` keeps the engines resident and checkpoints every checkpoint_every updates"
    )


def test_check_refuses_checkpoint_every_on_a_per_stage_executor_before_any_job(tiny_qwen, tmp_path):
    recipe = qwen_config(tiny_qwen.folder, store=str(tmp_path / "store"), checkpoint_every=2)
    found = check_launch(recipe.model_dump(mode="json"), "local", None).findings
    assert found.failures == [
        "executor local: checkpoint_every = 2 needs engines that stay resident from update to update, and"
        " this executor starts a job per stage (each would replay every update since the last full"
        " checkpoint): use `--executor resident` (the driver as one SLURM job) or `inline`, or set"
        " checkpoint_every = 1"
    ]
