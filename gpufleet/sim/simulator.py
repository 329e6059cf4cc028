"""Discrete-event replay of a workload trace through the unchanged engine.

Time advances from event to event (arrivals, completions). At every event time the engine gets
a snapshot of the simulated cluster and its decisions are applied: admitted work starts and ends
after its remaining duration; preempted work loses what it did since its last checkpoint and
waits again. Deterministic: the same fleet and trace give the same result.

The pools' nodes are simulated at full size (`maxGPUs / gpusPerNode` nodes each), so the
simulation answers "what would this configuration do with this demand", not "what does the
autoscaler do".
"""

from __future__ import annotations

import statistics
import time
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from gpufleet.engine import (
    Node,
    Reason,
    Snapshot,
    Workload,
    WorkloadClass,
    WorkloadState,
    decide,
)
from gpufleet.engine.snapshot import fleet_parts
from gpufleet.model.fleet import Fleet
from gpufleet.sim.trace import TraceJob

EPOCH = datetime(2026, 1, 1, tzinfo=UTC)
# waiting for these reasons is not a broken guarantee: the team asked for more than it reserved
NOT_GUARANTEED = (Reason.RESERVATION_EXHAUSTED, Reason.POLICY_LIMIT, Reason.NO_MATCHING_POOL)


@dataclass
class _Job:
    spec: TraceJob
    remaining: float  # seconds of work left
    submitted: float
    state: WorkloadState = WorkloadState.PENDING
    pool: str | None = None
    nodes: tuple[str, ...] = ()
    started: float | None = None  # current run segment
    first_start: float | None = None
    end: float | None = None
    finished: float | None = None
    preempted_at: float | None = None
    preempted_from: str | None = None
    preemptions: int = 0
    lost: float = 0.0  # GPU-seconds of work lost to preemption
    waited_unguaranteed: bool = False


@dataclass
class SimResult:
    makespan_s: float
    capacity_gpus: int
    allocated_gpu_s: float
    jobs: list[_Job] = field(default_factory=list)
    decide_cpu_s: float = 0.0
    decisions: int = 0

    @property
    def allocation_rate(self) -> float:
        """Time-averaged allocated GPUs / capacity."""
        if not self.makespan_s or not self.capacity_gpus:
            return 0.0
        return self.allocated_gpu_s / (self.makespan_s * self.capacity_gpus)

    def metrics(self, grace_period_s: float = 60) -> dict[str, Any]:
        delays: dict[str, list[float]] = defaultdict(list)
        jct: dict[str, list[float]] = defaultdict(list)
        for job in self.jobs:
            if job.first_start is None:
                continue
            key = f"{job.spec.team}/{job.spec.workload_class}"
            delays[key].append(job.first_start - job.submitted)
            if job.finished is not None:
                jct[key].append(job.finished - job.submitted)
        violations = sum(
            1
            for j in self.jobs
            if j.spec.workload_class == "reserved"
            and j.first_start is not None
            and j.first_start - j.submitted > grace_period_s
            and not j.waited_unguaranteed
        )
        days = self.makespan_s / 86400 or 1.0
        return {
            "jobs": len(self.jobs),
            "finished": sum(j.finished is not None for j in self.jobs),
            "allocation_rate": round(self.allocation_rate, 4),
            "queue_delay_s": {k: _percentiles(v) for k, v in sorted(delays.items())},
            "jct_s": {k: _percentiles(v) for k, v in sorted(jct.items())},
            "preemptions": sum(j.preemptions for j in self.jobs),
            "gpu_hours_lost": round(sum(j.lost for j in self.jobs) / 3600, 3),
            "reserved_guarantee_violations": violations,
            "engine_cpu_s_per_simulated_day": round(self.decide_cpu_s / days, 4),
            "decisions": self.decisions,
        }


def _percentiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)

    def at(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))], 1)

    return {
        "p50": at(50),
        "p95": at(95),
        "p99": at(99),
        "mean": round(statistics.fmean(ordered), 1),
    }


def cluster_nodes(fleet: Fleet) -> tuple[Node, ...]:
    nodes = []
    for name in sorted(fleet.pools):
        spec = fleet.pools[name].spec
        zone = spec.zones[0] if spec.zones else ""
        for i in range(spec.max_gpus // spec.gpus_per_node):
            nodes.append(Node(f"{name}-{i + 1}", name, spec.gpus_per_node, zone))
    return tuple(nodes)


def simulate(
    fleet: Fleet, trace: list[TraceJob], checkpoint_interval_s: float = 1800.0
) -> SimResult:
    nodes = cluster_nodes(fleet)
    capacity = sum(n.gpus for n in nodes)
    pools, teams, reservations, policy = fleet_parts(fleet, EPOCH)
    jobs = {t.name: _Job(t, t.duration_s, t.submit_s) for t in trace}
    arrivals = sorted(jobs.values(), key=lambda j: (j.submitted, j.spec.name))
    result = SimResult(0.0, capacity, 0.0, list(jobs.values()))
    now, next_arrival, allocated = 0.0, 0, 0.0
    running: dict[str, _Job] = {}
    waiting: dict[str, _Job] = {}
    while next_arrival < len(arrivals) or running or waiting:
        times = [j.end for j in running.values() if j.end is not None]
        if next_arrival < len(arrivals):
            times.append(arrivals[next_arrival].submitted)
        if not times:
            break  # only work that can never run is left (e.g. larger than any pool)
        event = max(min(times), now)
        result.allocated_gpu_s += allocated * (event - now)
        now = event
        for job in [j for j in running.values() if j.end is not None and j.end <= now]:
            job.finished = now
            del running[job.spec.name]
        while next_arrival < len(arrivals) and arrivals[next_arrival].submitted <= now:
            job = arrivals[next_arrival]
            waiting[job.spec.name] = job
            next_arrival += 1
        snapshot = Snapshot(
            EPOCH + timedelta(seconds=now),
            pools,
            teams,
            reservations,
            policy,
            nodes,
            tuple(_workload(j) for j in [*running.values(), *waiting.values()]),
        )
        started = time.process_time()
        decisions = decide(snapshot)
        result.decide_cpu_s += time.process_time() - started
        result.decisions += 1
        for preemption in decisions.preempted:
            job = running.pop(preemption.workload)
            assert job.started is not None
            ran = now - job.started
            done_safely = ran - ran % checkpoint_interval_s
            job.lost += (ran - done_safely) * job.spec.gpus * job.spec.pods
            job.remaining -= done_safely
            job.state, job.preempted_at, job.preempted_from = (
                WorkloadState.PREEMPTED,
                now,
                job.pool,
            )
            job.preemptions += 1
            job.end = None
            waiting[job.spec.name] = job
        for admission in decisions.admitted:
            job = waiting.pop(admission.workload)
            job.state, job.pool, job.nodes = WorkloadState.RUNNING, admission.pool, admission.nodes
            job.started, job.end = now, now + job.remaining
            if job.first_start is None:
                job.first_start = now
            running[job.spec.name] = job
        for pending in decisions.pending:
            if pending.reason in NOT_GUARANTEED:
                waiting[pending.workload].waited_unguaranteed = True
        allocated = sum(j.spec.gpus * j.spec.pods for j in running.values())
        if not running and next_arrival >= len(arrivals):
            break  # what still waits can never be placed
    result.makespan_s = now
    return result


def _workload(job: _Job) -> Workload:
    return Workload(
        name=job.spec.name,
        team=job.spec.team,
        workload_class=WorkloadClass(job.spec.workload_class),
        gpus=job.spec.gpus,
        pods=job.spec.pods,
        priority=job.spec.priority,
        state=job.state,
        submitted_at=EPOCH + timedelta(seconds=job.submitted),
        started_at=EPOCH + timedelta(seconds=job.started)
        if job.started is not None and job.state is WorkloadState.RUNNING
        else None,
        nodes=job.nodes if job.state is WorkloadState.RUNNING else (),
        expected_end=EPOCH + timedelta(seconds=job.end) if job.end is not None else None,
        preempted_at=EPOCH + timedelta(seconds=job.preempted_at)
        if job.preempted_at is not None
        else None,
        preempted_from=job.preempted_from,
    )
