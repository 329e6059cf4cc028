"""Autoscaled capacity for the simulator: pools that grow through Karpenter (provider aws or gcp)
start empty, get a node when the engine places work on a node to provision, and lose it once it
has been empty for the pool's `consolidateAfter` (Karpenter's WhenEmpty consolidation, as
gpufleet renders the NodePools).

A new node is ready `delay_s` after the decision; the work placed on it holds its GPUs from the
decision and starts when the node is ready. Static pools keep all their nodes.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from gpufleet.engine import Node
from gpufleet.model.durations import parse_duration
from gpufleet.model.fleet import Fleet

NEW_NODE = "/new-"  # the engine's name of a node to provision: "<pool>/new-<n>"


class Provisioner:
    def __init__(self, fleet: Fleet, nodes: tuple[Node, ...], delay_s: float) -> None:
        self.delay_s = delay_s
        self.autoscaled = {
            name for name, pool in fleet.pools.items() if pool.spec.provider != "static"
        }
        self.fixed = tuple(n for n in nodes if n.pool not in self.autoscaled)
        self.shape = {
            name: (pool.spec.gpus_per_node, pool.spec.zones[0] if pool.spec.zones else "")
            for name, pool in fleet.pools.items()
        }
        self.consolidate_after_s = {
            name: parse_duration(fleet.pools[name].spec.consolidate_after).total_seconds()
            for name in self.autoscaled
        }
        self.nodes: dict[str, Node] = {}
        self.ready_at: dict[str, float] = {}
        self.created_at: dict[str, float] = {}
        self.empty_since: dict[str, float] = {}
        self.counters: dict[str, int] = defaultdict(int)
        self.current: tuple[Node, ...] = self.fixed  # the nodes the engine sees
        self.provisioned = 0
        self.removed = 0
        # GPU-seconds of autoscaled nodes per pool, from the decision to the removal
        self.node_gpu_s: dict[str, float] = defaultdict(float)
        self.waits: list[float] = []  # per admission that waited for a node, seconds
        self.waiting_gpu_s = 0.0  # GPU-seconds held by work waiting for its nodes

    def place(
        self, nodes: tuple[str, ...], new: dict[str, str], gpus_per_pod: float, now: float
    ) -> tuple[tuple[str, ...], float]:
        """The real nodes of an admission, provisioning those the engine named new (`new` maps
        this cycle's new-node names, which several admissions may share), and when the work can
        start: when the last of its nodes is ready."""
        for name in nodes:
            if NEW_NODE in name and name not in new:
                pool = name.split(NEW_NODE)[0]
                self.counters[pool] += 1
                real = f"{pool}-{self.counters[pool]}"
                gpus, zone = self.shape[pool]
                self.nodes[real] = Node(real, pool, gpus, zone)
                self.ready_at[real] = now + self.delay_s
                self.created_at[real] = now
                self.provisioned += 1
                new[name] = real
                self.current = self.fixed + tuple(self.nodes.values())
        placed = tuple(new.get(n, n) for n in nodes)
        start = max([now, *(self.ready_at.get(n, now) for n in placed)])
        if start > now:
            self.waits.append(start - now)
            self.waiting_gpu_s += (start - now) * gpus_per_pod * len(placed)
        return placed, start

    def consolidate(self, used: dict[str, float], now: float) -> None:
        """Remove the nodes empty for their pool's consolidateAfter; note when others emptied."""
        gone = []
        for name, node in self.nodes.items():
            if used.get(name, 0.0) > 0:
                self.empty_since.pop(name, None)
                continue
            since = self.empty_since.setdefault(name, now)
            if now - since >= self.consolidate_after_s[node.pool]:
                gone.append(name)
        for name in gone:
            self._account(name, now)
            del self.nodes[name], self.ready_at[name], self.empty_since[name]
            self.removed += 1
        if gone:
            self.current = self.fixed + tuple(self.nodes.values())

    def next_removal(self) -> float | None:
        times = [
            since + self.consolidate_after_s[self.nodes[name].pool]
            for name, since in self.empty_since.items()
        ]
        return min(times) if times else None

    def finish(self, now: float) -> None:
        for name in list(self.nodes):
            self._account(name, now)

    def _account(self, name: str, now: float) -> None:
        node = self.nodes[name]
        self.node_gpu_s[node.pool] += (now - self.created_at.pop(name)) * node.gpus

    def metrics(self) -> dict[str, Any]:
        waits = sorted(self.waits)
        return {
            "delay_s": self.delay_s,
            "nodes_provisioned": self.provisioned,
            "nodes_removed": self.removed,
            "autoscaled_gpu_hours": round(sum(self.node_gpu_s.values()) / 3600, 3),
            "admissions_that_waited_for_nodes": len(waits),
            "gpu_hours_waiting_for_nodes": round(self.waiting_gpu_s / 3600, 3),
        }
