"""The model's files, as its jobs will read them: a local folder, a GGUF file or a hub id whose snapshot is
in the local cache, with its config, a tokenizer and every weight shard, each shard's header readable.

Nothing here loads a model's weights or contacts the Hugging Face hub: compute nodes usually cannot reach
it, so a hub id counts only when its files are in the local cache. The engines' file names are imported
where a Hugging Face model is checked: they bring torch (2 s), which the data check's importers (staging)
and a testbed recipe's check do without.
"""

from __future__ import annotations

import contextlib
import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from probepo.checks.findings import Findings
from probepo.config import ModelConfig

if TYPE_CHECKING:
    from probepo.checks.launch import Launch

TOKENIZER_FILES = (("tokenizer.json",), ("tokenizer.model",), ("vocab.json", "merges.txt"))
"""Any one of these sets is a tokenizer transformers can load (fast, SentencePiece, byte-level BPE)."""


def check(launch: Launch) -> Findings:
    """The recipe's model files (`Launch.model`, read once for every check that needs them)."""
    return launch.model[0]


def recipe_model(launch: Launch) -> tuple[Findings, ModelFiles]:
    """The model files of the launch's recipe; of a recipe that failed validation, of its model where its
    fields are valid on their own."""
    if launch.config is not None:
        return model_files(launch.config.model)
    with contextlib.suppress(ValidationError):  # the model's own failures are among the recipe's
        return model_files(ModelConfig.model_validate(launch.fields.get("model") or {}))
    return Findings(), ModelFiles()


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
    config = model_config_json(folder)
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


def model_context(folder: Path | None) -> int | None:
    """The policy's context (max_position_embeddings of its config, or of its text config), if readable."""
    data = model_config_json(folder)
    value = data.get("text_config", data).get("max_position_embeddings")
    return int(value) if value else None


def model_config_json(folder: Path | None) -> dict[str, Any]:
    """A Hugging Face model folder's config.json; {} when there is none or it does not parse."""
    try:
        return json.loads((folder / "config.json").read_text()) if folder else {}
    except (OSError, ValueError):
        return {}
