"""The benchmark tables the site renders from bench/results/*.json (docs/_ext/probepo_reference.py): each
bench's `markdown` is pure (the same text twice, its results untouched), opens each table with the command,
date and machine its results record, and marks the tables a page takes one at a time (benchlib.marked). That
the site shows every row is tests/docs/'s."""

from __future__ import annotations

import copy
import importlib
import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
for folder in (ROOT / "bench", ROOT / "docs" / "_ext"):
    sys.path.insert(0, str(folder))
from benchlib import marked, recorded, when  # noqa: E402

RESULTS = ROOT / "bench" / "results"


def test_a_date_is_given_to_the_minute_in_utc():
    assert when("2026-12-03T13:56:44+00:00") == "2026-12-03T13:56Z"
    assert when("2026-12-01T19:52+00:00") == "2026-12-01T19:52Z"
    assert when("2026-12-04T20:30:00+01:00") == "2026-12-04T19:30Z"
    assert when("2026-12-04") == "2026-12-04"


def test_the_recorded_line_says_what_the_results_hold():
    entry = {
        "command": "python bench/x.py ",
        "date": "2026-12-03T13:56:44+00:00",
        "machine": "AMD EPYC, 2 cores",
    }
    assert recorded(entry, "bench/results/x.json") == (
        "`python bench/x.py` → `bench/results/x.json` (2026-12-03T13:56Z; AMD EPYC, 2 cores)"
    )
    assert recorded({"date": "2026-12-01"}, "bench/results/x.json") == "`bench/results/x.json` (2026-12-01)"


def test_a_marked_table_is_what_an_include_between_its_comments_takes():
    text = "\n\n".join([marked("a", "| x |"), marked("ab", "| y |")])
    start, end = "<!-- table: a -->", "<!-- end: a -->"
    assert text[text.index(start) + len(start) : text.index(end)].strip() == "| x |"


def _tabled() -> dict[str, tuple[str, str | None]]:
    import probepo_reference

    return probepo_reference.BENCH_TABLES


@pytest.mark.parametrize("name", sorted(_tabled()))
def test_each_table_is_rendered_from_its_results_alone(name):
    module, key = _tabled()[name]
    recorded_results = json.loads((RESULTS / f"{name}.json").read_text())
    part = recorded_results[key] if key else recorded_results
    kept = copy.deepcopy(part)
    render = importlib.import_module(module).markdown
    text = render(part)
    assert text == render(part) and part == kept, "markdown is not pure"
    assert re.search(r"^\| .* \|$", text, re.MULTILINE), "no table"
    if key is None:  # the whole file: its tables open with what recorded it
        assert f"`bench/results/{name}.json`" in text or name == "overhead"
        assert recorded_results.get("machine", "") in text or name == "overhead"
    starts = re.findall(r"<!-- table: (\S+) -->", text)
    assert starts == re.findall(r"<!-- end: (\S+) -->", text) and len(set(starts)) == len(starts)
