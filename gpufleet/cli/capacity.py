"""`gpufleet capacity`: what each pool holds and what each team is guaranteed."""

from __future__ import annotations

from pathlib import Path

import typer
from rich import box
from rich.table import Table

from gpufleet.capacity import CapacitySummary, summarize
from gpufleet.cli.output import (
    OutputFormat,
    console,
    err_console,
    fail,
    print_data,
    print_problems,
    print_yaml,
    problem_counts,
)
from gpufleet.model import has_errors, validate_paths


def capacity(
    paths: list[Path] = typer.Argument(..., help="YAML files or folders.", show_default=False),
    output: OutputFormat = typer.Option(OutputFormat.TABLE, "-o", "--output"),
) -> None:
    """Summarise declared capacity per pool and per team.

    Per pool: GPUs reserved and unreserved and the monthly cost of the reservations.
    Per team (as a tree): reservations per pool, bursting priority and the most it may use.

    Example: gpufleet capacity examples/gitops -o json
    """
    fleet, problems = validate_paths(paths)
    if has_errors(problems):
        print_problems(problems, err_console)
        raise fail(f"cannot summarise: {problem_counts(problems)}")
    summary = summarize(fleet)
    if output is OutputFormat.JSON:
        print_data(summary.to_dict())
    elif output is OutputFormat.YAML:
        print_yaml(summary.to_dict())
    else:
        print_tables(summary)


def _money(value: float | None) -> str:
    return "-" if value is None else f"${value:,.2f}"


def print_tables(summary: CapacitySummary) -> None:
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
    for p in summary.pools:
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
        )
    total_cost = sum(p.reserved_cost_per_month or 0 for p in summary.pools)
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
    for t in summary.teams:
        teams.add_row(
            "  " * t.depth + t.name,
            str(t.bursting_priority),
            t.burst_limit if t.burst_limit is not None else "unlimited",
            *(str(t.reserved_gpus.get(name, "")) or "" for name in pool_names),
            str(t.own_reserved_gpus),
            str(t.subtree_reserved_gpus),
            "unlimited" if t.max_usable_gpus is None else f"{t.max_usable_gpus:g}",
        )
    console.print(teams)
