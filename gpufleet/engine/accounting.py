"""Who uses how much: reservations, usage per team and pool, burst ceilings, fair shares.

All amounts are milli-GPUs. Usage counts every active workload (Queued, Starting, Running)
plus the admissions of the current cycle.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from gpufleet.engine.types import MILLI, Snapshot, Workload
from gpufleet.model.bursting import UNLIMITED, ceiling_for


class Accounting:
    def __init__(self, snapshot: Snapshot) -> None:
        self.teams = snapshot.teams
        self.reserved = {key: gpus * MILLI for key, gpus in snapshot.reservations.items()}
        self.usage: dict[tuple[str, str], int] = defaultdict(int)  # (team, pool)
        self.reserved_usage: dict[tuple[str, str], int] = defaultdict(int)
        self.subtree_usage: dict[str, int] = defaultdict(int)  # all pools, team and descendants
        self.ancestors = {name: self._ancestors(name) for name in self.teams}
        subtree_reserved: dict[str, int] = defaultdict(int)
        for (owner, _pool), milli in self.reserved.items():
            for ancestor in self.ancestors.get(owner, [owner]):
                subtree_reserved[ancestor] += milli
        self.subtree_reserved = subtree_reserved
        self.ceiling: dict[str, int | None] = {}
        for name, info in self.teams.items():
            gpus = ceiling_for(info.burst_limit, subtree_reserved[name] / MILLI)
            self.ceiling[name] = None if gpus == UNLIMITED else round(gpus * MILLI)

    def _ancestors(self, team: str) -> list[str]:
        """The team, its parent, ... up to the root (cycles and unknown parents end the walk)."""
        chain = [team]
        parent = self.teams[team].parent
        while parent is not None and parent in self.teams and parent not in chain:
            chain.append(parent)
            parent = self.teams[parent].parent
        return chain

    def add(self, workload: Workload, pool: str, sign: int = 1) -> None:
        milli = sign * workload.total_milli
        self.usage[(workload.team, pool)] += milli
        if workload.reserved:
            self.reserved_usage[(workload.team, pool)] += milli
        for ancestor in self.ancestors.get(workload.team, [workload.team]):
            self.subtree_usage[ancestor] += milli

    def remove(self, workload: Workload, pool: str) -> None:
        self.add(workload, pool, -1)

    def unused_reservation(self, team: str, pool: str) -> int:
        """Reserved milli in the pool not taken by the team's reserved work (R1)."""
        return self.reserved.get((team, pool), 0) - self.reserved_usage[(team, pool)]

    def idle_reservation(self, team: str, pool: str) -> int:
        """Reserved milli in the pool the team uses for nothing at all (elastic included)."""
        return max(0, self.reserved.get((team, pool), 0) - self.usage[(team, pool)])

    def burst_blocker(self, team: str, milli: int) -> str | None:
        """The team (itself or an ancestor) whose burst ceiling `milli` more would break."""
        for ancestor in self.ancestors.get(team, [team]):
            ceiling = self.ceiling.get(ancestor)
            if ceiling is not None and self.subtree_usage[ancestor] + milli > ceiling:
                return ancestor
        return None

    def borrowed(self, team: str, pool: str) -> int:
        """Milli-GPUs the team uses in the pool beyond its reservation there."""
        return max(0, self.usage[(team, pool)] - self.reserved.get((team, pool), 0))

    def borrowed_total(self, team: str, pools: Iterable[str]) -> int:
        return sum(self.borrowed(team, pool) for pool in pools)


def fair_share_weights(snapshot: Snapshot, demanding: set[str]) -> dict[str, float]:
    """Each demanding team's share of surplus capacity (R3).

    Surplus is divided down the team tree by burstingPriority among the siblings whose subtree
    has demand; a team with children and work of its own competes with its children at its own
    weight. Shares of teams without demand flow to the others (work conservation)."""
    teams = snapshot.teams
    children: dict[str | None, list[str]] = defaultdict(list)
    for name in sorted(teams):
        parent = teams[name].parent
        children[parent if parent in teams else None].append(name)
    active: set[str] = set()
    for name in demanding:
        seen = set()
        current: str | None = name
        while current is not None and current in teams and current not in seen:
            seen.add(current)
            active.add(current)
            current = teams[current].parent
    shares: dict[str, float] = {}

    def divide(parent: str | None, share: float, own: bool) -> None:
        members = [c for c in children[parent] if c in active]
        weights = {c: float(teams[c].weight) for c in members}
        if own and parent is not None:
            weights[parent] = float(teams[parent].weight)
        total = sum(weights.values())
        for member, weight in weights.items():
            part = share * weight / total
            if member == parent:
                shares[member] = part
            else:
                divide(member, part, member in demanding)

    divide(None, 1.0, False)
    for name in demanding:  # teams in cycles or under unknown parents: an equal small share
        shares.setdefault(name, 1.0 / max(len(teams), 1))
    return shares
