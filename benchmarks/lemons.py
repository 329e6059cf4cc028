"""Lemon-node avoidance in the simulator: GPU-hours lost to node failures with and without it.

    python benchmarks/lemons.py --trace ../shared/data/philly/philly.csv \\
        --teams ../shared/data/philly/philly_vc.csv --load 1.0 --weeks 2017-09-25,2017-10-30

Each week of the Philly trace (the setup of `benchmarks/teams.py`, policy gpufleet) is replayed
with node failures (gpufleet/sim/failures.py: every node fails now and then, 5 % of them, the
lemons, 40 times as often; a failed node is out for 6 hours) twice per seed (`--seeds N`,
default 5): once with the engine seeing each node's fault history (critical work, reserved and
gangs, avoids lemons) and once without. The failures are the same in both runs. Prints one
JSON line per week and load, then a summary over all of them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from guarantees import prepare_week, sweep

from gpufleet.sim.failures import Failures
from gpufleet.sim.simulator import simulate

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


def main(argv: list[str] | None = None) -> int:
    extra = argparse.ArgumentParser(add_help=False)
    extra.add_argument("--seeds", type=int, default=5, help="failure seeds per week (1..N)")
    known, rest = extra.parse_known_args(argv)
    os.environ[SEEDS_ENV] = str(max(known.seeds, 1))
    rows = sweep(__doc__.split("\n\n")[0] + " (also: --seeds N, default 5)", run_week, rest)
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
