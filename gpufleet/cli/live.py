"""Live commands against a cluster: `gpufleet status` and `gpufleet workloads ...`.

Reading the cluster (`ClusterReader`) is kept apart from summarising (`gpufleet.api.views`,
which `gpufleet server` answers with too) and from printing.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import typer
from rich import box
from rich.table import Table

from gpufleet.api import models, views
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
from gpufleet.model.durations import parse_duration
from gpufleet.model.states import FINISHED_STATES

KUBECONFIG = typer.Option(None, "--kubeconfig", help="Cluster to read; default $KUBECONFIG.")
CLUSTER = typer.Option(
    None,
    "--cluster",
    help="On the hub of a fleet of clusters (--kubeconfig is the hub's): read this worker "
    "cluster, reached with the kubeconfig in its Cluster's Secret; all: every one.",
)


WAIT_POLL_S = 2.0
TEAM = typer.Option(None, "--team", "-t", help="Only this team's.")
SUBMITTER = typer.Option(
    None, "--submitter", help="Only those this user created (as the API server named them)."
)
CLASS = typer.Option(None, "--class", help="Only reserved or only elastic work.")
STATE = typer.Option(
    None, "--state", help="Only these states, comma-separated: Pending,Preempted,Running,..."
)
SINCE = typer.Option(None, "--since", help="Finished ones only if they ended within this: 48h.")
SEARCH = typer.Option(None, "--search", help="Only those whose name holds this, any case.")


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


Items = list[dict[str, Any]]  # (`list` is a method's name in the class below)


class ClusterReader:
    """The few reads the live commands need: of the cluster of --kubeconfig, or of the one
    `api` (an API client of its own) reaches."""

    def __init__(self, kubeconfig: Path | None, api: Any = None) -> None:
        client = kube_client(kubeconfig) if api is None else _client_module()
        self.custom = client.CustomObjectsApi(api)
        self.core = client.CoreV1Api(api)
        self.batch = client.BatchV1Api(api)
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
        except Exception as err:  # refused, timed out, unresolvable: the cluster is not there
            raise fail(f"cannot list {plural}: the cluster did not answer ({err})") from None
        return cast(list[dict[str, Any]], cast(dict[str, Any], listed)["items"])

    def find_workload(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The GPUWorkload, or None while there is none."""
        try:
            return cast(
                dict[str, Any],
                self.custom.get_namespaced_custom_object(
                    GROUP, VERSION, namespace, "gpuworkloads", name
                ),
            )
        except self.api_exception as err:
            if err.status == 404:
                return None
            raise fail(f"cannot read GPUWorkload {namespace}/{name}: {err.reason}") from None
        except Exception as err:  # refused, timed out: the cluster is not there
            raise fail(f"cannot read GPUWorkload {namespace}/{name}: {err}") from None

    def workload(self, namespace: str, name: str) -> dict[str, Any]:
        found = self.find_workload(namespace, name)
        if found is None:
            raise fail(
                f"no GPUWorkload {namespace}/{name}; list them with gpufleet workloads list "
                "-A (the controller makes one for a workload that waits, and for one "
                "admitted at once when its pods run or 10 s later: check again soon after "
                "a create)"
            )
        return found

    def namespace_list(self, what: str, namespace: str) -> Items:
        """The `what` (events or pods) of `namespace`, as the API server lists them."""
        lister = {"events": self.core.list_namespaced_event, "pods": self.core.list_namespaced_pod}
        try:
            found = lister[what](namespace)
        except self.api_exception as err:
            raise fail(f"cannot list {what} in {namespace}: {err.reason}") from None
        except Exception as err:  # refused, timed out: the cluster is not there
            raise fail(f"cannot list {what} in {namespace}: {err}") from None
        items: Items = self.core.api_client.sanitize_for_serialization(found)["items"]
        return items

    def nodes(self, names: Iterable[str]) -> Items:
        """The nodes of `names` that still exist."""
        found = []
        for name in sorted(set(names)):
            try:
                node = self.core.read_node(name)
            except self.api_exception as err:
                if err.status == 404:
                    continue  # gone with its autoscaled pool, or replaced
                raise fail(f"cannot read node {name}: {err.reason}") from None
            found.append(self.core.api_client.sanitize_for_serialization(node))
        return found


def _client_module() -> Any:
    from kubernetes import client

    return client


def cluster_readers(
    hub: ClusterReader, cluster: str | None
) -> list[tuple[str | None, ClusterReader]]:
    """The clusters a command reads, each with its name: the one of --kubeconfig (`hub`, no
    name); with --cluster, that worker of the hub's fleet, or every one (all)."""
    if cluster is None:
        return [(None, hub)]
    from gpufleet.kube.calls import KubernetesSecrets
    from gpufleet.kube.workers import WorkerError, kubeconfig_of, worker_api

    clusters = {c["metadata"]["name"]: c for c in hub.list("clusters")}
    if not clusters:
        raise fail("--cluster: this cluster declares no Cluster; is --kubeconfig the hub's?")
    if cluster != "all" and cluster not in clusters:
        names = ", ".join(sorted(clusters))
        raise fail(f"--cluster {cluster}: no such Cluster in the hub; use all or {names}")
    secrets = KubernetesSecrets(hub.core)
    readers: list[tuple[str | None, ClusterReader]] = []
    for name in sorted(clusters) if cluster == "all" else [cluster]:
        try:
            api = worker_api(kubeconfig_of(clusters[name], secrets))
        except WorkerError as err:
            raise fail(f"--cluster {name}: {err}") from None
        readers.append((name, ClusterReader(None, api)))
    return readers


def fleet_objects(hub: ClusterReader, cluster: str | None) -> views.Objects:
    """What `gpufleet status` shows: of the cluster of --kubeconfig (`hub`), or with
    --cluster of the hub's fleet with each worker read (only `cluster` unless all)."""
    if cluster is None:
        return cluster_objects(hub)
    workers = {
        name: cluster_objects(reader)
        for name, reader in cluster_readers(hub, cluster)
        if name is not None
    }
    seen = views.of_fleet(cluster_objects(hub), workers)
    return seen if cluster == "all" else views.in_cluster(seen, cluster)


def cluster_objects(reader: ClusterReader, namespace: str | None = None) -> views.Objects:
    """What `gpufleet status` shows: pools, reservations and workloads; in observe mode (no
    GPUPool declared) the GPU nodes and pods too, to group GPUs by product."""
    import json

    pools = reader.list("gpupools")
    objects = views.Objects(
        pools=pools,
        reservations=reader.list("reservations"),
        workloads=reader.list("gpuworkloads", namespace),
    )
    if pools:
        return objects
    raw_nodes: Any = reader.core.list_node(_preload_content=False)  # raw JSON, not models
    raw_pods: Any = reader.core.list_pod_for_all_namespaces(_preload_content=False)
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
    cluster: str | None = CLUSTER,
    output: OutputFormat = typer.Option(OutputFormat.TABLE, "-o", "--output"),
) -> None:
    """GPUs by pool (total, allocated, idle, utilisation), queue depth and top teams, live.

    Example: gpufleet status --kubeconfig ~/.cache/gpufleet/dev-cluster/kubeconfig

    Example: gpufleet status --kubeconfig hub.kubeconfig --cluster all   # a whole fleet
    """
    summary = _plain(views.status(fleet_objects(ClusterReader(kubeconfig), cluster)))
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
    team: str | None = TEAM,
    workload_class: str | None = CLASS,
    state: str | None = STATE,
    since: str | None = SINCE,
    search: str | None = SEARCH,
    submitter: str | None = SUBMITTER,
    limit: int | None = typer.Option(None, "--limit", min=1, help="At most this many."),
    kubeconfig: Path | None = KUBECONFIG,
    cluster: str | None = CLUSTER,
    output: OutputFormat = typer.Option(OutputFormat.TABLE, "-o", "--output"),
) -> None:
    looked_in = None if all_namespaces else (namespace or "default")
    found = _matching(
        kubeconfig, cluster, looked_in, team, workload_class, state, since, search, submitter
    )
    found.sort(key=lambda w: (w.namespace, w.name, w.cluster or ""))
    rows = [_plain(w) for w in found[:limit]]
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
    fleet = cluster is not None
    for column in (
        "NAMESPACE",
        "NAME",
        *(["CLUSTER"] if fleet else []),
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
            *([r["cluster"] or "-"] if fleet else []),
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


@workloads_app.command("stats")
def workload_stats(
    namespace: str | None = typer.Option(None, "-n", "--namespace"),
    all_namespaces: bool = typer.Option(False, "-A", "--all-namespaces"),
    team: str | None = TEAM,
    workload_class: str | None = CLASS,
    state: str | None = STATE,
    since: str | None = SINCE,
    search: str | None = SEARCH,
    submitter: str | None = SUBMITTER,
    kubeconfig: Path | None = KUBECONFIG,
    cluster: str | None = CLUSTER,
    output: OutputFormat = typer.Option(OutputFormat.TABLE, "-o", "--output"),
) -> None:
    """Count workloads by state, team and class, with their GPUs and the GPU-hours of their
    current or last run (the usage ledger counts every run: gpufleet usage). Takes the
    filters of workloads list.

    Example: gpufleet workloads stats -A --team nlp --since 7d
    """
    looked_in = None if all_namespaces else (namespace or "default")
    found = _matching(
        kubeconfig, cluster, looked_in, team, workload_class, state, since, search, submitter
    )
    summary = views.stats(found, datetime.now(UTC))
    if print_structured(_plain(summary), output):
        return
    console.print(
        f"{summary.total} workloads, {summary.gpu_hours:g} GPU-hours, "
        f"{summary.waiting_gpus:g} GPUs asked by waiting ones"
    )
    for title, counts in (
        ("STATE", summary.by_state),
        ("TEAM", summary.by_team),
        ("CLASS", summary.by_class),
    ):
        table = Table(box=box.SIMPLE)
        for column in (title, "WORKLOADS", "GPUS"):
            table.add_column(column)
        for count in counts:
            table.add_row(count.key, str(count.workloads), f"{count.gpus:g}")
        console.print(table)


def _matching(
    kubeconfig: Path | None,
    cluster: str | None,
    namespace: str | None,
    team: str | None,
    workload_class: str | None,
    state: str | None,
    since: str | None,
    search: str | None,
    submitter: str | None,
) -> list[models.Workload]:
    """The workloads of `namespace` (None: all) the filters keep, as the API's list does."""
    try:
        chosen = views.WorkloadFilter.parsed(
            None, team, workload_class, state, since, search, submitter=submitter
        )
    except ValueError as err:
        raise fail(f"--{err}") from None
    objects = [
        obj if name is None else views.tagged(obj, name)
        for name, reader in cluster_readers(ClusterReader(kubeconfig), cluster)
        for obj in reader.list("gpuworkloads", namespace)
    ]
    now = datetime.now(UTC)
    return [w for w in views.workloads(objects) if chosen.keeps(w, now)]


@workloads_app.command("wait")
def wait_workload(
    name: str,
    namespace: str = typer.Option("default", "-n", "--namespace"),
    timeout: str = typer.Option("1h", "--timeout", help="Give up after this long: 30m, 2h."),
    kubeconfig: Path | None = KUBECONFIG,
) -> None:
    """Wait until a workload is Completed (exit 0), Failed or Cancelled (exit 1), printing
    each change of its state; one the controller has not recorded yet is waited for.

    Example: gpufleet workloads wait sweep-1 -n nlp --timeout 2h
    """
    try:
        limit = parse_duration(timeout).total_seconds()
    except ValueError as err:
        raise fail(f"--timeout {timeout!r}: {err}") from None
    reader = ClusterReader(kubeconfig)
    deadline = time.monotonic() + limit
    last = None
    while True:
        found = reader.find_workload(namespace, name)
        state = ((found or {}).get("status") or {}).get("state")
        if state != last and state is not None:
            reason = ((found or {}).get("status") or {}).get("reason")
            err_console.print(f"{namespace}/{name}: {state}" + (f" ({reason})" if reason else ""))
            last = state
        if state in FINISHED_STATES:
            if state != "Completed":
                raise typer.Exit(1)
            return
        if time.monotonic() >= deadline:
            raise fail(f"{namespace}/{name} did not finish within {timeout} (last: {last})")
        time.sleep(min(WAIT_POLL_S, max(0.0, deadline - time.monotonic())))


@workloads_app.command("get")
def get_workload(
    name: str,
    namespace: str = typer.Option("default", "-n", "--namespace"),
    kubeconfig: Path | None = KUBECONFIG,
    cluster: str | None = CLUSTER,
    output: OutputFormat = typer.Option(OutputFormat.YAML, "-o", "--output"),
) -> None:
    """Print one workload's GPUWorkload object.

    Example: gpufleet workloads get train -n nlp -o json
    """
    workload = _one_reader(kubeconfig, cluster).workload(namespace, name)
    if output is OutputFormat.JSON:
        print_data(workload)
    else:
        print_yaml(workload)


@workloads_app.command("explain")
def explain_workload(
    name: str,
    namespace: str = typer.Option("default", "-n", "--namespace"),
    kubeconfig: Path | None = KUBECONFIG,
    cluster: str | None = CLUSTER,
) -> None:
    """Say in plain words where a workload is and why: the engine's reason, its position in
    its team's queue and when it may start.

    Example: gpufleet workloads explain train -n nlp
    """
    console.print(
        views.explain(views.workload(_one_reader(kubeconfig, cluster).workload(namespace, name)))
    )


@workloads_app.command("events")
def workload_events(
    name: str,
    namespace: str = typer.Option("default", "-n", "--namespace"),
    kubeconfig: Path | None = KUBECONFIG,
    cluster: str | None = CLUSTER,
    output: OutputFormat = typer.Option(OutputFormat.TABLE, "-o", "--output"),
) -> None:
    """Show a workload's Kubernetes Events, oldest first: of its GPUWorkload (admitted,
    preempted, requeued), of its object and of its pods (scheduled, pulled, evicted).

    Example: gpufleet workloads events train -n nlp
    """
    reader = _one_reader(kubeconfig, cluster)
    workload = reader.workload(namespace, name)
    about = views.involved(workload, reader.namespace_list("pods", namespace))
    found = views.events(reader.namespace_list("events", namespace), about)
    if print_structured([_plain(e) for e in found], output):
        return
    if not found:
        err_console.print(f"No events of {namespace}/{name} (most clusters keep them an hour).")
        return
    table = Table(box=box.SIMPLE)
    for column in ("LAST SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"):
        table.add_column(column)
    for e in found:
        seen = e.last_seen.isoformat(timespec="seconds") if e.last_seen else "-"
        count = f" (x{e.count})" if e.count > 1 else ""
        table.add_row(seen, e.type, e.reason, e.object, e.message + count)
    console.print(table)


@workloads_app.command("metrics")
def workload_metrics(
    name: str,
    namespace: str = typer.Option("default", "-n", "--namespace"),
    prometheus: str = typer.Option(
        ...,
        "--prometheus",
        envvar="GPUFLEET_PROMETHEUS",
        help="A Prometheus that scrapes the gpufleet agents (base URL).",
    ),
    points: int = typer.Option(240, "--points", min=2, max=2_000, help="About this many."),
    kubeconfig: Path | None = KUBECONFIG,
    cluster: str | None = CLUSTER,
    output: OutputFormat = typer.Option(OutputFormat.TABLE, "-o", "--output"),
) -> None:
    """Show a workload's GPUs over its current or last run: utilisation, GPU Usage and memory,
    from the gpufleet agents' metrics in Prometheus (as the server's /metrics route).

    Example: gpufleet workloads metrics train -n nlp --prometheus http://prometheus:9090
    """
    from gpufleet.api.prometheus import MetricsUnavailable, Prometheus

    reader = _one_reader(kubeconfig, cluster)
    found = views.workload(reader.workload(namespace, name))
    plan = views.metrics_plan(
        found, views.node_gpus(reader.nodes(found.nodes)), datetime.now(UTC), points
    )
    if plan is None:
        raise fail(f"{namespace}/{name} has not run yet ({found.state}): it has no GPU metrics")
    source = Prometheus(prometheus)
    try:
        series = source.each_series(plan.queries, plan.start, plan.end, plan.step_s)
    except MetricsUnavailable as err:
        raise fail(str(err)) from None
    finally:
        source.close()
    answer = views.workload_metrics(found, plan, series)
    if print_structured(_plain(answer), output):
        return
    gib = 2**30
    start, end = (t.isoformat(timespec="seconds") for t in (answer.start, answer.end))
    console.print(f"{namespace}/{name} on {', '.join(answer.nodes)}, {start} to {end}")
    mean = answer.mean_utilization
    peak = answer.peak_memory_used_bytes
    console.print(f"mean GPU utilisation: {'-' if mean is None else f'{mean:.0%}'}")
    total = answer.memory_total_bytes
    console.print(
        f"peak GPU memory: {'-' if peak is None else f'{peak / gib:.1f} GiB'}"
        + (f" of {total / gib:.1f} GiB" if total else "")
    )
    if answer.note:
        err_console.print(f"note: {answer.note}")


@workloads_app.command("logs")
def workload_logs(
    name: str,
    namespace: str = typer.Option("default", "-n", "--namespace"),
    tail: int = typer.Option(100, "--tail", min=1, help="The last lines of each container."),
    container: str | None = typer.Option(None, "-c", "--container", help="Only this one."),
    kubeconfig: Path | None = KUBECONFIG,
    cluster: str | None = CLUSTER,
) -> None:
    """Print the last lines each of a workload's pods printed, every line prefixed with its
    pod and container where there are several (as kubectl logs --prefix). Pods that are gone
    (a finished Job's, once cleaned up) have no logs to give.

    Example: gpufleet workloads logs train -n nlp --tail 20
    """
    from gpufleet.kube.calls import api_message, pod_log_lines

    reader = _one_reader(kubeconfig, cluster)
    workload = reader.workload(namespace, name)
    pods = views.pods_of(workload, reader.namespace_list("pods", namespace))
    if not pods:
        raise fail(f"{namespace}/{name} has no pods now: nothing to read logs from")
    pods.sort(key=lambda p: p["metadata"]["name"])
    sources = [
        (p["metadata"]["name"], c["name"])
        for p in pods
        for c in (p.get("spec") or {}).get("containers") or []
        if container is None or c["name"] == container
    ]
    if not sources:
        raise fail(f"no container {container} in the pods of {namespace}/{name}")
    unread = []
    for pod, name_of in sources:
        prefix = f"[pod/{pod}/{name_of}] " if len(sources) > 1 else ""
        try:
            lines = pod_log_lines(reader.core, pod, namespace, name_of, tail, timeout=30)
        except reader.api_exception as err:
            unread.append(f"pod/{pod}/{name_of}: {api_message(err) or err.reason}")
            continue
        for line in lines:
            console.print(prefix + line, markup=False)
    for problem in unread:
        err_console.print(f"cannot read the logs of {problem}", markup=False)
    if len(unread) == len(sources):
        raise typer.Exit(1)


def _one_reader(kubeconfig: Path | None, cluster: str | None) -> ClusterReader:
    if cluster == "all":
        raise fail("--cluster all: a workload is in one cluster; name it")
    return cluster_readers(ClusterReader(kubeconfig), cluster)[0][1]


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
