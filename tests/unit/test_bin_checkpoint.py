"""A checkpoint published as PyTorch `.bin` shards only (as deepseek-ai/deepseek-math-7b-instruct is):
`probepo stage` converts it once to safetensors (a tied pair stored once, every tensor's bits kept, the
`.bin` files left behind, the manifest listing the new files), which `probepo check` then passes; `check`
sends a `.bin`-only folder to `probepo stage`, and names what an incomplete folder has and lacks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from probepo.checks.model import model_files
from probepo.engines.hf.convert import byte_size, unshared
from probepo.staging import StagingError, stage
from tests.hf.tiny_qwen import qwen_config

SHARDS = ("pytorch_model-00001-of-00002.bin", "pytorch_model-00002-of-00002.bin")
CONVERTED = ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")
EMBEDDING, HEAD = "model.embed_tokens.weight", "lm_head.weight"


def _model() -> torch.nn.Module:
    """A tiny Qwen2 with tied embeddings: its state dict holds the embedding under two names, one storage."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=32,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
        tie_word_embeddings=True,
    )
    return Qwen2ForCausalLM(config).eval()


def _bin_folder(folder: Path, *, sharded: bool = True) -> dict[str, torch.Tensor]:
    """`folder` as a `.bin`-only checkpoint (config, a tokenizer file, the weights as PyTorch pickles: two
    shards and their index, the tied pair in the first, or one `pytorch_model.bin`); its state dict."""
    model = _model()
    folder.mkdir()
    model.config.save_pretrained(folder)
    (folder / "tokenizer.json").write_text("{}")  # the check looks for the file; nothing here reads it
    state = model.state_dict()
    assert state[HEAD].untyped_storage().data_ptr() == state[EMBEDDING].untyped_storage().data_ptr()
    if not sharded:
        torch.save(state, folder / "pytorch_model.bin")
        return state
    names = list(state)
    first = {EMBEDDING, HEAD, *names[: len(names) // 2]}
    weight_map = {name: SHARDS[0] if name in first else SHARDS[1] for name in names}
    for shard in SHARDS:
        torch.save({name: state[name] for name in names if weight_map[name] == shard}, folder / shard)
    size = sum(tensor.nbytes for tensor in state.values())
    index = {"metadata": {"total_size": size}, "weight_map": weight_map}
    (folder / "pytorch_model.bin.index.json").write_text(json.dumps(index))
    return state


def _staged(tmp_path: Path, source: Path) -> tuple[Path, dict, list[str]]:
    """Stage a recipe on `source`: the staged model folder, the manifest, the summary lines."""
    staged = stage(qwen_config(source, store=str(tmp_path / "store")), tmp_path / "staged")
    manifest = json.loads((staged.folder / "manifest.json").read_text())
    return staged.folder / "models" / source.name, manifest, staged.sources


def test_staging_converts_bin_shards_to_safetensors(tmp_path):
    state = _bin_folder(tmp_path / "model")
    folder, manifest, sources = _staged(tmp_path, tmp_path / "model")

    assert sorted(path.name for path in folder.iterdir()) == sorted(
        ["config.json", "tokenizer.json", *CONVERTED, "model.safetensors.index.json"]
    )
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    source = json.loads((tmp_path / "model" / "pytorch_model.bin.index.json").read_text())
    renamed = {name: CONVERTED[SHARDS.index(shard)] for name, shard in source["weight_map"].items()}
    assert index["weight_map"] == {name: file for name, file in renamed.items() if name != HEAD}
    written = {name: tensor for file in CONVERTED for name, tensor in load_file(folder / file).items()}
    assert index["metadata"] == {"total_size": sum(tensor.nbytes for tensor in written.values())}
    assert set(written) == set(state) - {HEAD}  # the tied head stored once, under the embedding's name
    for name, tensor in written.items():
        assert tensor.dtype == state[name].dtype and torch.equal(tensor, state[name]), name
    for file in CONVERTED:
        with safe_open(folder / file, "pt") as opened:
            assert opened.metadata() == {"format": "pt"}

    listed = {entry["path"]: entry for entry in manifest["files"]}
    model = f"models/{folder.name}"
    assert {f"{model}/{file}" for file in CONVERTED} <= set(listed)
    assert not [path for path in listed if path.endswith(".bin") or "pytorch_model" in path]
    assert listed[f"{model}/{CONVERTED[0]}"]["bytes"] == (folder / CONVERTED[0]).stat().st_size
    size = byte_size(sum(tensor.nbytes for tensor in written.values()))
    (line,) = [line for line in sources if line.startswith("model:")]
    assert line == (
        f"model: {tmp_path / 'model'} -> {folder}, converted from PyTorch .bin to safetensors (2 shard(s),"
        f" {len(written)} tensors, {size}; tied, so stored once: {HEAD})"
    )

    found, files = model_files(qwen_config(folder).model)
    assert found.failures == []
    assert files.parameters == sum(parameter.numel() for parameter in _model().parameters())
    assert found.passed == [
        f"model: {folder}: config, tokenizer, 2 weight shard(s), {files.parameters / 1e9:.2f} B parameters"
    ]


def test_the_converted_folder_loads_as_the_bin_folder_does(tmp_path):
    from transformers import AutoModelForCausalLM

    _bin_folder(tmp_path / "model")
    folder, _, _ = _staged(tmp_path, tmp_path / "model")
    from_bin = AutoModelForCausalLM.from_pretrained(tmp_path / "model").eval()
    converted = AutoModelForCausalLM.from_pretrained(folder).eval()
    assert converted.lm_head.weight.data_ptr() == converted.model.embed_tokens.weight.data_ptr()
    expected, got = from_bin.state_dict(), converted.state_dict()
    assert set(got) == set(expected)
    assert all(torch.equal(got[name], expected[name]) for name in expected)
    ids = torch.tensor([[1, 5, 7, 2, 30]])
    with torch.no_grad():
        assert torch.equal(converted(input_ids=ids).logits, from_bin(input_ids=ids).logits)


def test_one_pytorch_model_bin_becomes_one_model_safetensors(tmp_path):
    state = _bin_folder(tmp_path / "model", sharded=False)
    folder, _, _ = _staged(tmp_path, tmp_path / "model")
    assert sorted(path.name for path in folder.iterdir()) == [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
    ]
    written = load_file(folder / "model.safetensors")
    assert set(written) == set(state) - {HEAD}
    assert all(torch.equal(tensor, state[name]) for name, tensor in written.items())
    assert model_files(qwen_config(folder).model)[0].failures == []


def test_check_sends_a_bin_only_folder_to_staging(tmp_path):
    folder = tmp_path / "model"
    _bin_folder(folder)
    found, files = model_files(qwen_config(folder).model)
    size = byte_size(sum((folder / shard).stat().st_size for shard in SHARDS))
    assert found.failures == [
        f"model.pretrained = {folder}: {folder} holds PyTorch .bin weights only (2 shards, {size}), and jobs"
        " load safetensors only: run `probepo stage` on the recipe, which converts them once to safetensors"
        " that every rank loads memory-mapped, and launch the staged recipe.yaml"
    ]
    assert files.parameters is None


def test_check_names_what_an_incomplete_folder_has_and_lacks(tmp_path):
    _bin_folder(tmp_path / "model")
    folder, _, _ = _staged(tmp_path, tmp_path / "model")
    named = f"model.pretrained = {folder}: {folder} lacks"
    interrupted = "copy the model's complete folder (a download interrupted midway leaves shards out"

    (folder / CONVERTED[1]).unlink()
    assert model_files(qwen_config(folder).model)[0].failures == [
        f"{named} {CONVERTED[1]}: {interrupted}; it has 1 of the 2 shards model.safetensors.index.json names)"
    ]

    (tmp_path / "model" / SHARDS[1]).unlink()
    assert model_files(qwen_config(tmp_path / "model").model)[0].failures == [
        f"model.pretrained = {tmp_path / 'model'}: {tmp_path / 'model'} lacks {SHARDS[1]}: {interrupted}; it"
        " has 1 of the 2 shards pytorch_model.bin.index.json names)"
    ]
    with pytest.raises(
        StagingError, match=f"has 1 of the 2 shards pytorch_model.bin.index.json names: {SHARDS[1]}"
    ):
        stage(qwen_config(tmp_path / "model", store=str(tmp_path / "store")), tmp_path / "again")

    for file in [*CONVERTED[:1], "model.safetensors.index.json"]:
        (folder / file).unlink()
    assert model_files(qwen_config(folder).model)[0].failures == [
        f"{named} weights (model.safetensors, or model.safetensors.index.json and its shards; or PyTorch's"
        f" pytorch_model.bin, or pytorch_model.bin.index.json and its shards): {interrupted}; it holds"
        " config.json, tokenizer.json)"
    ]


def test_unshared_drops_aliases_and_copies_other_views_of_a_storage(tmp_path):
    base, fused = torch.arange(6.0).reshape(2, 3), torch.arange(8.0)
    state = {
        "a": base,
        "alias": base,  # the same view: a tied weight
        "query": fused[:4],  # two views of one buffer, neither an alias of the other
        "key": fused[4:],
        "transposed": base.t(),  # the same storage seen another way
        "empty": torch.empty(0),
        "other empty": torch.empty(0),
    }
    kept, dropped = unshared(state)
    assert dropped == ["alias"]
    assert list(kept) == ["a", "query", "key", "transposed", "empty", "other empty"]
    assert all(torch.equal(kept[name], state[name]) and kept[name].is_contiguous() for name in kept)
    save_file(kept, tmp_path / "kept.safetensors")  # refuses tensors that share memory
    assert all(
        torch.equal(tensor, state[name]) for name, tensor in load_file(tmp_path / "kept.safetensors").items()
    )
