"""Engines on Hugging Face causal language models: generation with a forked prefix KV cache, scoring with
chunked full-vocabulary entropies, PPO-clip training, and checkpoints in Hugging Face layout.

Importing this package does not import `transformers`; the engines import it when they first need it.
"""

from probepo.engines.hf.generation import HFGenerationEngine
from probepo.engines.hf.loading import load_policy, load_weights_into, read_weights, smollm2_gguf
from probepo.engines.hf.trainer import HFTrainerEngine, chunked_logp_entropy

__all__ = [
    "HFGenerationEngine",
    "HFTrainerEngine",
    "chunked_logp_entropy",
    "load_policy",
    "load_weights_into",
    "read_weights",
    "smollm2_gguf",
]
