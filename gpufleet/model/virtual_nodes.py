"""Nodes an admission names before they exist: `<pool>/new-<n>` is a node the autoscaler is
to provision in `pool`, `<pool>/new-any` the room a pod waits for anywhere in it. The engine
places work on them, the state file and the controller read them back."""

from __future__ import annotations

from gpufleet.model.fleet import Fleet

VIRTUAL_NODE = "/new-"  # a node still to be provisioned is named <pool>/new-<n>


def room_in(pool: str) -> str:
    """The node of a pod that waits for room anywhere in `pool` (its node went away, and its
    replacement may go wherever there is room); the engine counts it like a node still to be
    provisioned."""
    return f"{pool}{VIRTUAL_NODE}any"


def virtual_pool(node: str) -> str | None:
    """The pool of a node still to be provisioned (admissions name them); None for a real one."""
    pool, found, _ = node.partition(VIRTUAL_NODE)
    return pool if found else None


def to_be_provisioned(node: str, fleet: Fleet) -> bool:
    """Whether `node` is one an admission named in an autoscaling pool before it existed
    (`<pool>/new-<n>`): its work waits for the autoscaler and holds the GPUs meanwhile."""
    pool = virtual_pool(node)
    return pool in fleet.pools and fleet.pools[pool].spec.provider != "static"
