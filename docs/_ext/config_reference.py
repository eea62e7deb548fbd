"""The configuration reference, written from the pydantic models themselves: every field of a recipe, an
execution profile and a site file with its type, its default and its docstring (attribute docstrings are
the fields' descriptions: `use_attribute_docstrings` in probepo/config/base.py). Nothing here restates a
field by hand, so the reference cannot drift from the code."""

from __future__ import annotations

import inspect
import json
import re
import types
from dataclasses import dataclass
from enum import Enum
from typing import Any, Literal, Union, get_args, get_origin

import annotated_types
from pydantic import BaseModel
from pydantic.fields import FieldInfo

_CODE_SPAN = re.compile(r"(`+)(.+?)\1", re.S)


def markdown_text(text: str) -> str:
    """Docstring or help text as MyST markdown: code spans kept, and outside them `<` escaped so that a
    placeholder such as `<benchmarks_root>/…` is shown, not taken for an HTML tag."""
    pieces, end = [], 0
    for span in _CODE_SPAN.finditer(text):
        pieces += [text[end : span.start()].replace("<", "\\<"), span.group(0)]
        end = span.end()
    return "".join([*pieces, text[end:].replace("<", "\\<")])


def definition(term: str, summary: str, body: str) -> list[str]:
    """One entry of a MyST definition list: the term, a summary line, then the body's paragraphs."""
    lines = [term, f": {summary}"]
    for paragraph in inspect.cleandoc(body).split("\n\n") if body else []:
        lines += ["", *("  " + line for line in paragraph.splitlines())]
    return [*lines, ""]


def _named(annotation: Any) -> str:
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        return "one of " + ", ".join(f"`{member.value}`" for member in annotation)
    if get_origin(annotation) is Literal:
        return "one of " + ", ".join(value_text(value) for value in get_args(annotation))
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "a section (below)"
    origin, args = get_origin(annotation), get_args(annotation)
    if origin in (Union, types.UnionType):
        named = [_named(arg) for arg in args if arg is not type(None)]
        return " or ".join(named) + (" or None" if type(None) in args else "")
    if origin is tuple:
        return f"list of {_named(args[0])}"
    if origin is dict:
        return f"mapping of {_named(args[0])} to {_named(args[1])}"
    return f"`{getattr(annotation, '__name__', str(annotation))}`"


_BOUNDS = (
    (annotated_types.Ge, "ge", "≥"),
    (annotated_types.Gt, "gt", ">"),
    (annotated_types.Le, "le", "≤"),
    (annotated_types.Lt, "lt", "<"),
    (annotated_types.MinLen, "min_length", "items ≥"),
    (annotated_types.MaxLen, "max_length", "items ≤"),
)


def type_text(field: FieldInfo) -> str:
    """The field's type in words, with its bounds, e.g. "`int`, ≥ 1"."""
    bounds = [
        f"{sign} {getattr(rule, name)}"
        for rule in field.metadata
        for kind, name, sign in _BOUNDS
        if isinstance(rule, kind)
    ]
    return ", ".join([_named(field.annotation), *bounds])


def value_text(value: Any) -> str:
    """A default as a YAML file would hold it (None as the docstrings name it)."""
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    if value is None:
        return "`None`"
    if isinstance(value, Enum):
        value = value.value
    if isinstance(value, str):
        plain = value and value == value.strip() and "\n" not in value  # else quoted, so it shows
        return f"`{value}`" if plain else f"`{json.dumps(value)}`"
    return f"`{json.dumps(value, ensure_ascii=False)}`"


def _default_of(field: FieldInfo) -> Any:
    if field.default_factory is not None:
        return field.default_factory()  # type: ignore[call-arg]
    return field.default


def _section_model(annotation: Any) -> tuple[type[BaseModel] | None, str]:
    """The model a field opens a section for, and how its path goes on: `` for a model (or an optional
    one), `.<key>` for a mapping of keys to models."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation, ""
    args = get_args(annotation)
    if get_origin(annotation) in (Union, types.UnionType):
        models = [arg for arg in args if isinstance(arg, type) and issubclass(arg, BaseModel)]
        return (models[0], "") if models else (None, "")
    if get_origin(annotation) is dict and isinstance(args[1], type) and issubclass(args[1], BaseModel):
        return args[1], ".<" + getattr(args[0], "__name__", "key").lower() + ">"
    return None, ""


@dataclass(frozen=True)
class Section:
    """One model's fields at one place of a file: `path` is their prefix (empty at the top)."""

    path: str
    model: type[BaseModel]
    values: BaseModel | None
    """The values the fields take there by default (a parent's default can differ from the model's own)."""


def _joined(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _sections(top: Section) -> list[Section]:
    """The top section and every nested one, depth first in field order."""
    found = [top]
    for name, field in top.model.model_fields.items():
        model, suffix = _section_model(field.annotation)
        if model is None:
            continue
        value = getattr(top.values, name) if top.values is not None else _default_of(field)
        path = _joined(top.path, name) + suffix
        values = value if isinstance(value, model) else None
        found += _sections(Section(path, model, values))
    return found


def _field_entries(section: Section, documented: dict[type[BaseModel], str]) -> list[str]:
    lines: list[str] = []
    for name, field in section.model.model_fields.items():
        model, suffix = _section_model(field.annotation)
        path = _joined(section.path, name)
        if model is not None:
            where = documented.get(model, f"{path}{suffix}")
            summary = type_text(field).replace("a section (below)", f"section `{where}` (below)")
            lines += definition(f"`{path}`", summary, markdown_text(field.description or ""))
            continue
        if section.values is not None:
            default = value_text(getattr(section.values, name))
        elif field.is_required():
            default = "required"
        else:
            default = value_text(_default_of(field))
        summary = f"{type_text(field)} · default {default}"
        lines += definition(f"`{path}`", summary, markdown_text(field.description or ""))
    return lines


def page(
    title: str, introduction: str, top: type[BaseModel], values: BaseModel | None, level: int = 1
) -> str:
    """A reference page (or, at a deeper `level`, a part of one) of a model and every model nested in it,
    one heading per section."""
    lines = [f"{'#' * level} {title}", "", introduction, ""]
    documented: dict[type[BaseModel], str] = {}
    for section in _sections(Section("", top, values)):
        heading = f"`{section.path}`" if section.path else "The top level"
        lines += [f"{'#' * (level + 1)} {heading}", ""]
        if section.model in documented:  # e.g. every `stages.<stage>` entry has the fields of `defaults`
            field = section.path.rsplit(".", 1)[0]
            fields = documented[section.model]
            lines += [f"The fields of `{fields}`; the field `{field}` says how they combine.", ""]
            continue
        documented[section.model] = section.path or "the top level"
        lines += [markdown_text(inspect.cleandoc(section.model.__doc__ or "")), ""]
        lines += _field_entries(section, documented)
    return "\n".join(lines)
