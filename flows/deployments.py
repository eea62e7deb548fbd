"""The deployments `infra/prefect/deploy.sh` creates: those of prefect.yaml, with its `train` entry made
once per recipe preset (configs/*.yaml and the site's recipe folders) and the site's store, executor and
profile (probepo/config/site.py) written into every deployment's parameters.

Why a train deployment per preset, rather than one form with a preset choice and overrides: its run form
opens on the recipe itself, field by field, so what will run is what the form shows (the study's 7B recipe
shows its 1,000 updates and its model), a value out of its field's bounds is refused on submit naming the
field, and Quick run launches the preset as it stands. A preset added is deployed by running deploy.sh again.

`python -m flows.deployments [--site FILE]` prints the prefect.yaml that deploy.sh deploys; with
`--fit-forms`, it fits the deployed train forms to their recipes (flows/forms.py), deploy.sh's last step.
"""

from __future__ import annotations

import copy
import itertools
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml

from flows.forms import fitted_schema, recipe_parameters
from probepo.config import RunConfig, SiteConfig
from probepo.config.site import site_file
from probepo.errors import ExecutionError
from probepo.presets import ConfigError, load_profile, load_run_config, load_site_file
from probepo.staging import preset_name
from slurm.executors import executor_for, executor_that_runs

ROOT = Path(__file__).resolve().parent.parent
PRESETS = ROOT / "configs"


def load_site(path: Path | None) -> tuple[SiteConfig, Path]:
    """The site's settings and the folder its relative paths start from, from `site_file(path)`; without
    one, the defaults (every deployment keeps its own)."""
    named = site_file(path)
    if named is None:
        return SiteConfig(), ROOT
    site = load_site_file(named)
    try:
        executor_for(site.executor)
        load_profile(site.profile)
    except ExecutionError as exc:
        raise ConfigError(f"{named}: executor: {exc}") from None
    return site, named.resolve().parent


def _absolute(path: str | None, folder: Path) -> str | None:
    return None if path is None else str((folder / path).resolve())


@dataclass(frozen=True)
class Preset:
    """A recipe preset as its train deployment opens on it."""

    path: Path
    recipe: RunConfig
    """Its recipe with the site's store in it."""

    @property
    def description(self) -> str:
        """The first sentence of its leading comment (which may wrap), and where it is."""
        lines = itertools.takewhile(lambda line: line.startswith("#"), self.path.read_text().splitlines())
        comment = " ".join(line.lstrip("# ").rstrip() for line in lines)
        first = re.match(r"(.+?\.)(\s|$)", comment)
        words = first.group(1) if first else comment or f"the recipe of {self.path.name}"
        return f"{words} ({self.path.relative_to(self.path.parent.parent)})"


def presets(site: SiteConfig, folder: Path) -> dict[str, Preset]:
    """The recipe presets to deploy, by deployment name (preset_name)."""
    stored = {"store": site.store} if site.store else {}
    found: dict[str, Preset] = {}
    for directory in (PRESETS, *(Path(_absolute(d, folder) or d) for d in site.recipes)):
        if not directory.is_dir():
            raise ConfigError(f"site recipes: {directory} is not a folder of recipe presets")
        for path in sorted(directory.glob("*.yaml")):
            name = preset_name(path)
            if name in found:
                raise ConfigError(f"{path}: a preset named {name} exists already ({found[name].path})")
            found[name] = Preset(path, load_run_config(path, stored))
    return found


def site_profiles(site: SiteConfig, folder: Path) -> list[str]:
    """The execution profiles a train form offers (absolute paths): the site's `profile`, then its
    `profiles`; none without a site (the form then takes any path)."""
    named = [site.profile, *(_absolute(p, folder) for p in site.profiles)]
    return list(dict.fromkeys(p for p in named if p))


def opens_on(store: str | None, executor: str) -> str:
    """What a deployment's description adds: the store and executor its form opens on (the site's, where
    it has them), which the deployments list shows without opening the form."""
    return f"opens on {f'the store {store}' if store else 'no store (give one)'} and the executor {executor}"


def deployments(site: SiteConfig, folder: Path) -> dict[str, Any]:
    """prefect.yaml with the train deployment made per preset and the site's defaults in every
    deployment's parameters and description (opens_on); a preset the site's executor cannot run opens on
    the resident executor (slurm.executors.executor_that_runs), and the evaluations take slurm where the
    site's executor runs no job arrays."""
    project = yaml.safe_load((ROOT / "prefect.yaml").read_text())
    executors = {"executor": site.executor, "profile": site.profile}
    arrays = {**executors, "executor": site.executor if executor_for(site.executor).arrays else "slurm"}
    stored = {"store": site.store} if site.store else {}
    made = []
    for entry in project["deployments"]:
        flow = entry["entrypoint"].rsplit(":", 1)[1]
        if flow == "train":
            for name, preset in presets(site, folder).items():
                train = copy.deepcopy(entry)
                executor = executor_that_runs(site.executor, preset.recipe.checkpoint_every)
                described = f"{preset.description}; {opens_on(preset.recipe.store, executor)}."
                train.update(name=name, description=described)
                train["parameters"] = {
                    "config": recipe_parameters(preset.recipe),
                    **executors,
                    "executor": executor,
                }
                made.append(train)
            continue
        given = {"resume": {**stored, **executors}, "evaluate": {**stored, **arrays},
                 "nightly_eval": {**stored, **arrays}}.get(flow, {})  # fmt: skip
        described = entry["description"]
        if given:  # the demo is given none: its own recipe, in the worker's process
            described += f" It {opens_on(site.store, given['executor'])}."
        parameters = {**entry.get("parameters", {}), **given}
        made.append({**entry, "description": described, "parameters": parameters})
    return {**project, "deployments": made}


def fit_train_forms(site: SiteConfig, folder: Path) -> list[str]:
    """Fit the run form of every train deployment on the server to its preset (flows/forms.py); returns
    their names."""
    from prefect import get_client
    from prefect.client.schemas.actions import DeploymentUpdate
    from prefect.utilities.callables import parameter_schema

    from flows.train import train

    # the schema `prefect deploy` sent, made again: the server's copy has lost the models' field order
    schema = parameter_schema(train).model_dump(exclude_unset=True)
    profiles = site_profiles(site, folder)
    fitted = []
    with get_client(sync_client=True) as client:
        for name, preset in presets(site, folder).items():
            deployment = client.read_deployment_by_name(f"train/{name}")
            form = fitted_schema(schema, preset.recipe, profiles)
            client.update_deployment(deployment.id, DeploymentUpdate(parameter_openapi_schema=form))
            fitted.append(name)
    return fitted


SiteOption = Annotated[Path | None, typer.Option("--site", help="The site file (default: $PROBEPO_SITE).")]
FitOption = Annotated[
    bool, typer.Option("--fit-forms", help="Fit the deployed train forms to their recipes instead.")
]


def main(site: SiteOption = None, fit_forms: FitOption = False) -> None:
    """Print the prefect.yaml deploy.sh deploys (or, after `prefect deploy`, fit its train forms)."""
    try:
        settings, folder = load_site(site)
        if fit_forms:
            names = fit_train_forms(settings, folder)
            typer.echo(f"fitted the run forms of {len(names)} train deployments to their recipes")
            return
        typer.echo(yaml.safe_dump(deployments(settings, folder), sort_keys=False, allow_unicode=True))
    except ConfigError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None


if __name__ == "__main__":
    typer.run(main)
