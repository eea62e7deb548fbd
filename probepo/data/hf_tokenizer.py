"""A Hugging Face tokenizer behind the pipeline's `Tokenizer` protocol (probepo.data.task)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


class HFTokenizer:
    """Wraps a transformers tokenizer. `encode` adds no special tokens (the prompt templates of
    probepo.data.math_task decide where BOS goes); `decode` keeps them, so the verifier sees the stop token.

    `vocab_size` counts added tokens too (`len(tokenizer)`; a model's embedding may be padded beyond it).
    Tokenizers without a BOS token (Qwen) report `has_bos` False and their EOS id as `bos_id`, which nothing
    prepends then.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        if tokenizer.eos_token_id is None:
            raise ValueError(f"{type(tokenizer).__name__} has no EOS token: responses could not stop")
        self.hf = tokenizer
        self.vocab_size = len(tokenizer)
        self.eos_id = int(tokenizer.eos_token_id)
        self.has_bos = tokenizer.bos_token_id is not None
        self.bos_id = int(tokenizer.bos_token_id) if self.has_bos else self.eos_id
        self.pad_id = int(tokenizer.pad_token_id) if tokenizer.pad_token_id is not None else self.eos_id
        self._texts: dict[int, str] = {}

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`, no special tokens added (special-token strings in it are still matched)."""
        return list(self.hf.encode(text, add_special_tokens=False))

    def decode(self, ids: list[int]) -> str:
        """Text of `ids`, special tokens included, spaces exactly as tokenized."""
        return self.hf.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def token_texts(self, ids: list[int]) -> list[str]:
        """The text of each token decoded alone (a byte-level token holding part of a UTF-8 character
        decodes to U+FFFD); cached per id."""
        missing = [i for i in dict.fromkeys(ids) if i not in self._texts]
        if missing:  # transformers < 5.2x decodes an empty batch as [""]
            texts = self.hf.batch_decode([[i] for i in missing], clean_up_tokenization_spaces=False)
            self._texts.update(zip(missing, texts, strict=True))
        return [self._texts[i] for i in ids]
