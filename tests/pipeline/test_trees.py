"""The tree baselines end to end on the tiny recipe (BASELINES.md): the trees sample stage commits, every
sampled token counted once and trained on through the training rows, and a run killed inside the tree's
sampling or between sample's commit and advantage's resumes bitwise."""

from __future__ import annotations

import signal
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from probepo.config import RunConfig
from probepo.methods.advantages import LOSS_MASK
from probepo.run.pipeline import train
from probepo.run.schedule import ADVANTAGES, ROLLOUTS, SCORES, TREE
from probepo.store import ArtifactStore
from probepo.store.formats import table_from_parquet, tensors_from_bytes
from tests.pipeline.conftest import FINAL_FILES, tiny_config, train_cli

pytestmark = pytest.mark.integration

TREE_FIELDS = {
    # tiny responses are ~21 tokens: SPO-tree 2-2 over segments of 10 (4 leaves, the tiny group size),
    # TreePO segments of 6, at most 5 deep, 4 leaves a prompt.
    "spo_tree": {"spo_branching": (2, 2), "spo_segment_tokens": 10},
    "treepo": {"treepo_segment_tokens": 6, "treepo_depth": 5, "treepo_width": 4},
}
# a kill inside the tree's growth (after a shard of one of its first engine calls) and one between
# sample's commit and advantage's
CRASHES = {
    "spo_tree": ("0:sample.level-01.shard-0000:after-commit", "0:score:after-commit"),
    "treepo": ("0:sample.step-02-n2.shard-0000:after-commit", "0:score:after-commit"),
}


def tree_config(algorithm: str) -> RunConfig:
    config = tiny_config(algorithm)
    return config.model_copy(update={"algo": config.algo.model_copy(update=TREE_FIELDS[algorithm])})


@pytest.fixture(scope="module", params=sorted(TREE_FIELDS))
def finished(request, warm_store: ArtifactStore) -> tuple[str, ArtifactStore, str]:
    algorithm = request.param
    run_id = f"tree-{algorithm.replace('_', '-')}"
    train(tree_config(algorithm), run_id, store=warm_store)
    return algorithm, warm_store, run_id


def test_every_sampled_token_is_in_one_segment_and_trained_on(finished):
    algorithm, store, run_id = finished
    for update in (0, 1):
        sample = store.read_stage(run_id, update, "sample")
        rollouts, tree = table_from_parquet(sample[ROLLOUTS]), table_from_parquet(sample[TREE])
        responses = [list(map(int, r)) for r in rollouts["response_ids"]]
        parent, row, span_row = (list(map(int, tree[c])) for c in ("parent", "row", "span_row"))
        start, end, depth = (list(map(int, tree[c])) for c in ("start", "end", "depth"))

        segments = [responses[r][a:b] for r, a, b in zip(span_row, start, end, strict=True)]
        # each leaf's response is its path's segments, end to end
        for node, leaf_row in enumerate(row):
            if leaf_row < 0:
                continue
            path, up = [], node
            while parent[up] >= 0:
                path.append(segments[up])
                up = parent[up]
            assert [t for s in reversed(path) for t in s] == responses[leaf_row]
        # a node's segment is the same in every response below it, and starts where its parent's ends
        for node, up in enumerate(parent):
            if up >= 0:
                assert start[node] == end[up] and depth[node] == depth[up] + 1
        summary = store.marker(run_id, update, "sample")["summary"]
        sampled = sum(e - s for e, s in zip(end, start, strict=True))
        assert summary["tokens"] == sampled < sum(map(len, responses))  # shared prefixes count once
        assert len(responses) == sum(r >= 0 for r in row) == len(set(r for r in row if r >= 0))

        scores = tensors_from_bytes(store.read_stage(run_id, update, "score")[SCORES])
        advantages = tensors_from_bytes(store.read_stage(run_id, update, "advantage")[ADVANTAGES])
        if algorithm == "spo_tree":  # one row per edge: the training rows hold each sampled token once
            edges = [node for node, up in enumerate(parent) if up >= 0]
            assert scores["mask"].shape[0] == len(edges) and int(scores["mask"].sum()) == sampled
            lengths = scores["mask"].sum(dim=1).tolist()
            assert lengths == [end[n] - start[n] for n in edges]
            assert (advantages[LOSS_MASK] <= scores["mask"]).all()  # a subset of the response tokens
            groups = np.asarray(rollouts["group"])
            assert all((groups == g).sum() <= 4 for g in set(groups))  # at most 2 × 2 leaves
        else:  # one row per leaf path, 4 leaves a prompt (the fallback fills the width)
            assert scores["mask"].shape[0] == len(responses)
            assert np.bincount(np.asarray(rollouts["group"])).tolist() == [4] * 4
            assert LOSS_MASK not in advantages
            token_adv = advantages["advantages"][scores["mask"]]
            assert abs(float(token_adv.double().mean())) < 1e-5  # whitened over the batch's tokens
    metrics = store.read_metrics(run_id)
    assert [m["update"] for m in metrics] == [0, 1, 2]


def test_probes_are_not_sampled_and_the_optimizer_ran(finished):
    _, store, run_id = finished
    for update in (0, 1):
        assert store.marker(run_id, update, "probe")["summary"]["tokens"] == 0
        assert store.marker(run_id, update, "optimize")["summary"]["minibatches"] >= 1
    first = store.read_stage(run_id, 0, "checkpoint")["model.safetensors"]
    assert store.read_stage(run_id, 2, "checkpoint")["model.safetensors"] != first


@pytest.mark.parametrize("algorithm", sorted(TREE_FIELDS))
def test_a_killed_tree_run_resumes_bitwise(algorithm, warm_store, tmp_path: Path):
    config = tree_config(algorithm)
    baseline = f"resume-{algorithm.replace('_', '-')}"
    train(config, baseline, store=warm_store)
    expected = warm_store.read_stage(baseline, 2, "checkpoint")
    preset = tmp_path / "tree.yaml"
    preset.write_text(yaml.safe_dump(config.model_dump(mode="json")))
    for number, crash_at in enumerate(CRASHES[algorithm]):
        run_id = f"{baseline}-killed-{number}"
        assert train_cli(warm_store.url, preset, run_id, crash_at) == -signal.SIGKILL
        assert not warm_store.committed(run_id, 0, "advantage")
        assert train_cli(warm_store.url, preset, run_id, None) == 0
        final = warm_store.read_stage(run_id, 2, "checkpoint")
        assert {name: final[name] for name in FINAL_FILES} == {name: expected[name] for name in FINAL_FILES}
        samples = [a for a in warm_store.attempts(run_id, 0, "sample") if a["outcome"] == "committed"]
        assert len(samples) == 1
        if ".shard-" in crash_at:  # the resumed sample replayed the committed calls from the store
            assert samples[0]["resumed_shards"] >= 1 and samples[0]["shards_run"] >= 1
            assert warm_store.committed(run_id, 0, crash_at.split(":")[1])
    assert torch.equal(
        tensors_from_bytes(warm_store.read_stage(run_id, 0, "score")[SCORES])["logp"],
        tensors_from_bytes(warm_store.read_stage(baseline, 0, "score")[SCORES])["logp"],
    )
