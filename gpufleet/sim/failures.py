"""Node failures for the simulator: when each node fails, how long it is out, and what the
engine knows of it (healthy or not, its decayed fault history).

Each node fails as a Poisson process; a few *lemon* nodes fail far more often, as large-cluster
studies of GPU fleets report. The schedule depends only on the seed and the node names, never on
what runs where, so runs with and without lemon avoidance meet the same failures.

Nodes of pools that prefer spot capacity are also interrupted (the cloud takes the instance
back), as a Poisson process of their own: the node is gone until a replacement is provisioned.
An interruption is no fault of the node: it adds nothing to its fault history.
"""

from __future__ import annotations

import heapq
import random
from collections import defaultdict
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from gpufleet.engine import Node
from gpufleet.engine.types import FAULT_HALF_LIFE
from gpufleet.health.quarantine import fault_score

DAY_S = 86400.0
FAILURE, SPOT = "failure", "spot"  # why a node went down
REFRESH_S = 3600.0  # fault scores decay slowly: recomputed at most hourly between failures


@dataclass(frozen=True)
class Failures:
    per_node_per_day: float = 0.005  # a healthy node fails about every 200 days
    lemon_share: float = 0.05  # share of nodes that are lemons
    lemon_factor: float = 40.0  # how much more often a lemon fails
    repair_s: float = 6 * 3600.0  # out of service after a failure (quarantine, repair)
    seed: int = 1
    avoid_lemons: bool = True  # the engine sees fault histories (False: it sees none)
    lemons: tuple[str, ...] = ()  # these nodes are the lemons (default: lemon_share, by seed)
    spot_per_node_per_day: float = 0.0  # interruptions of a spot node
    spot_replace_s: float = 900.0  # until a replacement node is provisioned and ready


class FailureSchedule:
    def __init__(
        self,
        failures: Failures,
        nodes: tuple[Node, ...],
        epoch: datetime,
        spot_pools: frozenset[str] = frozenset(),
    ) -> None:
        self.failures, self.base, self.epoch = failures, nodes, epoch
        names = sorted(n.name for n in nodes)
        picker = random.Random(f"{failures.seed}/lemons")
        count = round(failures.lemon_share * len(names))
        self.lemons = set(failures.lemons) or (set(picker.sample(names, count)) if count else set())
        self._streams = {n: random.Random(f"{failures.seed}/{n}") for n in names}
        spot = sorted(n.name for n in nodes if n.pool in spot_pools)
        self._spot_streams = {n: random.Random(f"{failures.seed}/spot/{n}") for n in spot}
        self._next: list[tuple[float, str, str]] = []  # (when, node, FAILURE or SPOT)
        for name in names:
            self._schedule(name, 0.0, FAILURE)
        for name in spot:
            self._schedule(name, 0.0, SPOT)
        self.down_until: dict[str, float] = {}
        self.history: dict[str, list[float]] = defaultdict(list)
        self._nodes = nodes
        self._computed_at: float | None = None

    def _schedule(self, name: str, after: float, cause: str) -> None:
        """The node's next failure or interruption after `after`, from its own stream."""
        if cause == SPOT:
            rate, stream = self.failures.spot_per_node_per_day / DAY_S, self._spot_streams[name]
        else:
            rate, stream = self.failures.per_node_per_day / DAY_S, self._streams[name]
            if name in self.lemons:
                rate *= self.failures.lemon_factor
        if rate > 0:
            heapq.heappush(self._next, (after + stream.expovariate(rate), name, cause))

    def repairing(self, now: float) -> bool:
        """Some node is still out: waiting work may fit once it is back."""
        return any(t > now for t in self.down_until.values())

    def next_time(self, now: float) -> float | None:
        """The next failure or repair after `now`."""
        times = [t for t in self.down_until.values() if t > now]
        if self._next:
            times.append(self._next[0][0])
        return min(times) if times else None

    def fail_due(self, now: float) -> list[tuple[str, str]]:
        """The nodes that fail or are interrupted by `now`, with the cause (FAILURE or SPOT); a
        node that is down does not go down again."""
        failed = []
        while self._next and self._next[0][0] <= now:
            at, name, cause = heapq.heappop(self._next)
            if self.down_until.get(name, -1.0) <= at:
                if cause == SPOT:
                    self.down_until[name] = at + self.failures.spot_replace_s
                else:
                    self.down_until[name] = at + self.failures.repair_s
                    self.history[name].append(at)
                failed.append((name, cause))
            self._schedule(name, at, cause)
        if failed:
            self._computed_at = None
        return failed

    def nodes(self, now: float) -> tuple[Node, ...]:
        """The nodes as the engine sees them now: a failed node unhealthy until repaired, and,
        with lemon avoidance, every node's fault history."""
        repaired = any(now >= t > (self._computed_at or 0.0) for t in self.down_until.values())
        stale = self._computed_at is None or now - self._computed_at >= REFRESH_S
        if not (stale or repaired):
            return self._nodes
        at = self.epoch + timedelta(seconds=now)
        nodes = []
        for node in self.base:
            healthy = now >= self.down_until.get(node.name, -1.0)
            faults = 0.0
            if self.failures.avoid_lemons and self.history.get(node.name):
                times = [self.epoch + timedelta(seconds=t) for t in self.history[node.name]]
                faults = fault_score(times, at, FAULT_HALF_LIFE)
            if healthy != node.healthy or faults != node.faults:
                node = replace(node, healthy=healthy, faults=faults)
            nodes.append(node)
        self._nodes, self._computed_at = tuple(nodes), now
        return self._nodes
