"""The tiny Qwen2 model (built and trained once per session, ~20 s) and fresh copies of it per test."""

from __future__ import annotations

import pytest

from tests.hf.tiny_qwen import TinyQwen, build_tiny_qwen


@pytest.fixture(scope="session")
def tiny_qwen(tmp_path_factory: pytest.TempPathFactory) -> TinyQwen:
    from transformers.utils import logging

    logging.disable_progress_bar()  # "Loading weights" bars on every from_pretrained
    return build_tiny_qwen(tmp_path_factory.mktemp("tiny-qwen"))


@pytest.fixture
def model(tiny_qwen: TinyQwen):
    """A fresh copy of the tiny model (tests may train or perturb it)."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_qwen.folder).eval()


@pytest.fixture
def tokenizer(tiny_qwen: TinyQwen):
    return tiny_qwen.tokenizer
