"""`probepo launch`: a flow run of a Prefect deployment created through the API, as the UI's Run button
creates it (a worker of the deployment's pool runs it). Prefect is imported here only: probepo runs
without it."""

from __future__ import annotations

import os
from typing import Any


class LaunchError(RuntimeError):
    """The flow run could not be created: the message says why and what to do."""


def create_flow_run(deployment: str, parameters: dict[str, Any]) -> str:
    """Create a flow run of `deployment` (flow/deployment) with `parameters`; returns a line naming it and
    its URL in the UI. The server is PREFECT_API_URL's; no temporary server is started."""
    api = os.environ.get("PREFECT_API_URL", "")
    if not api:
        raise LaunchError(
            "PREFECT_API_URL is not set: point it at the Prefect server (infra/prefect/start.sh)"
        )
    import httpx
    from prefect import get_client
    from prefect.exceptions import ObjectNotFound, PrefectHTTPStatusError

    try:
        with get_client(sync_client=True) as client:
            target = client.read_deployment_by_name(deployment)
            created = client.create_flow_run_from_deployment(target.id, parameters=parameters)
    except ObjectNotFound:
        raise LaunchError(
            f"no deployment {deployment!r} on {api}: infra/prefect/deploy.sh makes one train deployment per"
            " preset of configs/ and of the site's recipe folders; or pass --deployment train/cpu-demo (any"
            " train deployment runs the recipe given)"
        ) from None
    except PrefectHTTPStatusError as exc:
        if exc.response.status_code == 401:
            raise LaunchError(
                f"the Prefect server at {api} wants its password: set PREFECT_API_AUTH_STRING=user:password"
                " (infra/prefect/start.sh prints it)"
            ) from None
        raise LaunchError(f"the Prefect server at {api} refused the flow run: {exc}") from None
    except (httpx.TransportError, OSError) as exc:
        raise LaunchError(f"the Prefect server at PREFECT_API_URL={api} does not answer ({exc})") from None
    return f"flow run {created.name} ({created.id}): {api.removesuffix('/api')}/runs/flow-run/{created.id}"
