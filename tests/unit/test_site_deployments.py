"""flows/deployments.py, what deploy.sh deploys: a train deployment per recipe preset opening on that
preset, the site's store, executor and profile in every deployment's parameters (a recipe on `resident`
where the site's executor cannot run its checkpoint_every), and a site file with a bad field, a bad
executor or a preset name used twice refused in one line naming it; staged recipes named after their
folders, and the example site file usable as the README copies it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from flows.deployments import deployments, load_site, site_profiles
from probepo.config import RunConfig
from probepo.presets import ConfigError, load_run_config

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def _site(tmp_path: Path, **fields: object) -> Path:
    path = tmp_path / "site.yaml"
    path.write_text(yaml.safe_dump(fields))
    return path


def test_every_preset_is_a_train_deployment_opening_on_it_with_the_sites_defaults(tmp_path):
    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes" / "team.yaml").write_text("# Our recipe.\nnum_updates: 3\n")
    (tmp_path / "profile.yaml").write_text("poll_s: 2\n")
    settings = {"store": "s3://team/runs", "executor": "resident", "profile": "profile.yaml"}
    site, folder = load_site(_site(tmp_path, **settings, recipes=["recipes"]))
    made = {entry["name"]: entry for entry in deployments(site, folder)["deployments"]}
    presets = {path.stem for path in CONFIGS.glob("*.yaml")} | {"team"}
    assert {name for name, entry in made.items() if entry["entrypoint"].endswith(":train")} == presets
    recipe = made["deepseekmath-7b-sft"]
    expected = load_run_config(CONFIGS / "deepseekmath-7b-sft.yaml", {"store": "s3://team/runs"})
    assert RunConfig.model_validate(recipe["parameters"]["config"]) == expected
    assert recipe["description"].startswith("The study's DeepSeekMath-7B-SFT recipe")
    profile = str(tmp_path / "profile.yaml")
    assert recipe["parameters"]["executor"] == "resident" and recipe["parameters"]["profile"] == profile
    assert made["team"]["parameters"]["config"]["num_updates"] == 3
    opens = "opens on the store s3://team/runs and the executor resident."
    assert made["team"]["description"] == f"Our recipe. (recipes/team.yaml); {opens}"
    # a first sentence that wraps, and not the launch line after it
    assert made["qwen3-4b-base"]["description"].startswith(
        "The study's Qwen3-4B-Base recipe: ProbePO, 27 updates on the MATH train split, Avg-6 of the six"
        " benchmarks. (configs/qwen3-4b-base.yaml); opens on"
    )
    nightly = {"store": "s3://team/runs", "executor": "slurm", "profile": profile}
    nightly |= {"selection": {"latest": True}, "max_parallel": 8}  # prefect.yaml's: a night fit for a cluster
    assert made["nightly-eval"]["parameters"] == nightly
    assert made["nightly-eval"]["schedules"][0]["cron"] == "0 2 * * *"  # the rest of prefect.yaml kept
    assert made["nightly-eval"]["description"].endswith(
        " It opens on the store s3://team/runs and the executor slurm."
    )
    assert made["resume"]["parameters"]["executor"] == "resident"


def test_without_a_site_the_deployments_keep_their_defaults(monkeypatch):
    monkeypatch.delenv("PROBEPO_SITE", raising=False)
    monkeypatch.setattr("probepo.config.site.SITE_FILE", Path("/nonexistent/site.yaml"))
    site, folder = load_site(None)
    made = {entry["name"]: entry for entry in deployments(site, folder)["deployments"]}
    assert RunConfig.model_validate(made["cpu-demo"]["parameters"]["config"]) == RunConfig()
    nightly = {"executor": "inline", "profile": None, "selection": {"latest": True}, "max_parallel": 8}
    assert made["nightly-eval"]["parameters"] == nightly  # no store: it refuses to start
    # inline keeps its engines from update to update: the study recipes' checkpoint_every 10 runs there
    assert made["deepseekmath-7b-sft"]["parameters"]["executor"] == "inline"


@pytest.mark.parametrize(
    ("executor", "study", "demo"),
    [("inline", "inline", "inline"), ("local", "resident", "local"), ("slurm", "resident", "slurm"),
     ("resident", "resident", "resident")],
)  # fmt: skip
def test_a_recipe_opens_on_resident_only_where_the_sites_executor_cannot_run_its_checkpoint_every(
    tmp_path, executor, study, demo
):
    """The study's recipes checkpoint in full every 10 updates, which a job per stage cannot run."""
    site, folder = load_site(_site(tmp_path, executor=executor))
    made = {entry["name"]: entry["parameters"] for entry in deployments(site, folder)["deployments"]}
    assert (made["deepseekmath-7b-sft"]["executor"], made["cpu-demo"]["executor"]) == (study, demo)
    assert made["resume"]["executor"] == executor  # its run's recipe is not known until it starts


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"executor": "slrum"}, "executor 'slrum': choose one of inline, local, slurm, resident"),
        ({"stor": "s3://x"}, "stor: no such field; did you mean store?"),
        ({"profile": "missing.yaml"}, "missing.yaml: cannot read the execution profile"),
        ({"recipes": ["."]}, "a preset named"),
    ],
)
def test_a_bad_site_file_is_refused_naming_the_field(tmp_path, fields, message):
    if fields.get("recipes"):
        (tmp_path / "cpu-demo.yaml").write_text("num_updates: 1\n")  # a name configs/ already uses
    path = _site(tmp_path, **fields)
    with pytest.raises(ConfigError) as refused:
        site, folder = load_site(path)
        deployments(site, folder)
    assert message in str(refused.value) and "\n" not in str(refused.value)


def test_staged_recipes_deploy_side_by_side_named_after_their_folders(tmp_path):
    """`probepo stage` writes every staged recipe as recipe.yaml in a folder of its own."""
    for folder, updates in (("dsm7b", 3), ("qwen4b", 5)):
        (tmp_path / "staged" / folder).mkdir(parents=True)
        (tmp_path / "staged" / folder / "recipe.yaml").write_text(f"num_updates: {updates}\n")
    site, folder = load_site(_site(tmp_path, recipes=["staged/dsm7b", "staged/qwen4b"]))
    made = {entry["name"]: entry for entry in deployments(site, folder)["deployments"]}
    assert "recipe" not in made
    assert made["dsm7b"]["parameters"]["config"]["num_updates"] == 3
    assert made["qwen4b"]["parameters"]["config"]["num_updates"] == 5
    assert made["qwen4b"]["description"].startswith(
        "the recipe of recipe.yaml (qwen4b/recipe.yaml); opens on"
    )


def test_the_example_site_file_copied_to_the_checkouts_root_loads(tmp_path):
    """README: `cp configs/sites/example.yaml site.yaml`. A checkout's root stands in (its configs/ linked),
    so that no site.yaml appears in the real checkout, where every command would take it up."""
    (tmp_path / "configs").symlink_to(CONFIGS)
    copy = tmp_path / "site.yaml"
    shutil.copyfile(CONFIGS / "sites" / "example.yaml", copy)
    site, folder = load_site(copy)
    assert site.profile == str(CONFIGS / "profiles" / "h200-node.yaml")
    assert site_profiles(site, folder) == [site.profile, str(CONFIGS / "profiles" / "h200-two-nodes.yaml")]
    assert (site.executor, site.store) == ("resident", "s3://my-team-bucket/probepo")
