"""`probepo stage`: everything a recipe reads, put in one folder for compute nodes without internet, on a
machine that has the hub (or its cache: HF_HUB_OFFLINE=1 reads only the local Hugging Face cache).

The folder's layout is the one `probepo check` and the jobs read:

    DIR/models/<org>--<name>/        the policy (config, tokenizer, every weight shard; .bin as safetensors)
    DIR/benchmarks/<set>/<file>      each benchmark set as JSON Lines (docs/DATA.md)
    DIR/recipe.yaml                  the recipe, with model.pretrained and task.benchmarks_root pointing here
    DIR/manifest.json                every file with its size and sha256

A benchmark set comes from the local benchmarks root where it is there (the exact copies the project was
checked against), else from its hub dataset (its split's JSON Lines or Parquet files, rewritten as JSON
Lines and read back through the set's own reader, so a row the reader cannot use is named at once).
"""

from __future__ import annotations

import hashlib
import json
import pickle
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from probepo.checks.data import benchmark_names
from probepo.config import RunConfig

MANIFEST = "manifest.json"
RECIPE = "recipe.yaml"


def preset_name(path: Path) -> str:
    """A preset's deployment name: its file's stem, but a staged recipe's (`probepo stage` writes each as
    recipe.yaml in its own folder) its folder's name, so that several staged recipes deploy side by side."""
    return path.parent.name if path.name == RECIPE else path.stem


class StagingError(ValueError):
    """Something the recipe reads could not be staged: names it and what to do."""


@dataclass
class Staged:
    """What `stage` wrote, for the command's summary."""

    folder: Path
    recipe: Path
    files: list[dict[str, Any]] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)
    """One line per staged item: what it is and where it came from."""


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _snapshot(repo_id: str, repo_type: str | None = None) -> Path:
    """The repository's snapshot folder: downloaded, or (HF_HUB_OFFLINE=1) found in the local cache."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    try:
        return Path(str(snapshot_download(repo_id, repo_type=repo_type)))
    except (LocalEntryNotFoundError, HfHubHTTPError, OSError) as exc:
        kind = "dataset" if repo_type == "dataset" else "model"
        raise StagingError(
            f"{kind} {repo_id}: not on the hub from here and not in the local Hugging Face cache"
            f" ({str(exc).splitlines()[0]}): run `probepo stage` where the hub is reachable"
        ) from None


def stage_model(config: RunConfig, folder: Path, staged: Staged) -> str | None:
    """Copy the policy into `folder`/models (files, not the cache's links); returns the staged path. A
    checkpoint with PyTorch `.bin` weights and no safetensors is converted to safetensors instead of copied
    (probepo/engines/hf/convert.py: every rank then maps the weights instead of unpickling them)."""
    if config.model.kind != "hf":
        return None
    from probepo.engines.hf.convert import BIN_INDEX_FILE, bin_shards
    from probepo.engines.hf.loading import resolve_source, weight_shards

    source = resolve_source(config.model.pretrained)
    local = Path(source)
    if local.exists():
        path, origin, name = local, str(local), local.name
    else:
        path, origin, name = _snapshot(source), f"hub {source}", source.replace("/", "--")
    target = folder / "models" / name
    if path.is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)
        staged.sources.append(f"model: {origin} -> {target}")
        return str(target)
    try:
        pickled = [] if weight_shards(path) else bin_shards(path)
    except (json.JSONDecodeError, KeyError) as exc:
        raise StagingError(f"model {origin}: a weights index is unreadable ({exc}): copy it again") from None
    skip = [*pickled, BIN_INDEX_FILE] if pickled else []  # their safetensors replace them
    shutil.copytree(path, target, dirs_exist_ok=True, ignore=shutil.ignore_patterns(".cache", ".git*", *skip))
    converted = _convert(path, target, origin) if pickled else ""
    staged.sources.append(f"model: {origin} -> {target}{converted}")
    return str(target)


def _convert(path: Path, target: Path, origin: str) -> str:
    """Convert a `.bin`-only checkpoint at `path` to safetensors in `target`: the summary's words for it."""
    from probepo.engines.hf.convert import byte_size, convert_bin_checkpoint

    try:
        converted = convert_bin_checkpoint(path, target)
    except (OSError, ValueError, RuntimeError, pickle.UnpicklingError) as exc:
        raise StagingError(
            f"model {origin}: its PyTorch .bin weights do not convert to safetensors ({exc}): copy the"
            " complete checkpoint again"
        ) from None
    aliases = f"; tied, so stored once: {', '.join(converted.dropped)}"
    return (
        f", converted from PyTorch .bin to safetensors ({converted.shards} shard(s), {converted.tensors}"
        f" tensors, {byte_size(converted.bytes)}{aliases if converted.dropped else ''})"
    )


def _hub_rows(snapshot: Path, config: str | None, split: str | None) -> list[dict[str, Any]]:
    """The rows of a dataset snapshot's split: its JSON Lines or Parquet files, in name order."""
    base = snapshot / config if config and (snapshot / config).is_dir() else snapshot
    files = sorted(
        path
        for path in base.rglob("*")
        if path.suffix in (".jsonl", ".parquet") and (split is None or path.name.startswith(split))
    )
    rows: list[dict[str, Any]] = []
    for path in files:
        if path.suffix == ".jsonl":
            rows += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        else:
            import pyarrow.parquet as parquet

            rows += parquet.read_table(path).to_pylist()
    return rows


def stage_benchmark(name: str, root: Path, folder: Path, staged: Staged) -> None:
    """Stage one set from the local root, else from its hub dataset; checked by reading it back."""
    from probepo.data.benchmarks import BENCHMARKS, BenchmarkFormatError, load_benchmark

    spec = BENCHMARKS[name]
    target = folder / "benchmarks" / spec.folder / spec.file
    target.parent.mkdir(parents=True, exist_ok=True)
    local = root / spec.folder / spec.file
    if local.is_file():
        shutil.copy2(local, target)
        staged.sources.append(f"benchmark {name}: {local}")
    elif spec.hub is None:
        raise StagingError(
            f"benchmark {name}: not in {root} and without a hub id: copy {spec.folder}/{spec.file} there"
            f" ({spec.origin}), or set task.benchmarks_root to the folder that has it"
        )
    else:
        rows = _hub_rows(_snapshot(spec.hub.dataset, "dataset"), spec.hub.config, spec.hub.split)
        if not rows:
            raise StagingError(f"benchmark {name}: hub {spec.hub} has no JSON Lines or Parquet rows")
        target.write_text("".join(json.dumps(row, default=str) + "\n" for row in rows))
        staged.sources.append(f"benchmark {name}: hub {spec.hub}, {len(rows)} rows")
    try:
        load_benchmark(name, folder / "benchmarks")
    except BenchmarkFormatError as exc:
        raise StagingError(f"benchmark {name}: staged, but its rows do not read: {exc}") from None


def stage(config: RunConfig, folder: Path) -> Staged:
    """Stage what `config` reads into `folder` and write its recipe and manifest there."""
    import yaml

    from probepo.data.benchmarks import benchmarks_root

    folder = folder.resolve()
    folder.mkdir(parents=True, exist_ok=True)
    staged = Staged(folder, folder / RECIPE)
    data = config.model_dump(mode="json")
    pretrained = stage_model(config, folder, staged)
    if pretrained is not None:
        data["model"]["pretrained"] = pretrained
    names = benchmark_names(config)
    root = benchmarks_root(config.task.benchmarks_root)
    for name in names:
        stage_benchmark(name, root, folder, staged)
    if names:
        data["task"]["benchmarks_root"] = str(folder / "benchmarks")
    staged.recipe.write_text(yaml.safe_dump(data, sort_keys=False))
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST):
        staged.files.append(
            {"path": str(path.relative_to(folder)), "bytes": path.stat().st_size, "sha256": _sha256(path)}
        )
    manifest = {"recipe": RECIPE, "sources": staged.sources, "files": staged.files}
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return staged
