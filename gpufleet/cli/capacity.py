"""`gpufleet capacity`: what each pool holds and what each team is guaranteed."""

from __future__ import annotations

from pathlib import Path

import typer
from rich import box
from rich.table import Table

from gpufleet.capacity import CapacitySummary, summarize
from gpufleet.cli.live import KUBECONFIG, ClusterReader
from gpufleet.cli.output import (
    OutputFormat,
    console,
    err_console,
    fail,
    print_problems,
    print_structured,
    problem_counts,
)
from gpufleet.model import has_errors, validate_paths
from gpufleet.model.fleet import fleet_from_objects


def capacity(
    paths: list[Path] | None = typer.Argument(
        None,
        help="YAML files or folders; none: read the cluster (--kubeconfig).",
        show_default=False,
    ),
    output: OutputFormat = typer.Option(OutputFormat.TABLE, "-o", "--output"),
    kubeconfig: Path | None = KUBECONFIG,
) -> None:
    """Summarise declared capacity per pool and per team.

    Per pool: GPUs reserved and unreserved and the monthly cost of the reservations.
    Per team (as a tree): reservations per pool, bursting priority and the most it may use.

    Without a path it reads the cluster and adds what is in use now (allocated and idle GPUs
    per pool; used and borrowed GPUs per team).

    Example: gpufleet capacity examples/gitops -o json
    """
    if paths:
        fleet, problems = validate_paths(paths)
        if has_errors(problems):
            print_problems(problems, err_console)
            raise fail(f"cannot summarise: {problem_counts(problems)}")
        summary = summarize(fleet)
    else:
        summary = _live_summary(kubeconfig)
    if not print_structured(summary.to_dict(), output):
        print_tables(summary)


def _live_summary(kubeconfig: Path | None) -> CapacitySummary:
    reader = ClusterReader(kubeconfig)
    objects = [
        o
        for plural in ("gpupools", "teams", "reservations", "fleetpolicies")
        for o in reader.list(plural)
    ]
    live = {(o["kind"], o["metadata"]["name"]): o.get("status") or {} for o in objects}
    return summarize(fleet_from_objects(objects).fleet, live)


def _money(value: float | None) -> str:
    return "-" if value is None else f"${value:,.2f}"


def print_tables(summary: CapacitySummary) -> None:
    live = any(p.allocated_gpus is not None for p in summary.pools)
    pools = Table(title="GPU pools", title_justify="left", box=box.SIMPLE)
    for column in (
        "POOL",
        "PROVIDER",
        "GPU",
        "MAX GPUS",
        "RESERVED",
        "UNRESERVED",
        "RESERVED %",
        "$/GPU-H",
        "RESERVED $/MONTH",
    ):
        pools.add_column(
            column, justify="right" if column not in ("POOL", "PROVIDER", "GPU") else "left"
        )
    if live:
        pools.add_column("ALLOCATED", justify="right")
        pools.add_column("IDLE", justify="right")
    for p in summary.pools:
        now = [f"{p.allocated_gpus or 0:g}", f"{p.idle_gpus or 0:g}"] if live else []
        pools.add_row(
            p.name,
            p.provider,
            p.gpu_type,
            str(p.max_gpus),
            str(p.reserved_gpus),
            str(p.unreserved_gpus),
            f"{p.reserved_percent:.1f}",
            _money(p.price_per_gpu_hour),
            _money(p.reserved_cost_per_month),
            *now,
        )
    total_cost = sum(p.reserved_cost_per_month or 0 for p in summary.pools)
    totals_now = (
        [
            f"{sum(p.allocated_gpus or 0 for p in summary.pools):g}",
            f"{sum(p.idle_gpus or 0 for p in summary.pools):g}",
        ]
        if live
        else []
    )
    pools.add_section()
    pools.add_row(
        "total",
        "",
        "",
        str(summary.total_max_gpus),
        str(summary.total_reserved_gpus),
        str(summary.total_max_gpus - summary.total_reserved_gpus),
        "",
        "",
        _money(total_cost),
        *totals_now,
    )
    console.print(pools)

    pool_names = [p.name for p in summary.pools]
    teams = Table(title="Teams (reserved GPUs per pool)", title_justify="left", box=box.SIMPLE)
    teams.add_column("TEAM")
    teams.add_column("PRIORITY", justify="right")
    teams.add_column("BURST LIMIT", justify="right")
    for name in pool_names:
        teams.add_column(name.upper(), justify="right")
    teams.add_column("OWN", justify="right")
    teams.add_column("WITH CHILDREN", justify="right")
    teams.add_column("MAX USABLE", justify="right")
    if live:
        teams.add_column("USED", justify="right")
        teams.add_column("BORROWED", justify="right")
    for t in summary.teams:
        teams.add_row(
            "  " * t.depth + t.name,
            str(t.bursting_priority),
            t.burst_limit if t.burst_limit is not None else "unlimited",
            *(str(t.reserved_gpus.get(name, "")) or "" for name in pool_names),
            str(t.own_reserved_gpus),
            str(t.subtree_reserved_gpus),
            "unlimited" if t.max_usable_gpus is None else f"{t.max_usable_gpus:g}",
            *([f"{t.used_gpus or 0:g}", f"{t.borrowed_gpus or 0:g}"] if live else []),
        )
    console.print(teams)
