"""When a waiting workload can expect to start, from the expected end of running work (R9).

The estimate replays the ends of active workloads with a known `expectedEnd`, in time order,
until the workload would fit and its team's reservation or burst limit would allow it. It does
not account for work queued ahead of it, so it is the earliest possible start, not a promise.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any, Protocol

from gpufleet.engine.accounting import Accounting
from gpufleet.engine.backlog import Backlog
from gpufleet.engine.placement import PodPlacement, PoolCapacity
from gpufleet.engine.types import Reason, Snapshot, Workload


class Cycle(Protocol):
    """What an estimate reads of the cycle that asks for it (scheduler.Cycle, once its
    admissions and preemptions are final)."""

    snapshot: Snapshot
    backlog: Backlog
    workloads: dict[str, Workload]
    capacity: dict[str, PoolCapacity]
    accounting: Accounting
    placements: dict[str, tuple[str, list[PodPlacement]]]
    eta_memo: dict[str, dict[Any, Any]]

    def allowed_pools(self, workload: Workload) -> list[str]: ...


NO_ESTIMATE = (Reason.POLICY_LIMIT, Reason.NO_MATCHING_POOL, Reason.NO_HEALTHY_NODE)


def estimate_eta(cycle: Cycle, workload: Workload, reason: Reason) -> datetime | None:
    now = cycle.snapshot.time
    if reason in NO_ESTIMATE:
        return None
    if reason is Reason.BACK_OFF:
        # the back-off ends with its window or when the preemptor releases the GPUs
        assert workload.preempted_at is not None
        ends = workload.preempted_at + cycle.snapshot.policy.backoff
        by = workload.preempted_by or ""
        holder = cycle.workloads.get(by) or cycle.backlog.by_name.get(by)
        if holder is not None and holder.expected_end is not None:
            ends = min(ends, max(holder.expected_end, now))
        return ends
    best: datetime | None = None
    for pool in cycle.allowed_pools(workload):
        eta = _pool_eta(cycle, workload, pool)
        if eta is not None and (best is None or eta < best):
            best = eta
    return max(best, now) if best is not None else None


def _cache(cycle: Cycle, name: str) -> dict[Any, Any]:
    """Per-cycle memo: the state is final when ETAs are computed, so equal questions share an
    answer (thousands of waiting workloads have only a few shapes)."""
    return cycle.eta_memo.setdefault(name, {})


def _ending(cycle: Cycle, pool: str) -> list[tuple[datetime, str]]:
    """Active workloads of the pool with a known end, earliest first."""
    cache = _cache(cycle, "ending")
    if pool not in cache:
        ends = []
        for name, (where, _) in cycle.placements.items():
            end = cycle.workloads[name].expected_end
            if where == pool and end is not None:
                ends.append((end, name))
        cache[pool] = sorted(ends)
    result: list[tuple[datetime, str]] = cache[pool]
    return result


def _first_time(
    events: list[tuple[datetime, str]], gain: Callable[[str], int], needed: int
) -> datetime | None:
    """The end time at which the ended workloads' `gain` first adds up to `needed`.

    None: nothing is needed (not blocked by this). Raises LookupError: never, by known ends."""
    if needed <= 0:
        return None
    total = 0
    for when, name in events:
        total += gain(name)
        if total >= needed:
            return when
    raise LookupError


def _pool_eta(cycle: Cycle, workload: Workload, pool: str) -> datetime | None:
    events = _ending(cycle, pool)
    acct = cycle.accounting
    need = workload.total_milli
    team = workload.team
    times: list[datetime | None] = []
    try:
        if workload.reserved:
            if acct.reserved.get((team, pool), 0) < need:
                return None
            key = ("reservation", team, pool, need)
            memo = _cache(cycle, "limits")
            if key not in memo:
                memo[key] = _first_time(
                    events,
                    lambda n: _milli_if(cycle, n, lambda w: w.reserved and w.team == team),
                    need - acct.unused_reservation(team, pool),
                )
            times.append(memo[key])
        else:
            blocker = acct.burst_blocker(team, need)
            if blocker is not None:
                key = ("burst", blocker, pool, need)
                memo = _cache(cycle, "limits")
                if key not in memo:
                    ceiling = acct.ceiling[blocker] or 0
                    memo[key] = _first_time(
                        events,
                        lambda n: _milli_if(
                            cycle, n, lambda w: blocker in acct.ancestors.get(w.team, [])
                        ),
                        acct.subtree_usage[blocker] + need - ceiling,
                    )
                times.append(memo[key])
        times.append(_capacity_time(cycle, workload, pool, events))
    except LookupError:
        return None
    known = [t for t in times if t is not None]
    return max(known) if known else cycle.snapshot.time


def _milli_if(cycle: Cycle, name: str, test: Callable[[Workload], bool]) -> int:
    workload = cycle.workloads[name]
    return workload.total_milli if test(workload) else 0


def _capacity_time(
    cycle: Cycle, workload: Workload, pool: str, events: list[tuple[datetime, str]]
) -> datetime | None:
    """When the pool's nodes will have room for the workload, releasing ending work in order.
    Raises LookupError if known ends never make room."""
    memo = _cache(cycle, "capacity")
    key = (pool, workload.milli_per_pod, workload.pods, workload.zone)
    if key not in memo:
        memo[key] = _replay_ends(cycle, workload, pool, events)
    result: datetime | LookupError | None = memo[key]
    if isinstance(result, LookupError):
        raise result
    return result


def _replay_ends(
    cycle: Cycle, workload: Workload, pool: str, events: list[tuple[datetime, str]]
) -> datetime | LookupError | None:
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
        return LookupError()
    finally:
        for pod in reversed(released):
            capacity.allocate(pod)
