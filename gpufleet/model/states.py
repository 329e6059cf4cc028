"""A workload's states (DESIGN §4), and the sets every layer asks about: one definition each.

Pending → Queued → Starting → Running → Completed | Failed | Cancelled; Preempted waits again.
*Waiting* states are not admitted; *admitted* states hold GPUs (Queued is admitted: its pods
are not bound yet, but its GPUs are taken); *finished* states are final.
"""

from __future__ import annotations

from enum import StrEnum


class WorkloadState(StrEnum):
    PENDING = "Pending"
    PREEMPTED = "Preempted"  # waiting again after a preemption; keeps its submission time
    QUEUED = "Queued"
    STARTING = "Starting"
    RUNNING = "Running"
    COMPLETED = "Completed"
    FAILED = "Failed"
    CANCELLED = "Cancelled"


WAITING_STATES = frozenset({WorkloadState.PENDING, WorkloadState.PREEMPTED})
ADMITTED_STATES = frozenset({WorkloadState.QUEUED, WorkloadState.STARTING, WorkloadState.RUNNING})
FINISHED_STATES = frozenset(
    {WorkloadState.COMPLETED, WorkloadState.FAILED, WorkloadState.CANCELLED}
)
