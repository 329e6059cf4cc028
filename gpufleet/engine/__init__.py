"""The scheduling engine: pure, deterministic decisions from a cluster snapshot (DESIGN §4)."""

from gpufleet.engine.placed import SnapshotError
from gpufleet.engine.scheduler import Cycle, decide
from gpufleet.engine.types import (
    QUARTERS,
    Admission,
    Decisions,
    Node,
    Policy,
    PoolInfo,
    Preemption,
    PreemptionReason,
    Reason,
    Snapshot,
    TeamInfo,
    Waiting,
    Workload,
    WorkloadClass,
    WorkloadState,
)

__all__ = [
    "QUARTERS",
    "Admission",
    "Cycle",
    "Decisions",
    "Node",
    "Policy",
    "PoolInfo",
    "Preemption",
    "PreemptionReason",
    "Reason",
    "Snapshot",
    "SnapshotError",
    "TeamInfo",
    "Waiting",
    "Workload",
    "WorkloadClass",
    "WorkloadState",
    "decide",
]
