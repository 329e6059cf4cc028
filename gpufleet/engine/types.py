"""The engine's input (a cluster snapshot) and output (decisions).

Plain frozen dataclasses: the engine is pure and deterministic, so the same snapshot always
yields the same decisions, in the controllers, the simulator and `gpufleet decide` alike.
GPU amounts inside the engine are counted in milli-GPUs (`MILLI` per GPU), the unit of sharing:
the API asks for multiples of 0.25 GPU, the engine places any fraction of a GPU to 0.001.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from functools import cached_property
from typing import Any, Protocol, runtime_checkable

# the engine decides about waiting and admitted workloads; a finished one never reaches it
from gpufleet.model.states import WorkloadState

MILLI = 1000  # milli-GPUs per GPU


class WorkloadClass(StrEnum):
    RESERVED = "reserved"
    ELASTIC = "elastic"


# R5: cheaper victims first
VICTIM_STATE_RANK = {WorkloadState.QUEUED: 0, WorkloadState.STARTING: 1, WorkloadState.RUNNING: 2}


class Reason(StrEnum):
    """Why a workload is still waiting (R9). Stable strings: they appear in status and metrics."""

    RESERVATION_EXHAUSTED = "ReservationExhausted"
    BURST_LIMIT = "BurstLimit"
    POOL_FULL = "PoolFull"
    NO_FITTING_NODE = "NoFittingNode"
    WAITING_FOR_GANG = "WaitingForGang"
    NO_HEALTHY_NODE = "NoHealthyNode"
    BACK_OFF = "BackOff"
    POLICY_LIMIT = "PolicyLimit"
    NO_MATCHING_POOL = "NoMatchingPool"


class PreemptionReason(StrEnum):
    RESERVATION_RECLAIMED = "ReservationReclaimed"  # a reserved workload needs the GPUs (R1)
    HIGHER_PRIORITY = "HigherPriority"  # elastic work of higher priority (R4)
    FAIR_SHARE = "FairShare"  # equal priority, the victim's team is over its share (R3)
    NODE_UNHEALTHY = "NodeUnhealthy"  # a node it runs on is quarantined; requeued elsewhere


@dataclass(frozen=True)
class PoolInfo:
    name: str
    gpu_type: str
    gpus_per_node: int
    max_gpus: int
    autoscaling: bool  # aws/gcp pools grow through Karpenter; static pools do not
    allow_elastic_scale_up: bool = False
    sharing: bool = True  # False: whole GPUs only, no fraction of a GPU is placed here


@dataclass(frozen=True)
class TeamInfo:
    name: str
    parent: str | None
    weight: int  # burstingPriority
    burst_limit: str | None  # as in the Team spec; None: unlimited


@dataclass(frozen=True)
class Policy:
    min_runtime: timedelta = timedelta(minutes=5)
    backoff: timedelta = timedelta(minutes=10)
    max_gpus_per_workload: int | None = None
    max_priority: dict[str, int] = field(default_factory=dict)

    def priority_of(self, workload: Workload) -> int:
        """Effective priority: a FleetPolicy may cap what a team's elastic work may use (R4)."""
        cap = self.max_priority.get(workload.team) if self.max_priority else None
        if cap is None or workload.reserved:
            return workload.priority
        return min(workload.priority, cap)


# A fault counts 1 and halves every week: one quarantine keeps a node a "lemon" for a week (it
# then gets short, elastic work first, which doubles as its probation), two within a few days
# for two weeks. Large-cluster studies find a few such nodes behind a large share of failures.
FAULT_HALF_LIFE = timedelta(days=7)
LEMON_FAULTS = 0.5


@dataclass(frozen=True)
class Node:
    name: str
    pool: str
    gpus: int
    zone: str = ""
    healthy: bool = True  # False: its work is evicted (R-health)
    # False: it takes no new work but keeps what it runs (cordoned, or NotReady for less than
    # the grace period: Kubernetes itself keeps pods on an unreachable node for 300 s)
    schedulable: bool = True
    # its fault history: each quarantine counts 1, halving every FAULT_HALF_LIFE (R-lemon)
    faults: float = 0.0
    # topology domains inside its zone, "" where unknown: the network block (rack) and the
    # NVLink clique (GPU Operator, multi-node NVLink systems); a gang is placed in one clique,
    # else one block, where one has room (R8)
    block: str = ""
    clique: str = ""
    # what gpufleet's pods may still take of the node, where it reports them: its allocatable
    # milli-CPU and MiB of memory less what other pods (DaemonSets, unmanaged work) request;
    # None: not known, not checked
    cpu_free: int | None = None
    memory_free: int | None = None

    @property
    def lemon(self) -> bool:
        """A node with recent faults: long and large work is placed elsewhere when it fits."""
        return self.faults >= LEMON_FAULTS


TOPOLOGY_LEVELS = ("clique", "block")  # smallest first, as nodes list their domains


@dataclass(frozen=True)
class Workload:
    name: str
    team: str
    workload_class: WorkloadClass
    gpus: float  # per pod; a single-pod workload may ask 0.25, 0.5 or 0.75
    submitted_at: datetime
    pods: int = 1
    priority: int = 50
    state: WorkloadState = WorkloadState.PENDING
    pool: str | None = None  # requested pool; None: the engine chooses
    # the GPU types it accepts, the most preferred first: tried in this order under the same
    # rules (choice.py); (): any type
    gpu_types: tuple[str, ...] = ()
    zone: str | None = None
    started_at: datetime | None = None
    nodes: tuple[str, ...] = ()  # node of each pod, for active workloads
    expected_end: datetime | None = None  # for ETAs
    preempted_at: datetime | None = None
    preempted_from: str | None = None  # pool it was evicted from (R6 back-off)
    preempted_by: str | None = None  # the workload that took its GPUs (R6 back-off)
    # a gang that must run inside one domain of this level (R8), else it waits: "block" or
    # "clique"; None: one domain is preferred, not required
    topology: str | None = None
    # milli-CPU and MiB of memory per pod: checked where nodes report what is free of them
    # (the controllers, from the nodes' allocatable; the packing benchmark, CPU)
    cpu: int = 0
    memory: int = 0

    @cached_property  # asked millions of times per simulated week
    def milli_per_pod(self) -> int:
        return round(self.gpus * MILLI)

    @cached_property
    def total_milli(self) -> int:
        return self.milli_per_pod * self.pods

    @cached_property
    def fractional(self) -> bool:
        return 0 < self.milli_per_pod < MILLI

    @cached_property
    def reserved(self) -> bool:
        return self.workload_class is WorkloadClass.RESERVED

    @cached_property
    def queue_order(self) -> tuple[int, int, float, str]:
        """Place in the queue (R2): reserved first, then by priority, then first come first
        served; the name breaks ties. A FleetPolicy that caps priorities orders by the capped
        priority instead (`Backlog.order_key`)."""
        return (0 if self.reserved else 1, -self.priority, self.submitted_at.timestamp(), self.name)

    @cached_property
    def shape(self) -> tuple[Any, ...]:
        """Everything about the workload that decides its admission besides its back-off and
        the cluster's state (team first): a backlog holds many workloads of one shape, and while
        nothing changes the answer for the first is the answer for the rest."""
        return (
            self.team,
            self.reserved,
            self.priority,
            self.milli_per_pod,
            self.pods,
            self.pool,
            self.gpu_types,
            self.zone,
            self.topology,
            self.cpu,
        )

    @cached_property
    def victim_order(self) -> tuple[int, int, float, str]:
        """Cost as a preemption victim, cheapest first (R5): state, priority, most recently
        started first, name. A FleetPolicy that caps priorities uses the capped priority."""
        started = self.started_at.timestamp() if self.started_at else float("inf")
        return (VICTIM_STATE_RANK[self.state], self.priority, -started, self.name)

    @cached_property
    def critical(self) -> bool:
        """Work a node failure costs most: reserved (guaranteed, typically long training) or a
        gang (one failed node stops every pod). It avoids lemon nodes; other work takes them
        first (R-lemon)."""
        return self.reserved or self.pods > 1


@dataclass(frozen=True)
class Snapshot:
    time: datetime
    pools: dict[str, PoolInfo]
    teams: dict[str, TeamInfo]
    reservations: dict[tuple[str, str], int]  # (team, pool) -> GPUs; active reservations only
    policy: Policy
    nodes: tuple[Node, ...]
    workloads: tuple[Workload, ...]


@dataclass(frozen=True)
class Admission:
    workload: str
    pool: str
    nodes: tuple[str, ...]  # node of each pod; a "<pool>/new-N" name is a node to provision

    def to_dict(self) -> dict[str, Any]:
        return {"workload": self.workload, "pool": self.pool, "nodes": list(self.nodes)}


@dataclass(frozen=True)
class Preemption:
    workload: str
    by: str
    reason: PreemptionReason
    message: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "workload": self.workload,
            "by": self.by,
            "reason": str(self.reason),
            "message": self.message,
        }


@dataclass(frozen=True)
class Waiting:
    workload: str
    reason: Reason
    message: str
    position: int  # 1-based place in its team's queue
    eta: datetime | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "workload": self.workload,
            "reason": str(self.reason),
            "message": self.message,
            "position": self.position,
            "eta": self.eta.isoformat().replace("+00:00", "Z") if self.eta else None,
        }


@runtime_checkable
class ReasonsByQuestion(Protocol):
    """Waiting reasons kept per question rather than per workload (backlog.WaitingReasons)."""

    def waiting_for(self, reasons: Collection[Reason]) -> list[str]: ...


@dataclass(frozen=True)
class Decisions:
    admitted: tuple[Admission, ...] = ()
    preempted: tuple[Preemption, ...] = ()
    pending: tuple[Waiting, ...] = ()  # empty when the cycle was not asked to explain
    # why each workload still waits, by name (also when not explained)
    reasons: Mapping[str, Reason] = field(default_factory=dict)

    def waiting_for(self, reasons: Collection[Reason]) -> list[str]:
        """The workloads that still wait for one of `reasons`."""
        if isinstance(self.reasons, ReasonsByQuestion):  # read question by question
            return self.reasons.waiting_for(reasons)
        return [name for name, reason in self.reasons.items() if reason in reasons]

    def to_dict(self) -> dict[str, Any]:
        return {
            "admitted": [a.to_dict() for a in sorted(self.admitted, key=lambda a: a.workload)],
            "preempted": [p.to_dict() for p in sorted(self.preempted, key=lambda p: p.workload)],
            "pending": [w.to_dict() for w in sorted(self.pending, key=lambda w: w.workload)],
        }
