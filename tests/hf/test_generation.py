"""HFGenerationEngine on the tiny Qwen2 model: determinism, the forked prefix cache, probes, cutoff rescue,
resuming after any chunk, and switching weights."""

from __future__ import annotations

import pytest
import torch

from probepo.engines.base import SamplingParams, call_chunks
from probepo.engines.hf import HFGenerationEngine
from probepo.engines.hf.generation import sample_categorical

# token ids of short arithmetic text ("12+7=", "3+45=19. 19+", ...): Qwen digits are ids 15-24
PROMPTS = [[16, 17, 10, 22, 28], [18, 10, 19, 20, 28, 16, 24, 13, 220, 16, 24, 10], [20, 28], [17, 10]]
DOT = 13  # "."
SAMPLE = SamplingParams(temperature=1.0, max_tokens=10, stop_token_ids=(DOT,))
GREEDY = SamplingParams(temperature=0.0, max_tokens=10)


def no_cache_greedy(model, prefix: list[int], steps: int) -> list[int]:
    """Reference: each token from a full forward pass over everything so far, no cache, no padding."""
    ids = list(prefix)
    with torch.no_grad():
        for _ in range(steps):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prefix) :]


def test_generation_is_deterministic_from_the_seed(model):
    engine = HFGenerationEngine(model, max_batch_rows=8)
    first = engine.generate(PROMPTS, 3, SAMPLE, seed=5)
    assert engine.generate(PROMPTS, 3, SAMPLE, seed=5) == first
    assert engine.generate(PROMPTS, 3, SAMPLE, seed=6) != first
    assert [len(group) for group in first] == [3] * len(PROMPTS)
    for group in first:
        for completion in group:
            assert len(completion.ids) <= SAMPLE.max_tokens
            stopped = completion.finish_reason == "stop"
            assert stopped == (completion.ids[-1] == DOT) and DOT not in completion.ids[:-1]
            assert stopped or len(completion.ids) == SAMPLE.max_tokens


def test_each_prefix_is_encoded_once_and_forked(model):
    """The prefix forward pass sees P rows (not P·n), once per chunk; every later pass feeds one token."""
    engine = HFGenerationEngine(model, max_batch_rows=64)
    shapes = []
    hook = model.get_input_embeddings().register_forward_hook(
        lambda m, args, out: shapes.append(args[0].shape)
    )
    try:
        engine.generate(PROMPTS, 8, SAMPLE, seed=0)
    finally:
        hook.remove()
    width = max(map(len, PROMPTS))
    assert engine.prefill_calls == 1
    assert shapes[0] == (len(PROMPTS), width)
    assert all(shape[1] == 1 for shape in shapes[1:])


def test_greedy_equals_a_no_cache_reference_with_left_padding(model):
    engine = HFGenerationEngine(model, max_batch_rows=64)
    result = engine.generate(PROMPTS, 2, GREEDY, seed=0)
    for prompt, group in zip(PROMPTS, result, strict=True):
        reference = no_cache_greedy(model, prompt, GREEDY.max_tokens)
        assert [c.ids for c in group] == [reference, reference]


def test_a_tiny_top_p_is_greedy(model):
    engine = HFGenerationEngine(model)
    nucleus = SamplingParams(temperature=1.0, top_p=1e-6, max_tokens=10)
    assert engine.generate(PROMPTS, 2, nucleus, seed=3) == engine.generate(PROMPTS, 2, GREEDY, seed=0)


@pytest.mark.parametrize(
    ("temperature", "top_p", "expected"),
    [
        (1.0, 1.0, [0.5, 0.3, 0.2, 0.0]),
        (1.0, 0.6, [0.625, 0.375, 0.0, 0.0]),
        (0.5, 1.0, [25 / 38, 9 / 38, 4 / 38, 0]),
    ],
)
def test_sampling_draws_the_tempered_nucleus(temperature, top_p, expected):
    probs = torch.tensor([0.5, 0.3, 0.2, 0.0])
    logits = probs.log().expand(40_000, -1)
    tokens = sample_categorical(logits, temperature, top_p, torch.Generator().manual_seed(0))
    frequencies = torch.bincount(tokens, minlength=4) / len(tokens)
    torch.testing.assert_close(frequencies, torch.tensor(expected), rtol=0, atol=0.01)


def test_continue_from_a_prefix_equals_fresh_greedy(model):
    engine = HFGenerationEngine(model)
    fresh = [group[0].ids for group in engine.generate(PROMPTS, 1, GREEDY, seed=0)]
    for cut in (1, 4, 9):
        prefixes = [prompt + ids[:cut] for prompt, ids in zip(PROMPTS, fresh, strict=True)]
        limits = [GREEDY.max_tokens - cut] * len(PROMPTS)
        probes = engine.continue_from(prefixes, 2, GREEDY, 0, limits)
        assert [[c.ids for c in group] for group in probes] == [[ids[cut:]] * 2 for ids in fresh]


def test_per_prefix_limits(model):
    engine = HFGenerationEngine(model)
    limits = [0, 3, 7, 1]
    probes = engine.continue_from(PROMPTS, 3, SamplingParams(temperature=1.0), 0, limits)
    for limit, group in zip(limits, probes, strict=True):
        assert all(len(c.ids) == limit and c.finish_reason == "length" for c in group)


def test_cutoff_rescue_appends_the_suffix_then_greedy_tokens(model, tokenizer):
    engine = HFGenerationEngine(model)
    rescue = tokenizer.encode("\n\nFinal answer: \\boxed{")
    limit, extra = 6, 3
    probes = engine.continue_from(
        PROMPTS, 4, SAMPLE, 1, [limit] * len(PROMPTS), rescue_ids=rescue, rescue_tokens=extra
    )
    rescued = 0
    for prefix, group in zip(PROMPTS, probes, strict=True):
        for completion in group:
            if not completion.rescued:  # stopped by itself within its limit
                assert completion.finish_reason == "stop" and len(completion.ids) <= limit
                continue
            rescued += 1
            head, forced, tail = (
                completion.ids[:limit],
                completion.ids[limit : limit + len(rescue)],
                completion.ids[limit + len(rescue) :],
            )
            assert DOT not in head and forced == rescue
            # greedy after the suffix, ending early only at a stop token
            assert tail == no_cache_greedy(model, prefix + head + forced, extra)[: len(tail)]
            assert len(tail) == extra or (tail[-1] == DOT and completion.finish_reason == "stop")
    assert 0 < rescued < 4 * len(PROMPTS)


def test_any_chunk_decoded_alone_is_bitwise_the_calls(model):
    engine = HFGenerationEngine(model, max_batch_rows=3)  # n = 3: one prefix per chunk
    whole = engine.generate(PROMPTS, 3, SAMPLE, 11)
    plan = engine.chunks(PROMPTS, 3)
    assert len(plan) == len(PROMPTS)
    for index in reversed(range(len(plan))):
        [i] = plan[index]
        limits = [SAMPLE.max_tokens] * len(PROMPTS)
        [alone] = engine.decode_chunks(call_chunks(PROMPTS, limits, plan, [index], 11), 3, SAMPLE)
        assert alone == [whole[i]]


def test_load_weights_switches_the_policy(model, tiny_qwen, tmp_path):
    engine = HFGenerationEngine(model)
    before = engine.generate(PROMPTS, 1, GREEDY, 0)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.5)
    assert engine.generate(PROMPTS, 1, GREEDY, 0) != before
    engine.load_weights(tiny_qwen.folder)  # a checkpoint folder whose lm_head is tied, so absent
    assert engine.generate(PROMPTS, 1, GREEDY, 0) == before


def test_prefixes_that_do_not_fit_are_refused(model):
    engine = HFGenerationEngine(model)
    with pytest.raises(ValueError, match="exceed the model context of 512"):
        engine.continue_from([[1] * 500], 1, GREEDY, 0, [10], rescue_ids=[2, 3], rescue_tokens=4)
    with pytest.raises(ValueError, match="outside"):
        engine.generate([[10**6]], 1, GREEDY, 0)
