"""The command-line reference, written from the CLI's own parser (`typer.main.get_command`): every command,
its usage, its help and every argument and option as `--help` prints them, so the page is the CLI's."""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import typer.main
from config_reference import definition, markdown_text

from probepo.cli import app

ROOT = Path(__file__).resolve().parents[2]


def commands(command: Any, path: tuple[str, ...] = ("probepo",)) -> Iterator[tuple[tuple[str, ...], Any]]:
    """Every command of the tree under `command`, itself first, each with the words that call it."""
    yield path, command
    for name, sub in getattr(command, "commands", {}).items():
        yield from commands(sub, (*path, name))


def _help(text: str) -> str:
    # a default that is a path in this checkout is shown from the repository root, as users type it
    return markdown_text(text.replace(f"{ROOT}/", ""))


def page() -> str:
    """The reference of every command of `probepo`."""
    root = typer.main.get_command(app)
    lines = [
        "# Command line",
        "",
        "Every command of `probepo` with its arguments and options, as `probepo COMMAND --help` prints",
        "them: this page is written from the command's own parser when the site is built.",
        "",
    ]
    contexts: dict[tuple[str, ...], Any] = {}
    for path, command in commands(root):
        parent = contexts.get(path[:-1])
        context = command.context_class(command, info_name=path[-1], parent=parent)
        contexts[path] = context
        usage = " ".join([*path, *command.collect_usage_pieces(context)])
        lines += [f"## `{' '.join(path)}`", "", "```text", usage, "```", ""]
        lines += [_help(inspect.cleandoc(command.help or "")), ""]
        for parameter in command.params:
            record = parameter.get_help_record(context)
            if record is not None:
                term, explanation = record
                lines += definition(f"`{term}`", _help(explanation) or "(no help)", "")
        if getattr(command, "commands", None):
            called = [f"`{' '.join((*path, name))}`" for name in command.commands]
            lines += ["Commands: " + ", ".join(called), ""]
    return "\n".join(lines)
