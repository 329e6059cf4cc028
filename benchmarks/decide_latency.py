"""Engine decision latency on synthetic clusters. Prints JSON; not a timed test.

    python benchmarks/decide_latency.py            # the full grid (a few minutes)
    python benchmarks/decide_latency.py --quick    # smallest size of each scenario (CI smoke)

Scenarios, for each size (nodes of 8 GPUs, waiting workloads, teams):
- single-pod: an empty cluster; waiting work of 1, 2, 4 and 8 GPUs, half reserved.
- gangs: a half-used cluster; waiting work mixes single pods with 8-pod gangs of 8 GPUs.
- preemption: a cluster full of low-priority elastic work; waiting work is reserved or
  high-priority elastic, so most admissions need victims.

Per workload: the time of each admission attempt (all rules, placement, preemption search).
Per cycle: the whole `decide` call (snapshot indexing, every attempt, reasons and ETAs).
Peak memory is that of the decision cycle (not of building the input snapshot), measured in a
separate run under tracemalloc, which slows Python down.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import time
import tracemalloc
from datetime import UTC, datetime, timedelta
from typing import Any

from gpufleet.engine import (
    Node,
    Policy,
    PoolInfo,
    Snapshot,
    TeamInfo,
    Workload,
    WorkloadClass,
    WorkloadState,
)
from gpufleet.engine.scheduler import Cycle

T0 = datetime(2026, 1, 1, 12, tzinfo=UTC)
SIZES = [(1000, 100, 10), (5000, 1000, 100), (12000, 10000, 1000)]
SCENARIOS = ("single-pod", "gangs", "preemption")


class TimedCycle(Cycle):
    """The engine's cycle, timing every admission attempt."""

    def __post_init__(self) -> None:
        self.attempts: list[tuple[float, bool, bool]] = []  # seconds, admitted, preempted
        super().__post_init__()

    def _try(
        self,
        workload: Workload,
        preempt: bool,
        shares: dict[str, float] | None = None,
        conserving: bool = False,
    ) -> bool:
        victims_before = len(self.preempted)
        start = time.perf_counter()
        admitted = super()._try(workload, preempt, shares, conserving)
        self.attempts.append(
            (time.perf_counter() - start, admitted, len(self.preempted) > victims_before)
        )
        return admitted


def build(scenario: str, nodes: int, waiting: int, teams: int, seed: int = 7) -> Snapshot:
    rng = random.Random(seed)
    zones = ["zone-a", "zone-b", "zone-c"]
    node_list = [Node(f"gpu-{i}", "h100", 8, zone=zones[i % 3]) for i in range(nodes)]
    team_names = [f"team-{t}" for t in range(teams)]
    team_info = {name: TeamInfo(name, None, 1 + t % 5, None) for t, name in enumerate(team_names)}
    # half the pool reserved, spread evenly over the teams
    per_team = max(nodes * 8 // 2 // teams, 1)
    reservations = {(name, "h100"): per_team for name in team_names}
    workloads: list[Workload] = []
    if scenario in ("gangs", "preemption"):
        used = nodes if scenario == "preemption" else nodes // 2
        for i in range(used):
            workloads.append(
                Workload(
                    f"run-{i}",
                    team_names[i % teams],
                    WorkloadClass.ELASTIC,
                    8,
                    T0 - timedelta(hours=3),
                    priority=10,
                    state=WorkloadState.RUNNING,
                    started_at=T0 - timedelta(hours=2),
                    nodes=(f"gpu-{i}",),
                    expected_end=T0 + timedelta(minutes=rng.randint(1, 600)),
                )
            )
    for i in range(waiting):
        team = team_names[rng.randrange(teams)]
        if scenario == "gangs" and i % 4 == 0:
            gpus, pods = 8, 8
        else:
            gpus, pods = rng.choice([1, 2, 4, 8]), 1
        reserved = rng.random() < 0.5
        workloads.append(
            Workload(
                f"wait-{i}",
                team,
                WorkloadClass.RESERVED if reserved else WorkloadClass.ELASTIC,
                gpus,
                T0 - timedelta(seconds=i),
                pods=pods,
                priority=75 if scenario == "preemption" else 50,
            )
        )
    pool = PoolInfo("h100", "H100", 8, nodes * 8, autoscaling=False)
    return Snapshot(
        T0, {"h100": pool}, team_info, reservations, Policy(), tuple(node_list), tuple(workloads)
    )


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def ms(value: float | None) -> float | None:
    return None if value is None else round(value * 1000, 3)


def measure(scenario: str, nodes: int, waiting: int, teams: int) -> dict[str, Any]:
    snapshot = build(scenario, nodes, waiting, teams)
    start = time.perf_counter()
    cycle = TimedCycle(snapshot)
    decisions = cycle.run()
    full = time.perf_counter() - start
    tracemalloc.start()
    Cycle(snapshot).run()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    admitted = [t for t, ok, _ in cycle.attempts if ok]
    with_victims = [t for t, ok, victims in cycle.attempts if ok and victims]
    return {
        "scenario": scenario,
        "nodes": nodes,
        "gpus": nodes * 8,
        "waiting": waiting,
        "teams": teams,
        "admitted": len(decisions.admitted),
        "preempted": len(decisions.preempted),
        "still_waiting": len(decisions.pending),
        "full_cycle_s": round(full, 3),
        "per_attempt_ms": {
            "p50": ms(percentile([t for t, _, _ in cycle.attempts], 50)),
            "p99": ms(percentile([t for t, _, _ in cycle.attempts], 99)),
        },
        "per_admitted_ms": {
            "p50": ms(percentile(admitted, 50)),
            "p99": ms(percentile(admitted, 99)),
        },
        "per_admitted_with_preemption_ms": {
            "p50": ms(percentile(with_victims, 50)),
            "p99": ms(percentile(with_victims, 99)),
            "count": len(with_victims),
        },
        "peak_memory_mib": round(peak / 2**20, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="only the smallest size")
    args = parser.parse_args()
    sizes = SIZES[:1] if args.quick else SIZES
    results = []
    for nodes, waiting, teams in sizes:
        for scenario in SCENARIOS:
            print(f"{scenario}: {nodes} nodes, {waiting} waiting, {teams} teams", file=sys.stderr)
            results.append(measure(scenario, nodes, waiting, teams))
    print(
        json.dumps(
            {
                "machine": {
                    "cpus": os.cpu_count(),
                    "python": platform.python_version(),
                    "processor": platform.processor() or platform.machine(),
                },
                "targets": {
                    "nodes": 5000,
                    "waiting": 1000,
                    "full_cycle_s": 1.0,
                    "per_admitted_p99_ms": 10,
                    "with_preemption_p99_ms": 100,
                },
                "results": results,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
