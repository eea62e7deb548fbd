"""Checkpoint retention (probepo/store/retention.py, the profile's `retention`): what a run keeps of its
full checkpoints, the markers of a partial deletion, a killed run resumed bitwise, and the evaluations
seeing only the weights kept."""

from __future__ import annotations

import signal

import pytest
import yaml

from probepo.config import CheckpointSelection, Retention
from probepo.data.benchmarks import AVG6_BENCHMARKS
from probepo.run.evaluations import missing, retain_checkpoints
from probepo.run.faults import STOP_ENV
from probepo.run.pipeline import train
from probepo.run.preemption import Preempted
from probepo.store import open_store
from probepo.store.keys import RunLayout
from probepo.store.retention import holds, is_part, plan_retention, prune_parts
from tests.pipeline.conftest import FINAL_FILES, tiny_config, train_cli
from tests.pipeline.test_evaluations import math_run

UPDATES = 10
RETAIN = Retention(optimizer_last=1, weights_every=4)
"""10 updates, a full checkpoint every 2: the optimizer state of the last one, the weights of every 4th."""
EXPECTED = {0: "weights", 2: "record", 4: "weights", 6: "record", 8: "weights", 10: "full"}
WEIGHTS = {"config.json", "model.safetensors", "trainer.json"}


def test_the_plan_keeps_the_last_optimizer_states_and_every_mth_weights():
    full = dict.fromkeys(range(0, 11, 2), "full")
    assert plan_retention(full, RETAIN) == {u: h for u, h in EXPECTED.items() if h != "full"}
    pending = {0: "weights", 2: "record", 4: "weights", 6: "weights", 8: "weights"}  # 6 awaits an evaluation
    assert plan_retention(full, RETAIN, pending=[6]) == pending
    two = Retention(optimizer_last=2, weights_every=4)
    assert plan_retention(full, two) == {0: "weights", 2: "record", 4: "weights", 6: "record"}
    assert plan_retention(EXPECTED, RETAIN) == {}  # nothing more to prune, nothing restored
    assert plan_retention(full, Retention()) == {}  # the default keeps everything
    assert plan_retention({**EXPECTED, 12: "full"}, RETAIN) == {10: "record"}


def _checkpoint_files(store, run_id: str) -> dict[int, set[str]]:
    """The files of each checkpoint the store holds, by listing its objects (not by reading markers)."""
    found: dict[int, set[str]] = {}
    root = f"runs/{run_id}/checkpoints/"
    for info in store.objects.list(root):
        update, *_, name = info.key[len(root) :].split("/")
        found.setdefault(int(update), set()).add(name)
    return found


@pytest.mark.integration
def test_a_retained_run_keeps_exactly_what_it_says_and_resumes_bitwise_after_a_kill(warm_store, tmp_path):
    config = tiny_config("probepo", num_updates=UPDATES, checkpoint_every=2)
    train(config, "retain-none", store=warm_store)  # the reference: every checkpoint whole
    preset, profile = tmp_path / "recipe.yaml", tmp_path / "profile.yaml"
    preset.write_text(yaml.safe_dump(config.model_dump(mode="json")))
    profile.write_text(yaml.safe_dump({"retention": RETAIN.model_dump(mode="json")}))

    # Killed right after checkpoint 8 landed (uploaded beside update 8), before the driver pruned: 6 is the
    # last pruned pass's
    assert (
        train_cli(warm_store.url, preset, "retain", "8:checkpoint.upload:landed", profile=profile)
        == -signal.SIGKILL
    )
    markers = {u: warm_store.marker("retain", u, "checkpoint") for u in range(0, 9, 2)}
    assert {u: holds(m) for u, m in markers.items()} == {0: "weights", 2: "record", 4: "weights", 6: "full",
                                                         8: "full"}  # fmt: skip
    assert train_cli(warm_store.url, preset, "retain", None, profile=profile) == 0

    assert {u: holds(warm_store.marker("retain", u, "checkpoint")) for u in EXPECTED} == EXPECTED
    kept = {"full": WEIGHTS | {"optimizer.safetensors"}, "weights": WEIGHTS, "record": set()}
    assert _checkpoint_files(warm_store, "retain") == {u: kept[h] for u, h in EXPECTED.items() if kept[h]}
    report = warm_store.verify("retain")
    assert report.problems == [] and report.stages > 0
    final, reference = (
        warm_store.read_stage(run, UPDATES, "checkpoint") for run in ("retain", "retain-none")
    )
    assert {name: final[name] for name in FINAL_FILES} == {name: reference[name] for name in FINAL_FILES}
    pruned = warm_store.marker("retain", 6, "checkpoint")["pruned"]
    assert pruned["kept"] == "record" and set(pruned["files"]) == kept["full"]

    # The evaluations see only the checkpoints that kept their weights.
    selection = CheckpointSelection(runs=("retain",))
    assert [r.checkpoint for r in missing(warm_store, ["heldout"], selection)] == [0, 4, 8, 10]


@pytest.mark.integration
def test_weights_the_nightly_has_still_to_evaluate_are_kept_unless_told(warm_store):
    sparse = {**tiny_config().eval.model_dump(), "every": 100}  # evaluated in the run at 0 and 4 only
    train(tiny_config(num_updates=4, eval=sparse, store=warm_store.url), "retain-pending", store=warm_store)
    rarely = Retention(optimizer_last=1, weights_every=100)
    report = retain_checkpoints(warm_store, "retain-pending", rarely, dry_run=True)
    assert report.pruned == dict.fromkeys(range(4), "weights")  # 0: every 100th; 1-3 await the nightly
    latest_only = rarely.model_copy(update={"pending_evaluation": CheckpointSelection(latest=True)})
    pruned = retain_checkpoints(warm_store, "retain-pending", latest_only).pruned
    assert pruned == {0: "weights", 1: "record", 2: "record", 3: "record"}  # the nightly reads only 4
    assert warm_store.verify("retain-pending").problems == []


def test_by_default_a_maths_run_keeps_the_weights_its_six_benchmarks_still_have_to_read(tmp_path):
    """The default guard follows the nightly's default, a run's own recipe's suites: a maths run's six
    benchmarks (not its held-out split, which its evaluate stage never scores)."""
    store = open_store(tmp_path / "store")
    math_run(store, "retain-math", updates=(0, 1, 2, 3), evaluated_in_run=(0,))
    for name in AVG6_BENCHMARKS:  # 1 evaluated on all six after the fact, 2 on all but AIME24
        store.record_evaluation("retain-math", 1, name, {"mean": 0.5})
        if name != "aime24":
            store.record_evaluation("retain-math", 2, name, {"mean": 0.5})
    rarely = Retention(optimizer_last=1, weights_every=100)
    assert rarely.evaluation_suites is None
    pruned = retain_checkpoints(store, "retain-math", rarely, dry_run=True).pruned
    assert pruned == {0: "weights", 1: "record", 2: "weights"}  # 2 awaits its AIME24; 3 is the latest, whole
    on_heldout = rarely.model_copy(update={"evaluation_suites": ("heldout",)})  # what it used to guard
    pruned = retain_checkpoints(store, "retain-math", on_heldout, dry_run=True).pruned
    assert pruned == dict.fromkeys(range(3), "weights")


def test_an_updates_optimizer_parts_go_once_its_optimize_and_checkpoint_are_committed(
    warm_store, monkeypatch
):
    """A part (the optimizer's resume point, committed when a stop is asked mid-optimizer) is pruned by the
    driver once the resumed optimize is committed, the marker rewritten first; `store verify` passes; a
    pruned part is never loaded (an optimize invalidated with its checkpoint runs its optimizer whole) and
    the run ends bitwise as before."""
    config = tiny_config("probepo")  # 3 mini-batches
    monkeypatch.setenv(STOP_ENV, "1:optimize.minibatch-0000:done")
    with pytest.raises(Preempted, match="mini-batch 0 of update 1; progress committed"):
        train(config, "parts", store=warm_store)
    assert warm_store.marker("parts", 1, "optimize.part-0000")["files"]
    monkeypatch.delenv(STOP_ENV)
    train(config, "parts", store=warm_store)
    layout = RunLayout("parts")
    for update in range(config.num_updates):
        parts = [s for s in warm_store.committed_stages("parts", update) if is_part(s)]
        assert parts == (["optimize.part-0000"] if update == 1 else [])  # a stop's only
        for part in parts:
            marker = warm_store.marker("parts", update, part)
            assert marker["files"] == {} and marker["pruned"]["kept"] == "record"
            folder = layout.attempt_dir(update, part, marker["attempt"])
            gone = set(marker["pruned"]["files"])
            assert gone and not {info.key[len(folder) :] for info in warm_store.objects.list(folder)} & gone
    assert prune_parts(warm_store, "parts").pruned == {}  # nothing left to prune
    assert warm_store.verify("parts").problems == []
    final = warm_store.read_stage("parts", config.num_updates, "checkpoint")["model.safetensors"]
    warm_store.invalidate("parts", 1, "optimize", force=True)
    warm_store.invalidate("parts", 2, "checkpoint", force=True)
    train(config, "parts", store=warm_store)
    [rerun] = [a for a in warm_store.attempts("parts", 1, "optimize") if a.get("outcome") == "committed"][-1:]
    assert rerun["resumed_at_minibatch"] == 0 and rerun["minibatches_run"] == 3
    assert warm_store.read_stage("parts", config.num_updates, "checkpoint")["model.safetensors"] == final
