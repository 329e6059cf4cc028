"""`gpufleet hub run` (the hub of a fleet of clusters) and `gpufleet clusters list|get`."""

from __future__ import annotations

import logging
import signal
import threading
from pathlib import Path
from typing import Any

import typer
from rich import box
from rich.table import Table

from gpufleet.api import views
from gpufleet.cli.live import KUBECONFIG, kube_client
from gpufleet.cli.output import OutputFormat, console, fail, print_structured
from gpufleet.metrics_server import PortInUse, check_free
from gpufleet.model.api import GROUP, VERSION

hub_app = typer.Typer(
    help="The hub of a fleet of clusters: it sends Jobs submitted to it to the worker clusters "
    "(docs/multicluster.md).",
    no_args_is_help=True,
)
COLUMNS = (
    "CLUSTER",
    "STATE",
    "REGION",
    "VERSION",
    "NODES",
    "GPUS",
    "ALLOCATED",
    "WORKLOADS",
    "POOLS",
)
clusters_app = typer.Typer(
    help="The clusters of the fleet as the hub sees them.", no_args_is_help=True
)


@hub_app.command("run")
def run(
    kubeconfig: Path | None = KUBECONFIG,
    interval: float = typer.Option(
        1.0, "--interval", help="Most seconds between cycles (they also run on watch events)."
    ),
    metrics_port: int = typer.Option(
        8081, "--metrics-port", help="Prometheus /metrics port (0 turns it off)."
    ),
    metrics_host: str = typer.Option("0.0.0.0", "--metrics-host"),
    lease_namespace: str = typer.Option(
        "kube-system",
        "--lease-namespace",
        help="Namespace of the Lease gpufleet-hub that elects the one hub that sends work "
        "(every hub of one fleet must name the same).",
    ),
    install: bool = typer.Option(
        True,
        "--install/--no-install",
        help="Apply gpufleet's CRDs at start (off when a Helm chart installs them).",
    ),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    """Run the hub in the foreground against the hub cluster.

    It reads the fleet (Cluster, GPUPool, Team, Reservation, FleetPolicy) from the hub's API
    server, connects to every Cluster with the kubeconfig in its Secret, and sends each Job
    submitted to the hub (spec.managedBy: gpufleet.io/hub) to the cluster whose engine admits
    it soonest; pin one with the label gpufleet.io/cluster=NAME.

    Several hubs may run: the holder of the Lease gpufleet-hub (in --lease-namespace) sends
    work; the others keep their caches warm and take over 30 seconds after its last renewal
    when it dies (at once when it stops cleanly).

    Example: gpufleet hub run --kubeconfig ~/.cache/gpufleet/dev-cluster/hub/kubeconfig
    """
    try:
        if metrics_port:
            check_free(metrics_host, metrics_port)
    except PortInUse as err:
        raise fail(f"{err}: stop it, or give the hub another --metrics-port") from None
    client = kube_client(kubeconfig)
    from gpufleet.controllers import hub as hub_shell  # the shell, imported by its command only
    from gpufleet.metrics_server import serve as serve_metrics
    from gpufleet.render.crds import render_crds

    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    stop = threading.Event()
    configuration = client.Configuration.get_default_copy()
    configuration.connection_pool_maxsize = hub_shell.WRITERS + hub_shell.MIRROR_WRITERS + 8
    api = client.ApiClient(configuration)
    extensions = client.ApiextensionsV1Api(api)
    for crd in render_crds() if install else []:
        extensions.patch_custom_resource_definition(
            crd["metadata"]["name"], crd, field_manager="gpufleet-hub", force=True,
            _content_type="application/apply-patch+yaml",
        )  # fmt: skip
    hub = hub_shell.Hub(api, interval, stop, lease_namespace)
    if metrics_port:
        serve_metrics(metrics_port, metrics_host, None, hub_shell.REGISTRY)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        hub.start_informers()
    except RuntimeError as err:
        raise fail(f"{err}: is the hub's API server up, and may this identity read Jobs?") from None
    logging.getLogger("gpufleet.hub").info("hub running")
    hub.run()


@clusters_app.command("list")
def list_clusters(
    kubeconfig: Path | None = KUBECONFIG,
    output: OutputFormat = typer.Option(OutputFormat.TABLE, "--output", "-o"),
) -> None:
    """Every cluster of the fleet: state, region, Kubernetes version, GPU nodes, GPUs, the GPUs
    its workloads hold, the hub's workloads there and its pools, with totals. Read from the
    hub's Cluster objects (the hub writes their status); the same as GET /api/v1/clusters.

    Example: gpufleet clusters list --kubeconfig hub.kubeconfig -o json
    """
    summary = views.clusters(views.Objects(clusters=_clusters(kubeconfig)))
    if print_structured(summary.model_dump(mode="json", by_alias=True), output):
        return
    table = Table(box=box.SIMPLE)
    for column in COLUMNS:
        table.add_column(column)
    for row in summary.items:
        table.add_row(
            row.name, row.state, row.region or "-", row.kubernetes_version or "-",
            str(row.nodes), f"{row.gpus:g}", f"{row.allocated_gpus:g}", str(row.workloads),
            ",".join(row.pools) or "-",
        )  # fmt: skip
    totals = summary.totals
    table.add_row(
        "TOTAL", f"{totals.ready}/{totals.clusters} ready", "", "", str(totals.nodes),
        f"{totals.gpus:g}", f"{totals.allocated_gpus:g}", str(totals.workloads), "",
    )  # fmt: skip
    console.print(table)


@clusters_app.command("get")
def get_cluster(
    name: str = typer.Argument(..., help="The Cluster's name."),
    kubeconfig: Path | None = KUBECONFIG,
    output: OutputFormat = typer.Option(OutputFormat.YAML, "--output", "-o"),
) -> None:
    """One cluster: its spec and the status the hub wrote (heartbeat, state, counts)."""
    objects = _clusters(kubeconfig)
    found = [obj for obj in objects if obj["metadata"]["name"] == name]
    if not found:
        names = ", ".join(o["metadata"]["name"] for o in objects) or "none"
        raise fail(f"no Cluster {name!r} in the hub (clusters: {names})")
    (row,) = views.clusters(views.Objects(clusters=found)).items
    data = {**row.model_dump(mode="json", by_alias=True), "spec": found[0].get("spec") or {}}
    if not print_structured(data, output):
        print_structured(data, OutputFormat.YAML)


def _clusters(kubeconfig: Path | None) -> list[dict[str, Any]]:
    client = kube_client(kubeconfig)
    try:
        listed = client.CustomObjectsApi().list_cluster_custom_object(
            GROUP, VERSION, "clusters", _request_timeout=10
        )
    except Exception as err:  # not a hub (no CRD), refused, unreachable
        raise fail(
            f"cannot list the hub's Clusters: {getattr(err, 'reason', err)}; is --kubeconfig "
            "the hub's, and is gpufleet installed there?"
        ) from None
    items: list[dict[str, Any]] = listed.get("items") or []
    return items
