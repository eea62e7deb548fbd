"""The site's generated pages, written when a build starts (Sphinx's `builder-inited`) into docs/reference/,
which git ignores: the configuration reference from the pydantic models, the command-line reference from
the CLI's parser, and the benchmark tables from bench/results/*.json through each bench's own `markdown`
(the tables docs/BENCHMARKS.md includes). When the build ends, the UI screenshots the UI tests took since
docs/ui/ was last copied replace the site's copies, so the site shows the UI as the tests last saw it."""

from __future__ import annotations

import importlib
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from sphinx.application import Sphinx

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"
for folder in (ROOT, BENCH):  # the project, and the bench scripts' own imports (benchlib, science_plan, …)
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))

import cli_reference  # noqa: E402
import config_reference  # noqa: E402

from probepo.config import CheckpointSelection, ExecutionProfile, RunConfig, SiteConfig  # noqa: E402

SCREENSHOTS = Path(os.environ.get("PROBEPO_TEST_SCREENSHOTS", ROOT / "out" / "ui-screenshots"))
"""Where tests/flows/test_ui.py saves its screenshots (the same variable and default)."""

BENCH_TABLES: dict[str, tuple[str, str | None]] = {
    "algo": ("algo", None),
    "checkpoint": ("checkpoint", None),
    "demo": ("demo", None),
    "gpu_check": ("gpu_check", None),
    "handoff": ("handoff", None),
    "orchestration": ("orchestration", None),
    "overhead": ("overhead", None),
    "overhead_gpu": ("overhead_gpu", None),
    "ranks": ("ranks", None),
    "real_lm": ("real_lm", None),
    "sampler": ("sampler", None),
    "scale": ("scale", None),
    "science": ("science_output", "testbeds"),
    "store": ("store", None),
}
"""bench/results/<name>.json → the bench module whose `markdown` renders it, and the key of the part it
renders (None: the whole file), as the bench itself calls it. docs/BENCHMARKS.md includes each as
reference/tables/<name>.md; where prose stands between a file's tables, the bench's `markdown` marks each
(benchlib.marked) and the page takes one at a time (`:start-after:` / `:end-before:`)."""

UNTABLED: dict[str, str] = {
    "science-before-48": "the science bench's arms before issue 48 reran them: out of every table, kept as"
    " measured (docs/BENCHMARKS.md names it)",
    "science-prefix-f30d05b": "the science bench before the engine fixes: docs/science/prefix-f30d05b.md",
    "gpu_gate": "written only on a GPU (bench/gpu_gate.py): no table yet",
}
"""bench/results/<name>.json that no generated table renders, and why (tests/docs/ holds every other
results file to its table in the site)."""


def recipe_page() -> str:
    return config_reference.page(
        "Recipe fields",
        "Every field of a recipe (`probepo.config.RunConfig`: a preset in `configs/`, `--set FIELD=VALUE`, a"
        " train deployment's form), with its type, its default in a recipe and its docstring. The defaults"
        " are the embedded default's: the CPU testbed. A run's recipe is frozen in the store (`run.json`),"
        " all but `store` and `checkpoint_every`.",
        RunConfig,
        RunConfig(),
    )


def profile_page() -> str:
    return config_reference.page(
        "Execution profile fields",
        "Every field of an execution profile (`probepo.config.ExecutionProfile`, `--profile FILE`; examples"
        " in `configs/profiles/`): where each stage runs and what its job asks SLURM for. Never part of a"
        " recipe: a run may resume under another profile and give the same bits.",
        ExecutionProfile,
        ExecutionProfile(),
    )


def site_page() -> str:
    site = config_reference.page(
        "Site file fields",
        "Every field of the site file (`probepo.config.SiteConfig`: `site.yaml` in the checkout, or"
        " `$PROBEPO_SITE`; `configs/sites/example.yaml` shows one).",
        SiteConfig,
        SiteConfig(),
    )
    selection = config_reference.page(
        "Checkpoint selection fields",
        "Which checkpoints an evaluation after the fact takes (`probepo.config.CheckpointSelection`: the"
        " nightly evaluation's and the evaluate deployment's `selection`).",
        CheckpointSelection,
        CheckpointSelection(),
        level=2,
    )
    return site + "\n" + selection


def bench_table(name: str) -> str:
    """The tables of bench/results/<name>.json, as its bench writes them."""
    module, key = BENCH_TABLES[name]
    results = json.loads((BENCH / "results" / f"{name}.json").read_text())
    return importlib.import_module(module).markdown(results[key] if key else results) + "\n"


def pages() -> dict[str, str]:
    """Every generated file, by its path under docs/reference/."""
    generated = {
        "recipe.md": recipe_page(),
        "profile.md": profile_page(),
        "site.md": site_page(),
        "cli.md": cli_reference.page(),
    }
    return generated | {f"tables/{name}.md": bench_table(name) for name in BENCH_TABLES}


def _write_if_changed(path: Path, text: str) -> None:
    # an unchanged page keeps its mtime, so an incremental build does not read it again; the rename makes
    # a concurrent build read the old page or the new one, never half of one
    if path.is_file() and path.read_text() == text:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    partial.write_text(text)
    partial.replace(path)


def write_reference(app: Sphinx) -> None:
    for name, text in pages().items():
        _write_if_changed(Path(app.srcdir) / "reference" / name, text)


def refresh_screenshots(app: Sphinx, exception: Exception | None) -> None:
    """Replace each docs/ui/ screenshot in the built site by the UI tests' own when theirs is newer."""
    images = Path(app.outdir) / "_images"
    if exception is not None or not images.is_dir():
        return
    for committed in sorted((Path(app.srcdir) / "ui").glob("*.png")):
        taken, shown = SCREENSHOTS / committed.name, images / committed.name
        if shown.is_file() and taken.is_file() and taken.stat().st_mtime > committed.stat().st_mtime:
            shutil.copyfile(taken, shown)


def setup(app: Sphinx) -> dict[str, Any]:
    app.connect("builder-inited", write_reference)
    app.connect("build-finished", refresh_screenshots)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
