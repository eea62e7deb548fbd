"""The engines' phases on a GPU they share (probepo/stages/policy.py: PolicyEngines): the generator sleeps
before the trainer is asked, and wakes — its weights' memory, policy k's weights, then its KV cache — before
it generates. Driven over the stages of updates and over resumes, on fakes that refuse what a phase forbids:
a generate while asleep, a load into weights not awake, a trainer at work beside an awake generator. Then
VLLMGenerationEngine's sleep and wake calls against a stub of vLLM's `LLM` with the signatures of vLLM 0.32's
source (vllm/entrypoints/llm.py:836 `sleep(self, level: int = 1, mode: PauseMode = "abort")`, :869
`wake_up(self, tags: list[str] | None = None) -> bool`; vLLM is not installed here)."""

from __future__ import annotations

import sys
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch

from probepo.engines.base import SamplingParams
from probepo.stages import policy
from probepo.stages.committed import at_update
from probepo.stages.context import StageContext
from probepo.stages.location import Committed
from probepo.stages.policy import PolicyEngines
from tests.unit.test_policy_location import NoStore, context


class PhaseError(AssertionError):
    """An engine used in a phase that forbids it."""


@dataclass
class Gpu:
    """What the engines share: the log of what each did, in order, and the generator, which a trainer at
    work checks is asleep."""

    log: list[str] = field(default_factory=list)
    generator: Generator | None = None

    def trainer_works(self, what: str) -> None:
        if self.generator is not None and not self.generator.asleep:
            raise PhaseError(f"the trainer {what} beside an awake generator")
        self.log.append(what)


@dataclass
class Generator:
    """A generation engine whose policy is a number; asleep it refuses to generate, and `keeps_weights`
    False (vLLM's level 2 on a GPU) makes sleep discard its weights."""

    gpu: Gpu
    keeps_weights: bool
    handoff = "handoff_memory"
    policy: int | None = None
    asleep = False
    weights_awake = True

    def generate(self) -> int:
        if self.asleep or self.policy is None:
            raise PhaseError(f"a generate while {'asleep' if self.asleep else 'holding no policy'}")
        self.gpu.log.append(f"generate {self.policy}")
        return self.policy

    def load_weights(self, source: Path | dict[str, torch.Tensor]) -> None:
        if not self.weights_awake:
            raise PhaseError("weights loaded into memory not awake")
        self.policy = int(source["policy"]) if isinstance(source, dict) else int(source.name)
        self.gpu.log.append(f"load {self.policy}")

    def sleep(self) -> bool:
        if self.asleep:
            raise PhaseError("asleep twice")
        self.asleep, self.weights_awake = True, self.keeps_weights
        if not self.keeps_weights:
            self.policy = None
        self.gpu.log.append("sleep")
        return self.keeps_weights

    @contextmanager
    def waking(self) -> Iterator[None]:
        if not self.asleep:
            raise PhaseError("woken while awake")
        self.weights_awake = True
        self.gpu.log.append("wake weights")
        yield
        self.asleep = False
        self.gpu.log.append("wake kv_cache")


@dataclass
class Trainer:
    """A trainer engine on policy `policy`; its memory comes at construction, and all its work is checked
    against the generator's phase."""

    gpu: Gpu
    policy: int

    def __post_init__(self) -> None:
        self.gpu.trainer_works(f"trainer on {self.policy} built")

    @contextmanager
    def live_weights(self) -> Iterator[dict[str, torch.Tensor]]:
        yield {"policy": torch.tensor(self.policy)}

    def score(self) -> None:
        self.gpu.trainer_works(f"score {self.policy}")

    def train_step(self) -> None:
        self.gpu.trainer_works(f"train {self.policy}")
        self.policy += 1


Stage = Callable[[PolicyEngines, StageContext], None]


def generating(engines: PolicyEngines, ctx: StageContext) -> None:
    """sample, probe, evaluate: the generator on policy k generates."""
    assert engines.generator(ctx).generate() == ctx.update


def score(engines: PolicyEngines, ctx: StageContext) -> None:
    engines.trainer(ctx, optimizer_state=False).score()


def on_cpu(_: PolicyEngines, __: StageContext) -> None:
    """select, advantage: no engine."""


def optimize(engines: PolicyEngines, ctx: StageContext) -> None:
    """As probepo/stages/optimize.py: the trainer on policy k, released while it changes, makes k + 1."""
    trainer = engines.trainer(ctx, optimizer_state=True)
    engines.release_trainer(ctx)
    trainer.train_step()
    engines.trainer_made(ctx, trainer, ctx.update + 1)


UPDATE: list[tuple[str, Stage]] = [
    ("sample", generating),
    ("score", score),
    ("select", on_cpu),
    ("probe", generating),
    ("advantage", on_cpu),
    ("optimize", optimize),
]


def run_updates(engines: PolicyEngines, ctx: StageContext, updates: range, *, start: int = 0) -> None:
    """The stages of `updates` in order (the first from stage `start`), then evaluate of the last policy."""
    for k in updates:
        for _, stage in UPDATE[start if k == updates.start else 0 :]:
            stage(engines, at_update(ctx, k))
    generating(engines, at_update(ctx, updates.stop))


def shared_gpu(monkeypatch: pytest.MonkeyPatch, *, keeps_weights: bool) -> Gpu:
    """One GPU whose generator is built on first use."""
    shared = Gpu()

    def new_generator(*_: Any) -> Generator:
        assert shared.generator is None, "one generator per process"
        shared.generator = Generator(shared, keeps_weights)
        shared.log.append("generator built")
        return shared.generator

    monkeypatch.setattr(policy, "new_generator", new_generator)
    return shared


@pytest.fixture
def gpu(monkeypatch: pytest.MonkeyPatch) -> Gpu:
    """A GPU whose generator discards its weights asleep (vLLM's level 2)."""
    return shared_gpu(monkeypatch, keeps_weights=False)


def test_an_update_on_a_shared_gpu_sleeps_the_generator_whenever_the_trainer_works(
    gpu: Gpu, tmp_path: Path
) -> None:
    """Checkpoint 0, updates 0 and 1, evaluate: each hand-off is policy k's, into a generator whose weights
    alone are awake, and nothing generates nor trains out of its phase (the fakes would raise)."""
    engines, ctx = PolicyEngines(), context(NoStore(), tmp_path)
    engines.trainer_made(ctx, Trainer(gpu, 0), 0)  # checkpoint 0

    def woken(k: int) -> tuple[str, ...]:
        return ("wake weights", f"load {k}", "wake kv_cache", f"generate {k}")

    run_updates(engines, ctx, range(2))
    assert gpu.log == [
        "trainer on 0 built",
        *("generator built", "load 0", "generate 0"),  # sample
        *("sleep", "score 0", *woken(0)),  # score, probe
        *("sleep", "train 0", *woken(1)),  # optimize, update 1's sample
        *("sleep", "score 1", *woken(1)),
        *("sleep", "train 1", *woken(2)),  # optimize, evaluate policy 2
    ]


def test_a_generator_that_keeps_its_weights_takes_one_hand_off_per_update(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The torch engines (and vLLM on CPU) keep their weights asleep: policy k is handed off once per update,
    as before the phases, and probe generates on the weights sample was given."""
    gpu = shared_gpu(monkeypatch, keeps_weights=True)
    engines, ctx = PolicyEngines(), context(NoStore(), tmp_path)
    engines.trainer_made(ctx, Trainer(gpu, 0), 0)
    run_updates(engines, ctx, range(2))
    assert [line for line in gpu.log if line.startswith("load")] == ["load 0", "load 1", "load 2"]
    assert gpu.log.count("generate 0") == gpu.log.count("generate 1") == 2


class Store:
    """The store's facts about policy k as `committed_policy` reports them, and its folders: checkpoints
    `full` are full, the updates between them uncommitted (`checkpoint_every` > 1)."""

    url = "memory://store"

    def __init__(self, monkeypatch: pytest.MonkeyPatch, gpu: Gpu, root: Path, full: set[int]) -> None:
        self.gpu, self.root, self.full = gpu, root, full
        monkeypatch.setattr(policy, "committed_policy", self.committed)
        monkeypatch.setattr(policy, "fetch_policy", self.fetch)
        monkeypatch.setattr(policy, "load_trainer", self.load_trainer)
        monkeypatch.setattr(policy, "restore_trainer", self.replay)

    def committed(self, ctx: StageContext) -> Committed:
        return Committed(
            "full" if ctx.update in self.full else None, max(c for c in self.full if c <= ctx.update)
        )

    def fetch(self, ctx: StageContext, *, optimizer_state: bool) -> Path:
        folder = self.root / str(ctx.update)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "model.safetensors").write_bytes(b"w")
        return folder

    def load_trainer(self, _: Any, folder: Path, *, optimizer_state: bool) -> Trainer:
        return Trainer(self.gpu, int(folder.name))

    def replay(self, ctx: StageContext, full: int) -> Trainer:
        trainer = Trainer(self.gpu, full)
        for _ in range(full, ctx.update):
            trainer.train_step()
        return trainer


def test_a_resume_at_a_full_checkpoint_loads_each_engine_while_the_other_sleeps(
    gpu: Gpu, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new process resumes update 2 at its sample: the generator reads checkpoint 2, the scoring trainer
    its weights once the generator sleeps, the full trainer after (optimize), each beside a sleeping one."""
    store = Store(monkeypatch, gpu, tmp_path / "store", full={0, 2})
    run_updates(PolicyEngines(), context(store, tmp_path), range(2, 3))
    assert gpu.log == [
        *("generator built", "load 2", "generate 2"),  # sample: checkpoint 2's weights
        *("sleep", "trainer on 2 built", "score 2"),  # its weights alone
        *("wake weights", "load 2", "wake kv_cache", "generate 2"),  # probe: the scoring trainer's
        *("sleep", "trainer on 2 built", "train 2"),  # optimize: the full checkpoint
        *("wake weights", "load 3", "wake kv_cache", "generate 3"),  # evaluate policy 3
    ]


def test_a_replay_never_runs_beside_an_awake_generator(
    gpu: Gpu, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Policy 3 was never committed (checkpoint 2 is the latest full one): a process resumed at update 3's
    probe replays optimize 2, and one whose generator holds policy 2 puts it to sleep first."""
    store = Store(monkeypatch, gpu, tmp_path / "store", full={0, 2})
    engines, ctx = PolicyEngines(), context(store, tmp_path, update=2)
    generating(engines, ctx)  # the generator awake on checkpoint 2
    run_updates(engines, ctx, range(3, 4), start=3)  # from update 3's probe
    assert gpu.log == [
        *("generator built", "load 2", "generate 2"),
        *("sleep", "trainer on 2 built", "train 2"),  # the replay of optimize 2
        *("wake weights", "load 3", "wake kv_cache", "generate 3"),  # probe 3
        *("sleep", "train 3"),
        *("wake weights", "load 4", "wake kv_cache", "generate 4"),
    ]


def test_a_resume_at_a_replay_builds_the_generator_on_the_replayed_policy(
    gpu: Gpu, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new process resumed at update 1's score, policy 1 never committed: the replay comes first, with no
    generator yet, which is then built on the replayed policy."""
    store = Store(monkeypatch, gpu, tmp_path / "store", full={0})
    run_updates(PolicyEngines(), context(store, tmp_path), range(1, 2), start=1)  # from update 1's score
    assert gpu.log == [
        *("trainer on 0 built", "train 0", "score 1"),  # a replay of optimize 0: no generator yet
        *("generator built", "load 1", "generate 1"),
        *("sleep", "train 1"),
        *("wake weights", "load 2", "wake kv_cache", "generate 2"),
    ]


# VLLMGenerationEngine against a stub of vllm.LLM


class StubLLM:
    """vllm.LLM's sleep and wake calls as 0.32 has them (vllm/entrypoints/llm.py:836, 869), recording each;
    after level 1 or 2 the executor sleeps with tags {"weights", "kv_cache"} (vllm/v1/executor/abstract.py:37,
    389) and `wake_up` says whether none is left (vllm/v1/engine/core.py:1016)."""

    calls: list[str]

    def __init__(self, **options: Any) -> None:
        self.options = options
        self.sleeping: set[str] = set()
        model_config = types.SimpleNamespace(get_vocab_size=lambda: 16, max_model_len=64)
        self.llm_engine = types.SimpleNamespace(model_config=model_config)

    def sleep(self, level: int = 1, mode: str = "abort") -> None:
        self.calls.append(f"sleep(level={level}, mode={mode})")
        if level >= 1:
            self.sleeping = {"weights", "kv_cache"}

    def wake_up(self, tags: list[str] | None = None) -> bool:
        self.calls.append(f"wake_up(tags={tags})")
        self.sleeping -= set(tags) if tags is not None else self.sleeping
        return not self.sleeping

    def collective_rpc(self, method: str, args: tuple[Any, ...] = ()) -> list[Any]:
        self.calls.append(f"collective_rpc({method})")
        return [None]

    def reset_prefix_cache(self, reset_running_requests: bool = False, reset_connector: bool = False) -> bool:
        self.calls.append("reset_prefix_cache()")
        return True


def stub_engine(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, *, gpu: bool) -> tuple[Any, list[str]]:
    """A VLLMGenerationEngine on StubLLM, on a platform with sleep mode (a GPU) or without (the CPU)."""
    calls: list[str] = []
    vllm = types.ModuleType("vllm")
    vllm.LLM = type("LLM", (StubLLM,), {"calls": calls})  # type: ignore[attr-defined]
    vllm.SamplingParams = types.SimpleNamespace  # type: ignore[attr-defined]
    platforms = types.ModuleType("vllm.platforms")
    platforms.current_platform = types.SimpleNamespace(is_sleep_mode_available=lambda: gpu)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setitem(sys.modules, "vllm.platforms", platforms)
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append("torch.cuda.empty_cache()"))
    from probepo.engines.vllm_engine import VLLMGenerationEngine

    return VLLMGenerationEngine(tmp_path, scratch=tmp_path / "scratch"), calls


def test_vllm_sleeps_at_level_2_and_wakes_its_weights_then_the_hand_off_then_its_kv_cache(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    engine, calls = stub_engine(monkeypatch, tmp_path, gpu=True)
    assert engine.llm.options["enable_sleep_mode"] is True
    assert engine.sleep() is False  # the weights are gone
    with engine.waking():
        engine.load_weights({"w": torch.zeros(2)})
    assert calls == [
        "sleep(level=2, mode=abort)",
        "torch.cuda.empty_cache()",
        "wake_up(tags=['weights'])",
        "collective_rpc(load_policy)",
        "reset_prefix_cache()",
        "wake_up(tags=['kv_cache'])",
    ]


def test_vllm_asleep_refuses_to_generate_or_load(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Asleep, vLLM's scheduler is paused (a generate would wait for good) and its weights unmapped."""
    engine, calls = stub_engine(monkeypatch, tmp_path, gpu=True)
    engine.sleep()
    with pytest.raises(RuntimeError, match="cannot load weights while vLLM's weights sleep"):
        engine.load_weights({"w": torch.zeros(2)})
    with pytest.raises(RuntimeError, match="cannot generate while vLLM's kv_cache sleep"), engine.waking():
        engine.generate([[1, 2]], 1, SamplingParams(max_tokens=8), seed=0)
    assert calls == ["sleep(level=2, mode=abort)", "torch.cuda.empty_cache()", "wake_up(tags=['weights'])"]


def test_vllm_still_asleep_after_waking_is_an_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    engine, _ = stub_engine(monkeypatch, tmp_path, gpu=True)
    engine.sleep()
    engine.llm.sleeping.add("scheduling")  # what a wake of both tags would leave, were vLLM to disagree
    with pytest.raises(RuntimeError, match="still asleep"), engine.waking():
        pass


def test_vllm_on_cpu_has_no_sleep_mode_and_keeps_everything(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """vLLM 0.32 refuses enable_sleep_mode on CPU (vllm/config/model.py:655-657): never asked for there."""
    engine, calls = stub_engine(monkeypatch, tmp_path, gpu=False)
    assert engine.llm.options["enable_sleep_mode"] is False
    assert engine.sleep() is True
    with engine.waking():
        pass
    assert calls == []
