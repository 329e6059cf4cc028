"""Choosing victims: cheapest first and no more than needed (R5), within the rules R1, R3, R4, R6.

The search works on the live capacity index: victims are released tentatively, the preemptor's
fit is checked, and anything not chosen is put back exactly as it was.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gpufleet.engine.capacity import PodPlacement, PoolCapacity
from gpufleet.engine.types import VICTIM_STATE_RANK, PreemptionReason, Workload

VictimKey = tuple[int, int, float, str]


@dataclass
class Candidate:
    workload: Workload
    placements: list[PodPlacement]
    reason: PreemptionReason
    key: VictimKey  # R5 cost: state, priority, most recently started first, name


def victim_key(workload: Workload, priority: int) -> VictimKey:
    started = workload.started_at.timestamp() if workload.started_at else float("inf")
    return (VICTIM_STATE_RANK[workload.state], priority, -started, workload.name)


def _release(capacity: PoolCapacity, victims: list[Candidate]) -> None:
    for victim in victims:
        for pod in victim.placements:
            capacity.release(pod)


def _restore(capacity: PoolCapacity, victims: list[Candidate]) -> None:
    for victim in reversed(victims):
        for pod in reversed(victim.placements):
            capacity.allocate(pod)


def select_victims(
    preemptor: Workload,
    capacity: PoolCapacity,
    candidates: list[Candidate],
    allowed: Callable[[list[Candidate]], bool],
) -> list[Candidate] | None:
    """A minimal, cheap set of victims after whose eviction the preemptor fits, or None.

    `allowed(victims)` says whether a set is permitted as a whole (fair-share reclaim depends on
    how much is taken from each team). On success the victims stay released in `capacity`."""
    candidates = sorted(candidates, key=lambda c: c.key)
    chosen = None
    if preemptor.pods == 1 and not preemptor.fractional:
        chosen = _on_one_node(preemptor, capacity, candidates, allowed)
    if chosen is None:
        chosen = _greedy(preemptor, capacity, candidates, allowed)
    if chosen is None:
        return None
    _release(capacity, chosen)
    chosen = _minimise(preemptor, capacity, chosen)
    return chosen


def _fits(preemptor: Workload, capacity: PoolCapacity) -> bool:
    return capacity.fit_zone(preemptor) is not None


def _greedy(
    preemptor: Workload,
    capacity: PoolCapacity,
    candidates: list[Candidate],
    allowed: Callable[[list[Candidate]], bool],
) -> list[Candidate] | None:
    """Add victims cheapest first until the preemptor fits; leaves `capacity` unchanged."""
    chosen: list[Candidate] = []
    found = False
    for candidate in candidates:
        if not allowed([*chosen, candidate]):
            continue
        chosen.append(candidate)
        _release(capacity, [candidate])
        if _fits(preemptor, capacity):
            found = True
            break
    _restore(capacity, chosen)
    return chosen if found else None


def _on_one_node(
    preemptor: Workload,
    capacity: PoolCapacity,
    candidates: list[Candidate],
    allowed: Callable[[list[Candidate]], bool],
) -> list[Candidate] | None:
    """For a single-pod preemptor: the node whose cheapest sufficient victims cost least, so the
    freed GPUs are on the node the pod will use rather than scattered (R5)."""
    gpus = preemptor.quarters_per_pod // 4
    zones = set(capacity.zones_for(preemptor, new_nodes=False))
    by_node: dict[str, list[Candidate]] = {}
    for candidate in candidates:
        for pod in candidate.placements:
            if pod.node.zone in zones and pod.node.healthy:
                by_node.setdefault(pod.node.name, [])
                if candidate not in by_node[pod.node.name]:
                    by_node[pod.node.name].append(candidate)
    best: tuple[tuple[VictimKey, int, str], list[Candidate]] | None = None
    for name in sorted(by_node):
        node = capacity.by_name[name]
        chosen: list[Candidate] = []
        for candidate in by_node[name]:
            if node.whole_free >= gpus:
                break
            if not allowed([*chosen, candidate]):
                continue
            chosen.append(candidate)
            _release(capacity, [candidate])
        enough = node.whole_free >= gpus
        _restore(capacity, chosen)
        if enough and chosen:
            cost = (max(c.key for c in chosen), len(chosen), name)
            if best is None or cost < best[0]:
                best = (cost, chosen)
    return None if best is None else best[1]


def _minimise(
    preemptor: Workload, capacity: PoolCapacity, victims: list[Candidate]
) -> list[Candidate]:
    """Drop every victim the preemptor does not need, most expensive first, until none can go."""
    victims = list(victims)
    changed = True
    while changed:
        changed = False
        for victim in sorted(victims, key=lambda c: c.key, reverse=True):
            _restore(capacity, [victim])
            if _fits(preemptor, capacity):
                victims.remove(victim)
                changed = True
            else:
                _release(capacity, [victim])
    return victims
