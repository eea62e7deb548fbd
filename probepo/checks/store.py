"""The store a run commits to: it answers a listing, takes a write and a delete, and honours the conditional
requests exactly-once rests on."""

from __future__ import annotations

from typing import TYPE_CHECKING

from probepo.checks.findings import Findings
from probepo.config import RunConfig
from probepo.store import StoreError, open_store
from probepo.store.capabilities import probe_conditionals

if TYPE_CHECKING:
    from probepo.checks.launch import Launch


def check(launch: Launch) -> Findings:
    """The recipe's store; of a recipe that failed validation, its `store` where it is given as text."""
    if launch.config is not None:
        return store_findings(launch.config.store)
    store = launch.fields.get("store", RunConfig.model_fields["store"].default)
    return store_findings(store) if isinstance(store, str) and store else Findings()


def store_findings(url: str) -> Findings:
    """The store answers a listing (reachable, credentials accepted), takes a write and a delete, and
    honours the conditional requests exactly-once rests on (probepo/store/capabilities.py, run afresh)."""
    try:
        store = open_store(url)
        runs = len(store.runs())
        found, lacks = probe_conditionals(store.objects)
    except StoreError as exc:
        return Findings(failures=[str(exc)])
    except OSError as exc:  # a local folder that cannot be made or written
        return Findings(failures=[f"store {url}: {exc.strerror or exc}: give a folder you can write"])
    if lacks:
        return Findings(
            failures=[
                f"store {url}: its endpoint does not honour conditional requests ({'; '.join(lacks)}): two"
                " writers could both commit a stage or hold a lease: use an endpoint that honours them"
            ]
        )
    passed = f"store: {url}: {runs} run(s), writable, conditional requests honoured"
    notes = "; ".join(found.workarounds())
    return Findings(passed=[f"{passed} ({notes})" if notes else passed])
