"""The method table: one entry per name of the config's Literal, unknown names refused, and no method name
compared anywhere else in the code (a missed comparison once fell through to ProbePO silently)."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import get_args

import pytest

from probepo.config import AlgoConfig
from probepo.config.algo import METHOD_CHECKS, Algorithm
from probepo.methods import METHODS, method_for

ROOT = Path(__file__).resolve().parents[2]
TABLE_FILES = {ROOT / "probepo" / "methods" / "__init__.py"}


def test_the_table_has_exactly_the_configs_names():
    assert list(METHODS) == list(get_args(Algorithm))
    assert set(METHOD_CHECKS) <= set(METHODS)  # the config's checks name methods of the table


def test_an_unknown_method_is_refused_naming_the_choices():
    with pytest.raises(ValueError, match=r"unknown method 'ppo': choose one of grpo, probepo, vineppo, rloo"):
        method_for("ppo")


def test_what_each_method_does_at_each_stage():
    """The rows of the design's method table (docs/DESIGN.md, "Methods"), read back from the entries."""
    probes = {name for name, m in METHODS.items() if m.probes}
    trees = {name for name, m in METHODS.items() if m.tree is not None}
    assert probes == {"probepo", "vineppo"}
    assert trees == {"spo_tree", "treepo"}
    assert not METHODS["vineppo"].shrinks_values and METHODS["probepo"].shrinks_values
    assert METHODS["spo_tree"].rows is not METHODS["treepo"].rows  # edges, not leaf paths


def test_a_methods_checks_run_only_for_that_method():
    with pytest.raises(ValueError, match="exceeds probe_budget"):
        AlgoConfig(algorithm="probepo", max_pivots=6)
    AlgoConfig(algorithm="grpo", max_pivots=6)  # GRPO never probes: the budget is not its concern
    with pytest.raises(ValueError, match="treepo_first_fork = 9 exceeds treepo_width = 8"):
        AlgoConfig(algorithm="treepo", treepo_first_fork=9, treepo_width=8)


def _name_comparisons(path: Path) -> list[str]:
    """`x == "grpo"`, `x in ("spo_tree", ...)` and the like in one file, as file:line."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Compare):
            continue
        operands = [node.left, *node.comparators]
        strings = [
            element.value
            for operand in operands
            for element in (
                operand.elts if isinstance(operand, ast.Tuple | ast.List | ast.Set) else [operand]
            )
            if isinstance(element, ast.Constant) and isinstance(element.value, str)
        ]
        if set(strings) & set(METHODS):
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def test_no_method_name_is_compared_outside_the_table():
    files = [
        path
        for folder in ("probepo", "flows", "slurm")
        for path in sorted((ROOT / folder).rglob("*.py"))
        if path not in TABLE_FILES
    ]
    assert [where for path in files for where in _name_comparisons(path)] == []
