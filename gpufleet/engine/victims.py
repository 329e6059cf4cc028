"""The elastic work a cycle may preempt (R5, R6), kept in order as work comes and goes.

Per pool: every elastic workload placed when the cycle starts, cheapest victim first; of those,
the ones old enough to yield to elastic work (R6), in the same order; and the milli of those
per priority and team, and their sizes (the bounds of `Cycle._could_yield`). A cycle reads them
and takes out what it evicts. Work it admits joins at the next cycle (a workload admitted in a
cycle is not preempted in it). A replay keeps the index between cycles with its `Placed`, so a
cycle costs the changes since the last one, not a sort of everything running; work turns old
enough as the replay's clock passes its start plus minRuntime.
"""

from __future__ import annotations

import bisect
import heapq
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from gpufleet.engine.preemption import VictimKey, victim_key
from gpufleet.engine.types import Policy, Workload


@dataclass
class _Entry:
    pool: str
    key: VictimKey
    team: str
    priority: int
    milli: int
    started: datetime | None
    old: bool


class VictimIndex:
    def __init__(self, policy: Policy, young_since: datetime) -> None:
        self.policy = policy
        # work started after this is too young to yield to elastic work (R6)
        self.young_since = young_since
        self.all: dict[str, list[tuple[VictimKey, str]]] = defaultdict(list)
        self.old: dict[str, list[tuple[VictimKey, str]]] = defaultdict(list)
        # the milli of the old ones per pool, priority and team, and per pool and priority
        self.yieldable: dict[str, dict[int, dict[str, int]]] = defaultdict(dict)
        self.yieldable_total: dict[str, dict[int, int]] = defaultdict(dict)
        # how many possible victims each team has (in any pool, of any age)
        self.teams: dict[str, int] = {}
        # the sizes (milli) of the old ones per pool, team and priority, with how many of each
        self._sizes: dict[tuple[str, str, int], dict[int, int]] = defaultdict(dict)
        self._entries: dict[str, _Entry] = {}
        self._young: list[tuple[datetime, str]] = []  # (started_at, name); stale ones skipped
        self._capped = bool(policy.max_priority)

    def __contains__(self, name: str) -> bool:
        return name in self._entries

    def add(self, workload: Workload, pool: str) -> None:
        """A placed elastic workload becomes a possible victim (reserved work never is)."""
        if workload.reserved:
            return
        if self._capped:
            priority = self.policy.priority_of(workload)
            key = victim_key(workload, priority)
        else:
            priority, key = workload.priority, workload.victim_order
        started = workload.started_at
        old = started is None or started <= self.young_since
        name = workload.name
        entry = _Entry(pool, key, workload.team, priority, workload.total_milli, started, old)
        self._entries[name] = entry
        _tally(self.teams, entry.team, 1)
        bisect.insort(self.all[pool], (key, name))
        if old:
            self._add_old(entry, name)
        else:
            assert started is not None
            heapq.heappush(self._young, (started, name))

    def remove(self, name: str) -> None:
        """No longer a possible victim (evicted, ended, or placed differently)."""
        entry = self._entries.pop(name, None)
        if entry is None:
            return
        _delete(self.all[entry.pool], (entry.key, name))
        _tally(self.teams, entry.team, -1)
        if entry.old:
            _delete(self.old[entry.pool], (entry.key, name))
            self._tally_old(entry, -1)

    def age(self, young_since: datetime) -> None:
        """Move the clock on (never back): work started by `young_since` may now yield."""
        assert young_since >= self.young_since, "a replay's clock only moves on"
        self.young_since = young_since
        young = self._young
        while young and young[0][0] <= young_since:
            started, name = heapq.heappop(young)
            entry = self._entries.get(name)
            # an entry of a workload since removed, or added again with another start, is stale
            if entry is not None and not entry.old and entry.started == started:
                entry.old = True
                self._add_old(entry, name)

    def smallest(self, pool: str, team: str, priority: int) -> int:
        """The fewest milli one old victim of the team at the priority holds in the pool."""
        return min(self._sizes[(pool, team, priority)], default=0)

    def _add_old(self, entry: _Entry, name: str) -> None:
        bisect.insort(self.old[entry.pool], (entry.key, name))
        self._tally_old(entry, 1)

    def _tally_old(self, entry: _Entry, sign: int) -> None:
        """Count an old victim in (1) or out (-1) of the sums the bounds read."""
        by_team = self.yieldable[entry.pool].setdefault(entry.priority, {})
        _tally(by_team, entry.team, sign * entry.milli)
        _tally(self.yieldable_total[entry.pool], entry.priority, sign * entry.milli)
        _tally(self._sizes[(entry.pool, entry.team, entry.priority)], entry.milli, sign)


def _tally(counts: dict[Any, int], key: Any, delta: int) -> None:
    """Add `delta` to a count, dropping it at zero (a team or size with none is no key)."""
    left = counts.get(key, 0) + delta
    if left:
        counts[key] = left
    else:
        counts.pop(key, None)


def _delete(ordered: list[tuple[VictimKey, str]], item: tuple[VictimKey, str]) -> None:
    del ordered[bisect.bisect_left(ordered, item)]
