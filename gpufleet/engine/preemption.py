"""Choosing victims: cheapest first and no more than needed (R5), within the rules R1, R3, R4, R6.

The search works on the live capacity index: victims are released tentatively, the preemptor's
fit is checked, and anything not chosen is put back exactly as it was.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from gpufleet.engine.placement import PodPlacement, PoolCapacity
from gpufleet.engine.types import MILLI, PreemptionReason, Workload

VictimKey = tuple[int, int, float, str]


@dataclass
class Candidate:
    workload: Workload
    placements: list[PodPlacement]
    reason: PreemptionReason
    key: VictimKey  # R5 cost: state, priority, most recently started first, name


def victim_key(workload: Workload, priority: int) -> VictimKey:
    """Workload.victim_order with the effective priority."""
    state, _, started, name = workload.victim_order
    return (state, priority, started, name)


def release_all(capacity: PoolCapacity, victims: list[Candidate]) -> None:
    for victim in victims:
        for pod in victim.placements:
            capacity.release(pod)


def restore_all(capacity: PoolCapacity, victims: list[Candidate]) -> None:
    for victim in reversed(victims):
        for pod in reversed(victim.placements):
            capacity.allocate(pod)


def select_victims(
    preemptor: Workload,
    capacity: PoolCapacity,
    candidates: Callable[[], Iterator[Candidate]],
    may_lose: Callable[[str, int], bool],
) -> list[Candidate] | None:
    """A minimal, cheap set of victims after whose eviction the preemptor fits, or None.

    `candidates()` yields the eligible victims cheapest first (R5), lazily: the search stops
    as soon as it has enough, so its cost follows the victims it needs, not the cluster size.
    `may_lose(team, milli)` says whether a team may lose that many milli to fair-share
    reclaim (R3: it depends on how much is taken from the team, so a set of victims is judged
    team by team, by its fair-share victims; others need no check). On success the victims stay
    released in `capacity`."""
    chosen = None
    if preemptor.pods == 1 and not preemptor.fractional:
        chosen, room = _on_one_node(preemptor, capacity, candidates(), may_lose)
        if not room:
            # no node had room even with every victim allowed on its own gone: no smaller
            # set of them (all the greedy search may take) can make room either
            return None
    if chosen is None:
        chosen = _greedy(preemptor, capacity, candidates(), may_lose)
    if chosen is None:
        return None
    release_all(capacity, chosen)
    return minimise(preemptor, capacity, chosen)


def allowed(victims: list[Candidate], may_lose: Callable[[str, int], bool]) -> bool:
    """Whether every team may lose the fair-share victims of `victims` that are its."""
    taken: dict[str, int] = {}
    for victim in victims:
        if victim.reason is PreemptionReason.FAIR_SHARE:
            team = victim.workload.team
            taken[team] = taken.get(team, 0) + victim.workload.total_milli
    return all(may_lose(team, milli) for team, milli in taken.items())


def _fits(preemptor: Workload, capacity: PoolCapacity) -> bool:
    return capacity.fit_zone(preemptor) is not None


def _greedy(
    preemptor: Workload,
    capacity: PoolCapacity,
    candidates: Iterator[Candidate],
    may_lose: Callable[[str, int], bool],
) -> list[Candidate] | None:
    """Add victims cheapest first until the preemptor fits; leaves `capacity` unchanged."""
    chosen: list[Candidate] = []
    taken: dict[str, int] = {}  # fair-share milli taken from each team so far
    found = False
    for candidate in candidates:
        if candidate.reason is PreemptionReason.FAIR_SHARE:
            team = candidate.workload.team
            more = taken.get(team, 0) + candidate.workload.total_milli
            if not may_lose(team, more):
                continue
            taken[team] = more
        chosen.append(candidate)
        release_all(capacity, [candidate])
        if _fits(preemptor, capacity):
            found = True
            break
    restore_all(capacity, chosen)
    return chosen if found else None


def _on_one_node(
    preemptor: Workload,
    capacity: PoolCapacity,
    candidates: Iterator[Candidate],
    may_lose: Callable[[str, int], bool],
) -> tuple[list[Candidate] | None, bool]:
    """For a single-pod preemptor: victims on the one node where the pod will run, so the
    freed GPUs are not scattered (R5). Victims are released cheapest first; the first node to
    have room is the node whose most expensive needed victim is cheapest. Leaves `capacity`
    unchanged. Also says whether any node had room."""
    gpus = preemptor.milli_per_pod // MILLI
    zones = set(capacity.zones_for(preemptor, new_nodes=False))
    released: list[Candidate] = []
    on_node: dict[str, list[Candidate]] = {}
    chosen = None
    for candidate in candidates:
        if candidate.reason is PreemptionReason.FAIR_SHARE and not may_lose(
            candidate.workload.team, candidate.workload.total_milli
        ):
            continue
        release_all(capacity, [candidate])
        released.append(candidate)
        for pod in candidate.placements:
            here = on_node.setdefault(pod.node.name, [])
            if candidate not in here:
                here.append(candidate)
        ready = [
            p.node
            for p in candidate.placements
            if p.node.whole_free >= gpus and p.node.zone in zones and p.node.healthy
        ]
        if ready:
            chosen = on_node[min(ready, key=lambda n: n.index).name]
            break
    restore_all(capacity, released)
    if chosen is None:
        return None, False
    return (chosen if allowed(chosen, may_lose) else None), True


def minimise(
    preemptor: Workload, capacity: PoolCapacity, victims: list[Candidate]
) -> list[Candidate]:
    """Drop every victim the preemptor does not need, most expensive first, until none can go."""
    victims = list(victims)
    changed = True
    while changed:
        changed = False
        for victim in sorted(victims, key=lambda c: c.key, reverse=True):
            restore_all(capacity, [victim])
            if _fits(preemptor, capacity):
                victims.remove(victim)
                changed = True
            else:
                release_all(capacity, [victim])
    return victims
