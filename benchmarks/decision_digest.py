"""Digests of the engine's decisions, to show that a change of code changed no decision.

    python benchmarks/decision_digest.py --trace ../shared/data/philly/philly.csv \\
        --teams ../shared/data/philly/philly_vc.csv
    python benchmarks/decision_digest.py --snapshots 500          # random snapshots only

Prints one JSON object: a SHA-256 of every job's history (first start, end, preemptions, pool)
in each simulated Philly window and load (the setup of `teams.py`), and one of the decisions
on `--snapshots` random snapshots (seeded: pending, preempted, queued and running work,
reserved and elastic, gangs, two pools, a team tree with burst limits, unhealthy and cordoned
nodes). Run it before and after a change (`git stash`, or a worktree of the old commit on
PYTHONPATH) and compare: equal digests mean equal decisions. Not a timed test.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from teams import build_fleet, nodes_for_load, read_teams

from gpufleet.engine import (
    Node,
    Policy,
    PoolInfo,
    Snapshot,
    TeamInfo,
    Workload,
    WorkloadClass,
    WorkloadState,
    decide,
)
from gpufleet.sim.simulator import simulate
from gpufleet.sim.trace import read_philly

T0 = datetime(2026, 1, 1, 12, tzinfo=UTC)
# two-day windows of the Philly trace, spread over its months
WINDOWS = (("2017-10-02", "2017-10-04"), ("2017-11-06", "2017-11-08"), ("2017-12-04", "2017-12-06"))
LOADS = (0.7, 1.0, 1.3)
# the states a workload has while the engine decides about it (waiting or admitted)
STATES = [
    WorkloadState.PENDING,
    WorkloadState.PREEMPTED,
    WorkloadState.QUEUED,
    WorkloadState.STARTING,
    WorkloadState.RUNNING,
]


def _sha(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()


def philly_digests(
    trace: Path, teams: Path, loads: tuple[float, ...], policies: tuple[str, ...]
) -> dict[str, str]:
    vc_nodes = read_teams(teams)
    digests: dict[str, str] = {}
    for start, end in WINDOWS:
        begin = datetime.fromisoformat(start).replace(tzinfo=UTC)
        finish = datetime.fromisoformat(end).replace(tzinfo=UTC)
        jobs, _ = read_philly(trace, begin, finish)
        window_s = (finish - begin).total_seconds()
        for load, policy in ((load, policy) for load in loads for policy in policies):
            fleet = build_fleet(nodes_for_load(jobs, window_s, load), vc_nodes)
            result = simulate(fleet, jobs, 1800.0, policy=policy, horizon_s=window_s)
            history = sorted(
                (
                    j.spec.name,
                    j.first_start,
                    j.finished,
                    j.preemptions,
                    j.pool,
                    j.workload_class,
                    round(j.lost, 3),
                )
                for j in result.jobs
            )
            name = f"{start}+{load}" + ("" if policy == "gpufleet" else f"+{policy}")
            digests[name] = _sha([history, round(result.allocation_rate, 9)])
    return digests


def random_snapshot(rng: random.Random) -> Snapshot:
    pools = {
        "h100": PoolInfo("h100", "H100", 8, 8 * rng.randint(2, 6), autoscaling=rng.random() < 0.3),
        "a100": PoolInfo("a100", "A100", 4, 4 * rng.randint(2, 6), autoscaling=False),
    }
    teams = {
        "org": TeamInfo("org", None, 1, None),
        "nlp": TeamInfo("nlp", "org", rng.randint(1, 3), rng.choice([None, "50%", "0"])),
        "vision": TeamInfo("vision", "org", rng.randint(1, 3), rng.choice([None, "100%"])),
        "infra": TeamInfo("infra", None, rng.randint(1, 5), None),
    }
    reservations = {
        (team, pool): rng.choice([0, 4, 8, 16])
        for team in ("nlp", "vision", "infra")
        for pool in pools
        if rng.random() < 0.6
    }
    nodes: list[Node] = []
    for pool in pools.values():
        for i in range(pool.max_gpus // pool.gpus_per_node):
            nodes.append(
                Node(
                    f"{pool.name}-{i}",
                    pool.name,
                    pool.gpus_per_node,
                    zone=rng.choice(["a", "b"]),
                    healthy=rng.random() > 0.05,
                    schedulable=rng.random() > 0.05,
                )
            )
    free = {n.name: n.gpus for n in nodes if n.healthy}
    workloads: list[Workload] = []
    for i in range(rng.randint(5, 40)):
        pool = rng.choice(list(pools.values()))
        pods = rng.choice([1, 1, 1, 2])
        gpus = rng.choice([1, 2, pool.gpus_per_node]) if pods == 1 else pool.gpus_per_node
        submitted = T0 - timedelta(minutes=rng.randint(1, 600))
        fields: dict[str, Any] = {
            "pods": pods,
            "priority": rng.choice([10, 25, 50, 75, 90]),
            "pool": pool.name if rng.random() < 0.7 else None,
        }
        state = rng.choice(STATES)
        if state in (WorkloadState.QUEUED, WorkloadState.STARTING, WorkloadState.RUNNING):
            fits = [n for n in nodes if n.pool == pool.name and free.get(n.name, 0) >= gpus]
            if len(fits) < pods:
                state = WorkloadState.PENDING
            else:
                chosen = rng.sample(fits, pods)
                for node in chosen:
                    free[node.name] -= gpus
                fields.update(
                    nodes=tuple(n.name for n in chosen),
                    pool=pool.name,
                    started_at=T0 - timedelta(minutes=rng.randint(0, 60)),
                    expected_end=T0 + timedelta(minutes=rng.randint(1, 300)),
                )
        if state is WorkloadState.PREEMPTED:
            fields.update(
                preempted_at=T0 - timedelta(minutes=rng.randint(0, 20)),
                preempted_from=pool.name,
                preempted_by="someone",
            )
        workloads.append(
            Workload(
                f"w{i}",
                rng.choice(["nlp", "vision", "infra"]),
                rng.choice(list(WorkloadClass)),
                gpus,
                submitted,
                state=state,
                **fields,
            )
        )
    policy = Policy(max_priority={"infra": 50} if rng.random() < 0.3 else {})
    return Snapshot(T0, pools, teams, reservations, policy, tuple(nodes), tuple(workloads))


def snapshot_digest(count: int, seed: int) -> tuple[str, int]:
    rng = random.Random(seed)
    decisions = []
    errors = 0
    for _ in range(count):
        try:
            decisions.append(decide(random_snapshot(rng)).to_dict())
        except ValueError as err:  # an impossible snapshot is refused: the refusal is a decision
            errors += 1
            decisions.append({"refused": str(err)})
    return _sha(decisions), errors


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", type=Path, help="Philly trace (philly.csv)")
    parser.add_argument("--teams", type=Path, help="Philly virtual clusters (philly_vc.csv)")
    parser.add_argument("--load", default=",".join(map(str, LOADS)), help="offered loads")
    parser.add_argument(
        "--policies", default="gpufleet", help="simulator policies, e.g. gpufleet,fifo"
    )
    parser.add_argument("--snapshots", type=int, default=1000, help="random snapshots to decide")
    parser.add_argument("--seed", type=int, default=41)
    args = parser.parse_args(argv)
    started = time.process_time()
    out: dict[str, Any] = {}
    if args.trace and args.teams:
        loads = tuple(float(x) for x in args.load.split(","))
        policies = tuple(args.policies.split(","))
        out["philly"] = philly_digests(args.trace, args.teams, loads, policies)
    digest, refused = snapshot_digest(args.snapshots, args.seed)
    out["snapshots"] = {"count": args.snapshots, "refused": refused, "digest": digest}
    out["cpu_s"] = round(time.process_time() - started, 1)
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
