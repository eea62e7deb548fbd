"""`probepo stage`, its offline half: a Hugging Face cache built here in the hub's cache layout (the tiny Qwen
as a model repository, the shared benchmark files as dataset repositories, one of them as Parquet) is read
with HF_HUB_OFFLINE=1 and staged; the staged folder passes `probepo check` with an empty cache and a run
trains from it. (The download itself needs the hub, which this machine cannot reach.)"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as parquet
import pytest
import yaml

from probepo.data.benchmarks import BENCHMARKS, SHIPPED_BENCHMARKS, benchmarks_root
from tests.hf.tiny_qwen import TinyQwen, qwen_config

SHARED = benchmarks_root()
pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        not all((SHARED / BENCHMARKS[n].folder / BENCHMARKS[n].file).is_file() for n in SHIPPED_BENCHMARKS),
        reason=f"the shared benchmark files are not at {SHARED} (set PROBEPO_BENCHMARKS to where they are)",
    ),
]

ROOT = Path(__file__).resolve().parents[2]
MODEL_ID = "probepo-tests/tiny-qwen"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def _snapshot(cache: Path, kind: str, repo_id: str) -> Path:
    """A repository in the hub cache layout: refs/main naming a commit, its snapshot folder."""
    repo = cache / f"{kind}s--{repo_id.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(COMMIT)
    snapshot = repo / "snapshots" / COMMIT
    snapshot.mkdir(parents=True)
    return snapshot


def _hub_cache(cache: Path, tiny_qwen: TinyQwen) -> None:
    model = _snapshot(cache, "model", MODEL_ID)
    shutil.copytree(tiny_qwen.folder, model, dirs_exist_ok=True)
    config = json.loads((model / "config.json").read_text())  # MATH prompts pass its 512 positions; RoPE
    (model / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 4096}))  # takes more
    for name in SHIPPED_BENCHMARKS:
        spec = BENCHMARKS[name]
        if spec.hub is None:
            continue
        snapshot = _snapshot(cache, "dataset", spec.hub.dataset)
        folder = snapshot / spec.hub.config if spec.hub.config else snapshot
        folder.mkdir(parents=True, exist_ok=True)
        split = spec.hub.split or "train"
        rows = (SHARED / spec.folder / spec.file).read_text()
        if name == "olympiadbench":  # published as Parquet
            table = pa.Table.from_pylist([json.loads(line) for line in rows.splitlines() if line.strip()])
            parquet.write_table(table, folder / f"{split}-00000-of-00001.parquet")
        else:
            (folder / f"{split}.jsonl").write_text(rows)


def _probepo(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "probepo.cli", *args],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
        env={**os.environ, **env},
    )


def test_a_recipe_staged_from_the_offline_cache_is_checked_and_trains(tiny_qwen, tmp_path):
    cache, staged = tmp_path / "hub", tmp_path / "staged"
    _hub_cache(cache, tiny_qwen)
    local = tmp_path / "local-benchmarks"  # the sets without a hub id, as a user copies them
    for name in ("college_math", "math_test"):
        spec = BENCHMARKS[name]
        (local / spec.folder).mkdir(parents=True)
        shutil.copy2(SHARED / spec.folder / spec.file, local / spec.folder)
    task = {"kind": "math", "source": "benchmarks", "eval_set": "math500", "benchmarks_root": str(local)}
    config = qwen_config(Path("unused"), task=task, store=str(tmp_path / "store"), num_updates=1)
    recipe = config.model_dump(mode="json")
    recipe["model"]["pretrained"] = MODEL_ID
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe))

    offline = {"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(cache)}
    done = _probepo("stage", str(tmp_path / "recipe.yaml"), "--to", str(staged), env=offline)
    assert done.returncode == 0, done.stderr
    assert f"staged model: hub {MODEL_ID} -> {staged / 'models' / MODEL_ID.replace('/', '--')}" in done.stdout
    parquet_line = "staged benchmark olympiadbench: hub Hothan/OlympiadBench (config OE_TO_maths_en_COMP)"
    assert f"{parquet_line}, 675 rows" in done.stdout
    manifest = json.loads((staged / "manifest.json").read_text())
    listed = {entry["path"]: entry for entry in manifest["files"]}
    assert {"benchmarks/math500/test.jsonl", "models/probepo-tests--tiny-qwen/config.json"} <= set(listed)
    assert all(len(entry["sha256"]) == 64 and entry["bytes"] > 0 for entry in listed.values())

    empty = {"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path / "no-cache")}  # nothing but the folder
    checked = _probepo("check", str(staged / "recipe.yaml"), "--executor", "inline", env=empty)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "ok   data: benchmark math500: 500 rows" in checked.stdout

    inline = ("--quiet", "--executor", "inline")
    trained = _probepo("train", str(staged / "recipe.yaml"), "--run-id", "staged", *inline, env=empty)
    assert trained.returncode == 0, trained.stderr[-2000:]
    assert (tmp_path / "store" / "runs" / "staged").is_dir()
