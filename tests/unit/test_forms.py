"""A train deployment's run form fitted to its recipe (flows/forms.py): the study's 7B recipe shows no
testbed field and no warm-up, the testbed no Hugging Face field; executor, profile and run id come first
and the store first in the recipe; the profile is a choice of the site's; the groups are described for
the model's kind and every description is markdown the UI shows whole; and the deployment's own
parameters validate against its fitted form as the server checks them (enforce_parameter_schema); and
probepo/config/kinds.py lists every field of the model and the task under its kinds, so that no field is
added without saying which kinds' forms show it."""

from __future__ import annotations

from pathlib import Path
from typing import get_args

import pytest
from prefect.utilities.callables import parameter_schema
from prefect.utilities.schema_tools import validate

from flows.forms import SECTION_DESCRIPTIONS, fitted_schema, recipe_parameters, ui_markdown
from flows.train import train
from probepo.config import RunConfig
from probepo.config.kinds import MODEL_COMMON, MODEL_FIELDS, SECTIONS_OF_MODEL, TASK_COMMON, TASK_FIELDS
from probepo.presets import load_run_config

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
SCHEMA = parameter_schema(train.fn).model_dump()
PROFILES = ["/shared/probepo/h200-node.yaml", "/shared/probepo/h200-two-nodes.yaml"]


def _shown(schema: dict, definition: str) -> list[str]:
    """The fields of `definition` in the order the form shows them (by `position`: the server keeps no key
    order)."""
    fields = schema["definitions"][definition]["properties"]
    return sorted(fields, key=lambda name: fields[name]["position"])


def test_the_7b_recipes_form_has_no_testbed_field_and_the_site_first():
    recipe = load_run_config(CONFIGS / "deepseekmath-7b-sft.yaml")
    form = fitted_schema(SCHEMA, recipe, PROFILES)
    order = sorted(form["properties"], key=lambda name: form["properties"][name]["position"])
    assert order == ["executor", "profile", "run_id", "config"]
    assert _shown(form, "RunConfig")[:3] == ["store", "seed", "num_updates"]  # then as RunConfig has them
    assert "warmup" not in _shown(form, "RunConfig")
    model = _shown(form, "ModelConfig")
    assert model[:2] == ["kind", "pretrained"] and not {"d_model", "vocab_size", "n_layers"} & set(model)
    assert not {"modulus", "steps", "hops"} & set(_shown(form, "TaskConfig"))
    assert "d_model" not in form["definitions"]["RunConfig"]["properties"]["model"]["default"]
    assert form["properties"]["profile"]["anyOf"][0]["enum"] == PROFILES
    parameters = {"config": recipe_parameters(recipe), "executor": "resident", "profile": PROFILES[0]}
    assert validate(parameters, form, raise_on_error=False) == []
    assert RunConfig.model_validate(parameters["config"]) == recipe  # what is left out takes its default
    assert validate({**parameters, "profile": "/elsewhere.yaml"}, form) == []  # another path still taken
    whole = {**parameters, "config": recipe.model_dump(mode="json")}  # a recipe given whole, via the API
    assert validate(whole, form) == []


def test_the_testbeds_form_keeps_its_model_and_warm_up_and_takes_any_profile_without_a_site():
    form = fitted_schema(SCHEMA, RunConfig(), [])
    assert "warmup" in _shown(form, "RunConfig") and "d_model" in _shown(form, "ModelConfig")
    assert "pretrained" not in _shown(form, "ModelConfig") and "eval_set" not in _shown(form, "TaskConfig")
    unfitted = ("description", "position")  # the flow's own type: no choice of the site's
    assert {k: v for k, v in form["properties"]["profile"].items() if k not in unfitted} == {
        k: v for k, v in SCHEMA["properties"]["profile"].items() if k not in unfitted
    }
    assert form["properties"]["profile"]["position"] == 1
    assert validate({"config": recipe_parameters(RunConfig())}, form) == []


def test_each_form_describes_the_groups_for_its_models_kind_in_markdown_the_ui_shows_whole():
    for recipe in (RunConfig(), load_run_config(CONFIGS / "deepseekmath-7b-sft.yaml")):
        sections = fitted_schema(SCHEMA, recipe, PROFILES)["definitions"]["RunConfig"]["properties"]
        for section, description in SECTION_DESCRIPTIONS[recipe.model.kind].items():
            assert sections[section]["description"] == description
    hf = fitted_schema(SCHEMA, load_run_config(CONFIGS / "deepseekmath-7b-sft.yaml"), PROFILES)
    assert "testbed" not in hf["definitions"]["RunConfig"]["properties"]["model"]["description"]
    sources = hf["definitions"]["TaskConfig"]["properties"]["train_sources"]["description"]
    assert "staged by the user as \\<benchmarks_root>/math_train/train.jsonl)" in sources  # not an HTML tag
    executor = hf["properties"]["executor"]["description"]  # its wrapped `> 1` is no quote: one line
    assert "\n" not in executor and "as checkpoint_every > 1 needs" in executor


def test_ui_markdown_joins_wrapped_lines_keeps_paragraphs_and_escapes_tags_outside_code():
    text = "Staged as <root>/a.jsonl, a\n> 1 line; `<kept>` as code.\n\nA second\n  paragraph."
    assert (
        ui_markdown(text)
        == "Staged as \\<root>/a.jsonl, a > 1 line; `<kept>` as code.\n\nA second paragraph."
    )


@pytest.mark.parametrize(
    ("section", "common", "by_kind"),
    [("model", MODEL_COMMON, MODEL_FIELDS), ("task", TASK_COMMON, TASK_FIELDS)],
)
def test_every_field_of_the_model_and_the_task_is_listed_once_as_common_or_of_its_kinds(
    section, common, by_kind
):
    model = RunConfig.model_fields[section].annotation
    assert set(by_kind) == set(get_args(model.model_fields["kind"].annotation))
    listed = [*common, *(name for fields in by_kind.values() for name in fields)]
    assert sorted(listed) == sorted(model.model_fields)


def test_the_sections_of_one_model_kind_are_recipe_sections():
    assert set(SECTIONS_OF_MODEL) == set(MODEL_FIELDS)
    assert {name for sections in SECTIONS_OF_MODEL.values() for name in sections} <= set(
        RunConfig.model_fields
    )
