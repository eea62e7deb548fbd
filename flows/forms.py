"""Each train deployment's run form fitted to its recipe, applied by infra/prefect/deploy.sh after
`prefect deploy` (which builds every train form from the same flow signature, hence the same 100 fields).

For a recipe the form shows: the executor, the profile and the run id first, then the recipe with its
store first; the model's and the task's fields of their own kind only, and the warm-up only for a testbed
model (probepo.config.kinds), the groups described for the model's kind (SECTION_DESCRIPTIONS); the
profile as a choice of the site's profiles (or another path). Every description is written for the UI's
markdown (ui_markdown), which would otherwise drop a `<placeholder>` as an HTML tag. The
deployment's parameters leave out what its form does (recipe_parameters), so its Quick run and its form
open on the same values, and a field left out takes its default when the flow validates the recipe. A recipe
given whole through the API (every field, as `model_dump` writes it) is still accepted by the server: the
fitted sections allow fields the form does not show, and the flow's own validation refuses, naming it, a
field that no model has.

`python -m flows.deployments --fit-forms [--site FILE]` fits the train deployments on the server
PREFECT_API_URL names.
"""

from __future__ import annotations

import copy
import re
from typing import Any

from probepo.config import RunConfig
from probepo.config.kinds import left_out

FIRST = ("executor", "profile", "run_id", "config")
"""The train form's parameters in the order it shows them."""
SECTION_DESCRIPTIONS = {
    "testbed": {
        "model": "The policy: the CPU testbed's tiny decoder-only GPT (probepo/models/gpt.py), trained in"
        " plain torch from the supervised warm-up's checkpoint (`warmup`).",
    },
    "hf": {
        "model": "The policy: a Hugging Face causal language model, from its pretrained weights"
        " (`pretrained`), sampled by the `generator` engine and trained by the `trainer` engine.",
        "algo": "The maths of the update, as the preset sets it.",
        "optim": "The optimizer of the policy, as the preset sets it.",
    },
}
"""The recipe's groups described for the model's kind, where RunConfig's own description speaks of
another kind (the testbed's defaults)."""


def recipe_parameters(config: RunConfig) -> dict[str, Any]:
    """The recipe as a deployment's parameter: its JSON dump without what does not apply to it."""
    dumped = config.model_dump(mode="json")
    for section, fields in left_out(config).items():
        if fields is None:
            dumped.pop(section, None)
        else:
            for name in fields:
                dumped[section].pop(name, None)
    return dumped


def fitted_schema(schema: dict[str, Any], config: RunConfig, profiles: list[str]) -> dict[str, Any]:
    """The train flow's parameter schema (Prefect's as `parameter_schema` makes it, with its `definitions`,
    each model's fields in their declared order) fitted to `config`: the parameters in FIRST's order, the
    store first in the recipe, the other kinds' fields and sections gone (from the definitions and from the
    nested defaults), the groups described for its model's kind, every description in ui_markdown, and
    `profiles` (absolute paths) offered as the profile's choices before any other path, or none for the
    executors that need none. Every field gets its `position`, which the UI sorts by: the server stores a
    schema as PostgreSQL JSONB, which keeps no key order (it sorts by length)."""
    fitted = copy.deepcopy(schema)
    for position, name in enumerate(FIRST):
        fitted["properties"][name]["position"] = position
    if profiles:
        # the site's profiles to choose from first; another path (an API caller's, a drill's) still taken
        fitted["properties"]["profile"]["anyOf"] = [
            {"type": "string", "enum": profiles, "title": "the site's"},
            {"type": "string", "title": "another path"},
            {"type": "null"},
        ]
    definitions = fitted["definitions"]
    recipe = definitions["RunConfig"]["properties"]
    definitions["RunConfig"]["properties"] = {"store": recipe["store"], **recipe}
    section_models = {"model": "ModelConfig", "task": "TaskConfig"}
    for section, fields in left_out(config).items():
        # a recipe given whole through the API (every field, as `model_dump` writes it) still validates
        # on the server; the flow's own validation still refuses a field no model has, naming it
        if fields is None:
            definitions["RunConfig"]["properties"].pop(section)
            definitions["RunConfig"]["additionalProperties"] = True
            continue
        definitions[section_models[section]]["additionalProperties"] = True
        properties = definitions[section_models[section]]["properties"]
        for name in fields:
            properties.pop(name, None)
            definitions["RunConfig"]["properties"][section].get("default", {}).pop(name, None)
    for section, description in SECTION_DESCRIPTIONS[config.model.kind].items():
        definitions["RunConfig"]["properties"][section]["description"] = description
    for definition in definitions.values():
        for position, field in enumerate(definition.get("properties", {}).values()):
            field["position"] = position
    return _described_for_the_ui(fitted)


def ui_markdown(text: str) -> str:
    """A docstring as the UI's markdown renders what it says: its wrapped lines joined (a wrapped line
    that starts with `>` or `-` would become a quote or a list), paragraphs kept, and `<` outside code
    spans escaped (the UI would take `<benchmarks_root>` for an HTML tag and show nothing)."""
    paragraphs = [" ".join(line.strip() for line in part.splitlines()) for part in re.split(r"\n\s*\n", text)]
    joined = "\n\n".join(paragraphs)
    pieces = joined.split("`")  # the odd pieces are code spans, shown as they are
    return "`".join(p if i % 2 else p.replace("<", "\\<") for i, p in enumerate(pieces))


def _described_for_the_ui(schema: Any) -> Any:
    """`schema` with every description in ui_markdown (in place; a default value is data, left alone)."""
    if isinstance(schema, dict):
        for key, value in schema.items():
            if key == "description" and isinstance(value, str):
                schema[key] = ui_markdown(value)
            elif key != "default":
                _described_for_the_ui(value)
    elif isinstance(schema, list):
        for item in schema:
            _described_for_the_ui(item)
    return schema
