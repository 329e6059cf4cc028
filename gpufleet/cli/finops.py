"""`gpufleet budgets` and `gpufleet recommendations`: the teams' GPU-hour budgets and what to
change, from the usage ledger and the fleet declared in git."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import typer
from rich import box
from rich.table import Table

from gpufleet.cli.cost import (
    _CLUSTER,
    _LEDGER,
    _OUTPUT,
    ReportFormat,
    _csv,
    _structured,
    read_ledger,
)
from gpufleet.cli.output import console, err_console
from gpufleet.cli.simulate import load_gitops
from gpufleet.ledger.reports import window_budgets, window_recommendations

_GITOPS = typer.Option(
    None, "--gitops", "-g", help="The fleet's GitOps files or folders (its Teams and GPUPools)."
)


def budgets_command(
    gitops: list[Path] = typer.Option(
        ..., "--gitops", "-g", help="The fleet's GitOps files or folders: its Teams' budgets."
    ),
    ledger: str | None = _LEDGER,
    output: ReportFormat = _OUTPUT,
) -> None:
    """Each team's monthly GPU-hour budget (Team spec.budget) against this month's use: used
    so far, the month's forecast with its 95 % band, the alert thresholds crossed, and the day
    it runs out at its pace. A team's budget covers its sub-teams. Budgets limit nothing; the
    controller alerts as each threshold is crossed (notification kind budget-threshold).

    Examples:

      gpufleet budgets --gitops fleet/ --ledger /var/lib/gpufleet/ledger.db

      gpufleet budgets -g fleet/ --ledger run.db -o csv
    """
    fleet = load_gitops(gitops)
    data = read_ledger(ledger, lambda store: window_budgets(store, fleet))
    if output is ReportFormat.CSV:
        rows = [
            {**r, "alertAtPercent": " ".join(map(str, r["alertAtPercent"])),
             "crossed": " ".join(map(str, r["crossed"])), "teams": " ".join(r["teams"])}
            for r in data["items"]
        ]  # fmt: skip
        sys.stdout.write(_csv(rows, list(BUDGET_COLUMNS)))
        return
    if _structured(data, output):
        return
    if not data["items"]:
        err_console.print("no team has a budget: set spec.budget.gpuHoursPerMonth on a Team")
        return
    table = Table(box=box.SIMPLE_HEAD, title=f"GPU-hour budgets, {data['month']}")
    for column in ("TEAM", "BUDGET", "USED", "USED %", "FORECAST", "FORECAST %", "STATE",
                   "RUNS OUT"):  # fmt: skip
        table.add_column(column, justify="left" if column in ("TEAM", "STATE") else "right")
    for row in data["items"]:
        table.add_row(
            row["team"], f"{row['budgetGPUHours']:,.0f}", f"{row['usedGPUHours']:,.1f}",
            f"{row['usedPercent']:g}%", f"{row['forecastGPUHours']:,.0f}",
            f"{row['forecastPercent']:g}%", row["state"], (row["runsOutAt"] or "-")[:10],
        )  # fmt: skip
    console.print(table)
    console.print(f"forecasts rest on {data['items'][0]['basis']}")


BUDGET_COLUMNS = ("team", "month", "budgetGPUHours", "usedGPUHours", "usedPercent",
                  "forecastGPUHours", "forecastPercent", "low", "high", "alertAtPercent",
                  "crossed", "state", "runsOutAt", "teams", "basis")  # fmt: skip


def recommendations_command(
    ledger: str | None = _LEDGER,
    gitops: list[Path] | None = _GITOPS,
    since: str | None = typer.Option(
        None, "--since", help="Start of the window (7d, 2026-12-01). Default: 7 days back."
    ),
    cluster: str | None = _CLUSTER,
    output: ReportFormat = _OUTPUT,
) -> None:
    """What to change, each with the figures behind it: elastic work paid at on-demand rates
    that spot capacity would have run for less (needs --gitops, for the pools' prices), teams
    whose runs fail more than 20 % of the time, and reservations their teams used less than
    half of. The API's /recommendations adds large work kept waiting by scattered free GPUs
    (it reads the queue as it is now).

    Examples:

      gpufleet recommendations --ledger /var/lib/gpufleet/ledger.db --gitops fleet/

      gpufleet recommendations --ledger run.db --since 30d -o json
    """
    fleet = load_gitops(gitops) if gitops else None
    data = read_ledger(
        ledger, lambda store: window_recommendations(store, fleet, since, cluster=cluster)
    )
    if output is ReportFormat.CSV:
        rows: list[dict[str, Any]] = [
            {**{k: v for k, v in r.items() if k != "figures"},
             "figures": json.dumps(r["figures"], sort_keys=True)}
            for r in data["items"]
        ]  # fmt: skip
        sys.stdout.write(_csv(rows, ["kind", "subject", "title", "action", "saving", "figures"]))
        return
    if _structured(data, output):
        return
    if fleet is None:
        err_console.print("note: without --gitops, no spot recommendation (it needs the prices)")
    if not data["items"]:
        console.print(f"nothing to recommend since {data['window']['since'][:16]}")
        return
    for row in data["items"]:
        saving = f" (saves ${row['saving']:,.2f})" if row["saving"] else ""
        console.print(f"[bold]{row['title']}[/bold]{saving}")
        console.print(f"  {row['action']}")
        figures = ", ".join(f"{k} {v}" for k, v in row["figures"].items())
        console.print(f"  [dim]{figures}[/dim]")
