"""Discrete-event replay of a workload trace through the unchanged engine.

Time advances from event to event (arrivals, completions). At every event time the engine gets
a snapshot of the simulated cluster and its decisions are applied: admitted work starts and ends
after its remaining duration; preempted work loses what it did since its last checkpoint and
waits again. Deterministic: the same fleet and trace give the same result.

The pools' nodes are simulated at full size (`maxGPUs / gpusPerNode` nodes each), so the
simulation answers "what would this configuration do with this demand", not "what does the
autoscaler do".

Policies (all run through the same engine, on the same nodes):
- `gpufleet`: the fleet as declared. Jobs of class `auto` are reserved while their team's
  reserved work fits its reservations, elastic (borrowing, preemptible) beyond.
- `static-partition`: every job is reserved work, so each team runs only on what it reserved
  and never borrows (quota without borrowing; the "private cluster" reference).
- `fifo`: one shared queue: no reservations, every job elastic at one priority, admitted in
  submission order with backfill.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
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
from gpufleet.engine.backlog import Backlog
from gpufleet.engine.placed import Placed
from gpufleet.engine.snapshot import fleet_parts
from gpufleet.lifecycle import Transition, pool_price
from gpufleet.model.fleet import Fleet
from gpufleet.sim.failures import SPOT, Failures, FailureSchedule
from gpufleet.sim.policies import SimPolicy, policy_named
from gpufleet.sim.provisioning import Provisioner
from gpufleet.sim.recorder import Recorder
from gpufleet.sim.trace import TraceJob

EPOCH = datetime(2026, 1, 1, tzinfo=UTC)
# waiting for these reasons is not a broken guarantee: the team asked for more than it reserved
NOT_GUARANTEED = (Reason.RESERVATION_EXHAUSTED, Reason.POLICY_LIMIT, Reason.NO_MATCHING_POOL)
# waiting that a declared guard chose: not counted as idle capacity with demand
HELD_BY_POLICY = (Reason.BACK_OFF, Reason.BURST_LIMIT, Reason.POLICY_LIMIT)
MAX_TIMELINE_POINTS = 400


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
    preempted_by: str | None = None
    preemptions: int = 0
    lost: float = 0.0  # GPU-seconds of work lost to preemption
    lost_to_failures: float = 0.0  # GPU-seconds of work lost when a node it ran on failed
    failures: int = 0  # times a node it ran on failed
    lost_to_spot: float = 0.0  # GPU-seconds of work lost when its spot node was taken back
    spot_interruptions: int = 0  # times its spot node was taken back
    waited_unguaranteed: bool = False
    reclaimed: bool = False  # reserved work whose admission preempted borrowers
    preempted_since: float | None = None  # waiting after a preemption since (not a failure)
    resume_waits: list[float] = field(default_factory=list)  # preemption to restart, seconds
    workload_class: str = ""  # as admitted: reserved or elastic (`auto` resolved on arrival)
    as_workload: Workload | None = None  # the engine's view, rebuilt when the state changes

    total_gpus: float = field(init=False)  # read for every job at every event
    size_order: tuple[float, str] = field(init=False)  # smallest first, by name

    def __post_init__(self) -> None:
        self.total_gpus = self.spec.gpus * self.spec.pods
        self.size_order = (self.total_gpus, self.spec.name)

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def team(self) -> str:
        return self.spec.team


@dataclass
class SimResult:
    makespan_s: float
    capacity_gpus: int
    allocated_gpu_s: float
    jobs: list[_Job] = field(default_factory=list)
    decide_cpu_s: float = 0.0
    decisions: int = 0
    events: int = 0  # distinct event times (arrivals, completions)
    peak_waiting: int = 0
    policy: str = "gpufleet"
    reserved_by_team: dict[str, int] = field(default_factory=dict)
    team_gpu_s: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    pool_gpu_s: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    pool_capacity: dict[str, int] = field(default_factory=dict)
    pool_cluster: dict[str, str] = field(default_factory=dict)  # where pools name a cluster
    pool_in_horizon_gpu_s: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    prices: dict[str, float | None] = field(default_factory=dict)
    idle_with_demand_gpu_s: float = 0.0
    idle_held_gpu_s: float = 0.0
    fairness_gap_gpu_s: float = 0.0  # integral of sum over teams |allocated - entitled|
    borrowed_gpu_s: float = 0.0  # integral of sum over teams of GPUs beyond their reservations
    timeline: list[dict[str, Any]] = field(default_factory=list)
    horizon_s: float | None = None  # measure the allocation rate over [0, horizon] only
    allocated_in_horizon_gpu_s: float = 0.0
    node_failures: int | None = None  # None: the run had no failures model
    spot_interruptions: int = 0
    reservations_expired: list[dict[str, Any]] = field(default_factory=list)
    provisioning: dict[str, Any] | None = None  # with a provisioning delay: autoscaling figures
    autoscaled_gpu_s: dict[str, float] = field(default_factory=dict)  # per autoscaled pool

    @property
    def allocation_rate(self) -> float:
        """Time-averaged allocated GPUs / capacity."""
        if self.horizon_s:
            return self.allocated_in_horizon_gpu_s / (self.horizon_s * self.capacity_gpus)
        if not self.makespan_s or not self.capacity_gpus:
            return 0.0
        return self.allocated_gpu_s / (self.makespan_s * self.capacity_gpus)

    def metrics(self, grace_period_s: float = 60) -> dict[str, Any]:
        delays: dict[str, list[float]] = defaultdict(list)
        jct: dict[str, list[float]] = defaultdict(list)
        for job in self.jobs:
            if job.first_start is None:
                continue
            key = f"{job.spec.team}/{job.workload_class}"
            delays[key].append(job.first_start - job.submitted)
            if job.finished is not None:
                jct[key].append(job.finished - job.submitted)
        violations = len(self.guarantee_violations(grace_period_s))
        days = self.makespan_s / 86400 or 1.0
        span = self.makespan_s or 1.0
        return {
            "policy": self.policy,
            "jobs": len(self.jobs),
            "finished": sum(j.finished is not None for j in self.jobs),
            "never_started": sum(j.first_start is None for j in self.jobs),
            "capacity_gpus": self.capacity_gpus,
            "makespan_s": round(self.makespan_s, 1),
            "allocation_rate": round(self.allocation_rate, 4),
            "idle_gpu_hours_with_demand": round(self.idle_with_demand_gpu_s / 3600, 3),
            "idle_gpu_hours_held_by_policy": round(self.idle_held_gpu_s / 3600, 3),
            "queue_delay_s": {k: _percentiles(v) for k, v in sorted(delays.items())},
            "jct_s": {k: _percentiles(v) for k, v in sorted(jct.items())},
            "teams": self._team_metrics(span),
            **({"clusters": self._cluster_metrics()} if self.pool_cluster else {}),
            "preemptions": sum(j.preemptions for j in self.jobs),
            "gpu_hours_lost": round(sum(j.lost for j in self.jobs) / 3600, 3),
            "lending": self._lending_metrics(),
            "reservations_expired": list(self.reservations_expired),
            **({"provisioning": self.provisioning} if self.provisioning is not None else {}),
            **self._failure_metrics(),
            "reserved_guarantee_violations": violations,
            "fairness_deviation": round(
                self.fairness_gap_gpu_s / (span * self.capacity_gpus or 1), 4
            ),
            "cost_usd": self._cost(),
            "engine_cpu_s_per_simulated_day": round(self.decide_cpu_s / days, 4),
            "decisions": self.decisions,
            "events": self.events,
            "peak_waiting": self.peak_waiting,
        }

    def _lending_metrics(self) -> dict[str, Any]:
        """Idle reserved GPUs lent to other teams' work, taken back when the owner needed them
        (reclaim), and the preempted work started again (resume)."""
        reclaims = [
            j.first_start - j.submitted
            for j in self.jobs
            if j.reclaimed and j.first_start is not None
        ]
        preempted = [j for j in self.jobs if j.preemptions]
        resumes = [w for j in self.jobs for w in j.resume_waits]
        return {
            "borrowed_gpu_hours": round(self.borrowed_gpu_s / 3600, 3),
            "reclaims": len(reclaims),
            "reclaim_wait_s": _percentiles(reclaims) if reclaims else None,
            "preempted_jobs": len(preempted),
            "preempted_jobs_resumed": sum(j.preempted_since is None for j in preempted),
            "resume_wait_s": _percentiles(resumes) if resumes else None,
        }

    def _failure_metrics(self) -> dict[str, Any]:
        if self.node_failures is None:
            return {}
        hit = [j for j in self.jobs if j.failures]
        to_failures = round(sum(j.lost_to_failures for j in self.jobs) / 3600, 3)
        to_spot = round(sum(j.lost_to_spot for j in self.jobs) / 3600, 3)
        return {
            "node_failures": self.node_failures,
            "jobs_hit_by_failures": len(hit),
            "gangs_hit_by_failures": sum(j.spec.pods > 1 for j in hit),
            "gpu_hours_lost_to_failures": to_failures,
            "spot_interruptions": self.spot_interruptions,
            "jobs_hit_by_spot_interruptions": sum(1 for j in self.jobs if j.spot_interruptions),
            "gpu_hours_lost_to_spot_interruptions": to_spot,
            "gpu_hours_lost_by_cause": {
                "preemption": round(sum(j.lost for j in self.jobs) / 3600, 3),
                "node_failure": to_failures,
                "spot_interruption": to_spot,
            },
        }

    def guarantee_violations(self, grace_period_s: float = 60) -> list[_Job]:
        """Reserved jobs whose guarantee was broken (docs/simulate.md): jobs admitted as reserved
        work that started more than `grace_period_s` after submission, or never, although the
        engine never said they waited for a reason outside the guarantee (their team's
        reservation already taken by its own reserved work, an admission limit, no such pool)."""
        return [
            j
            for j in self.jobs
            if j.workload_class == "reserved"
            and not j.waited_unguaranteed
            and (j.first_start if j.first_start is not None else self.makespan_s) - j.submitted
            > grace_period_s
        ]

    def delays_by_job(self) -> dict[str, float]:
        return {
            j.spec.name: j.first_start - j.submitted for j in self.jobs if j.first_start is not None
        }

    def _team_metrics(self, span: float) -> dict[str, dict[str, Any]]:
        out = {}
        for team in sorted({j.spec.team for j in self.jobs}):
            started = [
                j.first_start - j.submitted
                for j in self.jobs
                if j.spec.team == team and j.first_start is not None
            ]
            out[team] = {
                "reserved_gpus": self.reserved_by_team.get(team, 0),
                "mean_allocated_gpus": round(self.team_gpu_s.get(team, 0.0) / span, 2),
                "mean_queue_delay_s": round(statistics.fmean(started), 1) if started else None,
            }
        return out

    def _cluster_metrics(self) -> dict[str, dict[str, Any]]:
        """Each cluster's part of a fleet's run: its pools' GPUs (allocated over the window
        `allocation_rate` measures) and the jobs that ran there (where each last ran). The
        fleet is one engine over every cluster's pools, as the hub sends each job to the
        cluster that admits it soonest."""
        window, gpu_s = self.makespan_s or 1.0, self.pool_gpu_s
        if self.horizon_s:
            window, gpu_s = self.horizon_s, self.pool_in_horizon_gpu_s
        out = {}
        for cluster in sorted(set(self.pool_cluster.values())):
            pools = sorted(p for p, c in self.pool_cluster.items() if c == cluster)
            capacity = sum(self.pool_capacity.get(p, 0) for p in pools)
            allocated = sum(gpu_s.get(p, 0.0) for p in pools) / window
            ran = [j for j in self.jobs if j.pool in pools and j.first_start is not None]
            delays = [j.first_start - j.submitted for j in ran if j.first_start is not None]
            out[cluster] = {
                "pools": pools,
                "capacity_gpus": capacity,
                "mean_allocated_gpus": round(allocated, 2),
                "allocation": round(allocated / capacity, 4) if capacity else None,
                "jobs_started": len(ran),
                "mean_queue_delay_s": round(statistics.fmean(delays), 1) if delays else None,
                "preemptions": sum(j.preemptions for j in ran),
            }
        return out

    def _cost(self) -> dict[str, float] | None:
        if not self.prices or any(self.prices.get(p) is None for p in self.pool_capacity):
            return None
        hours = self.makespan_s / 3600
        # a pool that autoscales costs the GPU-hours of the nodes it had, a fixed one all of them
        gpu_hours = {
            p: self.autoscaled_gpu_s[p] / 3600 if p in self.autoscaled_gpu_s else n * hours
            for p, n in self.pool_capacity.items()
        }
        capacity = sum(gpu_hours[p] * (self.prices[p] or 0.0) for p in self.pool_capacity)
        used = sum(
            self.pool_gpu_s.get(p, 0.0) / 3600 * (self.prices[p] or 0.0) for p in self.pool_capacity
        )
        return {
            "capacity": round(capacity, 2),
            "allocated": round(used, 2),
            "idle": round(capacity - used, 2),
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


def spot_pools(fleet: Fleet) -> frozenset[str]:
    """Pools that prefer spot capacity (spot first among their capacity types): their nodes
    are the ones a cloud may take back."""
    return frozenset(
        name
        for name, pool in fleet.pools.items()
        if pool.spec.capacity_types and pool.spec.capacity_types[0] == "spot"
    )


def cluster_nodes(fleet: Fleet, block_nodes: int | None = None) -> tuple[Node, ...]:
    """Every pool at its full size; with `block_nodes`, its nodes in network blocks of that
    many (`{pool}-b1`, `{pool}-b2`, ... in node order)."""
    nodes = []
    for name in sorted(fleet.pools):
        spec = fleet.pools[name].spec
        zone = spec.zones[0] if spec.zones else ""
        for i in range(spec.max_gpus // spec.gpus_per_node):
            block = f"{name}-b{i // block_nodes + 1}" if block_nodes else ""
            nodes.append(Node(f"{name}-{i + 1}", name, spec.gpus_per_node, zone, block=block))
    return tuple(nodes)


def simulate(
    fleet: Fleet,
    trace: list[TraceJob],
    checkpoint_interval_s: float = 1800.0,
    policy: str | SimPolicy = "gpufleet",
    progress: Callable[[int, int], None] | None = None,
    horizon_s: float | None = None,
    failures: Failures | None = None,
    start: datetime = EPOCH,
    provisioning_delay_s: float | None = None,
    recorder: Recorder | None = None,
    block_nodes: int | None = None,
) -> SimResult:
    """Replay `trace` under `policy`; `progress(done, total)` is called as jobs finish. With
    `horizon_s`, the allocation rate is measured over [0, horizon_s] (a trace window) instead
    of the whole run including its drain. With `failures`, nodes fail (failures.py): the work
    on a failed node loses what it did since its last checkpoint and waits again. The trace
    starts at `start`: a reservation whose expiresAt falls in the run stops guaranteeing GPUs
    then (work admitted on it runs on; the team's new work is elastic). With
    `provisioning_delay_s`, autoscaled pools start empty and grow and shrink with the work
    (provisioning.py); otherwise every pool runs at its full size. A `recorder` receives the
    run's lifecycle events, pool capacity and reservations, for the usage ledger. With
    `block_nodes`, each pool's nodes form network blocks of that many nodes, which the engine
    places each gang inside where one has room."""
    rules = policy_named(policy) if isinstance(policy, str) else policy
    nodes = cluster_nodes(fleet, block_nodes)
    capacity = sum(n.gpus for n in nodes)
    pools, teams, reservations, engine_policy = fleet_parts(fleet, start)
    reserved_by_team = _by_team(reservations)
    expiries = _expiries(fleet, start)
    weights = {name: t.weight for name, t in teams.items()}  # the real teams, for fairness
    pool_types = {name: p.spec.gpu_type for name, p in fleet.pools.items()}
    teams, reservations, expiries = rules.fleet(teams, reservations, expiries)
    jobs = {t.name: _Job(t, t.duration_s, t.submit_s) for t in trace}
    arrivals = sorted(jobs.values(), key=lambda j: (j.submitted, j.spec.name))
    result = SimResult(0.0, capacity, 0.0, list(jobs.values()), policy=rules.name)
    result.reserved_by_team = dict(reserved_by_team)  # at the start
    result.horizon_s = horizon_s
    result.pool_capacity = {
        name: sum(n.gpus for n in nodes if n.pool == name) for name in sorted(pools)
    }
    result.prices = {name: pool_price(fleet, name) for name in pools}
    result.pool_cluster = {
        name: pool.spec.cluster for name, pool in fleet.pools.items() if pool.spec.cluster
    }
    schedule = (
        FailureSchedule(failures, nodes, EPOCH, spot_pools(fleet)) if failures is not None else None
    )
    if schedule is not None:
        result.node_failures = result.spot_interruptions = 0
    engine_nodes = nodes
    provisioner = None
    if provisioning_delay_s is not None:
        if failures is not None:
            raise ValueError("node failures and provisioning cannot be simulated together yet")
        provisioner = Provisioner(fleet, nodes, provisioning_delay_s)
        engine_nodes = provisioner.current
    now, next_arrival, finished = 0.0, 0, 0
    recorded_nodes = engine_nodes
    if recorder is not None:
        recorder.reservations_at(0.0)
        recorder.nodes(engine_nodes, 0.0)
    running = _Running()
    waiting = _Waiting(Backlog(engine_policy), rules)
    placed = Placed()  # the placements each cycle leaves, for the next
    reserved_demand: dict[str, float] = defaultdict(float)  # reserved work running or waiting
    rates = _Rates(reserved=reserved_by_team)
    preemptions = 0
    while next_arrival < len(arrivals) or running or waiting:
        first_end = running.next_end()
        times = [] if first_end is None else [first_end]
        if next_arrival < len(arrivals):
            times.append(arrivals[next_arrival].submitted)
        if not times and not waiting:
            break
        if schedule is not None and (times or waiting):
            # failures and repairs matter only while work remains (a repair may free a node
            # that waiting work needs)
            upcoming = schedule.next_time(now)
            if upcoming is not None:
                times.append(upcoming)
        if expiries and (times or waiting):
            times.append(expiries[0][0])  # an expiry may change what waiting work can do
        if provisioner is not None and (times or waiting):
            removal = provisioner.next_removal()
            if removal is not None:
                times.append(removal)
        if not times:
            break  # only work that can never run is left (e.g. larger than any pool)
        event = max(min(times), now)
        rates.accumulate(result, now, event)
        now = event
        if expiries and expiries[0][0] <= now:
            while expiries and expiries[0][0] <= now:
                at, name = expiries.pop(0)
                result.reservations_expired.append({"reservation": name, "at_s": round(at, 1)})
            if recorder is not None:
                recorder.reservations_at(now)
            reservations = fleet_parts(fleet, start + timedelta(seconds=now))[2]
            reserved_by_team = _by_team(reservations)
        for job in running.ended_by(now):
            job.finished = now
            running.pop(job.spec.name)
            if recorder is not None:
                recorder.event(Transition.COMPLETED, job, now)
            if job.workload_class == "reserved":
                reserved_demand[job.spec.team] -= job.total_gpus
            finished += 1
        while next_arrival < len(arrivals) and arrivals[next_arrival].submitted <= now:
            job = arrivals[next_arrival]
            job.workload_class = rules.class_on_arrival(
                job.spec.workload_class,
                job.spec.team,
                job.total_gpus,
                reserved_demand,
                reserved_by_team,
            )
            if job.workload_class == "reserved":
                reserved_demand[job.spec.team] += job.total_gpus
            waiting.add(job)
            next_arrival += 1
        if schedule is not None:
            for name, cause in schedule.fail_due(now):
                assert result.node_failures is not None
                if cause == SPOT:
                    result.spot_interruptions += 1
                else:
                    result.node_failures += 1
                for job in [j for j in running.values() if name in j.nodes]:
                    running.pop(job.spec.name)
                    # no back-off (no preempted_from): nothing took its GPUs
                    lost = _requeue(job, now, checkpoint_interval_s, None, None)
                    if recorder is not None:
                        why = "SpotInterruption" if cause == SPOT else "NodeFailure"
                        recorder.event(Transition.PREEMPTED, job, now, why, None, lost)
                    if cause == SPOT:
                        job.lost_to_spot += lost
                        job.spot_interruptions += 1
                    else:
                        job.lost_to_failures += lost
                        job.failures += 1
                    waiting.add(job)
            engine_nodes = schedule.nodes(now)
        held: set[str] = set()
        # with nothing waiting the engine has nothing to decide (it admits and preempts only
        # for waiting work); a second cycle runs at once when auto jobs turned elastic or nodes
        # were provisioned
        for _attempt in range(2 if waiting else 0):
            snapshot = Snapshot(
                EPOCH + timedelta(seconds=now),
                pools,
                teams,
                reservations,
                engine_policy,
                engine_nodes,
                tuple([j.as_workload or _workload(j, rules) for j in running.values()]),
            )
            # perf_counter, not process_time: reading the CPU clock costs more than a small
            # cycle on some virtual machines, and a cycle is CPU-bound either way
            started = time.perf_counter()
            decisions = decide(
                snapshot, with_etas=False, explain=False, backlog=waiting.backlog, placed=placed
            )
            result.decide_cpu_s += time.perf_counter() - started
            result.decisions += 1
            # read before the backlog changes
            unguaranteed = decisions.waiting_for(NOT_GUARANTEED)
            held_back = decisions.waiting_for(HELD_BY_POLICY)
            exhausted = set(decisions.waiting_for((Reason.RESERVATION_EXHAUSTED,)))
            for preemption in decisions.preempted:
                job = running.pop(preemption.workload)
                by = preemption.by or None
                lost = _requeue(job, now, checkpoint_interval_s, job.pool, by)
                job.lost += lost
                if recorder is not None:
                    reason = str(preemption.reason)
                    recorder.event(Transition.PREEMPTED, job, now, reason, by, lost)
                job.preemptions += 1
                job.preempted_since = now
                preemptions += 1
                if by is not None and jobs[by].workload_class == "reserved":
                    jobs[by].reclaimed = True
                waiting.add(job)
            new_nodes: dict[str, str] = {}  # this cycle's nodes to provision, as provisioned
            for admission in decisions.admitted:
                job = waiting.pop(admission.workload)
                on_nodes, begins = admission.nodes, now
                if provisioner is not None:
                    on_nodes, begins = provisioner.place(on_nodes, new_nodes, job.spec.gpus, now)
                    engine_nodes = provisioner.current
                job.state, job.pool, job.nodes = WorkloadState.RUNNING, admission.pool, on_nodes
                job.started, job.end = begins, begins + job.remaining
                job.as_workload = None
                if recorder is not None:
                    again = job.first_start is not None
                    recorder.event(Transition.RESUMED if again else Transition.ADMITTED, job, now)
                if job.first_start is None:
                    job.first_start = now
                if job.preempted_since is not None:
                    job.resume_waits.append(now - job.preempted_since)
                    job.preempted_since = None
                running.add(job)
            # held back on purpose: just preempted or backing off (R6), or over a declared limit
            held |= {p.workload for p in decisions.preempted}
            held -= {a.workload for a in decisions.admitted}
            held.update(held_back)
            turned = []
            for name in unguaranteed:
                job = waiting[name]
                job.waited_unguaranteed = True
                if (
                    name in exhausted
                    and rules.turns_auto_elastic
                    and job.spec.workload_class == "auto"
                    and job.workload_class == "reserved"
                ):
                    turned.append(job)
            for job in turned:
                waiting.turn_elastic(job)
                reserved_demand[job.spec.team] -= job.total_gpus
            # nodes provisioned in this cycle are real in the next: elastic work, which may not
            # grow a pool, may then fill what the work that asked for them left free
            if not turned and not new_nodes:
                break
        if provisioner is not None:
            provisioner.consolidate(running.used_by_node, now)
            engine_nodes = provisioner.current
        if recorder is not None and engine_nodes is not recorded_nodes:
            recorder.nodes(engine_nodes, now)
            recorded_nodes = engine_nodes
        rates = _Rates.measure(
            engine_nodes, running, waiting, held, reserved_by_team, weights, capacity, pool_types
        )
        _record(result, now, rates, len(waiting), preemptions)
        result.events += 1
        result.peak_waiting = max(result.peak_waiting, len(waiting))
        if progress is not None:
            progress(finished, len(arrivals))
        repairing = schedule is not None and schedule.repairing(now)
        if not running and next_arrival >= len(arrivals) and not repairing:
            break  # what still waits can never be placed
    result.makespan_s = now
    if recorder is not None:
        recorder.finish(now)
    if provisioner is not None:
        provisioner.finish(now)
        result.provisioning = provisioner.metrics()
        used = provisioner.node_gpu_s
        result.autoscaled_gpu_s = {p: used.get(p, 0.0) for p in provisioner.autoscaled}
    result.timeline = _downsample(result.timeline)
    return result


def _by_team(reservations: dict[tuple[str, str], int]) -> dict[str, int]:
    reserved: dict[str, int] = defaultdict(int)
    for (team, _pool), gpus in reservations.items():
        reserved[team] += gpus
    return reserved


def _expiries(fleet: Fleet, start: datetime) -> list[tuple[float, str]]:
    """(seconds after `start`, name) of each reservation that expires after `start`."""
    out = []
    for name, reservation in fleet.reservations.items():
        expires = reservation.spec.expires_utc
        if expires is not None and expires > start:
            out.append(((expires - start).total_seconds(), name))
    return sorted(out)


def _requeue(
    job: _Job, now: float, checkpoint_interval_s: float, taken_from: str | None, by: str | None
) -> float:
    """Stop a running job and let it wait again (preempted, or its node failed): what it did up
    to its last checkpoint is kept, the rest is lost; returns the GPU-seconds lost."""
    assert job.started is not None
    ran = max(now - job.started, 0.0)  # preempted before its new node was ready: nothing ran
    done_safely = ran - ran % checkpoint_interval_s
    job.remaining -= done_safely
    job.state, job.preempted_at, job.preempted_from, job.preempted_by = (
        WorkloadState.PREEMPTED,
        now,
        taken_from,
        by,
    )
    job.end = None
    job.as_workload = None
    return (ran - done_safely) * job.total_gpus


class _Jobs:
    """Jobs by name, with the GPUs they take per team kept up to date as they come and go
    (exact: sizes are multiples of a quarter); subclasses keep more in `_count`."""

    def __init__(self) -> None:
        self.jobs: dict[str, _Job] = {}
        self.gpus_by_team: dict[str, float] = defaultdict(float)

    def add(self, job: _Job) -> None:
        self.jobs[job.spec.name] = job
        self._count(job, 1)

    def pop(self, name: str) -> _Job:
        job = self.jobs.pop(name)
        self._count(job, -1)
        return job

    def _count(self, job: _Job, sign: int) -> None:
        self.gpus_by_team[job.spec.team] += sign * job.total_gpus

    def __getitem__(self, name: str) -> _Job:
        return self.jobs[name]

    def __len__(self) -> int:
        return len(self.jobs)

    def values(self) -> Iterable[_Job]:
        return self.jobs.values()


class _Running(_Jobs):
    """The running jobs, and the GPUs they hold per pool and per node; when the next one ends
    and the teams in the order their jobs run, kept as they come and go (each event read them
    from hundreds of running jobs)."""

    def __init__(self) -> None:
        super().__init__()
        self.gpus_by_pool: dict[str, float] = defaultdict(float)
        self.used_by_node: dict[str, float] = defaultdict(float)
        self._added = itertools.count()
        self._seq: dict[str, int] = {}  # when each running job was added: the order of `jobs`
        self._of_team: dict[str, dict[str, None]] = defaultdict(dict)  # in that order too
        self._ends: list[tuple[float, int, str]] = []  # a heap; entries of jobs gone are stale

    def _count(self, job: _Job, sign: int) -> None:
        super()._count(job, sign)
        self.gpus_by_pool[job.pool or ""] += sign * job.total_gpus
        for node in job.nodes:
            self.used_by_node[node] += sign * job.spec.gpus
        name, team = job.spec.name, job.spec.team
        if sign > 0:
            seq = self._seq[name] = next(self._added)
            self._of_team[team][name] = None
            if job.end is not None:
                heapq.heappush(self._ends, (job.end, seq, name))
        else:
            del self._seq[name], self._of_team[team][name]

    def next_end(self) -> float | None:
        """When the first running job ends (None when none has an end)."""
        ends = self._ends
        while ends and self._seq.get(ends[0][2]) != ends[0][1]:
            heapq.heappop(ends)
        return ends[0][0] if ends else None

    def ended_by(self, now: float) -> list[_Job]:
        """The running jobs that end by `now`, in the order they run in."""
        ended = []
        while (end := self.next_end()) is not None and end <= now:
            ended.append(self._ends[0][1:])
            heapq.heappop(self._ends)
        return [self.jobs[name] for _, name in sorted(ended)]

    def teams(self) -> list[str]:
        """The teams with running jobs, in the order their first running job was added (the
        order of the running jobs: sums over teams are made in it)."""
        first = [
            (self._seq[next(iter(names))], team) for team, names in self._of_team.items() if names
        ]
        return [team for _, team in sorted(first)]


class _Waiting(_Jobs):
    """The waiting jobs, with what every event reads about them kept up to date as they come
    and go, rather than gathered from thousands of jobs per event: the engine's backlog, the
    GPUs they ask in all, and the jobs by size."""

    def __init__(self, backlog: Backlog, policy: SimPolicy) -> None:
        super().__init__()
        self.backlog, self.policy = backlog, policy
        self.by_size: list[tuple[float, str]] = []  # smallest first, then by name
        self._gpus = 0.0
        self._float_sized = 0  # jobs whose size is a float, not an int

    def add(self, job: _Job) -> None:
        super().add(job)
        self.backlog.add(_workload(job, self.policy))
        bisect.insort(self.by_size, job.size_order)

    def pop(self, name: str) -> _Job:
        job = super().pop(name)
        self.backlog.remove(name)
        del self.by_size[bisect.bisect_left(self.by_size, job.size_order)]
        return job

    def turn_elastic(self, job: _Job) -> None:
        """An auto job its team's reservations cannot cover waits on as borrowing work."""
        job.workload_class, job.as_workload = "elastic", None
        self.backlog.remove(job.spec.name)
        self.backlog.add(_workload(job, self.policy))

    def _count(self, job: _Job, sign: int) -> None:
        super()._count(job, sign)
        self._gpus += sign * job.total_gpus
        self._float_sized += sign * isinstance(job.total_gpus, float)

    @property
    def gpus(self) -> float:
        """GPUs asked in all, as their sum would be: exact (sizes are multiples of a quarter),
        and an int where every size is one."""
        return self._gpus if self._float_sized else int(self._gpus)


@dataclass
class _Rates:
    """What holds between two events: GPUs allocated per team and pool, idle GPUs that waiting
    work could use, and the distance from each team's entitled share."""

    allocated: float = 0.0
    by_team: dict[str, float] = field(default_factory=dict)
    by_pool: dict[str, float] = field(default_factory=dict)
    idle_with_demand: float = 0.0
    idle_held: float = 0.0  # idle only because a guard holds the waiting work back
    fairness_gap: float = 0.0
    waiting_gpus: float = 0.0
    reserved: dict[str, int] = field(default_factory=dict)  # per team, to tell borrowing

    @property
    def borrowed(self) -> float:
        reserved = self.reserved
        return sum(max(0.0, gpus - reserved.get(t, 0)) for t, gpus in self.by_team.items())

    def accumulate(self, result: SimResult, start: float, end: float) -> None:
        seconds = end - start
        result.allocated_gpu_s += self.allocated * seconds
        if result.horizon_s is not None:
            inside = max(0.0, min(end, result.horizon_s) - start)
            result.allocated_in_horizon_gpu_s += self.allocated * inside
            if inside:
                for pool, gpus in self.by_pool.items():
                    result.pool_in_horizon_gpu_s[pool] += gpus * inside
        for team, gpus in self.by_team.items():
            result.team_gpu_s[team] += gpus * seconds
        for pool, gpus in self.by_pool.items():
            result.pool_gpu_s[pool] += gpus * seconds
        result.idle_with_demand_gpu_s += self.idle_with_demand * seconds
        result.idle_held_gpu_s += self.idle_held * seconds
        result.fairness_gap_gpu_s += self.fairness_gap * seconds
        if seconds:
            result.borrowed_gpu_s += self.borrowed * seconds

    @classmethod
    def measure(
        cls,
        nodes: tuple[Node, ...],
        running: _Running,
        waiting: _Waiting,
        held: set[str],
        reserved: dict[str, int],
        weights: dict[str, int],
        capacity: int,
        pool_types: Mapping[str, str],
    ) -> _Rates:
        # teams in the order they first run in (the order sums below are made in)
        by_team = {t: running.gpus_by_team[t] for t in running.teams()}
        by_pool = {p: gpus for p, gpus in running.gpus_by_pool.items() if gpus}
        used = running.used_by_node
        free: dict[str, list[float]] = defaultdict(list)  # per pool, each node's free GPUs
        for n in nodes:
            free[n.pool].append(float(n.gpus) - used.get(n.name, 0.0))
        demand = dict(by_team)
        for team, gpus in waiting.gpus_by_team.items():
            if gpus or team in demand:
                demand[team] = demand.get(team, 0.0) + gpus
        entitled = _entitled(demand, reserved, weights, capacity)
        free_for_demand = _usable_idle(free, pool_types, waiting, held)
        return cls(
            allocated=sum(by_team.values()),
            by_team=dict(by_team),
            by_pool=dict(by_pool),
            idle_with_demand=free_for_demand,
            idle_held=(_usable_idle(free, pool_types, waiting) - free_for_demand) if held else 0.0,
            fairness_gap=sum(abs(by_team.get(t, 0.0) - e) for t, e in entitled.items()),
            waiting_gpus=waiting.gpus,
            reserved=reserved,
        )


def _usable_idle(
    free: dict[str, list[float]],
    pool_types: Mapping[str, str],
    waiting: _Waiting,
    held: set[str] | None = None,
    limit: int = 200,
) -> float:
    """Idle GPUs that waiting work (but the `held`) could run on right now: the smallest
    waiting jobs are packed first-fit onto the free GPUs of each pool's nodes (whole pods per
    node, all of a job's pods in one pool: a gang does not span GPU types; only pools of a
    GPU type the job accepts), up to `limit` jobs."""
    if not waiting:
        return 0.0
    rooms = {
        pool: sorted((g for g in gpus if g > 0), reverse=True)
        for pool, gpus in sorted(free.items())
    }
    idle = sum(sum(room) for room in rooms.values())
    if not idle:
        return 0.0  # the common case under load: no need to look at the backlog
    usable = 0.0
    smallest = (waiting[name] for _, name in waiting.by_size if not held or name not in held)
    for job in itertools.islice(smallest, limit):
        if job.total_gpus > idle - usable:
            break  # jobs are sorted by size: no later one fits either
        accepts = job.spec.gpu_types
        for pool, room in rooms.items():
            if not room or job.spec.gpus > room[0]:
                continue
            if accepts and pool_types.get(pool) not in accepts:
                continue
            trial = list(room)
            placed = 0
            for i in range(len(trial)):
                while placed < job.spec.pods and trial[i] >= job.spec.gpus:
                    trial[i] -= job.spec.gpus
                    placed += 1
            if placed == job.spec.pods:
                rooms[pool] = trial
                usable += job.total_gpus
                break
    return min(usable, idle)


def _entitled(
    demand: dict[str, float], reserved: dict[str, int], weights: dict[str, int], capacity: int
) -> dict[str, float]:
    """Weighted max-min share: each team first gets min(demand, reserved); what is left is
    shared by burstingPriority weight, never above a team's demand."""
    share = {t: min(d, float(reserved.get(t, 0))) for t, d in demand.items()}
    left = capacity - sum(share.values())
    hungry = {t for t, d in demand.items() if d > share[t]}
    while left > 1e-9 and hungry:
        total = sum(max(weights.get(t, 1), 1) for t in hungry)
        step = {t: left * max(weights.get(t, 1), 1) / total for t in hungry}
        left = 0.0
        for t in list(hungry):
            give = min(step[t], demand[t] - share[t])
            share[t] += give
            left += step[t] - give
            if demand[t] - share[t] <= 1e-9:
                hungry.discard(t)
    return share


def _record(result: SimResult, now: float, rates: _Rates, waiting: int, preemptions: int) -> None:
    result.timeline.append(
        {
            "t": round(now, 1),
            "preemptions": preemptions,  # so far: a count that survives downsampling
            "allocated": round(rates.allocated, 2),
            "by_team": {k: round(v, 2) for k, v in sorted(rates.by_team.items())},
            "waiting_jobs": waiting,
            "waiting_gpus": round(rates.waiting_gpus, 2),
            "idle_with_demand": round(rates.idle_with_demand, 2),
        }
    )


def _downsample(points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    if len(points) <= MAX_TIMELINE_POINTS:
        return points
    step = len(points) / MAX_TIMELINE_POINTS
    return [points[int(i * step)] for i in range(MAX_TIMELINE_POINTS)] + [points[-1]]


def sharing_safety(shared: SimResult, partitioned: SimResult) -> dict[str, float | None]:
    """Per team: mean queue delay under `shared` minus under `partitioned` (static partition),
    over the team's jobs that started in both runs. <= 0: sharing cost the team nothing."""
    ours, theirs = shared.delays_by_job(), partitioned.delays_by_job()
    out: dict[str, float | None] = {}
    for team in sorted({j.spec.team for j in shared.jobs}):
        names = [
            j.spec.name
            for j in shared.jobs
            if j.spec.team == team and j.spec.name in ours and j.spec.name in theirs
        ]
        out[team] = (
            round(statistics.fmean(ours[n] - theirs[n] for n in names), 1) if names else None
        )
    return out


def _workload(job: _Job, policy: SimPolicy) -> Workload:
    if job.as_workload is None:
        job.as_workload = _build_workload(job, policy)
    return job.as_workload


def _build_workload(job: _Job, policy: SimPolicy) -> Workload:
    return Workload(
        name=job.spec.name,
        team=policy.team_of(job.spec.team),
        workload_class=WorkloadClass(job.workload_class),
        gpus=job.spec.gpus,
        pods=job.spec.pods,
        gpu_types=job.spec.gpu_types,
        priority=policy.priority_of(job.spec.priority),
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
        preempted_by=job.preempted_by,
    )
