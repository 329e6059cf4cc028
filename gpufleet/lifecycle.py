"""A workload's lifecycle transitions, as one structured event that everybody reads.

The controller computes them where it decides (`controllers/actions.py`) and the simulator
where it replays a trace; the usage ledger, notifications and anything else subscribe to the
same events, so a simulation and a live cluster are recorded and reported the same way. Pure.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from gpufleet.model.fleet import Fleet


class Transition(StrEnum):
    ADMITTED = "admitted"  # given GPUs: a run segment starts (its GPUs are held from here)
    RESUMED = "resumed"  # admitted again after a preemption: also starts a run segment
    RUNNING = "running"  # all its pods run
    PREEMPTED = "preempted"  # its GPUs taken back (by other work, a failed node, a spot reclaim)
    REQUEUED = "requeued"  # the nodes it was admitted to are gone; it waits to be placed again
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"  # deleted while it held GPUs

    @property
    def starts_segment(self) -> bool:
        return self in (Transition.ADMITTED, Transition.RESUMED)

    @property
    def ends_segment(self) -> bool:
        return self not in (Transition.ADMITTED, Transition.RESUMED, Transition.RUNNING)


# How a run segment ended, by the transition that ended it (the ledger's `outcome`)
OUTCOMES: dict[Transition, str] = {
    Transition.PREEMPTED: "preempted",
    Transition.REQUEUED: "preempted",
    Transition.COMPLETED: "completed",
    Transition.FAILED: "failed",
    Transition.CANCELLED: "cancelled",
}
STILL_RUNNING = "running"  # the outcome of a segment that has not ended


@dataclass(frozen=True)
class LifecycleEvent:
    """One transition of one workload, with what a reader needs to account for it."""

    transition: Transition
    workload: str  # namespace/name (a simulated job: its trace name)
    uid: str  # the workload object's uid (a simulated job: its trace name)
    at: datetime  # timezone-aware, UTC
    team: str
    workload_class: str  # reserved | elastic
    gpus: float  # all its pods together
    pool: str | None = None
    gpu_type: str | None = None
    nodes: int = 0  # distinct nodes it runs on
    price_per_gpu_hour: float | None = None  # the pool's price when the segment started
    reason: str | None = None
    message: str = ""
    by: str | None = None  # the workload that took its GPUs (a preemption)
    lost_gpu_seconds: float | None = None  # work lost since its last checkpoint, where known
    submitter: str | None = None  # who created it, as the API server named them

    @property
    def namespace(self) -> str:
        return self.workload.split("/", 1)[0] if "/" in self.workload else ""


Subscriber = Callable[[LifecycleEvent], None]


@dataclass(frozen=True)
class PoolFacts:
    """What the controller's writes and events need to know of a pool: its GPU type, price per
    GPU-hour and zones."""

    gpu_type: str
    price_per_gpu_hour: float | None
    zones: tuple[str, ...] = ()


def pool_price(fleet: Fleet, pool: str) -> float | None:
    """A pool's price per GPU-hour for cost reports: its reserved price where one is given,
    else its on-demand price."""
    prices = fleet.pools[pool].spec.price_per_gpu_hour
    if prices is None:
        return None
    return prices.reserved if prices.reserved is not None else prices.on_demand


def pool_facts(fleet: Fleet) -> dict[str, PoolFacts]:
    return {
        name: PoolFacts(pool.spec.gpu_type, pool_price(fleet, name), tuple(pool.spec.zones))
        for name, pool in fleet.pools.items()
    }


class Publisher:
    """Hands each batch of lifecycle events to every subscriber (the ledger, notifications,
    metrics). Subscribers queue what they need and return: they must never block the loop
    that publishes; one that raises is logged and the others still get the events."""

    def __init__(self) -> None:
        self.subscribers: list[Callable[[Sequence[LifecycleEvent]], None]] = []

    def subscribe(self, subscriber: Callable[[Sequence[LifecycleEvent]], None]) -> None:
        self.subscribers.append(subscriber)

    def publish(self, events: Sequence[LifecycleEvent]) -> None:
        if not events:
            return
        for subscriber in self.subscribers:
            try:
                subscriber(events)
            except Exception:
                logging.getLogger("gpufleet.lifecycle").exception(
                    "a lifecycle subscriber failed; the others still get the events"
                )
