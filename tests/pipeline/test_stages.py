"""Every stage on the CPU testbed, one run per algorithm, checked through what the store holds."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from probepo.algo.advantage import group_advantages, group_stats
from probepo.config import with_overrides
from probepo.data import build_task
from probepo.pipeline import train
from probepo.report import load_curves, write_report
from probepo.stages import TRAINING_STAGES, warmup
from probepo.store import ArtifactStore
from probepo.store.formats import table_from_parquet, tensors_from_bytes
from tests.pipeline.conftest import tiny_config


def _tensors(store: ArtifactStore, run: str, update: int, stage: str, name: str) -> dict[str, torch.Tensor]:
    return tensors_from_bytes(store.read_stage(run, update, stage)[name])


@pytest.fixture(scope="module")
def runs(warm_store: ArtifactStore) -> dict[str, list[dict]]:
    return {
        algo: train(tiny_config(algo), f"stages-{algo}", store=warm_store)
        for algo in ("grpo", "probepo", "vineppo")
    }


def test_every_stage_committed_once_per_update(runs, warm_store):
    for algo in runs:
        entries = warm_store.ledger_entries(f"stages-{algo}")
        assert {"checkpoint", "evaluate", *TRAINING_STAGES} <= set(entries[0])
        assert {"checkpoint", "evaluate", *TRAINING_STAGES} <= set(entries[1])
        assert entries[2] == ["checkpoint", "evaluate"]  # after the last update: the final policy, evaluated
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
    finished = np.asarray(table["finish_reason"]) == "stop"
    group = np.asarray(table["group"])
    for row, response in enumerate(table["response_ids"]):
        ends = task.step_end(list(response))
        boundaries = {t for t in range(1, len(response)) if ends[t - 1]}
        chosen = {int(t) for t in pivots[row] if t >= 0}
        # Every boundary, except in groups whose responses are all unfinished (skipped).
        assert chosen == (boundaries if finished[group == group[row]].any() else set())
    assert warm_store.marker(run, 0, "probe")["summary"]["continuations"] == int((pivots >= 0).sum()) * 3


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

    def without_timings(record: dict) -> dict:
        return {k: v for k, v in record.items() if not k.endswith("wall_s")}

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
