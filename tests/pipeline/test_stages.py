"""Every stage on the CPU testbed, one run per algorithm, checked through what the store holds."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from probepo import spend
from probepo.algo.advantage import group_advantages, group_stats, redistribute, rloo_advantages
from probepo.data import build_task
from probepo.methods.inputs import Rollouts
from probepo.models.gpt import load_model
from probepo.presets import with_overrides
from probepo.report.summary import load_curves, write_report
from probepo.run.pipeline import train
from probepo.run.schedule import TRAINING_STAGES
from probepo.stages import warmup
from probepo.stages.context import StageContext
from probepo.stages.replay import FINGERPRINT
from probepo.stages.select import choose_pivots
from probepo.store import ArtifactStore, open_store
from probepo.store.formats import table_from_parquet, tensors_from_bytes
from tests.pipeline.conftest import tiny_config


def _tensors(store: ArtifactStore, run: str, update: int, stage: str, name: str) -> dict[str, torch.Tensor]:
    return tensors_from_bytes(store.read_stage(run, update, stage)[name])


@pytest.fixture(scope="module")
def runs(warm_store: ArtifactStore) -> dict[str, list[dict]]:
    return {
        algo: train(tiny_config(algo), f"stages-{algo}", store=warm_store)
        for algo in ("grpo", "probepo", "vineppo", "rloo")
    }


def test_every_stage_committed_once_per_update(runs, warm_store):
    for algo in runs:
        entries = warm_store.ledger_entries(f"stages-{algo}")
        assert {"checkpoint", "evaluate", *TRAINING_STAGES} <= set(entries[0])
        assert {"checkpoint", "evaluate", *TRAINING_STAGES} <= set(entries[1])
        # after the last update: the final policy, evaluated (its samples as the evaluate stage's shards)
        assert [s for s in entries[2] if ".shard-" not in s] == ["checkpoint", "evaluate"]
        for update, stages in entries.items():
            for stage in stages:
                outcomes = [a["outcome"] for a in warm_store.attempts(f"stages-{algo}", update, stage)]
                assert outcomes.count("committed") <= 1


def test_metrics_one_record_per_update(runs):
    for metrics in runs.values():
        assert [m["update"] for m in metrics] == [0, 1, 2]
        assert all("evaluate/accuracy" in m for m in metrics)
        assert 0.0 <= metrics[0]["sample/reward_mean"] <= 1.0


def test_rollouts_are_the_backbone_batch(runs, warm_store):
    table = table_from_parquet(warm_store.read_stage("stages-probepo", 0, "sample")["rollouts.parquet"])
    assert len(table["response_ids"]) == 16
    assert np.bincount(np.asarray(table["group"])).tolist() == [4, 4, 4, 4]
    assert set(np.asarray(table["reward"]).tolist()) <= {0.0, 1.0}


def test_grpo_probes_nothing(runs, warm_store):
    assert warm_store.marker("stages-grpo", 0, "probe")["summary"]["continuations"] == 0
    assert _tensors(warm_store, "stages-grpo", 0, "select", "pivots.safetensors")["pivot_pos"].numel() == 0


def test_rloo_probes_nothing_and_trains_each_response_on_its_leave_one_out_advantage(runs, warm_store):
    run = "stages-rloo"
    assert warm_store.marker(run, 0, "probe")["summary"]["continuations"] == 0
    table = table_from_parquet(warm_store.read_stage(run, 0, "sample")["rollouts.parquet"])
    rewards = torch.tensor(np.asarray(table["reward"]), dtype=torch.float64)
    expected = rloo_advantages(rewards, torch.tensor(np.asarray(table["group"]))).float()
    advantages = _tensors(warm_store, run, 0, "advantage", "advantages.safetensors")["advantages"]
    lengths = [len(r) for r in table["response_ids"]]
    for row, length in enumerate(lengths):
        assert torch.equal(advantages[row, :length], expected[row].expand(length))
        assert not advantages[row, length:].any()


def test_probepo_budget_and_token_mean(runs, warm_store):
    run = "stages-probepo"
    pivots = _tensors(warm_store, run, 0, "select", "pivots.safetensors")["pivot_pos"]
    per_group = (pivots >= 0).sum(1).view(4, 4).sum(1)
    assert (per_group <= 2).all()
    probe = warm_store.marker(run, 0, "probe")["summary"]
    assert probe["continuations"] == int((pivots >= 0).sum()) * 3
    # Probe continuations are measurements: the optimizer's batch is the 16 backbone responses.
    table = table_from_parquet(warm_store.read_stage(run, 0, "sample")["rollouts.parquet"])
    rewards = torch.tensor(np.asarray(table["reward"]), dtype=torch.float64)
    group = torch.tensor(np.asarray(table["group"]))
    advantages = _tensors(warm_store, run, 0, "advantage", "advantages.safetensors")["advantages"].double()
    assert advantages.shape[0] == 16
    lengths = torch.tensor([len(r) for r in table["response_ids"]])
    token_mean = advantages.sum(1) / lengths
    seq_adv = group_advantages(rewards, group)
    torch.testing.assert_close(token_mean, seq_adv, atol=1e-5, rtol=0)
    assert seq_adv.abs().sum() > 0  # the tiny recipe has mixed groups: a real learning signal
    mask = torch.arange(advantages.shape[1])[None, :] < lengths[:, None]
    assert (advantages - seq_adv[:, None])[mask].abs().max() > 1e-3  # the residual moved credit
    values = _tensors(warm_store, run, 0, "probe", "values.safetensors")
    mean, _ = group_stats(rewards, group)
    expected = (values["successes"] + 4.0 * mean[:, None]) / (values["trials"] + 4.0)
    present = pivots >= 0
    torch.testing.assert_close(values["values"][present], expected[present])


def test_vineppo_probes_every_boundary(runs, warm_store):
    run = "stages-vineppo"
    task = build_task(tiny_config().task)
    table = table_from_parquet(warm_store.read_stage(run, 0, "sample")["rollouts.parquet"])
    pivots = _tensors(warm_store, run, 0, "select", "pivots.safetensors")["pivot_pos"]
    for row, response in enumerate(table["response_ids"]):
        ends = task.step_end(list(response))
        assert {int(t) for t in pivots[row] if t >= 0} == {t for t in range(1, len(response)) if ends[t - 1]}
    assert warm_store.marker(run, 0, "probe")["summary"]["continuations"] == int((pivots >= 0).sum()) * 3


def test_vineppo_probes_groups_whose_responses_are_all_unfinished(tmp_path):
    """§6: every boundary of every response; the sparse selector's skip of all-unfinished groups does not
    apply to dense probing."""
    config = tiny_config("vineppo")
    task = build_task(config.task)
    cut = task.tokenizer.encode("0+1=1;1+2=0;0")  # cut at the length limit: no answer, no EOS
    done = [*task.tokenizer.encode("0+1=1;1+2=0;0+0=0;>0"), task.tokenizer.eos_id]
    rollouts = Rollouts(
        group=torch.tensor([0, 0, 1, 1]),
        prompts=[task.prompt_ids(task.problem(0, "train"))] * 4,
        responses=[cut, cut, done, cut],
        rewards=torch.tensor([0.0, 0.0, 1.0, 0.0], dtype=torch.float64),
        finished=torch.tensor([False, False, True, False]),
        problems=[task.problem(0, "train")] * 4,
    )
    ctx = StageContext(open_store(tmp_path), "unit", 0, config, tmp_path)
    pivots = choose_pivots(ctx, rollouts)
    assert [sorted(int(t) for t in row if t >= 0) for row in pivots] == [
        [6, 12],
        [6, 12],
        [6, 12, 18],
        [6, 12],
    ]
    random = with_overrides(tiny_config(), **{"algo.selector": "random"})  # reads no entropies
    sparse = choose_pivots(StageContext(open_store(tmp_path), "unit", 0, random, tmp_path), rollouts)
    assert not (sparse[:2] >= 0).any()  # ProbePO skips the group whose responses are all unfinished


def test_warmup_is_reused(warm_store):
    run_id = warmup.warmup_run_id(tiny_config())
    assert [a["outcome"] for a in warm_store.attempts(run_id, 0, "warmup")] == ["committed"]
    assert warm_store.marker(run_id, 0, "warmup")["summary"]["accuracy"] >= 0.0


def test_finished_run_is_a_no_op(runs, warm_store):
    before = len(warm_store.attempts("stages-grpo"))
    metrics = train(tiny_config("grpo"), "stages-grpo", store=warm_store)
    assert metrics == runs["grpo"]
    assert len(warm_store.attempts("stages-grpo")) == before


@pytest.mark.parametrize("override", [{"algo.max_pivots": 0}, {"algo.residual_weight": 0.0}])
def test_probepo_without_pivots_or_weight_trains_exactly_like_grpo(runs, warm_store, override):
    """Zero pivots (or λ = 0) recover GRPO end to end: the same final weights, bit for bit."""
    config = with_overrides(tiny_config("probepo"), **override)
    run = "stages-probepo-as-grpo-" + next(iter(override)).split(".")[1]
    train(config, run, store=warm_store)
    final = warm_store.read_stage(run, 2, "checkpoint")["model.safetensors"]
    assert final == warm_store.read_stage("stages-grpo", 2, "checkpoint")["model.safetensors"]
    assert final != warm_store.read_stage("stages-probepo", 2, "checkpoint")["model.safetensors"]


def test_evaluation_reports_sampled_and_greedy_accuracy(runs, warm_store):
    summary = warm_store.marker("stages-probepo", 1, "evaluate")["summary"]
    assert 0.0 <= summary["accuracy"] <= 1.0 and 0.0 <= summary["greedy_accuracy"] <= 1.0
    table = table_from_parquet(warm_store.read_stage("stages-probepo", 1, "evaluate")["eval.parquet"])
    assert np.mean(np.asarray(table["greedy_correct"])) == pytest.approx(summary["greedy_accuracy"])


def test_report_reads_costs_and_curves(runs, warm_store, tmp_path):
    curves = {algo: load_curves(warm_store, f"stages-{algo}") for algo in runs}
    for algo, c in curves.items():
        assert c.algorithm == algo and c.eval_updates == [0, 1, 2] and len(c.greedy) == 3
        assert c.eval_tokens[0] == 0.0 and c.eval_tokens[1:] == c.sampled_tokens
        assert c.eval_wall_s[1:] == c.wall_s and c.wall_s[0] > 0
        assert c.accuracy_at(2) == runs[algo][2]["evaluate/accuracy"]
    # Probes cost tokens; GRPO samples only the backbone (same prompts and seeds in both runs).
    assert curves["probepo"].sampled_tokens[0] > curves["grpo"].sampled_tokens[0]
    assert curves["vineppo"].sampled_tokens[0] > curves["probepo"].sampled_tokens[0]
    report = write_report(warm_store, [f"stages-{algo}" for algo in runs], tmp_path, title="t")
    text = report.read_text()
    assert "stages-vineppo" in text and "greedy (last)" in text
    assert (tmp_path / "curves.png").stat().st_size > 10_000


def test_a_longer_run_starts_as_the_shorter_one(runs, warm_store):
    # bench/science.py reads GRPO at update N off a run of 4N updates: its first N updates must be
    # exactly a run of N updates (batches and seeds derive from (seed, update), never from the horizon).
    train(tiny_config("grpo", num_updates=1), "horizon-1", store=warm_store)
    short = warm_store.read_stage("horizon-1", 1, "checkpoint")
    long = warm_store.read_stage("stages-grpo", 1, "checkpoint")
    assert short["model.safetensors"] == long["model.safetensors"]

    # the weights' fingerprint aside: the shorter run's last optimize commits its checkpoint (the weights,
    # equal above) instead, the longer run's uploads beside the next update and commits the fingerprint
    def without_timings(record: dict) -> dict:
        return {
            k: v
            for k, v in record.items()
            if not k.endswith(("wall_s", FINGERPRINT)) and not spend.is_spend_metric(k)
        }

    assert without_timings(warm_store.read_metrics("horizon-1")[0]) == without_timings(runs["grpo"][0])


def test_report_command_compares_runs_and_names_a_missing_one(runs, warm_store, tmp_path):
    from typer.testing import CliRunner

    from probepo.cli import app

    out = tmp_path / "report"
    args = ["report", "stages-grpo", "stages-probepo", "--store", warm_store.url, "--out", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "| stages-probepo | probepo |" in result.output and (out / "curves.png").exists()
    missing = CliRunner().invoke(app, ["report", "no-such-run", "--store", warm_store.url, "--out", str(out)])
    assert missing.exit_code == 2 and "no-such-run" in missing.output


@pytest.fixture(scope="module")
def variants(warm_store: ArtifactStore) -> dict[str, str]:
    """One-update runs down the code paths the default recipe does not take."""
    settings = {
        "random-groupstd": {"algo.selector": "random", "algo.residual_scale": "group_std"},
        "mixed-only": {"algo.probe_uniform_groups": False, "group_size": 2, "prompts_per_update": 8},
    }
    runs = {}
    for name, override in settings.items():
        runs[name] = f"variant-{name}"
        train(with_overrides(tiny_config("probepo", num_updates=1), **override), runs[name], store=warm_store)
    return runs


def _rollouts(store: ArtifactStore, run: str, update: int = 0):
    table = table_from_parquet(store.read_stage(run, update, "sample")["rollouts.parquet"])
    rewards = torch.tensor(np.asarray(table["reward"]), dtype=torch.float64)
    lengths = torch.tensor([len(r) for r in table["response_ids"]])
    return table, rewards, torch.tensor(np.asarray(table["group"])), lengths


def test_random_placement_ignores_step_boundaries(variants, warm_store):
    run = variants["random-groupstd"]
    table, _, _, lengths = _rollouts(warm_store, run)
    pivots = _tensors(warm_store, run, 0, "select", "pivots.safetensors")["pivot_pos"]
    assert ((pivots >= 0).sum(1).view(-1, 4).sum(1) <= 2).all()  # the budget per group holds
    present = pivots >= 0
    assert present.sum() > 0 and ((pivots >= 1) & (pivots < lengths[:, None]))[present].all()
    task = build_task(tiny_config().task)
    after_a_boundary = [
        task.step_end(list(table["response_ids"][row]))[int(pivots[row, slot]) - 1]
        for row, slot in present.nonzero().tolist()
    ]
    assert not all(after_a_boundary)  # the entropy selector places pivots after boundaries only


def test_group_std_residual_scale_divides_the_residual(variants, warm_store):
    run = variants["random-groupstd"]
    _, rewards, group, lengths = _rollouts(warm_store, run)
    pivots = _tensors(warm_store, run, 0, "select", "pivots.safetensors")["pivot_pos"]
    values = _tensors(warm_store, run, 0, "probe", "values.safetensors")["values"]
    mask = torch.arange(int(lengths.max()))[None, :] < lengths[:, None]
    mean, std = group_stats(rewards, group)
    seq_adv = group_advantages(rewards, group)
    expected = redistribute(seq_adv, rewards, mean, mask, pivots, values, scale=std.clamp_min(0.1))
    got = _tensors(warm_store, run, 0, "advantage", "advantages.safetensors")["advantages"]
    torch.testing.assert_close(got, expected.float())
    unscaled = redistribute(seq_adv, rewards, mean, mask, pivots, values).float()
    assert (got - unscaled).abs().max() > 1e-3


def test_uniform_groups_are_not_probed_when_told(variants, warm_store):
    run = variants["mixed-only"]
    _, rewards, group, _ = _rollouts(warm_store, run)
    pivots = _tensors(warm_store, run, 0, "select", "pivots.safetensors")["pivot_pos"]
    _, std = group_stats(rewards, group)
    assert (std == 0).any() and (std > 0).any()  # both kinds of group are there to tell apart
    probed = (pivots >= 0).any(1)
    assert not probed[std == 0].any() and probed[std > 0].any()


def test_vineppo_values_are_plain_monte_carlo(runs, warm_store):
    """VinePPO's κ = 0 in the probe stage, whatever algo.kappa says (tiny_config keeps κ = 4)."""
    values = _tensors(warm_store, "stages-vineppo", 0, "probe", "values.safetensors")
    probed = values["trials"] > 0
    assert probed.any()
    torch.testing.assert_close(values["values"][probed], (values["successes"] / values["trials"])[probed])


def _greedy_reference(model, prompt: list[int], max_tokens: int, eos: int) -> list[int]:
    """Greedy decoding one token at a time with a full forward pass each: no cache, no batching."""
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(max_tokens):
            token = int(model(torch.tensor([ids]))[0, -1].argmax())
            ids.append(token)
            if token == eos:
                break
    return ids[len(prompt) :]


def test_greedy_evaluation_is_greedy(runs, warm_store, tmp_path):
    run = "stages-probepo"
    for name in ("model.safetensors", "config.json"):
        warm_store.download_stage_file(run, 1, "checkpoint", name, tmp_path / name)
    model = load_model(tmp_path).eval()
    config = tiny_config()
    task = build_task(config.task)
    problems = [task.problem(i, "eval") for i in range(config.eval.problems)]
    expected = [
        task.verify(
            task.tokenizer.decode(
                _greedy_reference(
                    model, task.prompt_ids(p), config.sampling.max_tokens, task.tokenizer.eos_id
                )
            ),
            p,
        )
        for p in problems
    ]
    table = table_from_parquet(warm_store.read_stage(run, 1, "evaluate")["eval.parquet"])
    assert np.asarray(table["greedy_correct"]).tolist() == expected


def test_sampling_context_caps_prompt_plus_response_and_the_probe_rescue(warm_store):
    """R1-Distill's binding 2K context, in small: every response fits `sampling.context` with its prompt,
    and every probe with its prefix and rescue (VinePPO probes every step of these cut responses)."""
    context, margin = 20, tiny_config().algo.margin
    train(
        tiny_config("vineppo", num_updates=1, sampling={"context": context}), "stages-ctx", store=warm_store
    )
    table = table_from_parquet(warm_store.read_stage("stages-ctx", 0, "sample")["rollouts.parquet"])
    totals = [len(p) + len(r) for p, r in zip(table["prompt_ids"], table["response_ids"], strict=True)]
    assert max(totals) == context and set(table["finish_reason"]) == {"length"}  # all cut
    probe = warm_store.marker("stages-ctx", 0, "probe")["summary"]
    # each continuation: at most context - prompt - pivot position (>= margin) tokens, the rescue included
    shortest = min(len(p) for p in table["prompt_ids"])
    assert probe["rescued_fraction"] == 1 and probe["tokens"] <= probe["continuations"] * (
        context - shortest - margin
    )
    with pytest.raises(ValueError, match=r"sampling\.context = 4 leaves no room"):
        train(tiny_config(num_updates=1, sampling={"context": 4}), "stages-no-room", store=warm_store)
