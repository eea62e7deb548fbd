"""The deployments `infra/prefect/deploy.sh` creates: those of prefect.yaml, with its `train` entry made
once per recipe preset (configs/*.yaml and the site's recipe folders) and the site's store, executor and
profile (probepo/config/site.py) written into every deployment's parameters.

Why a train deployment per preset, rather than one form with a preset choice and overrides: its run form
opens on the recipe itself, field by field, so what will run is what the form shows (the study's 7B recipe
shows its 1,000 updates and its model), per-field bounds are checked as it is edited, and Quick run
launches the preset as it stands. A preset added is deployed by running deploy.sh again.

`python -m flows.deployments [--site FILE]` prints the prefect.yaml that deploy.sh deploys; with
`--fit-forms`, it fits the deployed train forms to their recipes (flows/forms.py), deploy.sh's last step.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from pydantic import ValidationError

from flows.forms import fitted_schema, recipe_parameters
from probepo.config import RunConfig, SiteConfig
from probepo.errors import ExecutionError
from probepo.presets import ConfigError, explain, load_profile, load_run_config
from slurm.executors import executor_for

ROOT = Path(__file__).resolve().parent.parent
PRESETS = ROOT / "configs"
SITE_ENV = "PROBEPO_SITE"
SITE_FILE = ROOT / "site.yaml"
"""The checkout's own site file (git-ignored), where PROBEPO_SITE names none."""


def site_file(path: Path | None = None) -> Path | None:
    """The site file in force: `path`, else $PROBEPO_SITE, else `site.yaml` in the checkout, else none."""
    named = path or (Path(os.environ[SITE_ENV]) if os.environ.get(SITE_ENV) else None)
    return SITE_FILE if named is None and SITE_FILE.is_file() else named


def load_site(path: Path | None) -> tuple[SiteConfig, Path]:
    """The site's settings and the folder its relative paths start from, from `site_file(path)`; without
    one, the defaults (every deployment keeps its own)."""
    named = site_file(path)
    if named is None:
        return SiteConfig(), ROOT
    try:
        data = yaml.safe_load(named.read_text()) or {}
        site = SiteConfig.model_validate(data)
    except OSError as exc:
        raise ConfigError(f"{named}: cannot read the site file: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{named}: not valid YAML: {exc}") from None
    except ValidationError as exc:
        raise explain(exc, str(named), root=SiteConfig) from None
    folder = named.resolve().parent
    try:
        executor_for(site.executor)
        profile = _absolute(site.profile, folder)
        load_profile(profile)
    except ExecutionError as exc:
        raise ConfigError(f"{named}: executor: {exc}") from None
    return site.model_copy(update={"profile": profile}), folder


def _absolute(path: str | None, folder: Path) -> str | None:
    return None if path is None else str((folder / path).resolve())


def presets(site: SiteConfig, folder: Path) -> dict[str, Path]:
    """The recipe presets to deploy, by deployment name (the file's stem)."""
    found: dict[str, Path] = {}
    for directory in (PRESETS, *(Path(_absolute(d, folder) or d) for d in site.recipes)):
        if not directory.is_dir():
            raise ConfigError(f"site recipes: {directory} is not a folder of recipe presets")
        for path in sorted(directory.glob("*.yaml")):
            if path.stem in found:
                raise ConfigError(f"{path}: a preset named {path.stem} exists already ({found[path.stem]})")
            found[path.stem] = path
    return found


def train_presets(site: SiteConfig, folder: Path) -> dict[str, RunConfig]:
    """Each preset's recipe as its train deployment opens on it (the site's store in it), by name."""
    stored = {"store": site.store} if site.store else {}
    return {name: load_run_config(path, stored) for name, path in presets(site, folder).items()}


def site_profiles(site: SiteConfig, folder: Path) -> list[str]:
    """The execution profiles a train form offers (absolute paths): the site's `profile`, then its
    `profiles`; none without a site (the form then takes any path)."""
    named = [site.profile, *(_absolute(p, folder) for p in site.profiles)]
    return list(dict.fromkeys(p for p in named if p))


def _about(path: Path) -> str:
    """A preset's description: the first sentence of its leading comment."""
    words = ""
    for line in path.read_text().splitlines():
        if not line.startswith("#") or words.endswith((".", ":")):
            break
        words = f"{words} {line.lstrip('# ').rstrip()}".strip()
    return words or f"the recipe of {path.name}"


def deployments(site: SiteConfig, folder: Path) -> dict[str, Any]:
    """prefect.yaml with the train deployment made per preset and the site's defaults in every
    deployment's parameters; a preset with `checkpoint_every` > 1 opens on the resident executor, which
    it needs, whatever the site's."""
    project = yaml.safe_load((ROOT / "prefect.yaml").read_text())
    executors = {"executor": site.executor, "profile": site.profile}
    arrays = {**executors, "executor": "slurm" if site.executor == "resident" else site.executor}
    stored = {"store": site.store} if site.store else {}
    made = []
    for entry in project["deployments"]:
        flow = entry["entrypoint"].rsplit(":", 1)[1]
        if flow == "train":
            recipes = train_presets(site, folder)
            for name, path in presets(site, folder).items():
                train = copy.deepcopy(entry)
                train.update(
                    name=name, description=f"{_about(path)} ({path.relative_to(path.parent.parent)})"
                )
                # a recipe that checkpoints in full only every N updates needs the resident executor
                needs = {"executor": "resident"} if recipes[name].checkpoint_every > 1 else {}
                train["parameters"] = {"config": recipe_parameters(recipes[name]), **executors, **needs}
                made.append(train)
            continue
        given = {"resume": {**stored, **executors}, "evaluate": {**stored, **arrays},
                 "nightly_eval": {**stored, **arrays}}.get(flow, {})  # fmt: skip
        made.append({**entry, "parameters": {**entry.get("parameters", {}), **given}})
    return {**project, "deployments": made}


def fit_train_forms(site: SiteConfig, folder: Path) -> list[str]:
    """Fit the run form of every train deployment on the server to its preset (flows/forms.py); returns
    their names."""
    from prefect import get_client
    from prefect.client.schemas.actions import DeploymentUpdate

    profiles = site_profiles(site, folder)
    fitted = []
    with get_client(sync_client=True) as client:
        for name, config in train_presets(site, folder).items():
            deployment = client.read_deployment_by_name(f"train/{name}")
            schema = fitted_schema(deployment.parameter_openapi_schema, config, profiles)
            client.update_deployment(deployment.id, DeploymentUpdate(parameter_openapi_schema=schema))
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
