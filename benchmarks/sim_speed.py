"""Simulator speed on every week of the Philly trace (issue 22).

    python benchmarks/sim_speed.py --trace ../shared/data/philly/philly.csv \\
        --teams ../shared/data/philly/philly_vc.csv --load 0.7,1.0,1.3 --workers 1

Prints one JSON object per line, one per week and load (the setup of `benchmarks/teams.py`,
policy gpufleet): simulated days, wall and CPU seconds, seconds per simulated day, events,
engine cycles (decisions) and the most jobs waiting at once; then a summary line with the
slowest and fastest runs and the ratio of the slowest to the fastest per simulated day (which
follows the week's demand: a week of 14,000 jobs has more to decide per day than one of 800)
and per engine cycle (runs of at least 1,000 cycles). Runs in separate processes
(`--workers`); with one worker per core each run has a core of its own.
"""

from __future__ import annotations

import json
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from guarantees import prepare_week, sweep

from gpufleet.sim.simulator import simulate

GOAL_S = 60.0
MIN_DECISIONS = 1000


def run_week(
    trace: Path, vc_nodes: dict[str, int], start: datetime, end: datetime, load: float
) -> dict[str, Any]:
    week = prepare_week(trace, vc_nodes, start, end, load)
    row, jobs, window_s, fleet = week.row, week.jobs, week.window_s, week.fleet
    if fleet is None:
        return row
    wall, cpu = time.perf_counter(), time.process_time()
    result = simulate(fleet, jobs, policy="gpufleet", horizon_s=window_s)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    days = result.makespan_s / 86400
    row.update(
        {
            "simulated_days": round(days, 2),
            "wall_s": round(wall, 1),
            "cpu_s": round(cpu, 1),
            "wall_s_per_simulated_day": round(wall / days, 2) if days else None,
            "ms_per_decision": round(1000 * wall / result.decisions, 2)
            if result.decisions
            else None,
            "events": result.events,
            "decisions": result.decisions,
            "peak_waiting": result.peak_waiting,
            "engine_s": round(result.decide_cpu_s, 1),
        }
    )
    return row


def main(argv: list[str] | None = None) -> int:
    rows = sweep(__doc__.split("\n\n")[0], run_week, argv)
    if isinstance(rows, int):
        return rows
    timed = [r for r in rows if r.get("wall_s_per_simulated_day") is not None]
    if timed:
        slowest = max(timed, key=lambda r: r["wall_s"])
        per_day = [r["wall_s_per_simulated_day"] for r in timed]
        # the cost of one engine cycle and its event, where there are enough to measure it
        per_decision = [r["ms_per_decision"] for r in timed if r["decisions"] >= MIN_DECISIONS]
        print(
            json.dumps(
                {
                    "summary": {
                        "runs": len(rows),
                        "slowest": {k: slowest[k] for k in ("week", "load", "wall_s")},
                        "fastest_per_day_s": min(per_day),
                        "slowest_per_day_s": max(per_day),
                        # per-day times under 10 ms are measurement noise
                        "slowest_to_fastest_per_day": round(
                            max(per_day) / max(min(per_day), 0.01), 2
                        ),
                        "slowest_to_fastest_per_decision": round(
                            max(per_decision) / min(per_decision), 2
                        )
                        if per_decision
                        else None,
                        "runs_over_goal": sum(r["wall_s"] > GOAL_S for r in timed),
                        "goal_s": GOAL_S,
                    }
                }
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
