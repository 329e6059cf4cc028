"""Building an engine snapshot from the GitOps objects and a cluster state."""

from __future__ import annotations

from datetime import UTC, datetime

from gpufleet.engine.types import (
    Node,
    Policy,
    PoolInfo,
    Snapshot,
    TeamInfo,
    Workload,
    WorkloadClass,
)
from gpufleet.model.durations import parse_duration
from gpufleet.model.fleet import Fleet
from gpufleet.model.state import StateFile
from gpufleet.model.states import WorkloadState


def fleet_parts(
    fleet: Fleet, now: datetime
) -> tuple[dict[str, PoolInfo], dict[str, TeamInfo], dict[tuple[str, str], int], Policy]:
    """Pools, teams, active reservations and policy in the engine's terms."""
    pools = {
        name: PoolInfo(
            name,
            p.spec.gpu_type,
            p.spec.gpus_per_node,
            p.spec.max_gpus,
            autoscaling=p.spec.provider != "static",
            allow_elastic_scale_up=p.spec.allow_elastic_scale_up,
            sharing=p.spec.sharing != "none",
        )
        for name, p in fleet.pools.items()
    }
    teams = {
        name: TeamInfo(name, t.spec.parent, t.spec.bursting_priority, t.spec.burst_limit)
        for name, t in fleet.teams.items()
    }
    reservations: dict[tuple[str, str], int] = {}
    for r in fleet.reservations.values():
        expires = r.spec.expires_utc
        if expires is None or expires > now:
            key = (r.spec.team, r.spec.pool)
            reservations[key] = reservations.get(key, 0) + r.spec.gpus
    spec = fleet.policy
    policy = Policy(
        min_runtime=parse_duration(spec.preemption.min_runtime),
        backoff=parse_duration(spec.preemption.backoff),
        max_gpus_per_workload=spec.admission.max_gpus_per_workload,
        max_priority=dict(spec.admission.max_priority),
    )
    return pools, teams, reservations, policy


def snapshot_from_state(fleet: Fleet, state: StateFile, now: datetime | None = None) -> Snapshot:
    time = state.time or now or datetime.now(UTC)
    pools, teams, reservations, policy = fleet_parts(fleet, time)
    nodes = tuple(
        Node(
            n.name,
            n.pool,
            n.gpus,
            n.zone,
            n.healthy,
            faults=n.faults,
            block=n.block,
            clique=n.clique,
        )
        for n in state.nodes
    )
    workloads = []
    for w in state.workloads:
        started = _utc(w.started_at)
        end = _utc(w.expected_end)
        if end is None and w.expected_duration and started is not None:
            end = started + parse_duration(w.expected_duration)
        workloads.append(
            Workload(
                name=w.name,
                team=w.team,
                workload_class=WorkloadClass(w.workload_class),
                gpus=w.gpus,
                pods=w.pods,
                priority=w.priority,
                state=WorkloadState(w.state),
                pool=w.pool,
                gpu_types=tuple(w.gpu_types),
                zone=w.zone,
                topology=w.topology,
                submitted_at=_utc(w.submitted_at) or time,
                started_at=started,
                nodes=tuple(w.nodes),
                expected_end=end,
                preempted_at=_utc(w.preempted_at),
                preempted_from=w.preempted_from,
                preempted_by=w.preempted_by,
            )
        )
    return Snapshot(time, pools, teams, reservations, policy, nodes, tuple(workloads))


def _utc(value: datetime | None) -> datetime | None:
    if value is not None and value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value
