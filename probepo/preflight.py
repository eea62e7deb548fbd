"""What a launch verifies before it submits anything: the recipe's model and data are where its jobs will
look for them, and its store answers. A flow run (or `probepo launch`) refuses a run that fails, with one
line per problem naming the field or file and what to do, instead of a job failing minutes or hours later.

Nothing here loads a model or contacts the Hugging Face hub: compute nodes usually cannot reach it, so a
hub id counts only when its files are in the local cache.
"""

from __future__ import annotations

from pathlib import Path

from probepo.config import RunConfig
from probepo.store import StoreError, open_store


class Refused(ValueError):
    """A run that would fail in its jobs: `problems`, one line each."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


def model_problems(config: RunConfig) -> list[str]:
    """The policy of a Hugging Face recipe is readable without the network: a folder with its config, a
    GGUF file, or a hub id whose config is in the local hub cache."""
    if config.model.kind != "hf":
        return []
    from probepo.engines.hf.loading import resolve_source

    named = f"model.pretrained = {config.model.pretrained}"
    try:
        source = resolve_source(config.model.pretrained)
    except (FileNotFoundError, ValueError) as exc:
        return [f"{named}: {exc}"]
    path = Path(source)
    if path.suffix == ".gguf":
        return [] if path.is_file() else [f"{named}: no such GGUF file"]
    if path.exists():
        if (path / "config.json").is_file():
            return []
        return [f"{named}: not a Hugging Face model folder (no config.json beside its tokenizer and weights)"]
    if path.is_absolute() or source.startswith("."):
        return [f"{named}: no such folder"]
    try:
        from huggingface_hub import constants, try_to_load_from_cache
    except ImportError:
        return [f"{named}: a hub id needs huggingface_hub (the `hf` extra: scripts/venv.sh hf)"]

    if isinstance(try_to_load_from_cache(source, "config.json"), str):
        return []
    return [
        f"{named}: not a local folder and not in the Hugging Face cache ({constants.HF_HUB_CACHE}), and"
        f" jobs do not download: fetch it where the hub is reachable (`hf download {source}`) into a cache"
        " the compute nodes share (HF_HUB_CACHE), or set model.pretrained to a local folder"
    ]


def data_problems(config: RunConfig) -> list[str]:
    """Every benchmark file a maths recipe reads (its eval split, its evaluation sets, its training sets)
    is where the jobs will look."""
    if config.task.kind != "math" or config.task.source != "benchmarks":
        return []
    from probepo.data.benchmarks import BENCHMARKS, benchmarks_root

    root = benchmarks_root(config.task.benchmarks_root)
    names = dict.fromkeys([config.task.eval_set, *config.eval.benchmarks, *config.task.train_sources])
    return [
        f"benchmark {name}: {root / BENCHMARKS[name].folder / BENCHMARKS[name].file} not found; set"
        f" task.benchmarks_root (or PROBEPO_BENCHMARKS) to the folder holding the benchmark sets"
        for name in names
        if not (root / BENCHMARKS[name].folder / BENCHMARKS[name].file).is_file()
    ]


def store_problems(url: str) -> list[str]:
    """The store opens and answers a listing (reachable, credentials accepted)."""
    try:
        open_store(url).runs()
    except StoreError as exc:
        return [str(exc)]
    except OSError as exc:  # a local folder that cannot be made or read
        return [f"store {url}: {exc.strerror or exc}"]
    return []


def preflight(config: RunConfig) -> None:
    """Raise Refused naming every problem of `config` that its jobs would meet."""
    problems = [*model_problems(config), *data_problems(config), *store_problems(config.store)]
    if problems:
        raise Refused(problems)
