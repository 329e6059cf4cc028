"""Reserved guarantees and elastic waits on every week of the Philly trace (issue 12).

    python benchmarks/guarantees.py --trace ../shared/data/philly/philly.csv \\
        --teams ../shared/data/philly/philly_vc.csv --load 0.7,1.0,1.3 --workers 2

Prints one JSON object per line, one per week and load, with the setup of
`benchmarks/teams.py` (one static pool sized for the load, reservations in proportion to the
Philly VCs, jobs of class auto): reserved-guarantee violations (and the jobs, if any), the
allocation rate against a static-partition run of the same week, and the worst elastic wait
per team (`worst_elastic_wait_s`: the longest any elastic job of the team waited for its first
start; a job that never started counts its wait until the end of the run). The last line is a
summary over all rows. Weeks start on the Monday of the trace's first job; the last week may be
shorter.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from datetime import time as dt_time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from teams import PHILLY_GPUS_PER_NODE, build_fleet, nodes_for_load, read_teams, team_name

from gpufleet.model.fleet import Fleet
from gpufleet.sim.simulator import SimResult, simulate
from gpufleet.sim.trace import TraceJob, read_philly

GRACE_S = 60.0  # the simulator's default grace before a reserved wait is a violation


def weeks(trace: Path) -> list[tuple[datetime, datetime]]:
    """Monday-to-Monday windows covering every submission of the trace."""
    with trace.open(newline="") as handle:
        stamps = [row["timestamp"] for row in csv.DictReader(handle) if row.get("timestamp")]
    if not stamps:
        return []
    first = datetime.fromisoformat(min(stamps)).replace(tzinfo=UTC)
    last = datetime.fromisoformat(max(stamps)).replace(tzinfo=UTC)
    start = datetime.combine(first.date() - timedelta(days=first.weekday()), dt_time(), UTC)
    out = []
    while start <= last:
        out.append((start, start + timedelta(days=7)))
        start += timedelta(days=7)
    return out


def load_week(
    trace: Path, vc_nodes: dict[str, int], start: datetime, end: datetime
) -> list[TraceJob]:
    jobs, _ = read_philly(trace, start, end, PHILLY_GPUS_PER_NODE)
    return [
        TraceJob(
            j.name, team_name(j.team), j.workload_class, j.gpus, j.pods, j.submit_s, j.duration_s
        )
        for j in jobs
        if j.team in vc_nodes
    ]


@dataclass
class Week:
    """One week of the trace at one load, ready to simulate: its JSON row so far, its jobs,
    its length, and the fleet sized for the load (None when the week has no jobs)."""

    row: dict[str, Any]
    jobs: list[TraceJob]
    window_s: float
    nodes: int = 0
    fleet: Fleet | None = None


def prepare_week(
    trace: Path, vc_nodes: dict[str, int], start: datetime, end: datetime, load: float
) -> Week:
    """The setup every week sweep shares (guarantees, sim_speed, lemons)."""
    jobs = load_week(trace, vc_nodes, start, end)
    row: dict[str, Any] = {"week": start.date().isoformat(), "load": load, "jobs": len(jobs)}
    week = Week(row, jobs, (end - start).total_seconds())
    if jobs:
        week.nodes = nodes_for_load(jobs, week.window_s, load)
        week.fleet = build_fleet(week.nodes, vc_nodes)
    return week


def violations(result: SimResult) -> list[dict[str, Any]]:
    return [
        {
            "job": j.spec.name,
            "team": j.spec.team,
            "gpus": j.total_gpus,
            "pods": j.spec.pods,
            "submitted_s": j.submitted,
            "waited_s": round(
                (j.first_start if j.first_start is not None else result.makespan_s) - j.submitted,
                1,
            ),
            "started": j.first_start is not None,
        }
        for j in result.guarantee_violations(GRACE_S)
    ]


def worst_elastic_waits(result: SimResult) -> dict[str, dict[str, Any]]:
    worst: dict[str, dict[str, Any]] = {}
    for job in result.jobs:
        if job.workload_class != "elastic":
            continue
        started = job.first_start if job.first_start is not None else result.makespan_s
        wait = started - job.submitted
        team = job.spec.team
        if team not in worst or wait > worst[team]["wait_s"]:
            worst[team] = {
                "wait_s": round(wait, 1),
                "job": job.spec.name,
                "gpus": job.total_gpus,
                "started": job.first_start is not None,
            }
    return dict(sorted(worst.items()))


def run_week(
    trace: Path, vc_nodes: dict[str, int], start: datetime, end: datetime, load: float
) -> dict[str, Any]:
    week = prepare_week(trace, vc_nodes, start, end, load)
    row, jobs, window_s, fleet = week.row, week.jobs, week.window_s, week.fleet
    if fleet is None:
        return row
    began = time.perf_counter()
    ours = simulate(fleet, jobs, policy="gpufleet", horizon_s=window_s)
    ours_s = time.perf_counter() - began
    partitioned = simulate(fleet, jobs, policy="static-partition", horizon_s=window_s)
    metrics = ours.metrics()
    found = violations(ours)
    waits = worst_elastic_waits(ours)
    worst_team = max(waits, key=lambda t: waits[t]["wait_s"]) if waits else None
    row.update(
        {
            "capacity_gpus": week.nodes * PHILLY_GPUS_PER_NODE,
            "reserved_guarantee_violations": len(found),
            "violations": found,
            "allocation_rate": metrics["allocation_rate"],
            "static_partition_allocation_rate": round(partitioned.allocation_rate, 4),
            "idle_gpu_hours_with_demand": metrics["idle_gpu_hours_with_demand"],
            "preemptions": metrics["preemptions"],
            "never_started": metrics["never_started"],
            "worst_elastic_wait_s": waits[worst_team]["wait_s"] if worst_team else None,
            "worst_elastic_wait_team": worst_team,
            "worst_elastic_wait_by_team": waits,
            "simulate_s": round(ours_s, 1),
            "decisions": metrics["decisions"],
        }
    )
    return row


WeekRun = Callable[[Path, dict[str, int], datetime, datetime, float], dict[str, Any]]


def sweep(description: str, run: WeekRun, argv: list[str] | None) -> list[dict[str, Any]] | int:
    """The command line shared by the week sweeps: runs `run` for every selected week and load
    in `--workers` processes, printing each row as a JSON line as it comes; returns the rows,
    or an exit code when there is nothing to run."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--trace", type=Path, required=True, help="philly.csv (adaptdl)")
    parser.add_argument("--teams", type=Path, required=True, help="philly_vc.csv (Helios)")
    parser.add_argument("--load", default="0.7,1.0,1.3", help="offered loads, comma-separated")
    parser.add_argument("--weeks", default="", help="only these week starts (YYYY-MM-DD,...)")
    parser.add_argument("--workers", type=int, default=1, help="processes in parallel")
    args = parser.parse_args(argv)
    for path in (args.trace, args.teams):
        if not path.is_file():
            print(
                f"skipped: {path} is missing (the Philly trace lives in ../shared/data/philly)",
                file=sys.stderr,
            )
            print(json.dumps({"skipped": f"{path} is missing"}))
            return 0
    try:
        loads = [float(x) for x in args.load.split(",")]
        vc_nodes = read_teams(args.teams)
        windows = weeks(args.trace)
        if args.weeks:
            wanted = {datetime.fromisoformat(w).date() for w in args.weeks.split(",")}
            windows = [w for w in windows if w[0].date() in wanted]
    except (ValueError, KeyError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    tasks = [(start, end, load) for load in loads for start, end in windows]
    rows = []
    with ProcessPoolExecutor(max_workers=max(args.workers, 1)) as pool:
        for row in pool.map(
            run,
            [args.trace] * len(tasks),
            [vc_nodes] * len(tasks),
            *zip(*tasks, strict=True),
        ):
            print(json.dumps(row), flush=True)
            rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    rows = sweep(__doc__.split("\n\n")[0], run_week, argv)
    if isinstance(rows, int):
        return rows
    totals: dict[str, Any] = defaultdict(int)
    for row in rows:
        totals["runs"] += 1
        totals["reserved_guarantee_violations"] += row.get("reserved_guarantee_violations", 0)
    print(
        json.dumps(
            {
                "summary": dict(totals),
                "worst_elastic_wait_s": max(
                    (r["worst_elastic_wait_s"] for r in rows if r.get("worst_elastic_wait_s")),
                    default=None,
                ),
                "slowest_simulate_s": max((r.get("simulate_s", 0) for r in rows), default=0),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
