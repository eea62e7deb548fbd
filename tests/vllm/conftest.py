"""The Hugging Face tests' fixtures on the tiny Qwen2 model, for the vLLM engine's comparisons."""

from tests.hf.conftest import model, tokenizer

__all__ = ["model", "tokenizer"]
