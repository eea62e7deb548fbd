"""The documentation site, built as `bash scripts/docs --build-only` builds it, with warnings as errors (a
broken cross-reference, a missing page or a bad directive fails the build), and what its generated pages
must hold: every field of a recipe, an execution profile, a site file and a checkpoint selection with its
docstring, every command and option of the CLI's own parser, every row of the benchmark tables of every
bench/results/*.json, and the UI tests' latest screenshots. The README's links lead to files of the
repository. About 20 s on one core."""

from __future__ import annotations

import html
import importlib
import json
import os
import re
import shutil
import subprocess
import types
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any, Union, get_args, get_origin

import pytest
import typer.main
from pydantic import BaseModel

from probepo.cli import app
from probepo.config import CheckpointSelection, ExecutionProfile, RunConfig, SiteConfig

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(300)


class PageText(HTMLParser):
    """A page's visible text, whitespace collapsed, and where each heading starts in it."""

    def __init__(self) -> None:
        super().__init__()
        self.pieces: list[str] = []
        self.headings: list[tuple[str, int]] = []
        self._heading: list[str] | None = None
        self._hidden = 0

    def handle_starttag(self, tag, attrs):
        if tag in ("script", "style"):
            self._hidden += 1
        if re.fullmatch(r"h[1-6]", tag):
            self._heading = []

    def handle_endtag(self, tag):
        if tag in ("script", "style"):
            self._hidden -= 1
        if re.fullmatch(r"h[1-6]", tag) and self._heading is not None:
            self.headings.append((_collapsed("".join(self._heading)).rstrip("#¶ "), len(self.text)))
            self._heading = None

    def handle_data(self, data):
        if self._hidden:
            return
        self.pieces.append(data)
        if self._heading is not None:
            self._heading.append(data)

    @property
    def text(self) -> str:
        return _collapsed("".join(self.pieces))

    def section(self, title: str) -> str:
        """The text from the heading `title` to the next heading."""
        starts = [start for heading, start in self.headings if heading == title]
        assert starts, f"no heading {title!r} (headings: {[h for h, _ in self.headings]})"
        following = [start for _, start in self.headings if start > starts[0]]
        return self.text[starts[0] : min(following, default=len(self.text))]


def _collapsed(text: str) -> str:
    return re.sub(r"\s+", " ", html.unescape(text)).strip()


def _page(site: Path, name: str) -> PageText:
    parsed = PageText()
    parsed.feed((site / name).read_text())
    return parsed


def _plain(markdown: str) -> str:
    """Text to compare with a page's: no code-span backticks, and no `*` (emphasis marks in markdown)."""
    return _collapsed(markdown.replace("`", "").replace("*", ""))


@pytest.fixture(scope="module")
def screenshots(tmp_path_factory) -> Path:
    """A screenshot the UI tests took after docs/ui/'s copy: the site must show it."""
    folder = tmp_path_factory.mktemp("ui-screenshots")
    shutil.copyfile(ROOT / "docs" / "ui" / "train-run-refused.png", folder / "train-run-form.png")
    return folder


@pytest.fixture(scope="module")
def site(tmp_path_factory, screenshots) -> Path:
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "PROBEPO_TEST_SCREENSHOTS": str(screenshots)}
    built = subprocess.run(
        ["bash", "scripts/docs", "--build-only", "--out", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert built.returncode == 0, f"the site does not build cleanly:\n{built.stdout}\n{built.stderr}"
    return out


def _models_in(annotation: Any) -> list[tuple[type[BaseModel], str]]:
    """The models a field's annotation holds, each with what its fields' paths add (`.<key>` in a mapping)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [(annotation, "")]
    args = get_args(annotation)
    if get_origin(annotation) in (Union, types.UnionType):
        return [found for arg in args for found in _models_in(arg)]
    if get_origin(annotation) is dict:
        return [(model, ".<key>") for model, _ in _models_in(args[1])]
    return []


def fields_of(model: type[BaseModel], prefix: str = "", seen: set | None = None) -> Iterator[tuple[str, str]]:
    """(path, description) of every field, nested ones by their dotted path; a model met again (a
    stage's entry has the fields of `defaults`) is documented where it was first met."""
    seen = set() if seen is None else seen
    seen.add(model)
    for name, field in model.model_fields.items():
        path = f"{prefix}{name}"
        yield path, field.description or ""
        for nested, key in _models_in(field.annotation):
            if nested not in seen:
                yield from fields_of(nested, f"{path}{key}.", seen)


@pytest.mark.parametrize(
    ("page", "model"),
    [
        ("reference/recipe.html", RunConfig),
        ("reference/profile.html", ExecutionProfile),
        ("reference/site.html", SiteConfig),
        ("reference/site.html", CheckpointSelection),
    ],
)
def test_every_field_is_in_the_reference_with_its_docstring(site, page, model):
    text = _page(site, page).text.replace("*", "")
    fields = list(fields_of(model))
    assert len(fields) >= 5
    assert not [path for path, _ in fields if path not in text], "fields missing from the reference"
    assert not [path for path, about in fields if _plain(about) not in text], "docstrings missing"


def _commands(command: Any, path: tuple[str, ...] = ("probepo",)) -> Iterator[tuple[str, Any]]:
    yield " ".join(path), command
    for name, sub in getattr(command, "commands", {}).items():
        yield from _commands(sub, (*path, name))


def test_every_command_and_option_is_in_the_cli_reference(site):
    page = _page(site, "reference/cli.html")
    commands = list(_commands(typer.main.get_command(app)))
    assert {"probepo train", "probepo resume", "probepo store gc"} <= {name for name, _ in commands}
    for name, command in commands:
        section = page.section(name).replace("*", "")
        for parameter in command.params:
            if parameter.param_type_name == "option":
                assert all(flag in section for flag in parameter.opts), f"{name}: {parameter.opts} missing"
            assert _plain(parameter.help or "") in section, f"{name}: the help of {parameter.name} missing"


def _table_rows(markdown: str) -> list[str]:
    """A markdown text's table rows (not the separator lines) as the page shows them: each cell's text."""
    rows = [line for line in markdown.splitlines() if line.startswith("| ") and not line.startswith("|---")]
    return [" ".join(_plain(cell) for cell in row.strip("| ").split(" | ")) for row in rows]


def test_every_results_file_has_its_tables_in_the_site(site, monkeypatch):
    """Every bench/results/*.json is rendered by its bench's own `markdown` into docs/BENCHMARKS.md when the
    site is built (docs/_ext/probepo_reference.py's BENCH_TABLES), every row of it, or is one the page
    names without a table (UNTABLED); a new results file fails here until it has its table."""
    for folder in (ROOT / "bench", ROOT / "docs" / "_ext"):
        monkeypatch.syspath_prepend(str(folder))
    import probepo_reference

    results = ROOT / "bench" / "results"
    names = {path.stem for path in results.glob("*.json")}
    tabled = set(probepo_reference.BENCH_TABLES)
    assert not tabled - names, f"tables of results files that do not exist: {sorted(tabled - names)}"
    assert not names - tabled - set(probepo_reference.UNTABLED), (
        f"results files with no table in the site: {sorted(names - tabled - set(probepo_reference.UNTABLED))}"
    )
    text = _page(site, "BENCHMARKS.html").text.replace("*", "")
    shown = 0
    for name in sorted(tabled):
        module, key = probepo_reference.BENCH_TABLES[name]
        recorded = json.loads((results / f"{name}.json").read_text())
        rows = _table_rows(importlib.import_module(module).markdown(recorded[key] if key else recorded))
        assert rows, f"{name}: its bench's `markdown` renders no table"
        missing = [row for row in rows if row not in text]
        assert not missing, f"rows of {name}.json the site lacks: {missing[:3]}"
        shown += len(rows)
    assert shown > 150
    pages = " ".join(_page(site, str(page.relative_to(site))).text for page in site.rglob("*.html"))
    unnamed = [name for name in names - tabled if f"bench/results/{name}.json" not in pages]
    assert not unnamed, f"results files without a table that no page names: {unnamed}"


def test_the_site_shows_the_ui_tests_latest_screenshots(site, screenshots):
    images = site / "_images"
    assert (images / "train-run-form.png").read_bytes() == (screenshots / "train-run-form.png").read_bytes()
    committed = ROOT / "docs" / "ui" / "train-run-artifacts.png"  # the tests took none newer of this one
    assert (images / committed.name).read_bytes() == committed.read_bytes()


def test_the_readme_fits_a_screen_or_two_and_its_links_lead_to_files():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.encode()) <= 12 * 1024
    targets = re.findall(r"\]\(([^)\s]+)\)", readme)
    local = [target.split("#", 1)[0] for target in targets if not re.match(r"[a-z]+:", target)]
    assert "docs/guides/cluster.md" in local
    assert not [target for target in local if not (ROOT / target).exists()], "README links to nothing"
