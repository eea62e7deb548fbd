"""The CPU generation engine: determinism, finish reasons, prefix forking, cutoff rescue, bad input."""

import pytest
import torch

from probepo.config import ModelConfig, SamplingConfig
from probepo.engines.base import SamplingParams, call_chunks
from probepo.engines.decode_rows import sample_tokens
from probepo.engines.sampler import TorchGenerationEngine, call_plan
from probepo.models import GPT, save_model

EOS = 2
CONFIG = ModelConfig(vocab_size=19, d_model=32, n_layers=2, n_heads=4, context=64)


@pytest.fixture(scope="module")
def engine():
    torch.manual_seed(0)
    return TorchGenerationEngine(GPT(CONFIG))


def prompts(k=4):
    rng = torch.Generator().manual_seed(1)
    return [[1, *torch.randint(3, 19, (5 + i % 3,), generator=rng).tolist()] for i in range(k)]


def test_generation_is_deterministic_from_seed(engine):
    params = SamplingParams(temperature=1.0, max_tokens=20, stop_token_ids=(EOS,))
    first = engine.generate(prompts(), 3, params, seed=5)
    assert first == engine.generate(prompts(), 3, params, seed=5)
    assert first != engine.generate(prompts(), 3, params, seed=6)
    assert len(first) == 4 and all(len(group) == 3 for group in first)


def test_finish_reasons(engine):
    params = SamplingParams(temperature=1.0, max_tokens=12, stop_token_ids=(EOS,))
    completions = [c for group in engine.generate(prompts(8), 16, params, seed=0) for c in group]
    reasons = {c.finish_reason for c in completions}
    assert reasons == {"stop", "length"}  # a random model does both at this length
    for c in completions:
        if c.finish_reason == "stop":
            assert c.ids[-1] == EOS and EOS not in c.ids[:-1] and len(c.ids) <= 12
        else:
            assert len(c.ids) == 12 and EOS not in c.ids
        assert not c.rescued
    none_stop = engine.generate(prompts(2), 2, SamplingParams(max_tokens=7), seed=0)
    assert all(c.finish_reason == "length" and len(c.ids) == 7 for g in none_stop for c in g)


def test_greedy_continuation_from_a_prefix_equals_fresh_greedy(engine):
    greedy = SamplingParams(temperature=0.0, max_tokens=25, stop_token_ids=(EOS,))
    fresh = [g[0].ids for g in engine.generate(prompts(), 1, greedy, seed=0)]
    cut = [min(4, len(ids) - 1) for ids in fresh]
    prefixes = [p + ids[:c] for p, ids, c in zip(prompts(), fresh, cut, strict=True)]
    limits = [25 - c for c in cut]
    forked = engine.continue_from(prefixes, 3, greedy, seed=9, max_new_tokens=limits)
    for ids, c, group in zip(fresh, cut, forked, strict=True):
        assert all(comp.ids == ids[c:] for comp in group)


def test_chunking_does_not_change_greedy_results(engine):
    greedy = SamplingParams(temperature=0.0, max_tokens=15, stop_token_ids=(EOS,))
    small = TorchGenerationEngine(engine.model, max_batch_rows=2)
    assert small.generate(prompts(5), 2, greedy, 0) == engine.generate(prompts(5), 2, greedy, 0)


def test_forked_first_token_follows_the_full_forward_softmax(engine):
    prefix = prompts(1)[0] + [5, 7, 13]
    with torch.no_grad():
        probs = torch.softmax(engine.model(torch.tensor([prefix]))[0, -1] / 0.7, dim=-1)
    n = 6000
    params = SamplingParams(temperature=0.7, max_tokens=1)
    first = [c.ids[0] for c in engine.continue_from([prompts(2)[1], prefix], n, params, 3, [1, 1])[1]]
    freq = torch.bincount(torch.tensor(first), minlength=19).double() / n
    assert (freq - probs.double()).abs().max() < 4 * (0.25 / n) ** 0.5  # 4 sigma of the worst case


def test_top_p_keeps_the_nucleus():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]).repeat(4000, 1))
    draws = sample_tokens(logits, 1.0, 0.75, torch.Generator().manual_seed(0))
    assert set(draws.tolist()) == {0, 1}
    torch.testing.assert_close((draws == 0).double().mean().item(), 0.5 / 0.8, atol=0.03, rtol=0)


def test_cutoff_rescue_appends_suffix_and_greedy_tokens(engine):
    params = SamplingParams(temperature=1.0, max_tokens=99, stop_token_ids=(EOS,))
    rescue = [18, 17]
    out = engine.continue_from(prompts(3), 40, params, 2, [3, 0, 6], rescue_ids=rescue, rescue_tokens=4)
    seen_rescue = False
    for limit, group in zip([3, 0, 6], out, strict=True):
        for c in group:
            if c.rescued:
                seen_rescue = True
                assert EOS not in c.ids[:limit]
                assert c.ids[limit : limit + 2] == rescue
                assert len(c.ids) <= limit + 2 + 4
                assert c.finish_reason == ("stop" if c.ids[-1] == EOS else "length")
            else:
                assert c.finish_reason == "stop" and len(c.ids) <= limit
    assert seen_rescue and all(c.rescued and c.ids[:2] == rescue for c in out[1])
    # the greedy tail equals a plain greedy continuation from prefix + cut-off tokens + suffix
    c = next(c for c in out[2] if c.rescued)
    greedy = SamplingParams(temperature=0.0, max_tokens=4, stop_token_ids=(EOS,))
    tail = engine.continue_from([prompts(3)[2] + c.ids[:8]], 1, greedy, 0, [4])[0][0]
    assert c.ids[8:] == tail.ids


def test_rescue_disabled_leaves_cutoffs_alone(engine):
    params = SamplingParams(temperature=1.0, max_tokens=3)
    out = engine.continue_from(prompts(2), 4, params, 0, [3, 0], rescue_ids=[18], rescue_tokens=0)
    assert all(not c.rescued and c.finish_reason == "length" for g in out for c in g)
    assert all(c.ids == [] for c in out[1])


def test_load_weights_switches_policy(engine, tmp_path):
    torch.manual_seed(42)
    other = GPT(CONFIG)
    save_model(other, tmp_path)
    probe = TorchGenerationEngine(GPT(CONFIG))
    greedy = SamplingParams(temperature=0.0, max_tokens=10)
    expected = TorchGenerationEngine(other).generate(prompts(), 1, greedy, 0)
    probe.load_weights(tmp_path)
    assert probe.generate(prompts(), 1, greedy, 0) == expected
    probe.load_weights(engine.model.state_dict())
    assert probe.generate(prompts(), 1, greedy, 0) == engine.generate(prompts(), 1, greedy, 0)


def test_bad_input_is_named(engine):
    params = SamplingParams(max_tokens=10)
    with pytest.raises(ValueError, match="prefix 1 holds token ids outside"):
        engine.generate([[1, 3], [1, 19]], 1, params, 0)
    with pytest.raises(ValueError, match="prefix 0 is empty"):
        engine.generate([[]], 1, params, 0)
    with pytest.raises(ValueError, match="exceed the model context"):
        engine.generate([[1] * 60], 1, params, 0)
    with pytest.raises(ValueError, match="max_new_tokens has 1 entries for 2 prefixes"):
        engine.continue_from([[1], [1]], 1, params, 0, [3])
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0.0)
    assert SamplingParams.from_config(SamplingConfig(max_tokens=5), [EOS]) == SamplingParams(
        1.0, 1.0, 5, (EOS,)
    )


def test_probes_of_mixed_prefix_lengths_stay_inside_the_context():
    """A finished long-prefix row stays in the batch until compaction while short-prefix rows go on:
    every row must still be fed a position inside the context (the audit's reproduction)."""
    torch.manual_seed(0)
    engine = TorchGenerationEngine(GPT(ModelConfig(vocab_size=19, d_model=32, n_layers=1, context=32)))
    prompt = [1, 5, 6, 7, 8]
    response = torch.randint(3, 19, (26,), generator=torch.Generator().manual_seed(0)).tolist()
    pivots = [2, 2, 2, 2, 20]
    params = SamplingParams(max_tokens=27, stop_token_ids=())
    prefixes = [prompt + response[:t] for t in pivots]
    budgets = [params.max_tokens - t for t in pivots]
    continuations = engine.continue_from(prefixes, 2, params, 0, budgets)
    assert [[len(c.ids) for c in row] for row in continuations] == [[b, b] for b in budgets]
    assert all(c.finish_reason == "length" for row in continuations for c in row)


def test_any_chunk_decoded_alone_is_bitwise_the_calls(engine):
    """Chunks are the generating stages' shards, made by whichever rank claims them, in any order: chunk c
    alone, seeded chunk_seed(seed, c), gives exactly the rows the whole call gave it."""
    small = TorchGenerationEngine(engine.model, max_batch_rows=6)  # 3 prefixes × 2 samples per chunk
    params = SamplingParams(temperature=1.0, max_tokens=12, stop_token_ids=(EOS,))
    batch = prompts(8)
    whole = small.generate(batch, 2, params, 7)
    plan = small.chunks(batch, 2)
    assert len(plan) == 3 and sorted(i for chunk in plan for i in chunk) == list(range(8))
    for index in reversed(range(len(plan))):  # any order
        chunk = plan[index]
        limits = [params.max_tokens] * len(batch)
        [alone] = small.decode_chunks(call_chunks(batch, limits, plan, [index], 7), 2, params)
        assert alone == [whole[i] for i in chunk]
    assert small.generate(batch, 2, params, 8) != whole


@pytest.mark.parametrize(
    ("chunks", "shards", "calls"),
    [
        (5, None, [[0], [1], [2], [3], [4]]),
        (5, 2, [[0, 3, 4], [1, 2]]),
        (5, 8, [[0], [1], [2], [3], [4]]),
        (16, 8, [[c, 15 - c] for c in range(8)]),
        (40, 8, [[c, 15 - c, 16 + c, 31 - c, 32 + c] for c in range(8)]),
    ],
)
def test_chunks_are_dealt_into_calls_by_the_recipe(chunks, shards, calls):
    """The chunks (sorted by length) are dealt back and forth: each call a spread of the lengths, none always
    the longest of a round, so the calls take about as long (bench/ranks.py)."""
    assert call_plan(chunks, shards) == calls


def test_chunks_decode_alike_in_any_call(engine):
    """A chunk's rows are its own seed's, whichever chunks share its engine call: dealing a step's chunks
    into calls (sampling.shards) changes no bit on the lockstep engines."""
    params = SamplingParams(temperature=1.0, max_tokens=12, stop_token_ids=(EOS,))
    batch = prompts(8)
    one_per_chunk = TorchGenerationEngine(engine.model, max_batch_rows=4).generate(batch, 2, params, 7)
    dealt = TorchGenerationEngine(engine.model, max_batch_rows=4, shards=3)
    assert dealt.calls(len(dealt.chunks(batch, 2))) == [[0], [1], [2, 3]]
    assert dealt.generate(batch, 2, params, 7) == one_per_chunk
    with pytest.raises(ValueError, match="shards = 0"):
        TorchGenerationEngine(engine.model, shards=0)
