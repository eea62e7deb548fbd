"""A site's settings: what the Prefect deployments of a team open on (store, executor, profile, and the
team's own recipe presets). `infra/prefect/deploy.sh` writes them into every deployment's parameters: a
flow run sees the worker's environment, which the UI's form cannot show or change. The command line takes
its default executor and profile from the same file (probepo/cli/site.py)."""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import Field

from probepo.config.base import Strict

SITE_ENV = "PROBEPO_SITE"
SITE_FILE = Path(__file__).resolve().parents[2] / "site.yaml"
"""The checkout's own site file (git-ignored), where PROBEPO_SITE names none."""


def site_file(path: Path | None = None) -> Path | None:
    """The site file in force: `path`, else $PROBEPO_SITE, else `site.yaml` in the checkout, else none."""
    named = path or (Path(os.environ[SITE_ENV]) if os.environ.get(SITE_ENV) else None)
    return SITE_FILE if named is None and SITE_FILE.is_file() else named


class SiteConfig(Strict):
    """The site file (`PROBEPO_SITE`, else `site.yaml` in the checkout; configs/sites/example.yaml shows
    one). Relative paths are from the site file's folder."""

    store: str | None = Field(None, min_length=1)
    """Where the team's runs live: `s3://bucket/prefix` or a folder every node shares. Every train
    deployment's recipe gets it, the resume, evaluate and nightly deployments default to it, and so does
    the command line after `--store` and $PROBEPO_STORE (probepo/store/cli.py: store_url). None:
    each recipe keeps its own store (the testbed's `./store`, in the worker's checkout) and the nightly
    evaluation refuses to start."""

    executor: str = "inline"
    """Where the deployments' stages run: inline (the worker's process: a laptop or a CPU testbed), local
    (a subprocess per stage), slurm (a SLURM job per stage) or resident (one SLURM job runs every stage).
    The evaluation deployments take slurm for resident (they run job arrays)."""

    profile: str | None = None
    """The execution profile (YAML) of the SLURM jobs: partitions, GPUs, job folder. Needed by slurm and
    resident."""

    profiles: tuple[str, ...] = ()
    """Other execution profiles (YAML) every train form offers beside `profile`, the site's choice ("the
    site's"; another path is still taken), e.g. one per partition or node type: `profiles:
    [configs/profiles/h200-two-nodes.yaml]` beside an 8×H200 node's `profile`. Every train form opens on
    `profile`: a site whose `profile` is a CPU cluster's (the testbed's) lists its GPU profiles here, and a
    GPU recipe's run (vLLM, DeepSpeed) chooses one in its form; `probepo check` warns of a GPU recipe on a
    profile that gives its jobs no GPU."""

    recipes: tuple[str, ...] = ()
    """Folders of the team's own recipe presets (`*.yaml`): each gets a train deployment beside those of
    configs/, named after its file, a staged `recipe.yaml` after its folder (`probepo stage` writes one per
    folder); a name used twice is refused."""
