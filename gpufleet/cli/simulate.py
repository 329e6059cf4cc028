"""`gpufleet simulate`: replay a workload trace through the engine on the declared pools."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from pathlib import Path
from typing import Any

import typer
from rich import box
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
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
from gpufleet.ledger.store import LedgerError, open_ledger
from gpufleet.model import has_errors, validate_paths
from gpufleet.model.durations import parse_duration
from gpufleet.model.fleet import Fleet
from gpufleet.model.suggest import did_you_mean
from gpufleet.sim import report, synthetic
from gpufleet.sim.failures import Failures
from gpufleet.sim.recorder import Recorder
from gpufleet.sim.simulator import EPOCH, SimResult, sharing_safety, simulate
from gpufleet.sim.trace import TraceJob, read_trace


class TraceFormat(StrEnum):
    NATIVE = "native"
    PHILLY = "philly"
    OPENB = "openb"


class SimPolicy(StrEnum):
    GPUFLEET = "gpufleet"
    STATIC_PARTITION = "static-partition"
    FIFO = "fifo"


def load_gitops(gitops: list[Path]) -> Fleet:
    fleet, problems = validate_paths(gitops)
    if has_errors(problems):
        print_problems(problems, err_console)
        raise fail(f"the GitOps input has {problem_counts(problems)}")
    return fleet


def load_trace(
    fleet: Fleet,
    trace: Path | None,
    trace_format: TraceFormat,
    seed: int,
    start: str | None = None,
    end: str | None = None,
) -> list[TraceJob]:
    if trace is None:
        jobs = synthetic.generate(fleet, seed=seed)
        err_console.print(f"no --trace: using a synthetic 6-hour trace (seed {seed})")
        return jobs
    try:
        window = [
            datetime.fromisoformat(x).replace(tzinfo=UTC) if x else None for x in (start, end)
        ]
    except ValueError as err:
        raise fail(f"--start/--end: {err} (write e.g. 2017-10-02 or 2017-10-02T06:00)") from err
    jobs, problems = read_trace(trace, trace_format.value, window[0], window[1])
    if problems:
        print_problems(problems, err_console)
        raise fail(f"the trace has {problem_counts(problems)}")
    if not jobs:
        raise fail(f"{trace}: the trace has no jobs (in the chosen window)")
    types = sorted({p.spec.gpu_type for p in fleet.pools.values()})
    for job in jobs:
        unknown = [t for t in job.gpu_types if t not in types]
        if unknown:
            raise fail(
                f"{trace}: job {job.name} accepts GPU type {unknown[0]!r}, which no pool "
                f"has{did_you_mean(unknown[0], types)}; types: {', '.join(types)}"
            )
    return jobs


def _trace_origin(jobs: list[TraceJob]) -> datetime | None:
    """When the trace's time 0 was, where its jobs carry their own submission times."""
    for job in jobs:
        if job.submitted_at is not None:
            return job.submitted_at - timedelta(seconds=job.submit_s)
    return None


def run_with_progress(
    fleet: Fleet,
    jobs: list[TraceJob],
    checkpoint_interval: float,
    policy: str,
    failures: Failures | None = None,
    start: datetime | None = None,
    provisioning_delay: float | None = None,
    recorder: Recorder | None = None,
) -> SimResult:
    gpus = sum(p.spec.max_gpus for p in fleet.pools.values())
    with Progress(
        TextColumn(f"simulating {policy} on {gpus} GPUs"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err_console,
        transient=True,
        disable=not err_console.is_terminal,
    ) as progress:
        task = progress.add_task("jobs", total=len(jobs))

        def advance(done: int, total: int) -> None:
            progress.update(task, completed=done, total=total)

        # the allocation rate is measured while jobs arrive, not over the drain that follows
        horizon = max(j.submit_s for j in jobs) or None
        return simulate(
            fleet,
            jobs,
            checkpoint_interval,
            policy=policy,
            recorder=recorder,
            progress=advance,
            horizon_s=horizon,
            failures=failures,
            start=start or EPOCH,
            provisioning_delay_s=provisioning_delay,
        )


def simulate_command(
    gitops: list[Path] = typer.Option(..., "--gitops", "-g", help="GitOps files or folders."),
    trace: Path | None = typer.Option(
        None,
        "--trace",
        "-t",
        help="Trace file. Without it, a synthetic 6-hour trace for the fleet's teams (see --seed).",
    ),
    trace_format: TraceFormat = typer.Option(
        TraceFormat.NATIVE,
        "--format",
        "-f",
        help="native: name,team,class,gpus,pods,submit_s,duration_s[,priority]; philly: "
        "timestamp,duration,num_gpus,gpu_time,cluster (cluster = team); openb: an openb pod "
        "list replayed in time (QoS class = team).",
    ),
    policy: SimPolicy = typer.Option(
        SimPolicy.GPUFLEET,
        "--policy",
        "-p",
        help="gpufleet (as declared), static-partition (no borrowing) or fifo (one shared "
        "queue, no reservations).",
    ),
    seed: int = typer.Option(42, "--seed", help="Seed of the synthetic trace and the failures."),
    start: str | None = typer.Option(None, "--start", help="Philly: first submission to keep."),
    at: str | None = typer.Option(
        None,
        "--at",
        help="When the trace starts (UTC, e.g. 2026-12-07T09:00): a Reservation whose expiresAt "
        "falls in the run stops guaranteeing GPUs then; the ledger's times count from it. Default: "
        "the trace's own time (Philly: --start, else its first job), else now.",
    ),
    end: str | None = typer.Option(None, "--end", help="Philly: keep submissions before this."),
    checkpoint_interval: float = typer.Option(
        1800,
        "--checkpoint-interval",
        help="Seconds between checkpoints: preempted work loses what it did since the last one.",
    ),
    node_failures: float = typer.Option(
        0.0,
        "--node-failures",
        min=0,
        help="Failures per node per day (0: nodes never fail). 5 percent of the nodes, the lemons, "
        "fail 40 times as often (the fleet's mean rate is 2.95 times this); a failed node is out "
        "6 hours; work on it loses what it did since its last checkpoint. The engine knows each "
        "node's fault history (lemon avoidance) unless --blind. Meta's Llama 3 pre-training "
        "(16,384 H100, 54 days) had 419 unexpected interruptions, about 0.0038 per 8-GPU node "
        "per day: --node-failures 0.0013 gives that mean.",
    ),
    spot_interruptions: float = typer.Option(
        0.0,
        "--spot-interruptions",
        min=0,
        help="Interruptions per node per day on pools that prefer spot capacity (spot first "
        "in capacityTypes): the node is gone until a replacement is ready 15 minutes later; work "
        "on it loses what it did since its last checkpoint. AWS's Spot Instance Advisor rates "
        "instance types from under 5 to over 20 percent interrupted per month, about 0.002 to "
        "0.007 per node per day.",
    ),
    provisioning_delay: float | None = typer.Option(
        None,
        "--provisioning-delay",
        min=0,
        help="Seconds from the decision to a ready node in autoscaled pools (aws, gcp), e.g. "
        "300. They then start empty, get a node when the engine places work on a new one and "
        "lose it after the pool's consolidateAfter empty; the cost counts the GPU-hours they "
        "had. Default: every pool at its full size.",
    ),
    blind: bool = typer.Option(
        False, "--blind", help="With --node-failures: hide fault histories from the engine."
    ),
    json_file: Path | None = typer.Option(None, "--json", help="Also write the metrics here."),
    ledger: str | None = typer.Option(
        None,
        "--ledger",
        help="Write the run's usage ledger (every run segment, the pools' capacity and the "
        "reservations over simulated time) to this SQLite file or database URL; read it with "
        "gpufleet cost --ledger / gpufleet usage --ledger.",
    ),
    report_file: Path | None = typer.Option(
        None,
        "--report",
        help="Write a self-contained HTML report with charts; also runs the static-partition "
        "baseline to compare against.",
    ),
    output: OutputFormat = typer.Option(OutputFormat.TABLE, "-o", "--output"),
) -> None:
    """Replay a trace through the scheduling engine on the declared pools, and report
    allocation rate, idle GPUs while work waited, queue delays and completion times per team
    and class, preemptions, lost GPU-hours, reserved-guarantee violations, fairness and cost.

    Examples:

      gpufleet simulate --gitops examples/gitops --report report.html

      gpufleet simulate --gitops examples/gitops --trace examples/traces/demo.csv --json m.json

      gpufleet simulate --gitops my-fleet/ --trace philly.csv --format philly \\
          --start 2017-10-02 --end 2017-10-04 --policy static-partition
    """
    fleet = load_gitops(gitops)
    jobs = load_trace(fleet, trace, trace_format, seed, start, end)
    now = datetime.now(UTC).replace(microsecond=0)
    # a ledger keeps the trace's own times where it has them (Philly), else from now
    origin = _when(at, "--at") or _when(start, "--start") or _trace_origin(jobs) or now
    failures = (
        Failures(
            per_node_per_day=node_failures,
            seed=seed,
            avoid_lemons=not blind,
            spot_per_node_per_day=spot_interruptions,
        )
        if node_failures or spot_interruptions
        else None
    )
    if failures is not None and provisioning_delay is not None:
        raise fail(
            "--provisioning-delay cannot be combined with --node-failures or "
            "--spot-interruptions yet: run them separately"
        )
    recorder = Recorder(fleet, origin) if ledger else None
    result = run_with_progress(
        fleet,
        jobs,
        checkpoint_interval,
        policy.value,
        failures,
        origin,
        provisioning_delay,
        recorder,
    )
    if ledger and recorder is not None:
        _write_ledger(ledger, recorder)
    metrics = result.metrics(grace_period_s=_seconds(fleet.policy.preemption.grace_period))
    baseline = None
    # the static partition of the same reservations is what sharing is measured against
    if policy is not SimPolicy.STATIC_PARTITION and (
        report_file is not None or policy is SimPolicy.GPUFLEET
    ):
        baseline = run_with_progress(
            fleet,
            jobs,
            checkpoint_interval,
            "static-partition",
            failures,
            origin,
            provisioning_delay,
        )
        metrics["sharing_safety_s"] = sharing_safety(result, baseline)
        metrics["static_partition_allocation_rate"] = round(baseline.allocation_rate, 4)
    if json_file is not None:
        _write(json_file, json.dumps(metrics, indent=2) + "\n")
    if report_file is not None:
        title = f"gpufleet simulation: {trace.name if trace else f'synthetic trace, seed {seed}'}"
        page = report.render(title, result, baseline, metrics.get("sharing_safety_s"))
        _write(report_file, page)
        err_console.print(f"report written to {report_file}")
    if print_structured(metrics, output):
        return
    _print_summary(metrics)


def _write_ledger(target: str, recorder: Recorder) -> None:
    try:
        store = open_ledger(target)
    except LedgerError as err:
        raise fail(f"--ledger: {err}") from err
    with err_console.status(f"writing {len(recorder.events)} lifecycle events to the ledger"):
        store.write_recorded(recorder.events, recorder.capacity, recorder.reservations)
    err_console.print(
        f"ledger written to {store.url}: {len(recorder.events)} lifecycle events, "
        f"{len(recorder.capacity)} capacity and {len(recorder.reservations)} reservation "
        "intervals"
    )
    store.close()


def _when(value: str | None, option: str) -> datetime | None:
    if not value:
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError as err:
        raise fail(f"{option}: {err} (write e.g. 2026-12-07 or 2026-12-07T09:00)") from err
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _write(path: Path, text: str) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    except OSError as err:
        raise fail(f"cannot write {path}: {err}") from err


def _print_summary(metrics: dict[str, Any]) -> None:
    console.print(
        f"policy {metrics['policy']}: jobs {metrics['jobs']}, finished {metrics['finished']}, "
        f"allocation rate {100 * metrics['allocation_rate']:.1f}%, idle GPU-hours with demand "
        f"{metrics['idle_gpu_hours_with_demand']}, preemptions {metrics['preemptions']}, "
        f"GPU-hours lost {metrics['gpu_hours_lost']}, reserved-guarantee violations "
        f"{metrics['reserved_guarantee_violations']}"
    )
    reclaims, resumes = report.lending_text(metrics["lending"])
    console.print(
        f"lending: {metrics['lending']['borrowed_gpu_hours']} GPU-hours borrowed beyond teams' "
        f"reservations; reclaims {reclaims}; preempted jobs resumed {resumes}"
    )
    if "provisioning" in metrics:
        grown = metrics["provisioning"]
        console.print(
            f"autoscaling: {grown['nodes_provisioned']} nodes provisioned, "
            f"{grown['nodes_removed']} removed, {grown['autoscaled_gpu_hours']} GPU-hours; "
            f"{grown['admissions_that_waited_for_nodes']} admissions waited "
            f"{grown['delay_s']:g} s for their nodes ({grown['gpu_hours_waiting_for_nodes']} "
            "GPU-hours held meanwhile)"
        )
    for expired in metrics.get("reservations_expired", []):
        console.print(
            f"reservation {expired['reservation']} expired {expired['at_s'] / 3600:.1f} h into "
            "the trace: its team's later work ran as elastic work"
        )
    if "node_failures" in metrics:
        console.print(
            f"node failures {metrics['node_failures']}: {metrics['jobs_hit_by_failures']} jobs "
            f"hit ({metrics['gangs_hit_by_failures']} gangs), GPU-hours lost to failures "
            f"{metrics['gpu_hours_lost_to_failures']}; spot interruptions "
            f"{metrics['spot_interruptions']}: {metrics['jobs_hit_by_spot_interruptions']} jobs "
            f"hit, GPU-hours lost {metrics['gpu_hours_lost_to_spot_interruptions']}"
        )
    if "static_partition_allocation_rate" in metrics:
        console.print(
            "static partition of the same reservations: allocation rate "
            f"{100 * metrics['static_partition_allocation_rate']:.1f}%"
        )
    table = Table(title="Per team", title_justify="left", box=box.SIMPLE)
    for column in ("TEAM", "RESERVED", "MEAN ALLOCATED", "MEAN DELAY (s)", "VS STATIC (s)"):
        table.add_column(column, justify="left" if column == "TEAM" else "right")
    safety = metrics.get("sharing_safety_s", {})
    for team, t in metrics["teams"].items():
        delta = safety.get(team)
        table.add_row(
            team,
            str(t["reserved_gpus"]),
            f"{t['mean_allocated_gpus']:g}",
            "-" if t["mean_queue_delay_s"] is None else f"{t['mean_queue_delay_s']:g}",
            "-" if delta is None else f"{delta:+g}",
        )
    console.print(table)
    if metrics.get("clusters"):  # a fleet of clusters: each one's part of the run
        per_cluster = Table(title="Per cluster", title_justify="left", box=box.SIMPLE)
        for column in ("CLUSTER", "GPUS", "ALLOCATION", "JOBS RUN", "MEAN DELAY (s)", "PREEMPTED"):
            per_cluster.add_column(column, justify="left" if column == "CLUSTER" else "right")
        for cluster, c in metrics["clusters"].items():
            per_cluster.add_row(
                cluster,
                str(c["capacity_gpus"]),
                "-" if c["allocation"] is None else f"{100 * c['allocation']:.1f}%",
                str(c["jobs_started"]),
                "-" if c["mean_queue_delay_s"] is None else f"{c['mean_queue_delay_s']:g}",
                str(c["preemptions"]),
            )
        console.print(per_cluster)
    delays = Table(
        title="Queue delay and completion time (s)", title_justify="left", box=box.SIMPLE
    )
    for column in ("TEAM/CLASS", "DELAY P50", "P95", "P99", "JCT P50", "P95"):
        delays.add_column(column, justify="left" if column == "TEAM/CLASS" else "right")
    for key, delay in metrics["queue_delay_s"].items():
        jct = metrics["jct_s"].get(key, {})
        delays.add_row(
            key,
            f"{delay['p50']:g}",
            f"{delay['p95']:g}",
            f"{delay['p99']:g}",
            f"{jct.get('p50', 0):g}",
            f"{jct.get('p95', 0):g}",
        )
    console.print(delays)


def _seconds(duration: str) -> float:
    return parse_duration(duration).total_seconds()
