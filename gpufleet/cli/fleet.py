"""`gpufleet teams`, `reservations`, `templates`, `health` and `whoami`: the fleet as the
cluster of --kubeconfig holds it, in the API's own views (`gpufleet server` answers the same)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import typer
from rich import box
from rich.table import Table

from gpufleet.api import views
from gpufleet.cli.live import KUBECONFIG, ClusterReader, kube_client
from gpufleet.cli.output import OutputFormat, console, fail, print_structured

OUTPUT = typer.Option(OutputFormat.TABLE, "-o", "--output", help="table, json or yaml.")


def _plain(rows: Any) -> Any:
    if isinstance(rows, list):
        return [r.model_dump(mode="json", by_alias=True) for r in rows]
    return rows.model_dump(mode="json", by_alias=True)


def _table(columns: list[str], rows: list[list[str]]) -> None:
    table = Table(box=box.SIMPLE)
    for column in columns:
        table.add_column(column)
    for row in rows:
        table.add_row(*row)
    console.print(table)


def _expiry(at: datetime | None, expired: bool) -> str:
    return ("expired " if expired else "") + (at.isoformat() if at else "never")


def teams_command(kubeconfig: Path | None = KUBECONFIG, output: OutputFormat = OUTPUT) -> None:
    """Teams with what they reserve, use and borrow, their burst ceiling, and their running and
    waiting workloads.

    Example: gpufleet teams -o json
    """
    reader = ClusterReader(kubeconfig)
    objects = views.Objects(
        teams=reader.list("teams"),
        reservations=reader.list("reservations"),
        workloads=reader.list("gpuworkloads"),
    )
    rows = views.teams(objects)
    if print_structured(_plain(rows), output):
        return
    if not rows:
        console.print("No teams: declare Team objects in the GitOps repository.")
        return
    _table(
        ["TEAM", "NAMESPACES", "RESERVED", "USED", "BORROWED", "CEILING", "RUNNING", "WAITING"],
        [
            [
                t.name,
                ",".join(t.namespaces),
                f"{t.reserved_gpus:g}",
                f"{t.used_gpus:g}",
                f"{t.borrowed_gpus:g}",
                "none" if t.burst_ceiling_gpus is None else f"{t.burst_ceiling_gpus:g}",
                str(t.running),
                str(t.waiting),
            ]
            for t in rows
        ],
    )


def reservations_command(
    kubeconfig: Path | None = KUBECONFIG, output: OutputFormat = OUTPUT
) -> None:
    """Reservations (the brief's allocations): each team's guaranteed GPUs in a pool, what it
    uses of them, and when they expire.

    Example: gpufleet reservations
    """
    reader = ClusterReader(kubeconfig)
    objects = views.Objects(
        reservations=reader.list("reservations"), workloads=reader.list("gpuworkloads")
    )
    rows = views.reservations(objects)
    if print_structured(_plain(rows), output):
        return
    if not rows:
        console.print("No reservations: declare Reservation objects in the GitOps repository.")
        return
    _table(
        ["RESERVATION", "TEAM", "POOL", "GPUS", "USED", "BORROWED", "EXPIRES"],
        [
            [
                r.name,
                r.team,
                r.pool,
                str(r.gpus),
                f"{r.used_gpus:g}",
                f"{r.borrowed_gpus:g}",
                ("expired " if r.expired else "")
                + (r.expires_at.isoformat() if r.expires_at else "never"),
            ]
            for r in rows
        ],
    )


def templates_command(kubeconfig: Path | None = KUBECONFIG, output: OutputFormat = OUTPUT) -> None:
    """WorkloadTemplates (kept in git): what `gpufleet submit --template NAME` starts from.

    Example: gpufleet templates -o yaml
    """
    rows = views.templates(
        views.Objects(templates=ClusterReader(kubeconfig).list("workloadtemplates"))
    )
    if print_structured(_plain(rows), output):
        return
    if not rows:
        console.print("No templates: declare WorkloadTemplate objects in the GitOps repository.")
        return
    _table(
        ["TEMPLATE", "KIND", "IMAGE", "CLASS", "GPUS", "PODS", "TEAM", "DESCRIPTION"],
        [
            [
                t.name,
                t.kind,
                t.image,
                t.workload_class,
                str(t.gpus),
                str(t.pods),
                t.team or "any",
                t.description or "",
            ]
            for t in rows
        ],
    )


def health_command(kubeconfig: Path | None = KUBECONFIG, output: OutputFormat = OUTPUT) -> None:
    """The GPU nodes' health in numbers, and the nodes that need a look (not ready, not
    healthy, quarantined). Each node: gpufleet nodes list.

    Example: gpufleet health -o yaml
    """
    reader = ClusterReader(kubeconfig)
    raw_nodes: Any = reader.core.list_node(_preload_content=False)
    raw_pods: Any = reader.core.list_pod_for_all_namespaces(
        field_selector="status.phase=Running", _preload_content=False
    )
    objects = views.Objects(
        pools=reader.list("gpupools"),
        nodes=json.loads(raw_nodes.data)["items"],
        pods=json.loads(raw_pods.data)["items"],
    )
    found = views.health(views.nodes(objects, datetime.now(UTC)))
    if print_structured(_plain(found), output):
        return
    console.print(
        f"{found.nodes} GPU nodes: {found.ready} ready, {found.gpu_healthy} healthy, "
        f"{found.gpu_unhealthy} unhealthy, {found.unknown} unknown (no agent report); "
        f"{found.quarantined} quarantined ({found.escalated} escalated); "
        f"{found.unhealthy_gpus} of {found.gpus} GPUs on nodes not healthy"
    )
    if found.problems:
        _table(
            ["NODE", "POOL", "READY", "GPU HEALTHY", "QUARANTINED", "WHY"],
            [
                [
                    n.node,
                    n.pool,
                    str(n.ready),
                    n.gpu_healthy,
                    str(n.quarantined),
                    n.why or n.reason,
                ]
                for n in found.problems
            ],
        )


def whoami_command(kubeconfig: Path | None = KUBECONFIG, output: OutputFormat = OUTPUT) -> None:
    """The identity the cluster sees for --kubeconfig (a SelfSubjectReview): user and groups,
    the ones its RBAC judges.

    Example: gpufleet whoami
    """
    client = kube_client(kubeconfig)
    try:
        review: Any = client.AuthenticationV1Api().create_self_subject_review(
            {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},
            _request_timeout=30,
        )
    except Exception as err:  # refused, timed out: the cluster is not there
        raise fail(f"cannot ask the cluster who you are: {err}") from None
    info = review.status.user_info
    found = {"user": info.username, "groups": list(info.groups or []), "uid": info.uid or ""}
    if print_structured(found, output):
        return
    console.print(f"user: {found['user']}")
    console.print(f"groups: {', '.join(found['groups']) or 'none'}")


def metrics_command(
    prometheus: str = typer.Option(
        ...,
        "--prometheus",
        envvar="GPUFLEET_PROMETHEUS",
        help="A Prometheus that scrapes the gpufleet controller (base URL).",
    ),
    since: str = typer.Option("24h", "--since", help="The window, back from now: 1h, 7d."),
    output: OutputFormat = OUTPUT,
) -> None:
    """The fleet over a window, from the controller's metrics in Prometheus: each pool's mean
    GPUs and allocation and its idle GPU-hours; each team's queue (peak and mean), its wait
    (95th percentile), admissions and preemptions.

    Example: gpufleet metrics --prometheus http://prometheus:9090 --since 7d
    """
    from gpufleet.api.prometheus import MetricsUnavailable, Prometheus
    from gpufleet.model.durations import parse_duration

    try:
        seconds = int(parse_duration(since).total_seconds())
    except ValueError as err:
        raise fail(f"--since {since}: {err}") from None
    if seconds < 60:
        raise fail(f"--since {since}: give a minute or more")
    source = Prometheus(prometheus)
    try:
        answers = {k: source.instant(q) for k, q in views.fleet_metric_queries(seconds).items()}
    except MetricsUnavailable as err:
        raise fail(str(err)) from None
    finally:
        source.close()
    found = views.fleet_metrics(since, answers)
    if print_structured(found.model_dump(mode="json", by_alias=True), output):
        return
    if not found.pools:
        raise fail(f"no gpufleet_pool_gpus in {prometheus}: does it scrape the controller?")
    pools = Table(box=box.SIMPLE, title=f"pools, the last {since}")
    for column in ("POOL", "GPU TYPE", "GPUS", "ALLOCATED", "ALLOCATION", "IDLE GPU-H"):
        pools.add_column(column)
    for p in found.pools:
        share = "-" if p.allocation is None else f"{p.allocation:.0%}"
        pools.add_row(p.pool, p.gpu_type or "-", f"{p.mean_total_gpus:g}",
                      f"{p.mean_allocated_gpus:g}", share, f"{p.idle_gpu_hours:g}")  # fmt: skip
    console.print(pools)
    teams = Table(box=box.SIMPLE, title="teams")
    for column in ("TEAM", "QUEUE PEAK", "QUEUE MEAN", "WAIT P95", "ADMISSIONS", "PREEMPTIONS"):
        teams.add_column(column)
    for t in found.teams:
        wait = "-" if t.wait_p95_seconds is None else f"{t.wait_p95_seconds:g}s"
        teams.add_row(t.team, f"{t.peak_queue_depth:g}", f"{t.mean_queue_depth:g}", wait,
                      f"{t.admissions:g}", f"{t.preemptions:g}")  # fmt: skip
    console.print(teams)
