"""A workload's lifecycle transitions, as one structured event that everybody reads.

The controller computes them where it decides (`controllers/actions.py`) and the simulator
where it replays a trace; the usage ledger, notifications and anything else subscribe to the
same events, so a simulation and a live cluster are recorded and reported the same way. Pure.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

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
    # what its nodes are bought as (on-demand, spot, reserved; "mixed"); None: not known
    capacity_type: str | None = None

    @property
    def namespace(self) -> str:
        return self.workload.split("/", 1)[0] if "/" in self.workload else ""


Subscriber = Callable[[LifecycleEvent], None]


# the label Karpenter (on AWS and GCP) puts on each node it launches: on-demand, spot, reserved
CAPACITY_TYPE_LABEL = "karpenter.sh/capacity-type"


@dataclass(frozen=True)
class PoolFacts:
    """What the controller's writes and events need to know of a pool: its GPU type, price per
    GPU-hour (and per capacity type, where the pool gives them), zones, and what each node is
    bought as (`capacity_types`, from the nodes' CAPACITY_TYPE_LABEL)."""

    gpu_type: str
    price_per_gpu_hour: float | None
    zones: tuple[str, ...] = ()
    prices: Mapping[str, float] = field(default_factory=dict)  # capacity type -> USD/GPU-hour
    capacity_types: Mapping[str, str] = field(default_factory=dict)  # node -> capacity type

    def rate(self, nodes: Sequence[str]) -> tuple[float | None, str | None]:
        """The price per GPU-hour of work on `nodes`, and what they are bought as: each
        node's capacity type at the pool's price for it (the mean over the nodes where they
        differ: "mixed"). The pool's price, and no capacity type, where any node's is unknown."""
        kinds = [self.capacity_types.get(n) for n in nodes]
        if not kinds or None in kinds:
            return self.price_per_gpu_hour, None
        known = [k for k in kinds if k is not None]
        kind = known[0] if len(set(known)) == 1 else "mixed"
        if any(k not in self.prices for k in known):
            return self.price_per_gpu_hour, kind
        return sum(self.prices[k] for k in known) / len(known), kind


def pool_price(fleet: Fleet, pool: str) -> float | None:
    """A pool's price per GPU-hour for cost reports where its nodes' capacity types are not
    known: its reserved price where one is given, else its on-demand price, else (a pool of
    spot capacity only) its spot price."""
    prices = fleet.pools[pool].spec.price_per_gpu_hour
    if prices is None:
        return None
    for price in (prices.reserved, prices.on_demand, prices.spot):
        if price is not None:
            return price
    return None


def pool_facts(fleet: Fleet, nodes: Sequence[dict[str, Any]] = ()) -> dict[str, PoolFacts]:
    """Each pool's facts; with the cluster's `nodes`, what each is bought as."""
    capacity_types = {
        node["metadata"]["name"]: kind
        for node in nodes
        if (kind := (node["metadata"].get("labels") or {}).get(CAPACITY_TYPE_LABEL))
    }
    out = {}
    for name, pool in fleet.pools.items():
        given = pool.spec.price_per_gpu_hour
        prices = {
            kind: price
            for kind, price in (
                ("on-demand", given.on_demand if given else None),
                ("spot", given.spot if given else None),
                ("reserved", given.reserved if given else None),
            )
            if price is not None
        }
        out[name] = PoolFacts(pool.spec.gpu_type, pool_price(fleet, name),
                              tuple(pool.spec.zones), prices, capacity_types)  # fmt: skip
    return out


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
