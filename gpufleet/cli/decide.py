"""`gpufleet decide`: the scheduling engine on a file."""

from __future__ import annotations

from pathlib import Path

import typer
from rich import box
from rich.table import Table

from gpufleet.cli.output import (
    OutputFormat,
    console,
    err_console,
    fail,
    print_problems,
    print_structured,
    problem_counts,
)
from gpufleet.engine import Decisions, SnapshotError, decide
from gpufleet.engine.snapshot import snapshot_from_state
from gpufleet.model import Problem, has_errors, validate_paths
from gpufleet.model.state import load_state


def decide_command(
    gitops: list[Path] = typer.Option(
        ..., "--gitops", "-g", help="GitOps file or folder (repeatable), as for validate."
    ),
    state: Path = typer.Option(
        ..., "--state", "-s", help="Cluster state: nodes and workloads (see docs/decide.md)."
    ),
    output: OutputFormat = typer.Option(OutputFormat.TABLE, "-o", "--output"),
) -> None:
    """Run the scheduling engine once on a cluster state and print its decisions.

    Admissions (pool and node of every pod), preemptions (by whom and why) and, for every
    workload still waiting, a reason, its position in its team's queue and an ETA.

    Example: gpufleet decide --gitops examples/gitops --state examples/state/full-pool.yaml
    """
    fleet, problems = validate_paths(gitops)
    if has_errors(problems):
        print_problems(problems, err_console)
        raise fail(f"the GitOps input has {problem_counts(problems)}")
    loaded, source, state_problems = load_state(state, fleet)
    if loaded is None or has_errors(state_problems):
        print_problems(state_problems, err_console)
        raise fail(f"the state file has {problem_counts(state_problems)}")
    assert source is not None
    try:
        decisions = decide(snapshot_from_state(fleet, loaded))
    except SnapshotError as err:
        index = next(i for i, w in enumerate(loaded.workloads) if w.name == err.workload)
        problem = Problem(source.file, source.line_of(("workloads", index)), "error", str(err))
        print_problems([problem], err_console)
        raise fail("the state file contradicts itself") from None
    if not print_structured(decisions.to_dict(), output):
        print_tables(decisions)


def print_tables(decisions: Decisions) -> None:
    data = decisions.to_dict()
    admitted = Table(title="Admitted", title_justify="left", box=box.SIMPLE)
    for column in ("WORKLOAD", "POOL", "NODES"):
        admitted.add_column(column)
    for a in data["admitted"]:
        admitted.add_row(a["workload"], a["pool"], ",".join(a["nodes"]))
    preempted = Table(title="Preempted", title_justify="left", box=box.SIMPLE)
    for column in ("WORKLOAD", "BY", "REASON", "MESSAGE"):
        preempted.add_column(column)
    for p in data["preempted"]:
        preempted.add_row(p["workload"], p["by"], p["reason"], p["message"])
    pending = Table(title="Pending", title_justify="left", box=box.SIMPLE)
    for column in ("WORKLOAD", "REASON", "POSITION", "ETA", "MESSAGE"):
        pending.add_column(column)
    for w in data["pending"]:
        pending.add_row(
            w["workload"], w["reason"], str(w["position"]), w["eta"] or "-", w["message"]
        )
    for table, rows in (
        (admitted, data["admitted"]),
        (preempted, data["preempted"]),
        (pending, data["pending"]),
    ):
        if rows:
            console.print(table)
        else:
            console.print(f"{table.title}: none")
