"""The Hugging Face tests' tiny Qwen2 fixtures, for the vLLM engine's comparisons."""

from tests.hf.conftest import model, tiny_qwen, tokenizer

__all__ = ["model", "tiny_qwen", "tokenizer"]
