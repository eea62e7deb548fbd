"""The `demo` flow: what `probepo demo` does — the warm-up, both arms (GRPO and ProbePO, each in its own
process), the report — as three task runs, the report a markdown artifact. `probepo demo` runs it in
process; without PREFECT_API_URL Prefect starts a temporary server for it (nothing to set up)."""

from __future__ import annotations

from pathlib import Path

from prefect import flow, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE
from rich.console import Console

from flows.artifacts import artifact_key
from probepo.config import RunConfig
from probepo.presets import ConfigError, validate_run_config
from probepo.run.demo import summarize, train_arms, warm_up


@task(name="warm-up", cache_policy=NO_CACHE, persist_result=False)
def _warm_up(config: RunConfig) -> str:
    return warm_up(config, Console())


@task(name="arms", task_run_name="arms · grpo and probepo", cache_policy=NO_CACHE, persist_result=False)
def _arms(config: RunConfig, outdir: Path) -> list[str]:
    return train_arms(config, outdir, Console())


@task(name="report", cache_policy=NO_CACHE, persist_result=False)
def _report(config: RunConfig, run_ids: list[str], outdir: Path) -> str:
    path = summarize(config, run_ids, outdir, Console())
    create_markdown_artifact(path.read_text(), key=artifact_key("demo", "report"), description="demo report")
    return str(path)


@flow(name="demo", flow_run_name="demo seed {config.seed}")
def demo(config: RunConfig | None = None, outdir: str = "out/demo") -> str:
    """The CPU testbed end to end: warm-up (or reuse), GRPO and ProbePO side by side, then a report
    (returns its path).

    Args:
        config: The recipe both arms use; empty: the embedded default (configs/cpu-demo.yaml).
        outdir: Where the report, its plot and the arms' logs go (on the worker's machine).
    """
    try:
        config = validate_run_config((config or RunConfig()).model_dump(mode="json"), "flow parameter config")
    except ConfigError as exc:
        raise ValueError(str(exc)) from None
    _warm_up(config)
    run_ids = _arms(config, Path(outdir))
    return _report(config, run_ids, Path(outdir))
