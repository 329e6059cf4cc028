"""`gpufleet simulate`: replay a workload trace through the engine on the declared pools."""

from __future__ import annotations

import json
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
from gpufleet.model import has_errors, validate_paths
from gpufleet.sim.simulator import simulate
from gpufleet.sim.trace import read_native


def simulate_command(
    gitops: list[Path] = typer.Option(..., "--gitops", "-g", help="GitOps files or folders."),
    trace: Path = typer.Option(
        ...,
        "--trace",
        "-t",
        help="Native trace CSV: name,team,class,gpus,pods,submit_s,duration_s[,priority].",
    ),
    checkpoint_interval: float = typer.Option(
        1800,
        "--checkpoint-interval",
        help="Seconds between checkpoints: preempted work loses what it did since the last one.",
    ),
    json_file: Path | None = typer.Option(None, "--json", help="Also write the metrics here."),
    output: OutputFormat = typer.Option(OutputFormat.TABLE, "-o", "--output"),
) -> None:
    """Replay a trace through the scheduling engine on the declared pools, and report
    allocation rate, queue delays and completion times per team and class, preemptions, lost
    GPU-hours and reserved-guarantee violations.

    Example: gpufleet simulate --gitops examples/gitops --trace my-trace.csv --json out.json
    """
    fleet, problems = validate_paths(gitops)
    if has_errors(problems):
        print_problems(problems, err_console)
        raise fail(f"the GitOps input has {problem_counts(problems)}")
    jobs, trace_problems = read_native(trace)
    if trace_problems:
        print_problems(trace_problems, err_console)
        raise fail(f"the trace has {problem_counts(trace_problems)}")
    gpus = sum(p.spec.max_gpus for p in fleet.pools.values())
    err_console.print(f"simulating {len(jobs)} jobs on {gpus} GPUs...")
    metrics = simulate(fleet, jobs, checkpoint_interval).metrics(
        grace_period_s=_seconds(fleet.policy.preemption.grace_period)
    )
    if json_file is not None:
        json_file.write_text(json.dumps(metrics, indent=2) + "\n")
    if print_structured(metrics, output):
        return
    console.print(
        f"jobs {metrics['jobs']}, finished {metrics['finished']}, allocation rate "
        f"{100 * metrics['allocation_rate']:.1f}%, preemptions {metrics['preemptions']}, "
        f"GPU-hours lost {metrics['gpu_hours_lost']}, reserved-guarantee violations "
        f"{metrics['reserved_guarantee_violations']}"
    )
    table = Table(title="Queue delay and completion time (s)", title_justify="left", box=box.SIMPLE)
    for column in ("TEAM/CLASS", "DELAY P50", "P95", "P99", "JCT P50", "P95"):
        table.add_column(column, justify="left" if column == "TEAM/CLASS" else "right")
    for key, delay in metrics["queue_delay_s"].items():
        jct = metrics["jct_s"].get(key, {})
        table.add_row(
            key,
            f"{delay['p50']:g}",
            f"{delay['p95']:g}",
            f"{delay['p99']:g}",
            f"{jct.get('p50', 0):g}",
            f"{jct.get('p95', 0):g}",
        )
    console.print(table)


def _seconds(duration: str) -> float:
    from gpufleet.model.durations import parse_duration

    return parse_duration(duration).total_seconds()
