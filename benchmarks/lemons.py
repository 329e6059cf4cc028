"""Lemon-node avoidance in the simulator: GPU-hours lost to node failures with and without it.

    python benchmarks/lemons.py --trace ../shared/data/philly/philly.csv \\
        --teams ../shared/data/philly/philly_vc.csv --load 1.0 --weeks 2017-09-25,2017-10-30

Each week of the Philly trace (the setup of `benchmarks/teams.py`, policy gpufleet) is replayed
with node failures (gpufleet/sim/failures.py: every node fails now and then, 5 % of them, the
lemons, 40 times as often; a failed node is out for 6 hours) twice per seed (`--seeds N`,
default 5): once with the engine seeing each node's fault history (critical work, reserved and
gangs, avoids lemons) and once without. The failures are the same in both runs. Prints one
JSON line per week and load, then a summary over all of them.

    python benchmarks/lemons.py --training-cluster 64 --seeds 40

The same comparison on a training cluster, the case lemon avoidance is for: NODES 8-GPU nodes,
half of them reserved for a team whose work is multi-node gangs (2, 4 or 8 nodes, 6 to 48
hours), the rest shared with a research team's bursts of small jobs (1 to 8 GPUs, log-normal
durations around 50 minutes); a seeded week per seed, failures at 0.01 per node per day (lemons
40 times that; one schedule per seed for both runs, counted until each run ends). One JSON line
per seed, then a summary with the seeds each way won.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from guarantees import prepare_week, sweep

from gpufleet.model.fleet import Fleet, fleet_from_objects
from gpufleet.sim.failures import Failures
from gpufleet.sim.simulator import simulate
from gpufleet.sim.trace import TraceJob

SEEDS_ENV = "GPUFLEET_LEMONS_SEEDS"  # set from --seeds; read in the worker processes
KEYS = (
    "node_failures",
    "jobs_hit_by_failures",
    "gangs_hit_by_failures",
    "gpu_hours_lost_to_failures",
)


def run_week(
    trace: Path, vc_nodes: dict[str, int], start: datetime, end: datetime, load: float
) -> dict[str, Any]:
    week = prepare_week(trace, vc_nodes, start, end, load)
    row, jobs, window_s, fleet = week.row, week.jobs, week.window_s, week.fleet
    if fleet is None:
        return row
    seeds = range(1, int(os.environ.get(SEEDS_ENV, "5")) + 1)
    for label, avoid in (("avoiding_lemons", True), ("blind", False)):
        totals: dict[str, float] = dict.fromkeys(KEYS, 0.0)
        allocation = 0.0
        for seed in seeds:
            failures = Failures(seed=seed, avoid_lemons=avoid)
            result = simulate(fleet, jobs, policy="gpufleet", horizon_s=window_s, failures=failures)
            metrics = result.metrics()
            for key in KEYS:
                totals[key] += metrics[key]
            allocation += metrics["allocation_rate"]
        row[label] = {
            **{k: round(v, 2) for k, v in totals.items()},
            "mean_allocation_rate": round(allocation / len(seeds), 4),
        }
    row["seeds"] = list(seeds)
    return row


WEEK_S = 7 * 86400.0


def training_cluster(nodes: int) -> Fleet:
    api = "gpufleet.io/v1alpha1"
    loaded = fleet_from_objects(
        [
            {
                "apiVersion": api,
                "kind": "GPUPool",
                "metadata": {"name": "h100"},
                "spec": {
                    "provider": "static",
                    "gpuType": "H100",
                    "gpusPerNode": 8,
                    "maxGPUs": nodes * 8,
                    "nodeSelector": {"gpufleet.io/pool": "h100"},
                },
            },
            {"apiVersion": api, "kind": "Team", "metadata": {"name": "llm"}},
            {"apiVersion": api, "kind": "Team", "metadata": {"name": "research"}},
            {
                "apiVersion": api,
                "kind": "Reservation",
                "metadata": {"name": "llm-h100"},
                "spec": {"team": "llm", "pool": "h100", "gpus": nodes * 8 // 2},
            },
        ]
    )
    assert not loaded.problems, loaded.problems
    return loaded.fleet


def training_week(seed: int) -> list[TraceJob]:
    """A week of arrivals every 30 minutes on average: a quarter are gangs of the llm team,
    the rest bursts of small research jobs."""
    rng = random.Random(f"training-week/{seed}")
    jobs: list[TraceJob] = []
    now, arrival = 0.0, 0
    while True:
        now += rng.expovariate(1 / 1800)
        if now >= WEEK_S:
            return jobs
        arrival += 1
        if rng.random() < 0.25:
            pods, hours = rng.choice([2, 4, 8]), rng.uniform(6, 48)
            jobs.append(TraceJob(f"gang-{arrival}", "llm", "auto", 8, pods, now, hours * 3600))
        else:
            for k in range(rng.randint(1, 6)):
                gpus, duration = rng.choice([1, 1, 2, 4, 8]), rng.lognormvariate(8, 1.2)
                name = f"small-{arrival}-{k}"
                jobs.append(TraceJob(name, "research", "elastic", gpus, 1, now, duration))


def run_training_cluster(nodes: int, seeds: int) -> None:
    fleet = training_cluster(nodes)
    totals = {label: dict.fromkeys(KEYS, 0.0) for label in ("avoiding_lemons", "blind")}
    wins = {"avoiding_lemons": 0, "blind": 0, "tie": 0}
    for seed in range(1, seeds + 1):
        jobs = training_week(seed)
        row: dict[str, Any] = {"seed": seed, "nodes": nodes, "jobs": len(jobs)}
        for label, avoid in (("avoiding_lemons", True), ("blind", False)):
            failures = Failures(per_node_per_day=0.01, seed=seed, avoid_lemons=avoid)
            metrics = simulate(fleet, jobs, horizon_s=WEEK_S, failures=failures).metrics()
            row[label] = {k: metrics[k] for k in KEYS}
            row[label]["allocation_rate"] = metrics["allocation_rate"]
            for key in KEYS:
                totals[label][key] += metrics[key]
        ours, theirs = (row[k]["gpu_hours_lost_to_failures"] for k in ("avoiding_lemons", "blind"))
        wins["avoiding_lemons" if ours < theirs else "blind" if theirs < ours else "tie"] += 1
        print(json.dumps(row), flush=True)
    lost = {k: round(v["gpu_hours_lost_to_failures"], 1) for k, v in totals.items()}
    summary = {
        "runs": seeds,
        "gpu_hours_lost_to_failures": lost,
        "gangs_hit_by_failures": {k: int(v["gangs_hit_by_failures"]) for k, v in totals.items()},
        "saved_share": round(1 - lost["avoiding_lemons"] / lost["blind"], 3)
        if lost["blind"]
        else None,
        "seeds_with_less_lost": wins,
    }
    print(json.dumps({"summary": summary}))


def main(argv: list[str] | None = None) -> int:
    extra = argparse.ArgumentParser(add_help=False)
    extra.add_argument("--seeds", type=int, default=5, help="failure seeds per week (1..N)")
    extra.add_argument("--training-cluster", type=int, default=0, metavar="NODES")
    known, rest = extra.parse_known_args(argv)
    if known.training_cluster:
        run_training_cluster(known.training_cluster, max(known.seeds, 1))
        return 0
    os.environ[SEEDS_ENV] = str(max(known.seeds, 1))
    rows = sweep(
        __doc__.split("\n\n")[0] + " (also: --seeds N, default 5; --training-cluster NODES)",
        run_week,
        rest,
    )
    if isinstance(rows, int):
        return rows
    done = [r for r in rows if "blind" in r]
    if done:
        lost = {
            label: round(sum(r[label]["gpu_hours_lost_to_failures"] for r in done), 1)
            for label in ("avoiding_lemons", "blind")
        }
        print(
            json.dumps(
                {
                    "summary": {
                        "runs": len(done),
                        "gpu_hours_lost_to_failures": lost,
                        "saved_share": round(1 - lost["avoiding_lemons"] / lost["blind"], 3)
                        if lost["blind"]
                        else None,
                    }
                }
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
