"""What a launch verifies before it submits anything, on the login node and in seconds: the recipe's rules
(the tokenizer-dependent ones included), the model's files, the data and the store. `probepo check`, the
train and resume flows and `probepo launch` all run these (the cluster's part is slurm/site.py's); a run
that fails one is refused with one line per problem naming the field or file and what to do, instead of a
job failing minutes or hours into an allocation.

Nothing here loads a model's weights or contacts the Hugging Face hub: compute nodes usually cannot reach
it, so a hub id counts only when its files are in the local cache.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from probepo.config import ModelConfig, RunConfig
from probepo.store import StoreError, open_store

TOKENIZER_FILES = (("tokenizer.json",), ("tokenizer.model",), ("vocab.json", "merges.txt"))
"""Any one of these sets is a tokenizer transformers can load (fast, SentencePiece, byte-level BPE)."""


class Refused(ValueError):
    """A run that would fail in its jobs: `problems`, one line each."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


@dataclass
class Findings:
    """What a check found: `failures` (each one line: what, and how to fix it), `warnings` (it may run, but
    read this) and `passed` (what was checked and found in order, with its figures)."""

    failures: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    passed: list[str] = field(default_factory=list)

    def extend(self, other: Findings) -> Findings:
        self.failures += other.failures
        self.warnings += other.warnings
        self.passed += other.passed
        return self

    def refuse(self) -> None:
        """Raise Refused naming every failure, if any."""
        if self.failures:
            raise Refused(self.failures)


def model_folder(model: ModelConfig, found: Findings) -> Path | None:
    """The local folder (or GGUF file) of a Hugging Face policy, or None with a failure recorded: a folder,
    a GGUF file, or a hub id whose snapshot is in the local hub cache."""
    from probepo.engines.hf.loading import resolve_source

    named = f"model.pretrained = {model.pretrained}"
    try:
        source = resolve_source(model.pretrained)
    except (FileNotFoundError, ValueError) as exc:
        found.failures.append(f"{named}: {exc}")
        return None
    path = Path(source)
    if path.suffix == ".gguf":
        if path.is_file():
            return path
        found.failures.append(f"{named}: no such GGUF file")
        return None
    if path.exists() or path.is_absolute() or source.startswith("."):
        if path.is_dir():
            return path
        found.failures.append(f"{named}: no such folder")
        return None
    try:  # huggingface_hub reads HF_HUB_CACHE when imported: a check runs in the launcher's environment
        from huggingface_hub import constants, try_to_load_from_cache
    except ImportError:
        found.failures.append(f"{named}: a hub id needs huggingface_hub (the `hf` extra: scripts/venv.sh hf)")
        return None
    cached = try_to_load_from_cache(source, "config.json")
    if isinstance(cached, str):
        return Path(cached).parent
    found.failures.append(
        f"{named}: not a local folder and not in the Hugging Face cache ({constants.HF_HUB_CACHE}), and"
        f" jobs do not download: fetch it where the hub is reachable (`hf download {source}`) into a cache"
        " the compute nodes share (HF_HUB_CACHE), or set model.pretrained to a local folder"
    )
    return None


def safetensors_header(path: Path) -> dict[str, Any]:
    """A safetensors file's tensors by name ({"dtype", "shape", "data_offsets"}), from its header alone."""
    with path.open("rb") as file:
        (length,) = struct.unpack("<Q", file.read(8))
        header = json.loads(file.read(length))
    header.pop("__metadata__", None)
    return header


def safetensors_parameters(path: Path) -> int:
    """The number of parameters in a safetensors file, from its header alone (no tensor is read)."""
    return sum(math.prod(entry["shape"]) for entry in safetensors_header(path).values())


def safetensors_tensor_bytes(path: Path) -> int:
    """The bytes of a safetensors file's tensors (the file less its header), from its header alone."""
    return sum(end - begin for begin, end in (e["data_offsets"] for e in safetensors_header(path).values()))


def tied_parameters(folder: Path | None) -> int:
    """The parameters of a model's LM head tied to its embedding (config.json's tie_word_embeddings), which a
    state dict lists twice; 0 when untied or unknown."""
    config = _model_config(folder)
    if not config.get("tie_word_embeddings"):
        return 0
    return int(config.get("vocab_size", 0)) * int(config.get("hidden_size", 0))


@dataclass
class ModelFiles:
    """What the model check found of a Hugging Face policy."""

    folder: Path | None = None
    """Its folder (or GGUF file); None when not found."""
    parameters: int | None = None
    """Its parameter count from the weights' headers; None when unknown (GGUF, or not found)."""


def model_files(model: ModelConfig) -> tuple[Findings, ModelFiles]:
    """A Hugging Face policy's config, tokenizer and every weight shard are present, their headers
    readable."""
    found = Findings()
    if model.kind != "hf":
        return found, ModelFiles()
    folder = model_folder(model, found)
    if folder is None:
        return found, ModelFiles()
    from probepo.engines.hf.convert import BIN_FILE, BIN_INDEX_FILE, bin_shards, byte_size
    from probepo.engines.hf.loading import WEIGHTS_FILE, WEIGHTS_INDEX_FILE, weight_shards

    named = f"model.pretrained = {model.pretrained}"
    if folder.suffix == ".gguf":
        found.passed.append(f"model: {folder} (GGUF: weights and tokenizer in one file)")
        return found, ModelFiles(folder)
    missing = [] if (folder / "config.json").is_file() else ["config.json"]
    if not any(all((folder / name).is_file() for name in names) for names in TOKENIZER_FILES):
        missing.append("a tokenizer (tokenizer.json, tokenizer.model, or vocab.json with merges.txt)")
    index = WEIGHTS_INDEX_FILE
    try:
        shards = weight_shards(folder)  # the files the job loads, shard by shard
        if not shards:
            index, shards = BIN_INDEX_FILE, bin_shards(folder)
    except (json.JSONDecodeError, KeyError) as exc:
        found.failures.append(f"{named}: {folder / index} is not a weights index ({exc})")
        return found, ModelFiles()
    absent = [shard for shard in shards if not (folder / shard).is_file()]
    held = ""  # what the folder has of its weights, when they are what it lacks
    if absent:
        held = f"; it has {len(shards) - len(absent)} of the {len(shards)} shards {index} names"
    elif not shards:
        missing.append(
            f"weights ({WEIGHTS_FILE}, or {WEIGHTS_INDEX_FILE} and its shards; or PyTorch's {BIN_FILE}, or"
            f" {BIN_INDEX_FILE} and its shards)"
        )
        files = sorted(path.name for path in folder.iterdir())
        held = f"; it holds {', '.join(files[:8]) or 'no file'}{', …' if len(files) > 8 else ''}"
    if missing or absent:
        found.failures.append(
            f"{named}: {folder} lacks {', '.join(missing + absent)}: copy the model's complete folder (a"
            f" download interrupted midway leaves shards out{held})"
        )
        return found, ModelFiles()
    if index == BIN_INDEX_FILE:  # jobs read safetensors only, memory-mapped: staging converts these once
        size = byte_size(sum((folder / shard).stat().st_size for shard in shards))
        found.failures.append(
            f"{named}: {folder} holds PyTorch .bin weights only ({len(shards)} shard"
            f"{'s' if len(shards) > 1 else ''}, {size}), and jobs load safetensors only: run `probepo stage`"
            " on the recipe, which converts them once to safetensors that every rank loads memory-mapped,"
            " and launch the staged recipe.yaml"
        )
        return found, ModelFiles()
    try:
        parameters = sum(safetensors_parameters(folder / shard) for shard in shards)
    except (OSError, ValueError, KeyError, struct.error) as exc:
        found.failures.append(f"{named}: a weight shard of {folder} is unreadable ({exc}): copy it again")
        return found, ModelFiles()
    found.passed.append(
        f"model: {folder}: config, tokenizer, {len(shards)} weight shard(s),"
        f" {parameters / 1e9:.2f} B parameters"
    )
    return found, ModelFiles(folder, parameters)


def benchmark_names(config: RunConfig) -> list[str]:
    """Every benchmark set the recipe reads: its eval split, evaluation sets and training sources, and for
    a MATH training set the six evaluation sets its contamination check compares against."""
    if config.task.kind != "math" or config.task.source != "benchmarks":
        return []
    from probepo.data.benchmarks import AVG6_BENCHMARKS

    names = [config.task.eval_set, *config.eval.benchmarks, *config.task.train_sources]
    return list(dict.fromkeys([*names, *AVG6_BENCHMARKS]))


def task_findings(config: RunConfig, model: ModelFiles) -> Findings:
    """The data a recipe reads, and the rules that need its tokenizer: every benchmark file present (with
    its rows), the training set free of evaluation problems, the rescue suffix tokenizable, and the
    longest prompt with its response within the model's context."""
    found = Findings()
    if config.task.kind != "math":
        return found  # the testbed tasks' rules ran when the recipe was validated
    if config.task.source == "benchmarks":
        from probepo.data.benchmarks import BENCHMARKS, BenchmarkFormatError, benchmarks_root, load_benchmark

        root = benchmarks_root(config.task.benchmarks_root)
        for name in benchmark_names(config):
            path = root / BENCHMARKS[name].folder / BENCHMARKS[name].file
            if not path.is_file():
                found.failures.append(
                    f"benchmark {name}: {path} not found: set task.benchmarks_root (or PROBEPO_BENCHMARKS)"
                    " to the folder holding the benchmark sets, on a file system the jobs share"
                )
                continue
            try:
                found.passed.append(f"data: benchmark {name}: {len(load_benchmark(name, root))} rows")
            except BenchmarkFormatError as exc:
                found.failures.append(f"benchmark {name}: {exc}")
        if found.failures:
            return found
    return found.extend(_tokenized_task(config, model))


def _tokenized_task(config: RunConfig, model: ModelFiles) -> Findings:
    """Build the task as a job would (its tokenizer, its training problems and their contamination check)
    and check what depends on them."""
    from probepo.data import build_task
    from probepo.data.contamination import ContaminationError

    found = Findings()
    try:
        task = build_task(config.task, config.model)
    except ContaminationError as exc:
        return Findings(failures=[f"task.train_sources: {exc}"])
    except (OSError, ValueError) as exc:
        return Findings(failures=[f"task: {str(exc).splitlines()[0]}"])
    rows = {split: len(problems) for split, problems in task.problems.items()}
    found.passed.append(f"data: training and eval problems {rows}, none an evaluation problem")
    suffix = task.tokenizer.encode(config.algo.rescue_suffix) if config.algo.rescue_tokens else []
    longest = task.longest_prompt() + config.sampling.max_tokens + len(suffix) + config.algo.rescue_tokens
    context = _model_context(model.folder)
    if context is not None and longest > context:
        found.failures.append(
            f"sampling.max_tokens = {config.sampling.max_tokens}: the longest prompt"
            f" ({task.longest_prompt()} tokens) + max_tokens + rescue = {longest} tokens is past the"
            f" model's context of {context}: lower sampling.max_tokens or algo.rescue_tokens"
        )
    else:
        of = f"of the model's {context}" if context else "(the model's context is checked when it loads)"
        found.passed.append(f"context: longest prompt + response + rescue = {longest} tokens {of}")
    return found


def _model_context(folder: Path | None) -> int | None:
    """The policy's context (max_position_embeddings of its config, or of its text config), if readable."""
    data = _model_config(folder)
    value = data.get("text_config", data).get("max_position_embeddings")
    return int(value) if value else None


def _model_config(folder: Path | None) -> dict[str, Any]:
    """A Hugging Face model folder's config.json; {} when there is none or it does not parse."""
    try:
        return json.loads((folder / "config.json").read_text()) if folder else {}
    except (OSError, ValueError):
        return {}


def store_findings(url: str) -> Findings:
    """The store answers a listing (reachable, credentials accepted), takes a write and a delete, and
    honours the conditional requests exactly-once rests on (probepo/store/capabilities.py, run afresh)."""
    from probepo.store.capabilities import probe_conditionals

    try:
        store = open_store(url)
        runs = len(store.runs())
        found, lacks = probe_conditionals(store.objects)
    except StoreError as exc:
        return Findings(failures=[str(exc)])
    except OSError as exc:  # a local folder that cannot be made or written
        return Findings(failures=[f"store {url}: {exc.strerror or exc}: give a folder you can write"])
    if lacks:
        return Findings(
            failures=[
                f"store {url}: its endpoint does not honour conditional requests ({'; '.join(lacks)}): two"
                " writers could both commit a stage or hold a lease: use an endpoint that honours them"
            ]
        )
    passed = f"store: {url}: {runs} run(s), writable, conditional requests honoured"
    notes = "; ".join(found.workarounds())
    return Findings(passed=[f"{passed} ({notes})" if notes else passed])


WORKER_ENV_EXAMPLE = "infra/prefect/worker.env.example"
"""The documented environment file of a Prefect worker (what the flows need, each line explained)."""


def missing_environment(config: RunConfig) -> list[str]:
    """What this process's environment lacks that a run of `config` reads from it, each with what for: a
    Prefect worker (started by cron or systemd, with an empty environment) has only what its env file sets.
    An S3 store wants credentials (a credentials file, a profile or keys; an instance role cannot be seen
    from here) and a region; a model named by hub id, HF_HUB_OFFLINE and a cache (nodes have no internet);
    the maths benchmarks without `task.benchmarks_root`, PROBEPO_BENCHMARKS."""
    env = os.environ
    missing = []
    if config.store.startswith("s3://"):
        sources = ("AWS_SHARED_CREDENTIALS_FILE", "AWS_PROFILE", "AWS_ACCESS_KEY_ID")
        if (
            not any(env.get(name) for name in sources)
            and not (Path.home() / ".aws" / "credentials").is_file()
        ):
            missing.append(f"{' or '.join(sources)} (the S3 store's credentials)")
        if not (env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")):
            missing.append("AWS_REGION (the S3 store's region)")
    if config.model.kind == "hf" and not Path(config.model.pretrained).exists():
        if not env.get("HF_HUB_OFFLINE"):
            missing.append(
                f"HF_HUB_OFFLINE=1 (model.pretrained = {config.model.pretrained} from the local cache)"
            )
        if not (env.get("HF_HUB_CACHE") or env.get("HF_HOME")):
            missing.append("HF_HUB_CACHE (the Hugging Face cache the nodes share)")
    benchmarks = config.task.kind == "math" and config.task.source == "benchmarks"
    if benchmarks and config.task.benchmarks_root is None and not env.get("PROBEPO_BENCHMARKS"):
        missing.append("PROBEPO_BENCHMARKS (the benchmark files' folder)")
    return missing


def preflight(config: RunConfig) -> tuple[Findings, ModelFiles]:
    """Everything about `config` its jobs would meet, bar the cluster: model files, data, store."""
    found, model = model_files(config.model)
    if not found.failures:
        found.extend(task_findings(config, model))
    return found.extend(store_findings(config.store)), model


def invalid_recipe_preflight(fields: Mapping[str, Any]) -> Findings:
    """What `preflight` can still check of a recipe's `fields` that failed validation (which named its own
    failures): the model, where its fields are valid on their own, and the store, where it is given as
    text. The data needs the whole recipe (its task, its tokenizer) and waits for it."""
    found = Findings()
    with contextlib.suppress(ValidationError):  # the model's own failures are among the recipe's
        found.extend(model_files(ModelConfig.model_validate(fields.get("model") or {}))[0])
    store = fields.get("store", RunConfig.model_fields["store"].default)
    if isinstance(store, str) and store:
        found.extend(store_findings(store))
    return found
