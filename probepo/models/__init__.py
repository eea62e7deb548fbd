"""Policy models of the CPU testbed."""

from probepo.models.gpt import GPT, KVCache, load_model, save_model

__all__ = ["GPT", "KVCache", "load_model", "save_model"]
