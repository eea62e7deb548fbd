"""PyTorch `.bin` checkpoints (`pytorch_model.bin`, or `pytorch_model.bin.index.json` and its shards), found
and converted once to safetensors by `probepo stage`.

Every reader in probepo loads safetensors only: each rank maps them into memory without unpickling, where
`torch.load` of a 10 GB pickled shard reads it whole into host memory, once per rank (8 per node). So a
checkpoint published as `.bin` only (deepseek-ai/deepseek-math-7b-instruct) is converted at staging, shard
by shard, and `probepo check` sends a `.bin`-only folder there.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import Tensor

from probepo.engines.hf.loading import WEIGHTS_INDEX_FILE

BIN_FILE = "pytorch_model.bin"
BIN_INDEX_FILE = "pytorch_model.bin.index.json"


def bin_shards(folder: Path) -> list[str]:
    """The `.bin` files a checkpoint folder's weights are in: `pytorch_model.bin`, else the shards its
    index names; [] when it has neither."""
    if (folder / BIN_FILE).is_file():
        return [BIN_FILE]
    if (folder / BIN_INDEX_FILE).is_file():
        return sorted(set(json.loads((folder / BIN_INDEX_FILE).read_text())["weight_map"].values()))
    return []


def safetensors_name(shard: str) -> str:
    """The safetensors file a `.bin` shard becomes, named as transformers names its own shards:
    `pytorch_model-00001-of-00002.bin` -> `model-00001-of-00002.safetensors`."""
    return shard.removesuffix(".bin").replace("pytorch_model", "model", 1) + ".safetensors"


def unshared(state: dict[str, Tensor]) -> tuple[dict[str, Tensor], list[str]]:
    """`state` with every tensor stored once, contiguous, and the names it dropped: a name whose tensor is
    the same view of the same storage as an earlier name's (a tied LM head) is dropped, as safetensors' own
    convert script does; loading brings it back, transformers re-tying tied weights by the model's config
    and `with_tied_weights` by shared storage. Different views of one storage (slices of one buffer) are
    not the same tensor: each gets its own copy."""
    views: dict[int, dict[tuple[object, ...], str]] = {}
    dropped = []
    for name, tensor in state.items():
        if tensor.numel() == 0:  # empty tensors all sit at address 0: none is an alias
            continue
        held = views.setdefault(tensor.untyped_storage().data_ptr(), {})
        view = (tensor.data_ptr(), tensor.dtype, tuple(tensor.shape), tensor.stride())
        if view in held:
            dropped.append(name)
        else:
            held[view] = name
    copied = {name for held in views.values() if len(held) > 1 for name in held.values()}
    kept = {
        name: tensor.clone(memory_format=torch.contiguous_format) if name in copied else tensor.contiguous()
        for name, tensor in state.items()
        if name not in dropped
    }
    return kept, dropped


@dataclass(frozen=True)
class Converted:
    """What `convert_bin_checkpoint` wrote."""

    shards: int
    """`.bin` files read (and safetensors files written)."""
    tensors: int
    bytes: int
    """The tensors' bytes (the safetensors files less their headers)."""
    dropped: list[str]
    """Names left out because they alias a tensor written under another name."""


def convert_bin_checkpoint(source: Path, target: Path) -> Converted:
    """Write the `.bin` weights of the folder `source` into the folder `target` as safetensors: one file per
    shard (`safetensors_name`), and for a sharded checkpoint `model.safetensors.index.json` with the index's
    metadata and a weight map of the new files, written last. One shard is in memory at a time; nothing but
    tensors is unpickled (`weights_only=True`). Raises FileNotFoundError naming missing shards, ValueError
    for a shard that is not a state dict of tensors."""
    shards = bin_shards(source)
    if not shards:
        raise FileNotFoundError(f"{source} has no {BIN_FILE} or {BIN_INDEX_FILE}")
    missing = [shard for shard in shards if not (source / shard).is_file()]
    if missing:
        raise FileNotFoundError(
            f"{source} has {len(shards) - len(missing)} of the {len(shards)} shards {BIN_INDEX_FILE} names:"
            f" {', '.join(missing)} missing"
        )
    target.mkdir(parents=True, exist_ok=True)
    weight_map: dict[str, str] = {}
    dropped: list[str] = []
    written = 0
    for shard in shards:
        state = torch.load(source / shard, map_location="cpu", weights_only=True)
        if not isinstance(state, dict) or not all(isinstance(value, Tensor) for value in state.values()):
            raise ValueError(f"{source / shard} is not a state dict of tensors")
        kept, aliases = unshared(state)
        name = safetensors_name(shard)
        save_file(kept, target / name, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(kept, name))
        written += sum(tensor.nbytes for tensor in kept.values())
        dropped += aliases
        del state, kept  # before the next shard loads: a 7B model's largest shard is ~10 GB
    if shards != [BIN_FILE]:
        index = json.loads((source / BIN_INDEX_FILE).read_text())
        metadata = {**index.get("metadata", {}), "total_size": written}  # less any dropped alias
        text = json.dumps({"metadata": metadata, "weight_map": dict(sorted(weight_map.items()))}, indent=2)
        (target / WEIGHTS_INDEX_FILE).write_text(text + "\n")
    return Converted(len(shards), len(weight_map), written, dropped)


def byte_size(count: int) -> str:
    """A byte count in words: `13.8 GB`, or `39.1 MB` below a tenth of a GB."""
    return f"{count / 1e9:.1f} GB" if count >= 1e8 else f"{count / 1e6:.1f} MB"
