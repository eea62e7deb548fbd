"""Policy k rebuilt when no engine holds it: the latest full checkpoint c <= k, then the optimize stages of
updates c .. k - 1 replayed from their committed rollouts, old log-probs and advantages (nothing is
generated or graded again), each checked against the fingerprint of the weights it committed (a mismatch is
recorded and logged, not fatal: the run goes on, no longer bitwise the uninterrupted one; under
`determinism: fast` replays are checked without being expected to match, so it is logged as such)."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from probepo import spend
from probepo.engines.base import TrainerEngine
from probepo.engines.build import load_trainer
from probepo.engines.fingerprint import weights_digest
from probepo.run.schedule import Stage
from probepo.stages.batch import training_batch
from probepo.stages.committed import at_update, fetch_policy
from probepo.stages.context import StageContext

FINGERPRINT = "policy_fingerprint"
"""The key of optimize's summary holding the fingerprint of the weights it made (updates without a full
checkpoint): what a replay must reproduce."""
LEGACY_DIGEST = "policy_sha256"
"""What stores written before the fingerprint committed instead: the sha256 of a host copy of the weights."""
log = logging.getLogger(__name__)


def replay_optimize(ctx: StageContext, engine: TrainerEngine) -> bool:
    """Redo update k's committed optimize stage on `engine` (policy k): the same batch and seed, so it
    makes policy k + 1 again. Returns whether its weights match the digest optimize committed."""
    marker = ctx.store.marker(ctx.run_id, ctx.update, Stage.OPTIMIZE)
    if marker is None:
        raise RuntimeError(
            f"policy {ctx.update + 1} of run {ctx.run_id} does not exist: the run has not committed update"
            f" {ctx.update}'s optimize stage"
        )
    summary = marker["summary"]
    if FINGERPRINT not in summary and LEGACY_DIGEST not in summary:
        raise RuntimeError(
            f"policy {ctx.update + 1} of run {ctx.run_id} cannot be restored: its checkpoint is missing and"
            f" update {ctx.update}'s optimize stage committed no weight digest to replay it against"
        )
    with spend.timed("optimizer"):
        engine.train_step(training_batch(ctx), seed=ctx.seed(Stage.OPTIMIZE))
    return matches_committed(engine, summary)


def matches_committed(engine: TrainerEngine, summary: Mapping[str, Any]) -> bool:
    """Whether `engine` holds the weights an optimize summary committed: by their fingerprint, or in a store
    written before fingerprints by the sha256 of a host copy (`policy_sha256`)."""
    if FINGERPRINT in summary:
        with spend.timed("digest"):
            return engine.weights_fingerprint() == summary[FINGERPRINT]
    return weights_digest(engine.weights()) == summary[LEGACY_DIGEST]


def restore_trainer(ctx: StageContext, full: int) -> TrainerEngine:
    """Policy k with its optimizer state from the store: full checkpoint c < k (`full`, the latest, as
    `location.locate` found it: policy k's own, when full, is loaded as it is), then the optimize stages of
    updates c .. k - 1 replayed. The attempt records `replayed_updates`, `replay_s`,
    `replay_expected_to_match` (true under `determinism: bitwise`; under `fast` replays are checked, not
    expected to match) and, if any, `replay_diverged`: the updates whose replay did not reproduce the
    committed weights."""
    engine = load_trainer(ctx.config, fetch_policy(at_update(ctx, full)))
    started = time.perf_counter()
    log.info(
        "policy %d: checkpoint %d, then optimize of updates %d-%d replayed",
        ctx.update,
        full,
        full,
        ctx.update - 1,
    )
    diverged = [u for u in range(full, ctx.update) if not replay_optimize(at_update(ctx, u), engine)]
    ctx.attempt_notes.update(
        replayed_updates=ctx.update - full,
        replay_s=round(time.perf_counter() - started, 3),
        replay_expected_to_match=ctx.config.determinism == "bitwise",
    )
    if diverged:
        # Not fatal: the run goes on from a valid policy, but no longer bitwise the uninterrupted one.
        ctx.attempt_notes["replay_diverged"] = diverged
        if ctx.config.determinism == "fast":
            log.info(
                "run %s: replaying optimize of updates %s did not reproduce the weights they committed, as"
                " `determinism: fast` allows (its replays are checked, not expected to match)",
                ctx.run_id,
                diverged,
            )
        else:
            log.warning(
                "run %s: replaying optimize of updates %s did not reproduce the weights they committed"
                " (another device, dtype or thread count than the run, e.g. OMP_NUM_THREADS); the run goes"
                " on, no longer bitwise equal to an uninterrupted one",
                ctx.run_id,
                diverged,
            )
    return engine
