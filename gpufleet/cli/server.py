"""`gpufleet server`: the REST API and the web dashboard, in the foreground."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import typer

from gpufleet.cli.live import KUBECONFIG, kube_client
from gpufleet.cli.output import err_console, fail

LOOPBACK_NAMES = ("localhost",)


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def server_command(
    kubeconfig: Path | None = KUBECONFIG,
    host: str = typer.Option(
        "127.0.0.1", "--host", help="Address to listen on (0.0.0.0 in a cluster)."
    ),
    port: int = typer.Option(8090, "--port", help="Port of the dashboard and the API."),
    insecure_local: bool = typer.Option(
        False,
        "--insecure-local",
        help="Ask no token and allow every request: for a dev cluster on this machine only "
        "(refused unless --host is a loopback address).",
    ),
    auth_cache_seconds: float = typer.Option(
        10.0,
        "--auth-cache-seconds",
        help="How long a TokenReview or SubjectAccessReview answer is reused.",
    ),
    sync_timeout: float = typer.Option(
        60.0, "--sync-timeout", help="Seconds to wait for the first LIST of every kind."
    ),
    ledger: str | None = typer.Option(
        None,
        "--ledger",
        envvar="GPUFLEET_LEDGER",
        help="The usage ledger for /api/v1/cost and /usage: a SQLite file or a database URL "
        "(the controller's --ledger); default $GPUFLEET_LEDGER, else none.",
    ),
) -> None:
    """Serve the dashboard at / and the REST API under /api/v1/ (OpenAPI document at
    /api/v1/openapi.json), read from watch caches of the cluster. API requests carry a
    Kubernetes bearer token: the cluster decides who the caller is (TokenReview) and what they
    may read or change (SubjectAccessReview on the gpufleet.io resource), as for kubectl.

    Examples:

      gpufleet server --kubeconfig ~/.cache/gpufleet/dev-cluster/kubeconfig --insecure-local

      curl -H "Authorization: Bearer $(kubectl create token NAME)" localhost:8090/api/v1/status
    """
    if insecure_local and not is_loopback(host):
        raise fail(
            f"--insecure-local serves everyone without a token: refused on {host}; "
            "listen on 127.0.0.1 or drop --insecure-local"
        )
    import uvicorn

    from gpufleet.api.access import KubernetesAccess, LocalAccess
    from gpufleet.api.app import create_app
    from gpufleet.api.source import ClusterSource, KubernetesActions
    from gpufleet.ledger.store import LedgerError, open_ledger

    try:
        store = open_ledger(ledger, create=False) if ledger else None
    except LedgerError as err:
        raise fail(str(err)) from None
    client = kube_client(kubeconfig)
    configuration = client.Configuration.get_default_copy()
    configuration.connection_pool_maxsize = 16  # the watches and the access reviews
    api = client.ApiClient(configuration)
    source = ClusterSource(api)
    try:
        source.start(sync_timeout)
    except RuntimeError as err:
        raise fail(str(err)) from None
    access = (
        LocalAccess()
        if insecure_local
        else KubernetesAccess(
            client.AuthenticationV1Api(api), client.AuthorizationV1Api(api), auth_cache_seconds
        )
    )
    app = create_app(source, access, KubernetesActions(api), ledger=store)
    shown = f"[{host}]" if ":" in host else host
    err_console.print(
        f"gpufleet server: dashboard at http://{shown}:{port}/, API under /api/v1/"
        + (" (insecure-local: no token asked)" if insecure_local else "")
    )
    try:
        uvicorn.run(app, host=host, port=port, log_level="warning")
    finally:
        source.stop.set()
        if store is not None:
            store.close()
