"""Teams, reservations, borrowing and reclaim on the Philly trace (benchmark B2 of perf.md).

    python benchmarks/teams.py --trace ../shared/data/philly/philly.csv \\
        --teams ../shared/data/philly/philly_vc.csv --start 2017-10-02 --end 2017-10-04 \\
        --load 0.7,0.9,1.1 --policy gpufleet

Prints one JSON object. Setup:
- the 11 virtual clusters of `philly_vc.csv` are the teams; the jobs they submitted in
  [start, end) are replayed (the few jobs of VCs missing from that file are dropped);
- one static pool of 8-GPU nodes, scaled so that the mean offered load over the window is the
  requested RHO: capacity = offered GPU-seconds / (RHO x window seconds), rounded up to whole
  nodes, where a job offers its GPUs from submission to the earlier of its end and the end of
  the window (the whole Philly cluster has 2,816 GPUs; the scale factor is reported). The
  allocation rate is measured over the window; delays and the rest over every job to its end;
- each team reserves a share of the pool in proportion to its Philly node count (largest
  remainder, whole GPUs), so the reservations add up to the pool;
- jobs are of class auto: reserved while the team's reserved work fits its reservation,
  elastic (borrowing, preemptible) beyond; jobs larger than a node are gangs of whole nodes;
  preempted jobs lose the work done since their last checkpoint (--checkpoint-interval).

Every policy is run through the same engine and simulator (see gpufleet/sim/simulator.py);
`sharing_safety_s` always compares the chosen policy with a static-partition run of the same
window and load.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gpufleet.model.fleet import Fleet, fleet_from_objects
from gpufleet.sim.policies import POLICIES
from gpufleet.sim.simulator import SimResult, sharing_safety, simulate
from gpufleet.sim.trace import TraceJob, read_philly

PHILLY_GPUS_PER_NODE = 8
API = "gpufleet.io/v1alpha1"


def read_teams(path: Path) -> dict[str, int]:
    """VC id -> Philly node count."""
    with path.open(newline="") as handle:
        return {row["vc"]: int(row["node num"]) for row in csv.DictReader(handle)}


def team_name(vc: str) -> str:
    return f"vc-{vc}"


def split(total: int, weights: dict[str, int]) -> dict[str, int]:
    """`total` split in proportion to `weights`, largest remainder first."""
    whole = sum(weights.values())
    exact = {k: total * w / whole for k, w in weights.items()}
    shares = {k: math.floor(v) for k, v in exact.items()}
    for k in sorted(exact, key=lambda k: (shares[k] - exact[k], k))[: total - sum(shares.values())]:
        shares[k] += 1
    return shares


def build_fleet(nodes: int, vc_nodes: dict[str, int]) -> Fleet:
    gpus = nodes * PHILLY_GPUS_PER_NODE
    objects: list[dict[str, Any]] = [
        {
            "apiVersion": API,
            "kind": "GPUPool",
            "metadata": {"name": "philly"},
            "spec": {
                "provider": "static",
                "gpuType": "P100",
                "gpusPerNode": PHILLY_GPUS_PER_NODE,
                "maxGPUs": gpus,
                "nodeSelector": {"gpufleet.io/pool": "philly"},
            },
        }
    ]
    for vc, share in split(gpus, vc_nodes).items():
        objects.append({"apiVersion": API, "kind": "Team", "metadata": {"name": team_name(vc)}})
        if share:
            objects.append(
                {
                    "apiVersion": API,
                    "kind": "Reservation",
                    "metadata": {"name": team_name(vc)},
                    "spec": {"team": team_name(vc), "pool": "philly", "gpus": share},
                }
            )
    loaded = fleet_from_objects(objects, origin="teams-benchmark")
    assert not loaded.problems, loaded.problems
    return loaded.fleet


def summary(result: SimResult, safety: dict[str, float | None]) -> dict[str, Any]:
    metrics = result.metrics()
    return {
        "allocation_rate": metrics["allocation_rate"],
        "reserved_guarantee_violations": metrics["reserved_guarantee_violations"],
        "idle_gpu_hours_with_demand": metrics["idle_gpu_hours_with_demand"],
        "queue_delay_s": metrics["queue_delay_s"],
        "jct_s": metrics["jct_s"],
        "preemptions": metrics["preemptions"],
        "gpu_hours_lost": metrics["gpu_hours_lost"],
        "fairness_deviation": metrics["fairness_deviation"],
        "sharing_safety_s": safety,
        "teams": metrics["teams"],
        "jobs": metrics["jobs"],
        "finished": metrics["finished"],
        "never_started": metrics["never_started"],
        "engine_cpu_s_per_simulated_day": metrics["engine_cpu_s_per_simulated_day"],
    }


def offered_gpu_seconds(jobs: list[TraceJob], window_s: float) -> float:
    """A job offers its GPUs from submission to the earlier of its end and the window's end."""
    return sum(j.gpus * j.pods * min(j.duration_s, window_s - j.submit_s) for j in jobs)


def nodes_for_load(jobs: list[TraceJob], window_s: float, load: float) -> int:
    """8-GPU nodes for a mean offered load of `load` over the window, at least the largest
    job."""
    offered = offered_gpu_seconds(jobs, window_s)
    gpus = max(offered / (load * window_s), max(j.gpus * j.pods for j in jobs))
    return math.ceil(gpus / PHILLY_GPUS_PER_NODE)


def run_load(
    jobs: list[TraceJob],
    vc_nodes: dict[str, int],
    window_s: float,
    load: float,
    policy: str,
    checkpoint_s: float,
) -> dict[str, Any]:
    offered = offered_gpu_seconds(jobs, window_s)
    nodes = nodes_for_load(jobs, window_s, load)
    fleet = build_fleet(nodes, vc_nodes)
    started = time.process_time()
    ours = simulate(fleet, jobs, checkpoint_s, policy=policy, horizon_s=window_s)
    partitioned = (
        ours
        if policy == "static-partition"
        else simulate(fleet, jobs, checkpoint_s, policy="static-partition", horizon_s=window_s)
    )
    return {
        "load": load,
        "scaling": {
            "window_s": window_s,
            "offered_gpu_hours": round(offered / 3600, 1),
            "capacity_gpus": nodes * PHILLY_GPUS_PER_NODE,
            "scale_vs_philly": round(
                nodes * PHILLY_GPUS_PER_NODE / (sum(vc_nodes.values()) * PHILLY_GPUS_PER_NODE), 4
            ),
        },
        "policy": policy,
        **summary(ours, sharing_safety(ours, partitioned)),
        "static_partition_allocation_rate": round(partitioned.allocation_rate, 4),
        "cpu_s": round(time.process_time() - started, 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", type=Path, required=True, help="philly.csv (adaptdl)")
    parser.add_argument("--teams", type=Path, required=True, help="philly_vc.csv (Helios)")
    parser.add_argument("--start", default="2017-10-02", help="window start (UTC date/time)")
    parser.add_argument("--end", default="2017-10-04", help="window end, exclusive")
    parser.add_argument("--load", default="0.7,0.9,1.1", help="offered loads, comma-separated")
    parser.add_argument("--policy", choices=POLICIES, default="gpufleet")
    parser.add_argument("--checkpoint-interval", type=float, default=1800.0, help="seconds")
    parser.add_argument("--max-jobs", type=int, default=0, help="first N jobs only (smoke)")
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
        start = datetime.fromisoformat(args.start).replace(tzinfo=UTC)
        end = datetime.fromisoformat(args.end).replace(tzinfo=UTC)
        loads = [float(x) for x in args.load.split(",")]
        vc_nodes = read_teams(args.teams)
    except (ValueError, KeyError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if end <= start or any(x <= 0 for x in loads):
        print("error: --end must be after --start and every --load positive", file=sys.stderr)
        return 2
    jobs, problems = read_philly(args.trace, start, end, PHILLY_GPUS_PER_NODE)
    if problems:
        for p in problems[:10]:
            print(f"{p.file}:{p.line}: {p.message}", file=sys.stderr)
        return 2
    known = [j for j in jobs if j.team in vc_nodes]
    dropped = len(jobs) - len(known)
    jobs = [
        TraceJob(
            j.name, team_name(j.team), j.workload_class, j.gpus, j.pods, j.submit_s, j.duration_s
        )
        for j in known
    ]
    if args.max_jobs:
        jobs = jobs[: args.max_jobs]
    if not jobs:
        print("error: no jobs in the window", file=sys.stderr)
        return 2
    window_s = (end - start).total_seconds()
    if args.max_jobs:
        window_s = max(j.submit_s for j in jobs) or window_s
    results = [
        run_load(jobs, vc_nodes, window_s, load, args.policy, args.checkpoint_interval)
        for load in loads
    ]
    print(
        json.dumps(
            {
                "trace": args.trace.name,
                "window": [start.isoformat(), end.isoformat()],
                "jobs": len(jobs),
                "dropped_jobs_of_unknown_teams": dropped,
                "checkpoint_interval_s": args.checkpoint_interval,
                "results": results,
            },
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
