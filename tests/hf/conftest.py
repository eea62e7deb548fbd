"""Fresh copies of the tiny Qwen2 model per test (the model itself: the session fixture `tiny_qwen` of
tests/conftest.py)."""

from __future__ import annotations

import pytest

from tests.hf.tiny_qwen import TinyQwen


@pytest.fixture
def model(tiny_qwen: TinyQwen):
    """A fresh copy of the tiny model (tests may train or perturb it)."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_qwen.folder).eval()


@pytest.fixture
def tokenizer(tiny_qwen: TinyQwen):
    return tiny_qwen.tokenizer
