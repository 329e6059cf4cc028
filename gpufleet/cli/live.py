"""Live commands against a cluster: `gpufleet status` and `gpufleet workloads ...`.

Reading the cluster (`ClusterReader`) is kept apart from summarising (`gpufleet.api.views`,
which `gpufleet server` answers with too) and from printing.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import typer
from rich import box
from rich.table import Table

from gpufleet.api import views
from gpufleet.cli.output import (
    OutputFormat,
    console,
    err_console,
    fail,
    print_data,
    print_structured,
    print_yaml,
)
from gpufleet.kube.kinds import kind_list, referred_to
from gpufleet.model.api import GROUP, VERSION

KUBECONFIG = typer.Option(None, "--kubeconfig", help="Cluster to read; default $KUBECONFIG.")


def kube_client(kubeconfig: Path | None) -> Any:
    """The kubernetes client module, configured from --kubeconfig, $KUBECONFIG, or the pod's
    service account when running in a cluster; a clear error otherwise."""
    from kubernetes import client, config

    try:
        if (
            kubeconfig is None
            and "KUBECONFIG" not in os.environ
            and os.environ.get("KUBERNETES_SERVICE_HOST")
        ):
            config.load_incluster_config()
        else:
            config.load_kube_config(str(kubeconfig) if kubeconfig else os.environ.get("KUBECONFIG"))
    except Exception as err:  # the client raises several types for a bad kubeconfig
        raise fail(
            f"cannot load the kubeconfig: {err}; pass --kubeconfig or set KUBECONFIG"
        ) from None
    return client


class ClusterReader:
    """The few reads the live commands need."""

    def __init__(self, kubeconfig: Path | None) -> None:
        client = kube_client(kubeconfig)
        self.custom = client.CustomObjectsApi()
        self.core = client.CoreV1Api()
        self.batch = client.BatchV1Api()
        self.api_exception = client.ApiException

    def list(self, plural: str, namespace: str | None = None) -> list[dict[str, Any]]:
        try:
            if namespace:
                listed = self.custom.list_namespaced_custom_object(
                    GROUP, VERSION, namespace, plural
                )
            else:
                listed = self.custom.list_cluster_custom_object(GROUP, VERSION, plural)
        except self.api_exception as err:
            raise fail(
                f"cannot list {plural}: {err.reason}; is gpufleet installed "
                "(gpufleet controller run installs its CRDs)?"
            ) from None
        return cast(list[dict[str, Any]], cast(dict[str, Any], listed)["items"])

    def workload(self, namespace: str, name: str) -> dict[str, Any]:
        try:
            return cast(
                dict[str, Any],
                self.custom.get_namespaced_custom_object(
                    GROUP, VERSION, namespace, "gpuworkloads", name
                ),
            )
        except self.api_exception as err:
            if err.status == 404:
                raise fail(
                    f"no GPUWorkload {namespace}/{name}; list them with gpufleet workloads list "
                    "-A (the controller makes one for a workload that waits, and for one "
                    "admitted at once when its pods run or 10 s later: check again soon after "
                    "a create)"
                ) from None
            raise


def cluster_objects(reader: ClusterReader, namespace: str | None = None) -> views.Objects:
    """What `gpufleet status` shows: pools, reservations and workloads; in observe mode (no
    GPUPool declared) the GPU nodes and pods too, to group GPUs by product."""
    import json

    from kubernetes import client

    pools = reader.list("gpupools")
    objects = views.Objects(
        pools=pools,
        reservations=reader.list("reservations"),
        workloads=reader.list("gpuworkloads", namespace),
    )
    if pools:
        return objects
    core = client.CoreV1Api()
    raw_nodes: Any = core.list_node(_preload_content=False)  # raw JSON, not model objects
    raw_pods: Any = core.list_pod_for_all_namespaces(_preload_content=False)
    return replace(
        objects,
        nodes=json.loads(raw_nodes.data)["items"],
        pods=json.loads(raw_pods.data)["items"],
    )


def _plain(model: Any) -> Any:
    return model.model_dump(mode="json", by_alias=True)


# --- commands ------------------------------------------------------------------------------


def status_command(
    kubeconfig: Path | None = KUBECONFIG,
    output: OutputFormat = typer.Option(OutputFormat.TABLE, "-o", "--output"),
) -> None:
    """GPUs by pool (total, allocated, idle, utilisation), queue depth and top teams, live.

    Example: gpufleet status --kubeconfig ~/.cache/gpufleet/dev-cluster/kubeconfig
    """
    summary = _plain(views.status(cluster_objects(ClusterReader(kubeconfig))))
    if print_structured(summary, output):
        return
    table = Table(title="GPU pools", title_justify="left", box=box.SIMPLE)
    for column in ("POOL", "GPU", "TOTAL", "HEALTHY", "ALLOCATED", "IDLE", "UTILISATION"):
        table.add_column(column, justify="left" if column in ("POOL", "GPU") else "right")
    for row in summary["pools"]:
        table.add_row(
            row["pool"],
            row["gpuType"],
            str(row["totalGPUs"]),
            str(row["healthyGPUs"]),
            f"{row['allocatedGPUs']:g}",
            f"{row['idleGPUs']:g}",
            f"{row['utilisationPercent']:.1f}%",
        )
    console.print(table)
    if summary.get("observeMode"):
        console.print("observe mode: no GPUPool is declared; GPU nodes are shown by GPU product")
    totals = summary["totals"]
    console.print(
        f"total: {totals['allocatedGPUs']:g} of {totals['healthyGPUs']} healthy GPUs "
        f"allocated ({totals['utilisationPercent']:.1f}%), {totals['idleGPUs']:g} idle"
    )
    queue = ", ".join(f"{t}: {n}" for t, n in summary["queueDepth"].items()) or "empty"
    console.print(f"waiting workloads by team: {queue}")
    top = ", ".join(f"{t['team']} ({t['usedGPUs']:g} GPUs)" for t in summary["topTeams"])
    console.print(f"top teams: {top or 'none running'}")


workloads_app = typer.Typer(
    help="Workloads managed by gpufleet (their GPUWorkload objects).", no_args_is_help=True
)


@workloads_app.command(
    "list",
    help=f"""List workloads of every kind ({kind_list("and")}) with their state, pool,
    waiting reason and queue position.

    Example: gpufleet workloads list -A
    """,
)
def list_workloads(
    namespace: str | None = typer.Option(None, "-n", "--namespace"),
    all_namespaces: bool = typer.Option(False, "-A", "--all-namespaces"),
    kubeconfig: Path | None = KUBECONFIG,
    output: OutputFormat = typer.Option(OutputFormat.TABLE, "-o", "--output"),
) -> None:
    reader = ClusterReader(kubeconfig)
    looked_in = None if all_namespaces else (namespace or "default")
    found = views.workloads(reader.list("gpuworkloads", looked_in))
    found.sort(key=lambda w: (w.namespace, w.name))
    rows = [_plain(w) for w in found]
    if print_structured(rows, output):
        return
    if not rows:  # as kubectl does: say where it looked, on stderr, and where else to look
        if looked_in is None:
            err_console.print("No GPU workloads found in any namespace.")
        else:
            err_console.print(
                f"No GPU workloads found in {looked_in} namespace; use -A to list every namespace."
            )
        return
    table = Table(box=box.SIMPLE)
    for column in (
        "NAMESPACE",
        "NAME",
        "KIND",
        "TEAM",
        "CLASS",
        "GPUS",
        "STATE",
        "POOL",
        "REASON",
        "POSITION",
    ):
        table.add_column(column)
    for r in rows:
        table.add_row(
            r["namespace"],
            r["name"],
            r["kind"],
            r["team"],
            r["class"],
            f"{r['gpus']:g}",
            r["state"],
            r["pool"] or "-",
            r["reason"] or "-",
            str(r["position"] or "-"),
        )
    console.print(table)


@workloads_app.command("get")
def get_workload(
    name: str,
    namespace: str = typer.Option("default", "-n", "--namespace"),
    kubeconfig: Path | None = KUBECONFIG,
    output: OutputFormat = typer.Option(OutputFormat.YAML, "-o", "--output"),
) -> None:
    """Print one workload's GPUWorkload object.

    Example: gpufleet workloads get train -n nlp -o json
    """
    workload = ClusterReader(kubeconfig).workload(namespace, name)
    if output is OutputFormat.JSON:
        print_data(workload)
    else:
        print_yaml(workload)


@workloads_app.command("explain")
def explain_workload(
    name: str,
    namespace: str = typer.Option("default", "-n", "--namespace"),
    kubeconfig: Path | None = KUBECONFIG,
) -> None:
    """Say in plain words where a workload is and why: the engine's reason, its position in
    its team's queue and when it may start.

    Example: gpufleet workloads explain train -n nlp
    """
    console.print(
        views.explain(views.workload(ClusterReader(kubeconfig).workload(namespace, name)))
    )


@workloads_app.command(
    "cancel",
    help=f"""Cancel a workload: delete the object it stands for (a {kind_list()}; its
    pods stop and its GPUWorkload goes with it).

    Example: gpufleet workloads cancel jobset-sweep -n nlp
    """,
)
def cancel_workload(
    name: str,
    namespace: str = typer.Option("default", "-n", "--namespace"),
    kubeconfig: Path | None = KUBECONFIG,
) -> None:
    reader = ClusterReader(kubeconfig)
    workload = reader.workload(namespace, name)  # a clear error if it is not gpufleet's
    target = referred_to(workload)
    if target is None:
        raise fail(
            f"{namespace}/{name} stands for a kind gpufleet cannot delete: delete it yourself"
        )
    kind, obj = target
    from gpufleet.kube.calls import delete_object  # imports the client: only here

    uid = (workload["spec"].get("workloadRef") or {}).get("uid")
    try:
        delete_object(reader.custom, reader.core, kind, namespace, obj, uid)
    except reader.api_exception as err:
        raise fail(f"cannot delete {kind.kind} {namespace}/{obj}: {err.reason}") from None
    err_console.print(f"cancelled {namespace}/{name}: {kind.kind} {obj} deleted")
