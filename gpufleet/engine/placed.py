"""The nodes with the active workloads placed on them, and who uses how much.

This is what a cycle starts from and changes as it admits and preempts. A cycle places every
active workload of its snapshot. A replay that keeps one `Placed` between cycles (`decide(...,
placed=...)`) spares it that: the cycle then takes the state the last cycle left (after its own
decisions) and places or removes only the workloads that changed since. Where that could
place differently from placing everything, it places everything: other nodes, pools, teams or
reservations; a shared GPU's workload came or went (the snapshot names a pod's node, not its
GPU, so shared GPUs are packed in one order); nodes the autoscaler could still add; another
policy, or a clock that went back.

It keeps the cycle's possible victims (victims.py) the same way: a workload a cycle admits joins
them when the next cycle starts.
"""

from __future__ import annotations

import functools
import re
from collections import defaultdict
from datetime import datetime
from operator import attrgetter
from typing import Any

from gpufleet.engine.accounting import Accounting
from gpufleet.engine.placement import NEW_NODES, NodeState, PodPlacement, PoolCapacity
from gpufleet.engine.types import MILLI, Snapshot, Workload
from gpufleet.engine.victims import VictimIndex
from gpufleet.model.virtual_nodes import VIRTUAL_NODE, virtual_pool


class SnapshotError(ValueError):
    """The snapshot contradicts itself (e.g. a node holds more than its GPUs). `taken`: the
    workload's own nodes have too little room for it (its pods and others' on the same GPUs),
    not a gap of a moment such as nodes still being registered."""

    def __init__(self, workload: str, message: str, taken: bool = False) -> None:
        super().__init__(f"workload {workload}: {message}")
        self.workload = workload
        self.taken = taken


class Placed:
    def __init__(self) -> None:
        self.capacity: dict[str, PoolCapacity] = {}
        self.placements: dict[str, tuple[str, list[PodPlacement]]] = {}
        # the active workloads and those the last cycle admitted
        self.workloads: dict[str, Workload] = {}
        self.accounting: Accounting | None = None
        self.node_pools: dict[str, str] = {}
        self._basis: tuple[Any, ...] | None = None  # what it was placed for; None: nothing
        self._virtual = False  # there are nodes to provision
        self.victim_index: VictimIndex | None = None
        # elastic workloads admitted by the running cycle: possible victims from the next one
        self._admitted: set[str] = set()
        self._in_cycle = False

    def prepare(self, snapshot: Snapshot, active: list[Workload], young_since: datetime) -> None:
        """Place the snapshot's active workloads: only what changed where that is safe.
        `young_since`: work started after it is too young to yield to elastic work (R6)."""
        basis = (
            snapshot.nodes,
            snapshot.pools,
            snapshot.teams,
            snapshot.reservations,
            snapshot.policy,
        )
        same = (
            self._basis is not None
            and all(a is b for a, b in zip(basis, self._basis, strict=True))
            and self.victim_index is not None
            and young_since >= self.victim_index.young_since
        )
        self._basis = None  # until placed without error
        self._in_cycle = False
        if same:
            assert self.victim_index is not None
            self.victim_index.age(young_since)
        if not (same and not self._virtual and self._update(active)):
            self._build(snapshot, active, young_since)
        self._join_admitted()
        self._in_cycle = True
        self._basis = basis

    def forget(self) -> None:
        """Place everything again next time."""
        self._basis = None

    def _build(self, snapshot: Snapshot, active: list[Workload], young_since: datetime) -> None:
        self.accounting = Accounting(snapshot)
        self.victim_index = VictimIndex(snapshot.policy, young_since)
        self._admitted = set()
        self.placements, self.workloads = {}, {}
        self.capacity = _capacity(snapshot)
        self._virtual = any(n.virtual for c in self.capacity.values() for n in c.nodes)
        self.node_pools = {n: c.name for c in self.capacity.values() for n in c.by_name}
        # Whole GPUs first, then shared GPUs largest first: the snapshot says which node a pod
        # is on, not which GPU, and packing fractions in decreasing size always finds room if
        # any packing of the pods exists (first-fit decreasing; exact for sizes that divide a GPU
        # into quarters, the sizes the API allows).
        floating = []
        for workload in sorted(active, key=_placing_order):
            pool = self._floating_pool(workload)
            if pool is None:
                self._add_bound(workload)
            else:
                floating.append((workload, pool))
        for capacity in self.capacity.values():
            capacity.build_index()
        for workload, pool in floating:  # after the bound ones: not on a bound pod's GPUs
            self.commit(workload, pool, self._place_floating(workload, pool))

    def _update(self, active: list[Workload]) -> bool:
        """Bring the placements up to date with `active`; False where only placing everything
        again is right (a shared GPU's workload came or went)."""
        now = dict(zip(map(attrgetter("name"), active), active, strict=True))
        # known workloads no longer active, or active but changed where they run; workloads
        # the last cycle evicted are known but not placed
        gone = [self.workloads[name] for name in self.workloads.keys() - now.keys()]
        came = []
        known_of, placements = self.workloads.get, self.placements
        # most are the very objects of the last cycle, still placed: one pass skips them
        for workload in [
            w for w in active if known_of(w.name) is not w or w.name not in placements
        ]:
            name = workload.name
            known = known_of(name)
            if known is not None and name in placements and _places_alike(known, workload):
                self.workloads[name] = workload  # its state changed, not where it runs
                self._victim_changed(workload)
                continue
            came.append(workload)
            if known is not None:
                gone.append(known)
        if any(w.fractional for w in (*gone, *came)):
            return False
        for workload in gone:
            if workload.name in self.placements:
                self.remove(workload.name)
            else:
                del self.workloads[workload.name]
        for workload in sorted(came, key=_placing_order):
            self.add(workload)
        return True

    def _victim_changed(self, workload: Workload) -> None:
        """A placed workload's state changed (its cost as a victim may have)."""
        index = self.victim_index
        assert index is not None
        if workload.name in index:
            index.remove(workload.name)
            index.add(workload, self.placements[workload.name][0])

    def _join_admitted(self) -> None:
        """The elastic workloads the last cycle admitted become possible victims."""
        index = self.victim_index
        assert index is not None
        for name in sorted(self._admitted):
            if name in self.placements and name not in index:
                index.add(self.workloads[name], self.placements[name][0])
        self._admitted.clear()

    def admitted_teams(self) -> set[str]:
        """The teams of the elastic work the running cycle admitted (and has not evicted)."""
        return {self.workloads[name].team for name in self._admitted}

    def _floating_pool(self, workload: Workload) -> str | None:
        """The pool of an admitted workload with pods that wait for room (a node still to be
        provisioned, or anywhere in the pool); None for a workload with every pod on a node."""
        pools = {virtual_pool(node) or self.node_pools.get(node) for node in workload.nodes}
        if len(pools) != 1 or None in pools or not pools <= self.capacity.keys():
            return None
        if all(virtual_pool(node) is None for node in workload.nodes):
            return None
        return pools.pop()

    def add(self, workload: Workload) -> None:
        """Record where an active workload runs. Pods that wait for room (named after a node
        still to be provisioned) take it wherever they can go in the pool, real nodes first,
        as kube-scheduler will bind them: the names of nodes to be provisioned hold only for
        the cycle that chose them (as nodes come up, fewer are left to provision, and a later
        admission reuses a name), so counting the pods on those names would count two
        workloads on one node, or one on a node that is gone, and let the next workload take
        the nodes provisioned for them."""
        floating = self._floating_pool(workload)
        if floating is None:
            self._add_bound(workload)
        else:
            self.commit(workload, floating, self._place_floating(workload, floating))

    def _add_bound(self, workload: Workload) -> None:
        """Record an active workload with every pod on a node."""
        nodes = workload.nodes
        pools = {self.node_pools.get(node) for node in nodes}
        if len(nodes) != workload.pods or len(pools) != 1 or None in pools:
            raise SnapshotError(
                workload.name,
                f"needs one known node per pod, all in one pool; has {workload.pods} pod(s) on "
                f"{', '.join(nodes) or 'no nodes'} (pools: "
                f"{', '.join(sorted(str(p) for p in pools)) or 'none'})",
            )
        pool = pools.pop()
        assert pool is not None and self.accounting is not None
        try:
            pods = self.capacity[pool].place_on(workload, nodes)
        except ValueError as err:
            raise SnapshotError(workload.name, str(err), taken=True) from err
        self.commit(workload, pool, pods)

    def _place_floating(self, workload: Workload, pool: str) -> list[PodPlacement]:
        capacity = self.capacity[pool]
        bound = tuple(node for node in workload.nodes if virtual_pool(node) is None)
        if not bound:
            placed = capacity.place(workload, new_nodes=True)  # the whole gang, in one zone
        else:
            try:
                placed = capacity.place_on(workload, bound)
            except ValueError as err:
                raise SnapshotError(workload.name, str(err), taken=True) from err
            zones = [placed[0].node.zone, NEW_NODES]  # beside its bound pods, else new nodes
            for _ in range(len(workload.nodes) - len(bound)):
                pod = next(filter(None, (capacity.choose(workload, z) for z in zones)), None)
                if pod is None:
                    for done in placed:
                        capacity.release(done)
                    placed = None
                    break
                capacity.allocate(pod)
                placed.append(pod)
        if placed is None:
            raise SnapshotError(
                workload.name, f"has pods that wait for room in pool {pool}, and none is left"
            )
        return placed

    def commit(self, workload: Workload, pool: str, pods: list[PodPlacement]) -> None:
        """Count a workload as running on `pods` (their GPUs already taken)."""
        assert self.accounting is not None
        self.placements[workload.name] = (pool, pods)
        self.workloads[workload.name] = workload
        self.accounting.add(workload, pool)
        count_reserved(self.capacity[pool], workload, pods, 1)
        assert self.victim_index is not None
        if self._in_cycle:
            if not workload.reserved:
                self._admitted.add(workload.name)
        else:
            self.victim_index.add(workload, pool)

    def release(self, name: str) -> None:
        """Take a workload off its GPUs (evicted in this cycle: it stays known till the next)."""
        assert self.accounting is not None
        pool, pods = self.placements.pop(name)
        workload = self.workloads[name]
        self.evicted(name)
        count_reserved(self.capacity[pool], workload, pods, -1)
        for pod in pods:
            self.capacity[pool].release(pod)
        self.accounting.remove(workload, pool)

    def evicted(self, name: str) -> None:
        """No longer a possible victim: taken off its GPUs, or by a cycle's preemption."""
        assert self.victim_index is not None
        self.victim_index.remove(name)
        self._admitted.discard(name)

    def remove(self, name: str) -> None:
        """Forget a workload that no longer runs."""
        self.release(name)
        del self.workloads[name]


def count_reserved(
    capacity: PoolCapacity, workload: Workload, pods: list[PodPlacement], sign: int
) -> None:
    if workload.reserved:
        for pod in pods:
            capacity.add_reserved(pod.node, sign * (pod.gpus * MILLI + pod.milli))


def _placing_order(workload: Workload) -> tuple[bool, int, str]:
    return (workload.fractional, -workload.milli_per_pod, workload.name)


def _places_alike(a: Workload, b: Workload) -> bool:
    """Whether two versions of a workload hold the same GPUs and count the same."""
    return (a.nodes, a.team, a.reserved, a.milli_per_pod, a.pods) == (
        b.nodes,
        b.team,
        b.reserved,
        b.milli_per_pod,
        b.pods,
    )


def _capacity(snapshot: Snapshot) -> dict[str, PoolCapacity]:
    by_pool: dict[str, list[NodeState]] = defaultdict(list)
    for node in sorted(snapshot.nodes, key=lambda n: natural_key(n.name)):
        if node.pool in snapshot.pools:
            by_pool[node.pool].append(
                NodeState(
                    node.name,
                    node.pool,
                    node.zone,
                    node.gpus,
                    node.healthy and node.schedulable,  # where new work may go
                    len(by_pool[node.pool]),
                    tier=1 if node.lemon else 0,
                    domains=(node.clique, node.block),
                    cpu_free=node.cpu_free,
                    memory_free=node.memory_free,
                )
            )
    capacity = {}
    for name in sorted(snapshot.pools):
        pool = snapshot.pools[name]
        nodes = by_pool[name]
        if pool.autoscaling and pool.gpus_per_node:
            existing = sum(n.capacity for n in nodes)
            for i in range(max(pool.max_gpus - existing, 0) // pool.gpus_per_node):
                nodes.append(
                    NodeState(
                        f"{name}{VIRTUAL_NODE}{i + 1}",
                        name,
                        "",
                        pool.gpus_per_node,
                        True,
                        len(nodes),
                        virtual=True,
                    )
                )
        capacity[name] = PoolCapacity(name, nodes, indexed=False)
    return capacity


@functools.lru_cache(maxsize=65536)
def natural_key(name: str) -> tuple[tuple[int, int | str], ...]:
    """h100-2 before h100-10: node order is what people read in placements."""
    return tuple(
        (0, int(part)) if part.isdigit() else (1, part) for part in re.split(r"(\d+)", name) if part
    )
