"""Generation on more ranks than a recipe has engine calls (issue 62): a recipe's calls are part of its bits
and never follow the ranks (probepo/stages/shards.py), so the 4 ranks of a job given a 2-call recipe leave 2
idle in generation, and the recipe made for 4 ranks (4 calls) gives each rank one. Either commits on 4 ranks
(a local job of 4 tasks in a gloo group, as a stage job's ranks run) the shards one rank commits, bit for
bit. Beside them, the two-node study preset: deepseekmath-7b-sft.yaml but for the two settings that make
16 calls in its generating steps, one for each rank of configs/profiles/h200-two-nodes.yaml."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

import pytest
import submitit
import torch

from probepo.config import RunConfig
from probepo.data.task import RL_STREAM
from probepo.engines.base import Chunk, Completion, SamplingParams
from probepo.engines.sampler import TorchGenerationEngine, call_plan, chunk_plan
from probepo.models.gpt import GPT
from probepo.presets import load_run_config
from probepo.run import distributed
from probepo.run.schedule import Stage
from probepo.stages.common import response_budget, sampling_params, task_of
from probepo.stages.context import StageContext
from probepo.stages.shards import (
    SHARD_TABLE,
    calls_for_every_rank,
    generate_in_shards,
    sample_step_calls,
    shard_indices,
    shard_name,
)
from probepo.store import ArtifactStore, open_store
from slurm.ranks import job_ranks
from tests.pipeline.conftest import tiny_config

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
WORLD = 4
SHARDS = (2, WORLD)
"""The recipes run on the 4 ranks: one of 2 calls a step (as the 8-GPU recipes' 8 on two nodes' 16 ranks),
and the one made for 4 ranks."""
HOLD_S = 120.0


def recipe(shards: int) -> RunConfig:
    """The tiny recipe with a prompt per chunk (4 chunks in sample), dealt into `shards` engine calls."""
    sampling = tiny_config().sampling.model_dump()
    return tiny_config(sampling={**sampling, "batch_rows": tiny_config().group_size, "shards": shards})


def run_id(shards: int, world: int) -> str:
    return f"calls-{shards}-on-{world}-ranks"


class FirstCallsTogether(TorchGenerationEngine):
    """The testbed engine, each rank's first engine call held until every rank of the job is in one (a file
    per rank in `folder`): no rank takes a second call before each has its first, so whether every rank gets
    work does not hang on which process started first, and a rank left without a call makes the others fail,
    saying how many ranks had one."""

    def __init__(self, model: GPT, folder: Path, *, max_batch_rows: int, shards: int | None) -> None:
        super().__init__(model, max_batch_rows=max_batch_rows, shards=shards)
        self.folder, self.held = folder, False

    def decode_chunks(
        self,
        chunks: Sequence[Chunk],
        n: int,
        params: SamplingParams,
        *,
        rescue_ids: Sequence[int] = (),
        rescue_tokens: int = 0,
    ) -> list[list[list[Completion]]]:
        if not self.held:
            self.folder.mkdir(parents=True, exist_ok=True)
            (self.folder / f"rank-{distributed.rank()}").touch()
            deadline = time.monotonic() + HOLD_S
            while (arrived := len(list(self.folder.glob("rank-*")))) < distributed.world_size():
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{arrived} of {distributed.world_size()} ranks got an engine call")
                time.sleep(0.02)
            self.held = True
        return super().decode_chunks(chunks, n, params, rescue_ids=rescue_ids, rescue_tokens=rescue_tokens)


def engine_for(config: RunConfig, hold: Path | None = None) -> TorchGenerationEngine:
    """The testbed engine of `config`'s batching on a GPT seeded alike on every rank (no warm-up needed:
    what is compared is who made which call, and the bits); held (FirstCallsTogether) in `hold`."""
    torch.manual_seed(0)
    model = GPT(config.model)
    batch_rows, shards = config.sampling.batch_rows, config.sampling.shards
    if hold is None:
        return TorchGenerationEngine(model, max_batch_rows=batch_rows, shards=shards)
    return FirstCallsTogether(model, hold, max_batch_rows=batch_rows, shards=shards)


def sample_step(ctx: StageContext, engine: TorchGenerationEngine) -> list[list[list[int]]]:
    """The sample stage's generation (its prompts, limits, sampling and seed) over the job's ranks: every
    prompt's responses, as every rank gets them back."""
    config, task = ctx.config, task_of(ctx)
    problems = task.batch(RL_STREAM, config.seed, ctx.update, config.prompts_per_update)
    prompts = [task.prompt_ids(problem) for problem in problems]
    limits = [response_budget(config.sampling, len(prompt)) for prompt in prompts]
    groups = generate_in_shards(
        ctx,
        Stage.SAMPLE,
        engine,
        prompts,
        config.group_size,
        sampling_params(ctx, task),
        ctx.seed(Stage.SAMPLE),
        limits,
    )
    return [[completion.ids for completion in group] for group in groups]


def generate_on_ranks(store_url: str, scratch: str) -> dict[int, list[list[list[int]]]]:
    """This rank's part of each recipe's sample step (a rank of the job: joins its group first); what it
    gets back, by the recipe's shards."""
    torch.set_num_threads(1)
    job_ranks().export()
    distributed.join()
    made = {}
    for shards in SHARDS:
        config = recipe(shards)
        ctx = StageContext(open_store(store_url), run_id(shards, WORLD), 0, config, Path(scratch))
        hold = Path(scratch) / f"first-calls-{shards}" if shards >= WORLD else None
        made[shards] = sample_step(ctx, engine_for(config, hold))
    distributed.leave()
    return made


def shards_made(store: ArtifactStore, run: str) -> dict[int, tuple[int, bytes]]:
    """Each committed shard of the run's sample step: the rank that made it, and its table."""
    indices = shard_indices(store.committed_stages(run, 0), Stage.SAMPLE)
    names = {index: shard_name(Stage.SAMPLE, index) for index in indices}
    return {
        index: (store.marker(run, 0, name)["summary"]["rank"], store.read_stage(run, 0, name)[SHARD_TABLE])
        for index, name in names.items()
    }


@pytest.mark.timeout(300)
def test_a_recipe_made_for_the_ranks_gives_each_a_call_and_commits_the_one_rank_bits(tmp_path):
    store_url = str(tmp_path / "store")
    executor = submitit.LocalExecutor(folder=tmp_path / "jobs")
    executor.update_parameters(tasks_per_node=WORLD, timeout_min=5)
    answers = executor.submit(generate_on_ranks, store_url, str(tmp_path / "scratch")).results()
    store = open_store(store_url)
    for shards in SHARDS:
        config = recipe(shards)
        one_rank = StageContext(store, run_id(shards, 1), 0, config, tmp_path)
        reference = sample_step(one_rank, engine_for(config))
        assert all(response for group in reference for response in group)  # nothing compared is empty
        assert [answer[shards] for answer in answers] == [reference] * WORLD  # every rank gets all back
        made, alone = shards_made(store, run_id(shards, WORLD)), shards_made(store, run_id(shards, 1))
        assert len(made) == sample_step_calls(config) == shards
        assert {i: table for i, (_, table) in made.items()} == {i: table for i, (_, table) in alone.items()}
        ranks = sorted(rank for rank, _ in made.values())
        if shards < WORLD:  # the recipe's calls, not the ranks, say how many ranks work
            assert len(set(ranks)) <= shards < WORLD
        else:
            assert ranks == list(range(WORLD))  # each rank one call


def test_the_two_node_preset_is_the_study_recipe_with_a_call_for_each_of_16_ranks():
    base = load_run_config(CONFIGS / "deepseekmath-7b-sft.yaml")
    two_nodes = load_run_config(CONFIGS / "deepseekmath-7b-sft-two-nodes.yaml")
    variant = calls_for_every_rank(base, 16)
    assert variant == {"shards": 16, "batch_rows": 32}
    made = base.model_copy(update={"sampling": base.sampling.model_copy(update=variant)})
    assert two_nodes.model_dump() == made.model_dump()  # nothing else of the recipe differs
    assert (sample_step_calls(base), sample_step_calls(two_nodes)) == (8, 16)
    assert calls_for_every_rank(two_nodes, 16) == variant  # made for 16 ranks already
    # probe at its full budget: prompts x max_pivots prefixes, continuations_per_pivot rows each
    prefixes = [0] * (base.prompts_per_update * base.algo.max_pivots)
    n = base.algo.continuations_per_pivot
    plans = {
        config.sampling.shards: chunk_plan(prefixes, n, config.sampling.batch_rows)
        for config in (base, two_nodes)
    }
    assert {shards: len(call_plan(len(plan), shards)) for shards, plan in plans.items()} == {8: 8, 16: 16}
    assert plans[8] != plans[16]  # other chunks: other random streams, so other samples than the base's


def test_a_recipe_of_fewer_prompts_than_ranks_has_no_variant_for_them():
    assert calls_for_every_rank(tiny_config(), 8) is None  # 4 prompts: a chunk holds one at least
    assert calls_for_every_rank(recipe(2), 4) == {"shards": 4, "batch_rows": 4}  # its chunks number 4
