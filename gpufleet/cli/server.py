"""`gpufleet server`: the REST API and the web dashboard, in the foreground."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import typer

from gpufleet.api.limits import Limits
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
    tls_cert_file: Path | None = typer.Option(
        None,
        "--tls-cert-file",
        help="Serve HTTPS with this certificate (PEM, the chain after it); with "
        "--tls-private-key-file.",
    ),
    tls_private_key_file: Path | None = typer.Option(
        None, "--tls-private-key-file", help="The private key of --tls-cert-file (PEM)."
    ),
    rate_limit: float = typer.Option(
        Limits.rate,
        "--rate-limit",
        help="Requests per second each caller (token, or address without one) may make, "
        "on average; past it, 429 with Retry-After.",
    ),
    rate_burst: int = typer.Option(
        Limits.burst, "--rate-burst", help="Requests a caller may make at once above the rate."
    ),
    max_connections: int = typer.Option(
        200,
        "--max-connections",
        help="Connections and requests served at once; past it, 503 (the pod's memory stays "
        "bounded under a flood).",
    ),
    ledger: str | None = typer.Option(
        None,
        "--ledger",
        envvar="GPUFLEET_LEDGER",
        help="The usage ledger for /api/v1/cost and /usage: a SQLite file or a database URL "
        "(the controller's --ledger); default $GPUFLEET_LEDGER, else none.",
    ),
    prometheus: str | None = typer.Option(
        None,
        "--prometheus",
        envvar="GPUFLEET_PROMETHEUS",
        help="A Prometheus that scrapes the gpufleet agents (its base URL): a workload's GPU "
        "metrics (/api/v1/workloads/NS/NAME/metrics) are read from it; default none.",
    ),
    fleet: bool = typer.Option(
        False,
        "--fleet",
        help="On the hub of a fleet of clusters: show every worker's workloads, nodes and "
        "pools too (read with the kubeconfig in each Cluster's Secret), each with its "
        "cluster, and filter by ?cluster=. Read-only: cancel in the workload's cluster, or "
        "delete its hub Job.",
    ),
) -> None:
    """Serve the dashboard at / and the REST API under /api/v1/ (OpenAPI document at
    /api/v1/openapi.json), read from watch caches of the cluster. API requests carry a
    Kubernetes bearer token: the cluster decides who the caller is (TokenReview) and what they
    may read or change (SubjectAccessReview on the gpufleet.io resource), as for kubectl.

    It also takes the reports of standalone agents (`gpufleet agent standalone --server`) at
    /api/v1/hosts/NAME/reports, each host with its own token (`gpufleet hosts token NAME`),
    and keeps each host as a GPUHost.

    Examples:

      gpufleet server --kubeconfig ~/.cache/gpufleet/dev-cluster/kubeconfig --insecure-local

      curl -H "Authorization: Bearer $(kubectl create token NAME)" localhost:8090/api/v1/status

      gpufleet server --kubeconfig hub.kubeconfig --fleet   # every cluster, from the hub
    """
    if insecure_local and not is_loopback(host):
        raise fail(
            f"--insecure-local serves everyone without a token: refused on {host}; "
            "listen on 127.0.0.1 or drop --insecure-local"
        )
    if (tls_cert_file is None) != (tls_private_key_file is None):
        raise fail("--tls-cert-file and --tls-private-key-file go together: give both or neither")
    for given in (tls_cert_file, tls_private_key_file):
        if given is not None and not given.is_file():
            raise fail(f"{given}: no such file (a PEM certificate or key)")
    if prometheus is not None and not prometheus.startswith(("http://", "https://")):
        raise fail(f"--prometheus {prometheus}: give its base URL, http://HOST:9090")
    import uvicorn

    from gpufleet.api.access import KubernetesAccess, LocalAccess
    from gpufleet.api.app import create_app
    from gpufleet.api.fleet import FleetSource
    from gpufleet.api.hosts import KubernetesHosts
    from gpufleet.api.prometheus import Prometheus
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
    source = FleetSource(api) if fleet else ClusterSource(api)
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
    tls = tls_cert_file is not None
    limits = Limits(rate=rate_limit, burst=rate_burst)
    # on the hub, submissions are created in the hub (which sends them on); its workloads and
    # nodes are the workers': nothing is cancelled or released through it
    actions = KubernetesActions(api)
    reader = Prometheus(prometheus) if prometheus else None
    app = create_app(
        source, access, actions, ledger=store, limits=limits, tls=tls, prometheus=reader,
        host_reports=KubernetesHosts(api),  # GPUHosts in this (a hub's: the hub's) cluster
        hub=fleet,
    )  # fmt: skip
    shown = f"[{host}]" if ":" in host else host
    scheme = "https" if tls else "http"
    err_console.print(
        f"gpufleet server: dashboard at {scheme}://{shown}:{port}/, API under /api/v1/"
        + (" (insecure-local: no token asked)" if insecure_local else "")
    )
    try:
        uvicorn.run(
            app,
            host=host,
            port=port,
            log_level="warning",
            limit_concurrency=max_connections,
            ssl_certfile=str(tls_cert_file) if tls_cert_file else None,
            ssl_keyfile=str(tls_private_key_file) if tls_private_key_file else None,
            server_header=False,
        )
    finally:
        source.stop.set()
        if store is not None:
            store.close()
