"""When a waiting workload can expect to start, from the expected end of running work (R9).

The estimate replays the ends of active workloads with a known `expectedEnd`, in time order,
until the workload would fit and its team's reservation or burst limit would allow it. It does
not account for work queued ahead of it, so it is the earliest possible start, not a promise.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING

from gpufleet.engine.types import Reason, Workload

if TYPE_CHECKING:
    from gpufleet.engine.scheduler import Cycle

NO_ESTIMATE = (Reason.POLICY_LIMIT, Reason.NO_MATCHING_POOL, Reason.NO_HEALTHY_NODE)


def estimate_eta(cycle: Cycle, workload: Workload, reason: Reason) -> datetime | None:
    now = cycle.snapshot.time
    if reason in NO_ESTIMATE:
        return None
    if reason is Reason.BACK_OFF:
        assert workload.preempted_at is not None
        return workload.preempted_at + cycle.snapshot.policy.backoff
    best: datetime | None = None
    for pool in cycle._allowed_pools(workload):
        eta = _pool_eta(cycle, workload, pool)
        if eta is not None and (best is None or eta < best):
            best = eta
    return max(best, now) if best is not None else None


def _ending(cycle: Cycle, pool: str) -> list[tuple[datetime, str]]:
    """Active workloads of the pool with a known end, earliest first (cached per cycle)."""
    cache: dict[str, list[tuple[datetime, str]]] = cycle.__dict__.setdefault("_ending", {})
    if pool not in cache:
        cache[pool] = sorted(
            (cycle.workloads[name].expected_end, name)  # type: ignore[misc]
            for name, (p, _) in cycle.placements.items()
            if p == pool and cycle.workloads[name].expected_end is not None
        )
    return cache[pool]


def _first_time(
    events: list[tuple[datetime, str]], ok: Callable[[list[str]], bool]
) -> datetime | None:
    """The end time after which `ok(ended so far)` first holds."""
    ended: list[str] = []
    if ok(ended):
        return None  # not blocked by this; the caller treats None as "no constraint"
    for when, name in events:
        ended.append(name)
        if ok(ended):
            return when
    raise LookupError


def _pool_eta(cycle: Cycle, workload: Workload, pool: str) -> datetime | None:
    events = _ending(cycle, pool)
    acct = cycle.accounting
    need = workload.total_quarters
    times: list[datetime] = []
    try:
        if workload.reserved:

            def reservation_ok(ended: list[str]) -> bool:
                freed = sum(
                    cycle.workloads[n].total_quarters
                    for n in ended
                    if cycle.workloads[n].reserved and cycle.workloads[n].team == workload.team
                )
                return acct.unused_reservation(workload.team, pool) + freed >= need

            if acct.reserved.get((workload.team, pool), 0) < need:
                return None
            when = _first_time(events, reservation_ok)
            if when:
                times.append(when)
        else:
            blocker = acct.burst_blocker(workload.team, need)
            if blocker is not None:
                ceiling = acct.ceiling[blocker] or 0

                def burst_ok(ended: list[str]) -> bool:
                    freed = sum(
                        cycle.workloads[n].total_quarters
                        for n in ended
                        if blocker in acct.ancestors.get(cycle.workloads[n].team, [])
                    )
                    return acct.subtree_usage[blocker] - freed + need <= ceiling

                when = _first_time(events, burst_ok)
                if when:
                    times.append(when)
        when = _capacity_time(cycle, workload, pool, events)
        if when:
            times.append(when)
    except LookupError:
        return None
    return max(times) if times else cycle.snapshot.time


def _capacity_time(
    cycle: Cycle, workload: Workload, pool: str, events: list[tuple[datetime, str]]
) -> datetime | None:
    """When the pool's nodes will have room for the workload, releasing ending work in order."""
    capacity = cycle.capacity[pool]
    if capacity.fit_zone(workload) is not None:
        return None
    released = []
    try:
        for when, name in events:
            for pod in cycle.placements[name][1]:
                capacity.release(pod)
                released.append(pod)
            if capacity.fit_zone(workload) is not None:
                return when
        raise LookupError
    finally:
        for pod in reversed(released):
            capacity.allocate(pod)
