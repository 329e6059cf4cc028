"""`gpufleet cost` and `gpufleet usage`: what ran, what it cost and what sat idle, from the
usage ledger the controller (or `gpufleet simulate --ledger`) wrote."""

from __future__ import annotations

import csv
import io
import os
import sys
from collections.abc import Callable
from enum import StrEnum
from typing import Any, TypeVar

import typer
from rich import box
from rich.table import Table

from gpufleet.cli.output import console, err_console, fail, print_data, print_yaml
from gpufleet.ledger.cost import GROUP_KEYS
from gpufleet.ledger.reports import window_events, window_forecast, window_report
from gpufleet.ledger.store import Ledger, LedgerError, open_ledger

LEDGER_ENV = "GPUFLEET_LEDGER"
T = TypeVar("T")


class ReportFormat(StrEnum):
    TABLE = "table"
    JSON = "json"
    YAML = "yaml"
    CSV = "csv"


_LEDGER = typer.Option(
    None,
    "--ledger",
    "-l",
    envvar=LEDGER_ENV,
    help="The ledger: a SQLite file or a database URL (postgresql+psycopg://user@host/db); "
    f"default ${LEDGER_ENV}.",
)
_SINCE = typer.Option(
    None,
    "--since",
    help="Start of the window: a date or time (2026-12-01, 2026-12-01T09:00) or a duration "
    "back from the end (7d, 24h). Default: the ledger's first record.",
)
_UNTIL = typer.Option(
    None,
    "--until",
    help="End of the window (a date or time). Default: the ledger's last record, or now while "
    "work runs.",
)
_BY = typer.Option(
    None,
    "--by",
    help=f"Group by one or more of: {', '.join(GROUP_KEYS)} (repeat the option).",
)
_SHORT = typer.Option(
    "5m",
    "--short",
    help="A preempted or cancelled run shorter than this counts as waste.",
)
_CLUSTER = typer.Option(
    None,
    "--cluster",
    help="Only this cluster's work and pools, in a ledger the clusters of a fleet share "
    "(group by cluster with --by cluster).",
)
_OUTPUT = typer.Option(ReportFormat.TABLE, "-o", "--output", help="table, json, yaml or csv.")


cost_app = typer.Typer(no_args_is_help=False)


@cost_app.callback(invoke_without_command=True)
def cost_command(
    ctx: typer.Context,
    ledger: str | None = _LEDGER,
    since: str | None = _SINCE,
    until: str | None = _UNTIL,
    by: list[str] | None = _BY,
    share_idle: bool = typer.Option(
        False,
        "--share-idle",
        help="Share each pool's idle cost among the groups in proportion to their use of the "
        "pool, instead of showing it on its own.",
    ),
    short: str = _SHORT,
    cluster: str | None = _CLUSTER,
    output: ReportFormat = _OUTPUT,
) -> None:
    """GPU cost by team (or user, pool, GPU type, class, namespace, cluster): what the work
    cost at its pools' prices, what idle capacity cost, what was wasted (failed runs, work lost
    to preemption since the last checkpoint, runs cut short), efficiency, a team leaderboard
    and a forecast for the month. `gpufleet cost events` lists the runs one by one.

    Examples:

      gpufleet cost --ledger /var/lib/gpufleet/ledger.db --since 2026-12-01

      gpufleet cost --ledger run.db --by team --by pool --share-idle -o csv

      gpufleet cost --ledger postgresql+psycopg://gpufleet@db/ledger --by cluster --by user
    """
    if ctx.invoked_subcommand is not None:
        return
    data = _report(
        ledger, since, until, by or ["team"], share_idle, short, cluster, with_forecast=True
    )
    if _structured(data, output):
        return
    _print_groups(data, cost=True)
    totals = data["totals"]
    console.print(
        f"work {totals['gpuHours']:,.1f} GPU-hours, ${totals['gpuCost']:,.2f}; capacity "
        f"{totals['capacityGPUHours']:,.1f} GPU-hours, ${totals['capacityCost']:,.2f}; idle "
        f"${totals['idleCost']:,.2f}; wasted ${totals['wasteCost']:,.2f}"
    )
    month = data["forecast"]
    band = (
        f" (95 %: ${month['low']:,.2f} to ${month['high']:,.2f})"
        if month["low"] is not None
        else " (the band needs two complete days)"
    )
    console.print(
        f"{month['month']}: spent ${month['spentSoFar']:,.2f}, forecast "
        f"${month['forecast']:,.2f}{band}; it rests on {month['basis']['note']}"
    )
    _print_unpriced(data)


def usage_command(
    ledger: str | None = _LEDGER,
    since: str | None = _SINCE,
    until: str | None = _UNTIL,
    by: list[str] | None = _BY,
    short: str = _SHORT,
    cluster: str | None = _CLUSTER,
    output: ReportFormat = _OUTPUT,
) -> None:
    """GPU-hours by pool (or team, GPU type, class, namespace, cluster): runs and how they ended,
    waste and efficiency, each pool's capacity, idle and unhealthy GPU-hours, how much of
    each team's reservation its reserved work used, and the GPU-hours and idle GPU-hours of
    the hosts outside Kubernetes (standalone agents) by host and workload.

    Examples:

      gpufleet usage --ledger /var/lib/gpufleet/ledger.db --by pool -o csv

      gpufleet usage --ledger run.db --by team --since 7d
    """
    data = _report(ledger, since, until, by or ["pool"], False, short, cluster, with_forecast=False)
    if _structured(data, output):
        return
    _print_groups(data, cost=False)
    pools = Table(box=box.SIMPLE_HEAD)
    for column in ("POOL", "GPU TYPE", "CAPACITY GPU-H", "USED", "IDLE", "UNHEALTHY", "ALLOC"):
        pools.add_column(column, justify="left" if column in ("POOL", "GPU TYPE") else "right")
    for pool in data["pools"]:
        pools.add_row(
            pool["pool"],
            pool["gpuType"] or "-",
            f"{pool['capacityGPUHours']:,.1f}",
            f"{pool['gpuHours']:,.1f}",
            f"{pool['idleGPUHours']:,.1f}",
            f"{pool['unhealthyGPUHours']:,.1f}",
            _percent(pool["allocation"]),
        )
    console.print(pools)
    if data["reservations"]:
        table = Table(box=box.SIMPLE_HEAD)
        for column in ("TEAM", "POOL", "RESERVED GPU-H", "USED GPU-H", "UTILISATION"):
            table.add_column(column, justify="left" if column in ("TEAM", "POOL") else "right")
        for row in data["reservations"]:
            table.add_row(
                row["team"],
                row["pool"],
                f"{row['reservedGPUHours']:,.1f}",
                f"{row['usedGPUHours']:,.1f}",
                _percent(row["utilisation"]),
            )
        console.print(table)
    if data["hosts"]:
        hosts = Table(box=box.SIMPLE_HEAD)
        for column in ("HOST", "WORKLOAD", "GPU-H", "IDLE GPU-H"):
            hosts.add_column(column, justify="left" if column in ("HOST", "WORKLOAD") else "right")
        for row in data["hosts"]:
            hosts.add_row(row["host"], row.get("workload", "(the host)"),
                          f"{row['gpuHours']:,.2f}", f"{row['idleGPUHours']:,.2f}")  # fmt: skip
        console.print(hosts)


@cost_app.command("events")
def cost_events_command(
    ledger: str | None = _LEDGER,
    since: str | None = _SINCE,
    until: str | None = _UNTIL,
    team: str | None = typer.Option(None, "--team", "-t", help="Only this team's runs."),
    user: str | None = typer.Option(None, "--user", help="Only this user's (the submitter)."),
    short: str = _SHORT,
    cluster: str | None = _CLUSTER,
    output: ReportFormat = _OUTPUT,
) -> None:
    """The cost events: one row per run in the window, oldest first: workload, team, user,
    cluster, pool, start and end, GPUs, GPU-hours and cost at its rate, outcome, and the waste
    with its reason. A run that crosses the window counts its hours inside it.

    Examples:

      gpufleet cost events --ledger /var/lib/gpufleet/ledger.db --since 7d -o csv

      gpufleet cost events --ledger run.db --user alice@example.com
    """
    data = read_ledger(ledger, lambda store: window_events(
        store, since, until, short, cluster=cluster, team=team, user=user
    ))  # fmt: skip
    if output is ReportFormat.CSV:
        sys.stdout.write(_csv(data["items"], list(EVENT_COLUMNS)))
        return
    if _structured(data, output):
        return
    table = Table(box=box.SIMPLE_HEAD)
    for column in ("WORKLOAD", "TEAM", "USER", "POOL", "START", "END", "GPUS", "GPU-H", "COST",
                   "OUTCOME", "WASTE $", "WHY WASTE"):  # fmt: skip
        table.add_column(column, justify="right" if column in ("GPUS", "GPU-H", "COST",
                                                                "WASTE $") else "left")  # fmt: skip
    for row in data["items"]:
        table.add_row(
            row["workload"], row["team"], row["user"] or "-", row["pool"] or "-",
            row["start"][:16], (row["end"] or "running")[:16], f"{row['gpus']:g}",
            f"{row['gpuHours']:,.2f}", _money(row["cost"]), row["outcome"],
            _money(row["wasteCost"]), row["wasteReason"] or "",
        )  # fmt: skip
    console.print(table)
    totals = data["totals"]
    console.print(
        f"{totals['runs']} runs, {totals['gpuHours']:,.1f} GPU-hours, ${totals['cost']:,.2f}, "
        f"of which wasted ${totals['wasteCost']:,.2f}"
    )


@cost_app.command("forecast")
def cost_forecast_command(
    until: str = typer.Option(
        ..., "--until", help="The date the forecast runs to (2027-03-31), within a year."
    ),
    by: str | None = typer.Option(None, "--by", help="Per team or gpu-type as well."),
    ledger: str | None = _LEDGER,
    cluster: str | None = _CLUSTER,
    output: ReportFormat = _OUTPUT,
) -> None:
    """What GPUs will cost from now to a date: the daily cost of the last 90 days the ledger
    recorded, projected with its trend (from 7 complete days; the mean from 2; the rate so far
    before that), with a 95 % band, and what it rests on. In all, what the pools cost (where
    their capacity was recorded), else what the work cost; per team or GPU type, what the
    work cost.

    Examples:

      gpufleet cost forecast --ledger /var/lib/gpufleet/ledger.db --until 2027-03-31

      gpufleet cost forecast --ledger run.db --until 2027-01-01 --by team -o csv
    """
    data = read_ledger(ledger, lambda store: window_forecast(store, until, by, cluster=cluster))
    key = data.get("by")
    rows = [{"group": "(all)", **data["totals"]}] + [
        {"group": row[key], **{k: v for k, v in row.items() if k != key}}
        for row in data.get("groups", [])
    ]
    if output is ReportFormat.CSV:
        sys.stdout.write(_csv(rows, ["group", *FORECAST_COLUMNS]))
        return
    if _structured(data, output):
        return
    console.print(f"{data['from'][:16]} to {data['until'][:16]} ({data['days']:g} days)")
    table = Table(box=box.SIMPLE_HEAD)
    for column in ((key or "").upper() or "ALL", "FORECAST", "95 % LOW", "95 % HIGH", "PER DAY",
                   "TREND $/DAY", "METHOD"):  # fmt: skip
        table.add_column(column, justify="left" if column in (key or "").upper() else "right")
    for row in rows:
        table.add_row(row["group"], _money(row["projected"]), _money(row["low"]),
                      _money(row["high"]), _money(row["perDay"]),
                      "-" if row["trendPerDay"] is None else f"{row['trendPerDay']:+,.2f}",
                      row["method"])  # fmt: skip
    console.print(table)
    console.print(f"rests on {data['basis']['note']}")


FORECAST_COLUMNS = ("projected", "low", "high", "perDay", "trendPerDay", "method")

EVENT_COLUMNS = ("workload", "team", "user", "class", "cluster", "pool", "gpuType",
                 "capacityType", "start",
                 "end", "gpus", "gpuHours", "pricePerGPUHour", "cost", "outcome", "reason",
                 "wasteGPUHours", "wasteCost", "wasteReason")  # fmt: skip


def _money(value: float | None) -> str:
    return "-" if value is None else f"${value:,.2f}"


def read_ledger(target: str | None, read: Callable[[Ledger], T]) -> T:
    """`read` of the ledger at `target` (--ledger), closed after; a ValueError it raises (a
    bad window or option) is the message the command fails with."""
    store = _open(target)
    try:
        return read(store)
    except ValueError as err:
        raise fail(str(err)) from None
    finally:
        store.close()


def _open(target: str | None) -> Ledger:
    if not target:
        raise fail(
            f"no ledger: give --ledger FILE or URL, or set {LEDGER_ENV} (the controller's "
            "--ledger, or a file written by gpufleet simulate --ledger)"
        )
    try:
        return open_ledger(target, create=False)
    except LedgerError as err:
        raise fail(str(err)) from err


def _report(
    target: str | None,
    since: str | None,
    until: str | None,
    by: list[str],
    share_idle: bool,
    short: str,
    cluster: str | None,
    with_forecast: bool,
) -> dict[str, Any]:
    return read_ledger(target, lambda store: window_report(
        store, since, until, by, share_idle, short, with_forecast, cluster=cluster
    ))  # fmt: skip


def _structured(data: dict[str, Any], output: ReportFormat) -> bool:
    if output is ReportFormat.JSON:
        print_data(data)
    elif output is ReportFormat.YAML:
        print_yaml(data)
    elif output is ReportFormat.CSV:
        sys.stdout.write(to_csv(data))
    else:
        return False
    return True


def to_csv(data: dict[str, Any]) -> str:
    """One row per group: its keys, then every figure (outcomes as one column each)."""
    outcomes = sorted({o for row in data["groups"] for o in row["outcomes"]})
    rows = []
    for row in data["groups"]:
        flat = {k: v for k, v in row.items() if k != "outcomes"}
        flat.update({f"runs_{o}": row["outcomes"].get(o, 0) for o in outcomes})
        rows.append(flat)
    return _csv(rows, list(dict.fromkeys(k for row in rows for k in row)) or data["by"])


def _csv(rows: list[dict[str, Any]], fields: list[str]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=fields, lineterminator=os.linesep)
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()


def _print_groups(data: dict[str, Any], cost: bool) -> None:
    window = data["window"]
    console.print(
        f"{window['since']} to {window['until']} ({window['hours']:,.1f} h), ledger "
        f"{data['ledger']}"
    )
    table = Table(box=box.SIMPLE_HEAD)
    for key in data["by"]:
        table.add_column(key.upper())
    share = cost and "idleCost" in (data["groups"][0] if data["groups"] else {})
    figures = ["GPU-HOURS", "COST"] if cost else ["GPU-HOURS", "RUNS", "FAILED", "PREEMPTED"]
    if share:
        figures += ["IDLE SHARE", "TOTAL"]
    figures += ["WASTE $" if cost else "WASTE GPU-H", "EFFICIENCY"]
    for column in figures:
        table.add_column(column, justify="right")
    for row in data["groups"]:
        cells = [row[k] for k in data["by"]]
        cells.append(f"{row['gpuHours']:,.1f}")
        if cost:
            cells.append(f"${row['gpuCost']:,.2f}")
        else:
            outcomes = row["outcomes"]
            cells += [
                str(row["runs"]),
                str(outcomes.get("failed", 0)),
                str(outcomes.get("preempted", 0)),
            ]
        if share:
            cells += [f"${row['idleCost']:,.2f}", f"${row['totalCost']:,.2f}"]
        cells.append(f"${row['wasteCost']:,.2f}" if cost else f"{row['wasteGPUHours']:,.1f}")
        cells.append(_percent(row["efficiency"]))
        table.add_row(*cells)
    if not data["groups"]:
        err_console.print("no run segments in this window")
    console.print(table)


def _print_unpriced(data: dict[str, Any]) -> None:
    unpriced = [p["pool"] for p in data["pools"] if not p["priced"]]
    if unpriced:
        err_console.print(
            f"note: no pricePerGPUHour for {', '.join(unpriced)}: their GPU-hours cost $0 "
            "here (set spec.pricePerGPUHour on the GPUPool)"
        )


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"
