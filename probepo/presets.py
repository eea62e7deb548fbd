"""Run configs from YAML presets and dotted overrides, and errors a user can act on.

Every invalid value is reported as one line naming where it came from (the preset file, or the command-line
option that set it), the dotted field, what was wrong, what is allowed, and for a misspelt field the
nearest existing one (`group_sze` → `group_size`).

A recipe composed here (the presets' loader, the CLI's overrides, the flows' parameter check through
`validate_run_config`) also fits its task (`task_problems`): those rules build the task, its tokenizer or
read the benchmark registry, which the configuration models below them never import.
"""

from __future__ import annotations

import difflib
import typing
from collections.abc import Mapping
from os import PathLike
from pathlib import Path
from typing import Any

from annotated_types import Ge, Gt, Le, Lt, MinLen
from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo

from probepo.config import ExecutionProfile, RunConfig, SiteConfig
from probepo.config.run import TESTBED_TASKS
from probepo.data import build_task
from probepo.data.benchmarks import BENCHMARKS


class ConfigError(ValueError):
    """An invalid run config; the message has one line per problem, each naming its source and field."""


def _set_dotted(data: dict, overrides: Mapping[str, object]) -> dict:
    for dotted, value in overrides.items():
        node = data
        *parents, leaf = dotted.split(".")
        for depth, key in enumerate(parents, start=1):
            node = node.setdefault(key, {})
            if not isinstance(node, dict):
                held = ".".join(parents[:depth])
                raise ConfigError(f"{dotted}: {held} holds a value, not fields: drop the part after {held}")
        node[leaf] = value
    return data


def _field_at(
    root: type[BaseModel], loc: tuple[str | int, ...]
) -> tuple[type[BaseModel] | None, FieldInfo | None]:
    """The model that holds the field at `loc` and the field (None where `loc` leaves the models; a
    mapping of models, such as a profile's `stages`, is walked through its values)."""
    model: type[BaseModel] = root
    info: FieldInfo | None = None
    parts = list(loc)
    while parts:
        info = model.model_fields.get(str(parts.pop(0)))
        if info is None:
            return model, None
        nested = info.annotation
        if typing.get_origin(nested) is dict and parts:
            nested = typing.get_args(nested)[1]
            parts.pop(0)  # the mapping's key
        if parts:
            if not (isinstance(nested, type) and issubclass(nested, BaseModel)):
                return None, None
            model = nested
    return model, info


def _allowed(info: FieldInfo) -> str:
    """What a field accepts, in words: its type, its bounds, its choices."""
    annotation = info.annotation
    if typing.get_origin(annotation) is typing.Literal:
        return "one of " + ", ".join(repr(choice) for choice in typing.get_args(annotation))
    names = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}
    kind = names.get(annotation, getattr(annotation, "__name__", str(annotation)))
    bounds = []
    for rule in info.metadata:
        for cls, symbol, attribute in ((Ge, ">=", "ge"), (Gt, ">", "gt"), (Le, "<=", "le"), (Lt, "<", "lt")):
            if isinstance(rule, cls):
                bounds.append(f"{symbol} {getattr(rule, attribute)}")
        if isinstance(rule, MinLen):
            bounds.append(f"of at least {rule.min_length} character(s)")
    return " ".join([kind, *bounds])


def _problem(root: type[BaseModel], error: Mapping[str, Any], named: bool) -> str:
    """One error's text: what was wrong and what is allowed, or the nearest field for a typo. `named`: the
    source already names the field (an option such as `--set algo.kappa`), so the text does not repeat it."""
    loc = tuple(error["loc"])
    dotted = ".".join(map(str, loc)) or "<config>"
    field = "" if named else f"{dotted}: "
    message = str(error["msg"]).removeprefix("Value error, ")
    model, info = _field_at(root, loc)
    if error["type"] == "extra_forbidden":
        parent = ".".join(map(str, loc[:-1]))
        near = difflib.get_close_matches(str(loc[-1]), list(model.model_fields) if model else [], n=1)
        if near:
            return f"{field}no such field; did you mean {'.'.join(filter(None, [parent, near[0]]))}?"
        fields = ", ".join(model.model_fields) if model else ""
        return f"{field}no such field (the fields{' of ' + parent if parent else ''}: {fields})"
    if error["type"] == "value_error" or info is None:  # a rule across fields: its message says it all
        return f"{dotted}: {message}" if loc else message
    return f"{field}{error.get('input')!r} is refused: {message}; allowed: {_allowed(info)}"


def explain(
    exc: ValidationError,
    source: str,
    blame: Mapping[str, str] | None = None,
    root: type[BaseModel] = RunConfig,
) -> ConfigError:
    """A ConfigError for a failed validation of `root`: each problem is attributed to the option in
    `blame` (dotted field → e.g. `--set algo.kappa`) whose field it concerns, else to `source`."""
    blame = blame or {}
    lines = []
    for error in exc.errors():
        dotted = ".".join(map(str, error["loc"]))
        owner = next(
            (
                (field, option)
                for field, option in blame.items()
                if dotted in (field,) or dotted.startswith(field + ".")
            ),
            (None, source),
        )
        lines.append(f"{owner[1]}: {_problem(root, error, named=owner[0] == dotted)}")
    return ConfigError("\n".join(lines))


def validate_run_config(
    data: Mapping[str, Any], source: str, blame: Mapping[str, str] | None = None
) -> RunConfig:
    """RunConfig.model_validate, then what the recipe needs of its task (`task_problems`), with a
    ConfigError naming every problem on failure."""
    try:
        config = RunConfig.model_validate(data)
    except ValidationError as exc:
        raise explain(exc, source, blame) from None
    return fitting_its_task(config, source)


def with_overrides(config: RunConfig, **overrides: object) -> RunConfig:
    """A validated copy of `config` with dotted overrides, e.g. `**{"algo.algorithm": "grpo"}` (a pydantic
    ValidationError for a bad value; a ConfigError when the result does not fit its task)."""
    changed = RunConfig.model_validate(_set_dotted(config.model_dump(), overrides))
    return fitting_its_task(changed, "overrides " + ", ".join(overrides))


def fitting_its_task(config: RunConfig, source: str) -> RunConfig:
    """`config`, once it fits its task; else a ConfigError with a line per problem, each naming `source`."""
    problems = task_problems(config)
    if problems:
        raise ConfigError("\n".join(f"{source}: {problem}" for problem in problems))
    return config


def task_problems(config: RunConfig) -> list[str]:
    """Each way `config` does not fit its task, as a line naming the fields and what to do; [] if none.
    A testbed recipe builds its task (cheap: a tokenizer of a few symbols); a maths recipe's benchmark
    names are checked against the registry, its model's context when the model is loaded."""
    if config.task.kind not in TESTBED_TASKS:
        return _benchmark_problems(config)
    task = build_task(config.task)
    problems = []
    if config.model.vocab_size != task.tokenizer.vocab_size:
        problems.append(
            f"model.vocab_size = {config.model.vocab_size} but the {config.task.kind} task's tokenizer has"
            f" {task.tokenizer.vocab_size} tokens: set model.vocab_size = {task.tokenizer.vocab_size}"
        )
    algo = config.algo
    try:
        suffix = task.tokenizer.encode(algo.rescue_suffix) if algo.rescue_tokens else []
    except ValueError as exc:
        problems.append(
            f"algo.rescue_suffix = {algo.rescue_suffix!r} cannot be tokenized by the {config.task.kind}"
            f" task ({exc}): use the task's own suffix {task.rescue_suffix!r} (or algo.rescue_tokens = 0)"
        )
        return problems
    rescue = len(suffix) + algo.rescue_tokens if suffix else 0
    longest = task.longest_prompt() + config.sampling.max_tokens + rescue
    if longest > config.model.context:
        problems.append(
            f"model.context = {config.model.context} is shorter than the longest prompt +"
            f" sampling.max_tokens + rescue = {longest} tokens: raise model.context or lower"
            " sampling.max_tokens"
        )
    return problems


def _benchmark_problems(config: RunConfig) -> list[str]:
    unknown = [name for name in (*config.eval.benchmarks, config.task.eval_set) if name not in BENCHMARKS]
    if not unknown:
        return []
    return [f"eval.benchmarks / task.eval_set name {', '.join(unknown)}: choose from {', '.join(BENCHMARKS)}"]


def _read_yaml(path: str | PathLike[str], what: str) -> dict[str, Any]:
    import yaml

    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the {what}: {exc.strerror or exc}") from None
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of fields at the top level")
    return data


def load_run_config(
    path: str | PathLike[str],
    overrides: Mapping[str, object] | None = None,
    *,
    blame: Mapping[str, str] | None = None,
) -> RunConfig:
    """A RunConfig from a YAML preset with dotted overrides (e.g. `{"algo.algorithm": "grpo"}`).

    `blame` names the command-line option behind each override, so that an invalid value is reported
    against it (`--set algo.kappa`) rather than against the file. Raises ConfigError (a ValueError).
    """
    return validate_run_config(_set_dotted(preset_fields(path), overrides or {}), str(path), blame)


def preset_fields(path: str | PathLike[str]) -> dict[str, Any]:
    """A YAML preset's fields, not yet validated (`probepo check` reports what fails with the rest)."""
    return _read_yaml(path, "preset")


def load_profile(path: str | PathLike[str] | None) -> ExecutionProfile:
    """An ExecutionProfile from YAML (None: the defaults), its `job_folder` absolute: `~` expanded, a
    relative one taken from the file's own folder (not from wherever the reader runs: a worker's checkout,
    a login shell). Raises ConfigError naming file and field."""
    if path is None:
        return ExecutionProfile()
    try:
        profile = ExecutionProfile.model_validate(_read_yaml(path, "execution profile"))
    except ValidationError as exc:
        raise explain(exc, str(path), root=ExecutionProfile) from None
    folder = Path(profile.job_folder).expanduser()  # `~/jobs` is the reader's home, written out
    if not folder.is_absolute():
        folder = (Path(path).resolve().parent / folder).resolve()
    return profile.model_copy(update={"job_folder": str(folder)})


def load_site_file(path: str | PathLike[str]) -> SiteConfig:
    """A site file's settings, its `profile` and a folder `store` made absolute (a relative one is from the
    site file's folder). Raises ConfigError naming file and field."""
    try:
        site = SiteConfig.model_validate(_read_yaml(path, "site file"))
    except ValidationError as exc:
        raise explain(exc, str(path), root=SiteConfig) from None
    folder = Path(path).resolve().parent
    absolute = {}
    if site.profile is not None:
        absolute["profile"] = str((folder / site.profile).resolve())
    if site.store is not None and "://" not in site.store:
        absolute["store"] = str((folder / Path(site.store).expanduser()).resolve())
    return site.model_copy(update=absolute)
