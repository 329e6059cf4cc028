"""Free GPU capacity of the nodes of one pool, indexed for fast best-fit placement (R8).

Each node has whole free GPUs and *shared* GPUs (slots) with some free milli-GPUs. Healthy nodes
are indexed by (zone, tier, free whole GPUs) and shared slots by (zone, tier, free milli),
with exact counts and lazily cleaned heaps, so finding the best-fitting node is O(GPUs per
node), not O(nodes). The tier is 1 for a lemon node (recent faults), else 0: critical work
(reserved, gangs) looks at tier 0 first, other work at tier 1 first (R-lemon). Nodes Karpenter
could still add to an autoscaling pool appear as *virtual* nodes in a zone of their own
(`NEW_NODES`), used only where the rules allow scaling up (R7).

Where nodes report their free CPU or memory (`cpu_free`, `memory_free`: the controllers, from
the nodes' allocatable; the packing benchmark, CPU), a pod also needs its CPU and memory on the
node, a gang's topology domain is counted in pods that fit all three, and single pods are
placed where they strand the fewest GPUs for lack of CPU (`stranding.py`), by a scan of the
zone's nodes instead of the index. The index's counts then bound what fits from above: `place`
may still find no node.
"""

from __future__ import annotations

import bisect
import heapq
from collections import defaultdict
from typing import NamedTuple

from gpufleet.engine.stranding import CpuProfile
from gpufleet.engine.types import MILLI, TOPOLOGY_LEVELS, Workload

NEW_NODES = "(new nodes)"  # the zone key of virtual nodes, sorted after every real zone
TIERS = (0, 1)


def tiers_for(workload: Workload) -> tuple[int, int]:
    """The order in which a workload looks at reliable (0) and lemon (1) nodes."""
    return (0, 1) if workload.critical else (1, 0)


class NodeState:
    __slots__ = (
        "capacity",
        "cpu_free",
        "domains",
        "healthy",
        "index",
        "memory_free",
        "name",
        "next_slot",
        "partial",
        "pool",
        "reserved",
        "tier",
        "virtual",
        "whole_free",
        "zone",
    )

    def __init__(
        self,
        name: str,
        pool: str,
        zone: str,
        capacity: int,
        healthy: bool,
        index: int,
        virtual: bool = False,
        tier: int = 0,
        domains: tuple[str, ...] = (),
        cpu_free: int | None = None,
        memory_free: int | None = None,
    ) -> None:
        self.name = name
        self.pool = pool
        self.zone = NEW_NODES if virtual else zone
        self.capacity = capacity
        self.healthy = healthy
        self.index = index
        self.virtual = virtual
        self.whole_free = capacity
        self.partial: dict[int, int] = {}  # shared GPU slot -> free milli-GPUs (1..999; 0: full)
        self.next_slot = 0
        self.reserved = 0  # milli-GPUs held by reserved work (never preempted)
        self.tier = tier  # 1: a lemon node (recent faults), 0: the others
        # topology domains inside the zone, smallest first (clique, block), "" where unknown;
        # () for a node with none, so that the index's hot path skips them at once
        self.domains = domains if any(domains) else ()
        self.cpu_free = cpu_free  # milli-CPU; None: not known, not checked
        self.memory_free = memory_free  # MiB; None: not known, not checked

    def has_room(self, cpu: int, memory: int) -> bool:
        """Whether a pod's CPU and memory fit (where the node reports them)."""
        return (not cpu or self.cpu_free is None or self.cpu_free >= cpu) and (
            not memory or self.memory_free is None or self.memory_free >= memory
        )

    def pods_fitting(self, gpus: int, cpu: int, memory: int) -> int:
        """Pods of `gpus` whole GPUs, `cpu` and `memory` each that fit on the node now."""
        fits = self.whole_free // gpus
        if cpu and self.cpu_free is not None:
            fits = min(fits, max(self.cpu_free, 0) // cpu)
        if memory and self.memory_free is not None:
            fits = min(fits, max(self.memory_free, 0) // memory)
        return fits

    @property
    def free_milli(self) -> int:
        return self.whole_free * MILLI + sum(self.partial.values())


class PodPlacement(NamedTuple):
    """Where one pod sits: `gpus` whole GPUs, or `milli` of shared slot `slot`, and `cpu`
    milli-CPU and `memory` MiB (a tuple: every cycle records one per running pod)."""

    node: NodeState
    gpus: int = 0
    slot: int | None = None
    milli: int = 0
    cpu: int = 0
    memory: int = 0


# what `PoolCapacity._scan` finds: its key, the node and, for a shared GPU in use, its slot
_Scanned = tuple[tuple[int, int, int, int], NodeState, int | None]


class PoolCapacity:
    def __init__(
        self,
        name: str,
        nodes: list[NodeState],
        indexed: bool = True,
        cpu_profile: CpuProfile | None = None,
    ) -> None:
        """With `indexed=False` the index is built by `build_index()`, once the workloads
        already running have been recorded with `place_on` (one pass instead of one update per
        pod). `cpu_profile`: the CPU requests of GPU pods, where nodes report free CPU."""
        self.name = name
        self.nodes = nodes
        self.cpu_profile = cpu_profile or CpuProfile(())
        self.tracks_room = any(n.cpu_free is not None or n.memory_free is not None for n in nodes)
        self.by_name = {n.name: n for n in nodes}
        self.max_node_gpus = max((n.capacity for n in nodes), default=0)
        self._whole_count: dict[tuple[str, int, int], int] = defaultdict(int)
        self._whole_heap: dict[tuple[str, int, int], list[int]] = defaultdict(list)
        self._slot_count: dict[tuple[str, int, int], int] = defaultdict(int)
        self._slot_heap: dict[tuple[str, int, int], list[tuple[int, int]]] = defaultdict(list)
        # per (zone, tier), the free milli-GPU amounts some shared GPU has, sorted: a pod's
        # best fit is the first amount at or above its size (up to 999 amounts, few in use)
        self._slot_frees: dict[tuple[str, int], list[int]] = defaultdict(list)
        self._zone_free: dict[str, int] = defaultdict(int)  # free milli-GPUs of healthy nodes
        self.reserved_nodes: set[int] = set()  # indices of nodes holding reserved work
        self.zones = sorted({n.zone for n in nodes if n.healthy and not n.virtual})
        # nodes by topology level (0: clique, 1: block), zone and domain, where labelled
        self.domains: dict[tuple[int, str], dict[str, list[NodeState]]] = defaultdict(
            lambda: defaultdict(list)
        )
        for node in nodes:
            for level, domain in enumerate(node.domains):
                if domain:
                    self.domains[(level, node.zone)][domain].append(node)
        # per domain, its healthy nodes by whole free GPUs (kept with the index): what a
        # domain holds is a sum over a few free levels, not over its nodes
        self._domain_whole: dict[tuple[int, str, str], dict[int, int]] = defaultdict(
            lambda: defaultdict(int)
        )
        if any(n.virtual for n in nodes):
            self.zones.append(NEW_NODES)
        self._zones_for: dict[tuple[str | None, bool], list[str]] = {}
        # the last `_scan` and what it depended on: ranking a workload's pools (`fit_key`)
        # and then placing it in the chosen one ask the same question of the same nodes
        self._changes = 0  # allocations, releases and reservations so far
        self._last_scan: tuple[tuple[object, ...], _Scanned | None] | None = None
        self._indexed = False
        if indexed:
            self.build_index()

    def build_index(self) -> None:
        assert not self._indexed
        self._indexed = True
        for node in self.nodes:
            self._index(node)

    # --- index maintenance -------------------------------------------------------------------

    def _index(self, node: NodeState) -> None:
        if not node.healthy:
            return
        self._zone_free[node.zone] += node.free_milli
        key = (node.zone, node.tier, node.whole_free)
        self._whole_count[key] += 1
        if node.domains:
            self._count_domains(node, 1)
        heapq.heappush(self._whole_heap[key], node.index)
        for slot, free in node.partial.items():
            if free:
                key = (node.zone, node.tier, free)
                self._slot_count[key] += 1
                if self._slot_count[key] == 1:
                    bisect.insort(self._slot_frees[(node.zone, node.tier)], free)
                heapq.heappush(self._slot_heap[key], (node.index, slot))

    def _unindex(self, node: NodeState) -> None:
        if not node.healthy:
            return
        self._zone_free[node.zone] -= node.free_milli
        self._whole_count[(node.zone, node.tier, node.whole_free)] -= 1
        if node.domains:
            self._count_domains(node, -1)
        for free in node.partial.values():
            if free:
                key = (node.zone, node.tier, free)
                self._slot_count[key] -= 1
                if not self._slot_count[key]:
                    frees = self._slot_frees[(node.zone, node.tier)]
                    del frees[bisect.bisect_left(frees, free)]

    def _count_domains(self, node: NodeState, sign: int) -> None:
        for level, domain in enumerate(node.domains):
            if domain:
                self._domain_whole[(level, node.zone, domain)][node.whole_free] += sign

    # --- queries ---------------------------------------------------------------------------

    def whole_capacity(self, gpus: int, zone: str) -> int:
        """How many pods of `gpus` whole GPUs fit in `zone` (pods without GPUs: one per
        node; CPU is not counted)."""
        if gpus == 0:
            return sum(
                self._whole_count[(zone, tier, free)]
                for tier in TIERS
                for free in range(self.max_node_gpus + 1)
            )
        return sum(
            self._whole_count[(zone, tier, free)] * (free // gpus)
            for tier in TIERS
            for free in range(gpus, self.max_node_gpus + 1)
        )

    def _has_slot(self, milli: int, zone: str) -> bool:
        for tier in TIERS:
            frees = self._slot_frees[(zone, tier)]
            if frees and frees[-1] >= milli:
                return True
        return False

    def zones_for(self, workload: Workload, new_nodes: bool) -> list[str]:
        """The zones the workload may run in (not to be changed: one list per question)."""
        key = (workload.zone, new_nodes)
        zones = self._zones_for.get(key)
        if zones is None:
            zones = [z for z in self.zones if z != NEW_NODES]
            if workload.zone is not None:
                zones = [z for z in zones if z == workload.zone]
            if new_nodes and NEW_NODES in self.zones:
                zones.append(NEW_NODES)
            self._zones_for[key] = zones
        return zones

    def fit_zone(self, workload: Workload, new_nodes: bool = False) -> str | None:
        """The zone the workload fits in now (all pods of a gang in one zone), or None."""
        for zone in self.zones_for(workload, new_nodes):
            if self._zone_free[zone] < workload.total_milli:
                continue  # not even counting GPUs apart (the common answer in a full pool)
            if workload.fractional:
                if self._has_slot(workload.milli_per_pod, zone) or self.whole_capacity(1, zone):
                    return zone
            elif workload.topology is not None and workload.pods > 1:
                if self.domain_capacity(workload, zone) >= workload.pods:
                    return zone
            elif self.whole_capacity(workload.milli_per_pod // MILLI, zone) >= workload.pods:
                return zone
        return None

    def domain_capacity(self, workload: Workload, zone: str) -> int:
        """Most pods of the workload that fit together in one domain of its required
        topology level in `zone` (0 where no node of the zone is labelled at that level)."""
        level = TOPOLOGY_LEVELS.index(workload.topology or "block")
        return max(
            (
                self._domain_fit(level, zone, name, workload)
                for name in self.domains.get((level, zone), {})
            ),
            default=0,
        )

    def _domain_fit(self, level: int, zone: str, domain: str, workload: Workload) -> int:
        """Pods of the workload (whole GPUs, its CPU and memory) that fit on the domain's
        healthy nodes."""
        gpus = max(workload.milli_per_pod // MILLI, 1)
        if not self._indexed or self.tracks_room:
            members = self.domains[(level, zone)][domain]
            return sum(
                n.pods_fitting(gpus, workload.cpu, workload.memory) for n in members if n.healthy
            )
        counts = self._domain_whole[(level, zone, domain)]
        return sum(count * (free // gpus) for free, count in counts.items() if count)

    def free_milli(self, zones: list[str]) -> int:
        """Free milli-GPUs on the healthy existing nodes of these zones."""
        free = 0
        for zone in zones:  # a loop: one or two zones, asked for every preemption question
            if zone != NEW_NODES:
                free += self._zone_free[zone]
        return free

    def best_gang_capacity(self, workload: Workload) -> int:
        """Most pods of the workload that fit in one zone, or in one domain of its required
        topology level (for WaitingForGang messages)."""
        if workload.topology is not None:
            return max(
                (self.domain_capacity(workload, z) for z in self.zones_for(workload, False)),
                default=0,
            )
        gpus = max(workload.milli_per_pod // MILLI, 1)
        return max(
            (self.whole_capacity(gpus, z) for z in self.zones_for(workload, False)), default=0
        )

    # --- placement ---------------------------------------------------------------------------

    def _best_whole_node(
        self, gpus: int, zone: str, tiers: tuple[int, ...] = TIERS
    ) -> NodeState | None:
        """Best fit within the first tier that has room: the node with the fewest free GPUs
        that still fits (keeps empty nodes whole for large jobs); ties go to the first node by
        name."""
        for tier in tiers:
            for free in range(gpus, self.max_node_gpus + 1):
                key = (zone, tier, free)
                if not self._whole_count[key]:
                    continue
                heap = self._whole_heap[key]
                while heap:
                    node = self.nodes[heap[0]]
                    if node.whole_free == free and node.healthy:
                        return node
                    heapq.heappop(heap)
        return None

    def _best_slot(
        self, milli: int, zone: str, tiers: tuple[int, ...] = TIERS
    ) -> tuple[NodeState, int] | None:
        for tier in tiers:
            frees = self._slot_frees[(zone, tier)]
            for free in frees[bisect.bisect_left(frees, milli) :]:
                key = (zone, tier, free)
                heap = self._slot_heap[key]
                while heap:
                    index, slot = heap[0]
                    node = self.nodes[index]
                    if node.partial.get(slot) == free and node.healthy:
                        return node, slot
                    heapq.heappop(heap)
        return None

    def place(self, workload: Workload, new_nodes: bool = False) -> list[PodPlacement] | None:
        """Place every pod or none (gangs are all-or-nothing); commits on success."""
        zone = self.fit_zone(workload, new_nodes)
        if zone is None:
            return None
        if workload.pods > 1 and not workload.fractional:
            together = self._gang_by_topology(workload, zone)
            if together is not None:
                for placed in together:
                    self.allocate(placed)
                return together
            assert workload.topology is None, "fit_zone said one domain holds the gang"
        placements: list[PodPlacement] = []
        for _ in range(workload.pods):
            pod = self.choose(workload, zone)
            if pod is None:  # only where CPU is checked: fit_zone counts GPUs alone
                assert self.tracks_room, "fit_zone said the workload fits"
                for placed in placements:
                    self.release(placed)
                return None
            self.allocate(pod)
            placements.append(pod)
        return placements

    def _gang_by_topology(self, workload: Workload, zone: str) -> list[PodPlacement] | None:
        """A gang's pods in one NVLink clique, else one block, else the fewest blocks of `zone`
        (nothing is taken). Of the domains that fit, the one with the least room to spare
        (large domains stay whole for large gangs); in a domain, nodes best fit, lemons last
        for critical work. None where the nodes carry no topology labels or their domains
        cannot hold the gang together: it is then placed across the zone."""
        required = workload.topology
        levels = (TOPOLOGY_LEVELS.index(required),) if required else (0, 1)
        for level in levels:
            domains = self.domains.get((level, zone))
            if not domains:
                continue
            fits = sorted((self._domain_fit(level, zone, name, workload), name) for name in domains)
            chosen = self._fewest_domains(fits, workload.pods, spread=level == 1 and not required)
            if chosen is not None:
                return self._fill(workload, [(domains[name], fit) for fit, name in chosen])
        return None

    @staticmethod
    def _fewest_domains(
        fits: list[tuple[int, str]], pods: int, spread: bool
    ) -> list[tuple[int, str]] | None:
        """Domains (pods that fit, name) for `pods`: the tightest single one, else (`spread`)
        the fewest: the largest until one covers the rest, then the tightest that does."""
        chosen: list[tuple[int, str]] = []
        left = [f for f in fits if f[0] > 0]
        while pods > 0 and left:
            covering = [f for f in left if f[0] >= pods]
            if covering:
                chosen.append(covering[0])  # `fits` is sorted: the tightest first
                return chosen
            if not spread:
                return None
            largest = min(left, key=lambda f: (-f[0], f[1]))
            chosen.append(largest)
            left.remove(largest)
            pods -= largest[0]
        return None

    def _fill(
        self, workload: Workload, domains: list[tuple[list[NodeState], int]]
    ) -> list[PodPlacement]:
        gpus = workload.milli_per_pod // MILLI
        cpu, memory = workload.cpu, workload.memory
        order = tiers_for(workload)
        pods: list[PodPlacement] = []
        for members, fit in domains:
            # GPUs each node has left, and pods of this gang it can still take (GPUs, CPU and
            # memory), as the gang fills it
            left = {n.index: n.whole_free for n in members}
            takes = {n.index: n.pods_fitting(gpus, cpu, memory) for n in members}
            for _ in range(min(fit, workload.pods - len(pods))):
                node = min(
                    (n for n in members if n.healthy and takes[n.index] > 0),
                    key=lambda n: (order.index(n.tier), left[n.index], n.index),
                )
                left[node.index] -= gpus
                takes[node.index] -= 1
                pods.append(PodPlacement(node, gpus=gpus, cpu=cpu, memory=memory))
        return pods

    def add_reserved(self, node: NodeState, milli: int) -> None:
        self._changes += 1
        node.reserved += milli
        if node.reserved > 0:
            self.reserved_nodes.add(node.index)
        else:
            self.reserved_nodes.discard(node.index)

    def place_reserved(self, workload: Workload) -> list[PodPlacement] | None:
        """Place reserved work on free GPUs beside reserved work: on the node that already
        holds the most (then best fit), else as any work. Reserved work is never preempted, so
        reserved pods spread over many nodes would leave no node that evicting elastic work can
        empty, and a team's whole-node job could wait although its reservation covers it (R1).
        Single whole-GPU pods only; other shapes are placed as any work."""
        if workload.pods != 1 or workload.fractional or not self.reserved_nodes:
            return self.place(workload)
        gpus = workload.milli_per_pod // MILLI
        zones = set(self.zones_for(workload, new_nodes=False))
        best = None
        for index in self.reserved_nodes:
            node = self.nodes[index]
            fits = node.whole_free >= gpus and node.has_room(workload.cpu, workload.memory)
            if not fits or not node.healthy or node.zone not in zones:
                continue
            if best is None or (-node.tier, node.reserved, -node.whole_free, -node.index) > (
                -best.tier,
                best.reserved,
                -best.whole_free,
                -best.index,
            ):
                best = node
        if best is None:
            return self.place(workload)
        pod = PodPlacement(best, gpus=gpus, cpu=workload.cpu, memory=workload.memory)
        self.allocate(pod)
        return [pod]

    def choose(self, workload: Workload, zone: str) -> PodPlacement | None:
        """Where one pod of the workload would go in `zone` (nothing is taken)."""
        if self.tracks_room:
            return self._choose_by_room(workload, zone)
        tiers = tiers_for(workload)
        if workload.fractional:
            milli = workload.milli_per_pod
            found = self._best_slot(milli, zone, tiers)
            if found is not None:
                return PodPlacement(found[0], slot=found[1], milli=milli)
            node = self._best_whole_node(1, zone, tiers)
            if node is None:
                return None
            node.next_slot += 1
            return PodPlacement(node, slot=node.next_slot, milli=milli)
        gpus = workload.milli_per_pod // MILLI
        node = self._best_whole_node(gpus, zone, tiers)
        return None if node is None else PodPlacement(node, gpus=gpus)

    def fit_key(self, workload: Workload) -> tuple[int, int, int, int]:
        """How well a single pod of the workload fits the pool now, lower is better, comparable
        across pools (choice.py ranks a workload's pools by it): (0, tier, GPUs stranded for
        lack of CPU, free GPU room left where it lands) as `choose` picks its node; a gang, or
        a pod that fits nowhere: (1, -free milli-GPUs, 0, 0), the emptiest pool first."""
        if workload.pods == 1 or workload.fractional:
            zone = self.fit_zone(workload)
            if zone is not None:
                if self.tracks_room:
                    found = self._scan(workload, zone)
                    if found is not None:
                        return (0, *found[0][:3])
                else:
                    key = self._indexed_fit(workload, zone)
                    if key is not None:
                        return key
        return (1, -self.free_milli(self.zones), 0, 0)

    def _indexed_fit(self, workload: Workload, zone: str) -> tuple[int, int, int, int] | None:
        """`fit_key` by the index (nodes that do not report CPU), as `choose` picks."""
        tiers = tiers_for(workload)
        if workload.fractional:
            found = self._best_slot(workload.milli_per_pod, zone, tiers)
            if found is not None:
                node, slot = found
                return (0, tiers.index(node.tier), 0, node.partial[slot])
            whole = self._best_whole_node(1, zone, tiers)
            if whole is None:
                return None
            return (0, tiers.index(whole.tier), 0, MILLI + whole.whole_free)
        whole = self._best_whole_node(workload.milli_per_pod // MILLI, zone, tiers)
        return None if whole is None else (0, tiers.index(whole.tier), 0, whole.whole_free)

    def _choose_by_room(self, workload: Workload, zone: str) -> PodPlacement | None:
        """`choose` where nodes report free CPU or memory (`_scan`)."""
        found = self._scan(workload, zone)
        if found is None:
            return None
        _, node, slot = found
        milli, cpu, memory = workload.milli_per_pod, workload.cpu, workload.memory
        if not workload.fractional:
            return PodPlacement(node, gpus=milli // MILLI, cpu=cpu, memory=memory)
        if slot is None:
            node.next_slot += 1
            slot = node.next_slot
        return PodPlacement(node, slot=slot, milli=milli, cpu=cpu, memory=memory)

    def _scan(self, workload: Workload, zone: str) -> _Scanned | None:
        """Of the nodes with the pod's GPUs, CPU and memory free, the one that strands the
        fewest GPUs, then as `choose` decides by the index (tier; the fullest shared GPU, else
        the fewest whole GPUs free; the first by name): its key, the node and, for a shared
        GPU already in use, its slot."""
        milli, cpu, memory = workload.milli_per_pod, workload.cpu, workload.memory
        order = tiers_for(workload)
        asked = (self._changes, zone, milli, cpu, memory, workload.fractional, order)
        if self._last_scan is not None and self._last_scan[0] == asked:
            return self._last_scan[1]
        best = self._scan_nodes(workload, zone, order)
        self._last_scan = (asked, best)
        return best

    def _scan_nodes(self, workload: Workload, zone: str, order: tuple[int, int]) -> _Scanned | None:
        milli, cpu, memory = workload.milli_per_pod, workload.cpu, workload.memory
        gpus = milli // MILLI
        profile = self.cpu_profile
        best: _Scanned | None = None
        for node in self.nodes:
            if node.zone != zone or not node.healthy or not node.has_room(cpu, memory):
                continue
            slot = None
            if workload.fractional:
                slot = _best_fitting_slot(node, milli)
                if slot is not None:
                    fit = node.partial[slot]
                elif node.whole_free >= 1:
                    fit = MILLI + node.whole_free
                else:
                    continue
            elif node.whole_free >= gpus:
                fit = node.whole_free
            else:
                continue
            strands = 0
            if profile and node.cpu_free is not None:
                strands = profile.step(node.free_milli, node.cpu_free, milli, cpu)
            key = (order.index(node.tier), strands, fit, node.index)
            if best is None or key < best[0]:
                best = (key, node, slot)
        return best

    def place_on(self, workload: Workload, node_names: tuple[str, ...]) -> list[PodPlacement]:
        """Record where an active workload already runs; raises ValueError if it cannot be."""
        placements = []
        for name in node_names:
            node = self.by_name[name]
            if workload.fractional:
                milli = workload.milli_per_pod
                slot = _best_fitting_slot(node, milli)
                if slot is not None:
                    pod = PodPlacement(
                        node, slot=slot, milli=milli, cpu=workload.cpu, memory=workload.memory
                    )
                elif node.whole_free >= 1:
                    node.next_slot += 1
                    pod = PodPlacement(
                        node,
                        slot=node.next_slot,
                        milli=milli,
                        cpu=workload.cpu,
                        memory=workload.memory,
                    )
                else:
                    raise ValueError(f"node {name} has no room for {workload.gpus} GPU")
            else:
                gpus = workload.milli_per_pod // MILLI
                if node.whole_free < gpus:
                    raise ValueError(
                        f"node {name} is over-allocated: {workload.name} needs {gpus} GPUs, "
                        f"{node.whole_free} of {node.capacity} are free"
                    )
                pod = PodPlacement(node, gpus=gpus, cpu=workload.cpu, memory=workload.memory)
            self.allocate(pod)
            placements.append(pod)
        return placements

    def allocate(self, pod: PodPlacement) -> None:
        self._changes += 1
        node = pod.node
        if not self._indexed:
            _take(node, pod)
            return
        self._unindex(node)
        _take(node, pod)
        self._index(node)

    def release(self, pod: PodPlacement) -> None:
        self._changes += 1
        node = pod.node
        self._unindex(node)
        if node.cpu_free is not None:
            node.cpu_free += pod.cpu
        if node.memory_free is not None:
            node.memory_free += pod.memory
        if pod.slot is None:
            node.whole_free += pod.gpus
        else:
            node.partial[pod.slot] += pod.milli
            if node.partial[pod.slot] == MILLI:
                del node.partial[pod.slot]
                node.whole_free += 1
        self._index(node)


def _best_fitting_slot(node: NodeState, milli: int) -> int | None:
    """The node's shared GPU with the least free that still holds `milli`."""
    fits = [(free, slot) for slot, free in node.partial.items() if free >= milli]
    return min(fits)[1] if fits else None


def _take(node: NodeState, pod: PodPlacement) -> None:
    if node.cpu_free is not None:
        node.cpu_free -= pod.cpu
    if node.memory_free is not None:
        node.memory_free -= pod.memory
    if pod.slot is None:
        node.whole_free -= pod.gpus
    elif pod.slot in node.partial:
        node.partial[pod.slot] -= pod.milli
    else:
        node.whole_free -= 1
        node.partial[pod.slot] = MILLI - pod.milli
