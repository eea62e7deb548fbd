"""The house's layers, read from the code: the runtime import graph of probepo/, flows/ and slurm/ (every
import a module runs, at module level or inside a function; `if TYPE_CHECKING:` blocks left out) has no
circle, probepo/ reaches into flows/ or slurm/ only from its CLI modules, the configuration models
import nothing above themselves, and the launch checks (probepo/checks/) sit between the library and the
launch layer (docs/DESIGN.md, "The house")."""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("probepo", "flows", "slurm")
CONFIG_MAY_IMPORT = ("probepo.config", "probepo.run.schedule", "probepo.errors")
"""What probepo/config/ may import of the project: itself and the modules below it that it reads."""
CONFIG_THIRD_PARTY = {"pydantic", "annotated_types"}
CHECKS_MAY_IMPORT = (
    "probepo.checks",
    "probepo.config",
    "probepo.data",
    "probepo.engines",
    "probepo.errors",
    "probepo.methods",
    "probepo.presets",
    "probepo.run.schedule",
    "probepo.spend.model",
    "probepo.stages",
    "probepo.store",
)
"""What probepo/checks/ may import of the project: the library it judges a launch by (the recipe and its
composition, the data, the engines' file names, the method table, the memory and spend models, the
stages' plans and rates, the store), never flows/ or slurm/."""


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for package in PACKAGES for path in (ROOT / package).rglob("*.py")}
CLI = tuple(module for module in MODULES if module == "probepo.cli" or module.startswith("probepo.cli."))
"""The face (probepo/cli/): the only modules of probepo/ that launch flows and jobs."""
CHECKS_IMPORTED_BY = (*CLI, "probepo.staging")
"""The modules of probepo/ outside probepo/checks/ that may import it: the CLI, and `probepo stage`
(staging copies the benchmark sets the data check reads). flows/ and slurm/ are above it and may."""


def _is_package(module: str) -> bool:
    return MODULES[module].name == "__init__.py"


def _imported(module: str, node: ast.Import | ast.ImportFrom) -> Iterator[str]:
    """The names an import statement of `module` imports: `a.b` for `import a.b` and `from a import b`
    where a.b is a module, else `a`; relative imports resolved."""
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names)
        return
    base = node.module or ""
    if node.level:
        package = module.split(".") if _is_package(module) else module.split(".")[:-1]
        package = package[: len(package) - (node.level - 1)]
        base = ".".join([*package, base] if base else package)
    for alias in node.names:
        candidate = f"{base}.{alias.name}" if base else alias.name
        yield candidate if candidate in MODULES else base


def _runtime_imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement that runs, at any depth, outside `if TYPE_CHECKING:` blocks."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.orelse:
                yield from _runtime_imports(ast.Module(body=[child], type_ignores=[]))
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        yield from _runtime_imports(node)


def imports_of(module: str) -> set[str]:
    """Every name `module` imports at run time (the project's as module names, others as given)."""
    found = set()
    for node in _runtime_imports(ast.parse(MODULES[module].read_text())):
        for name in _imported(module, node):
            while "." in name and name not in MODULES and name.split(".")[0] in PACKAGES:
                name = name.rsplit(".", 1)[0]  # `from pkg.mod import function`: the module
            found.add(name)
    return found - {module}


GRAPH = {module: {name for name in imports_of(module) if name in MODULES} for module in MODULES}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_finder_sees_a_circle_through_a_function_level_import():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []
    code = ast.parse("if TYPE_CHECKING:\n    import x\nelse:\n    import y\ndef f():\n    import z\n")
    assert [ast.unparse(node) for node in _runtime_imports(code)] == ["import y", "import z"]


def test_no_circle_of_imports():
    assert circles(GRAPH) == []


def test_probepo_reaches_flows_and_slurm_only_from_its_cli():
    up = sorted(
        f"{module} -> {name}"
        for module, names in GRAPH.items()
        if module.startswith("probepo") and module not in CLI
        for name in names
        if name.split(".")[0] in ("flows", "slurm")
    )
    assert up == []


def test_the_configuration_imports_nothing_above_it():
    """probepo/config/ reads pydantic, the standard library, itself, the stage names and the errors: what a
    recipe is can be read, tested and changed without the stages, the engines or the data loaders."""
    wrong = sorted(
        f"{module} -> {name}"
        for module in MODULES
        if module.startswith("probepo.config")
        for name in imports_of(module)
        if not name.startswith(CONFIG_MAY_IMPORT)
        and name.split(".")[0] not in CONFIG_THIRD_PARTY | set(sys.stdlib_module_names)
    )
    assert wrong == []


def test_stages_never_import_prefect_or_submitit():
    wrong = sorted(
        f"{module} -> {name}"
        for module in MODULES
        if module.startswith("probepo.stages")
        for name in imports_of(module)
        if name.split(".")[0] in ("prefect", "submitit", "flows", "slurm")
    )
    assert wrong == []


def test_the_checks_import_the_library_below_them_and_nothing_above():
    """probepo/checks/ reads the library it judges a launch by and reaches the executor and its backend
    only through the `Launch` that slurm/check.py builds; below the launch layer, nothing imports it."""
    wrong = sorted(
        f"{module} -> {name}"
        for module, names in GRAPH.items()
        if module.startswith("probepo.checks")
        for name in names
        if not name.startswith(CHECKS_MAY_IMPORT)
    )
    below = sorted(
        f"{module} -> {name}"
        for module, names in GRAPH.items()
        if module.startswith("probepo")
        and not module.startswith("probepo.checks")
        and module not in CHECKS_IMPORTED_BY
        for name in names
        if name.startswith("probepo.checks")
    )
    assert wrong == [] and below == []


def test_every_subject_module_of_the_checks_is_in_the_launchs_order():
    """A module of probepo/checks/ with a `check(launch)` runs in `check_launch`: a new subject cannot be
    written and forgotten."""
    from probepo.checks.launch import SUBJECTS

    subjects = {
        module
        for module in MODULES
        if module.startswith("probepo.checks.") and "def check(launch" in MODULES[module].read_text()
    }
    assert subjects == {check.__module__ for check in SUBJECTS}
