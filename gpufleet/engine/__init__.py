"""The scheduling engine: pure, deterministic decisions from a cluster snapshot (DESIGN §4)."""

from gpufleet.engine.placed import SnapshotError
from gpufleet.engine.scheduler import Cycle, decide
from gpufleet.engine.types import (
    MILLI,
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
)
from gpufleet.model.states import WorkloadState

__all__ = [
    "MILLI",
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
