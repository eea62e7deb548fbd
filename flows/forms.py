"""Each train deployment's run form fitted to its recipe, applied by infra/prefect/deploy.sh after
`prefect deploy` (which builds every train form from the same flow signature, hence the same 100 fields).

For a recipe the form shows: the executor, the profile and the run id first, then the recipe with its
store first; the model's and the task's fields of their own kind only, and the warm-up only for a testbed
model (probepo.config.kinds); the profile as a choice of the site's profiles (or another path). The
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
from typing import Any

from probepo.config import RunConfig
from probepo.config.kinds import left_out

FIRST = ("executor", "profile", "run_id", "config")
"""The train form's parameters in the order it shows them."""


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
    nested defaults), and `profiles` (absolute paths) offered as the profile's choices before any other
    path, or none for the executors that need none. Every field gets its `position`, which the UI sorts
    by: the server stores a schema as PostgreSQL JSONB, which keeps no key order (it sorts by length)."""
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
    for definition in definitions.values():
        for position, field in enumerate(definition.get("properties", {}).values()):
            field["position"] = position
    return fitted
