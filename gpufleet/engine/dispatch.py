"""Where the hub sends work: the engine run over each cluster's snapshot, with the work waiting
at the hub added to it; a workload goes to a cluster whose cycle admits it now.

Every cluster's cycle sees all the hub's waiting work at once, so a cluster admits as much of it
as it holds (with the preemptions its own rules allow: a team's reservation there reclaims
what was lent; elastic work borrows idle GPUs). Any subset of what one cycle admitted still
fits that cluster, so each workload may go to any cluster that admitted it; it goes to the one
least filled by this call's sends, which spreads a burst over the fleet. Work no cluster admits
waits at the hub and is asked about again: nothing is parked in a cluster's queue where it
could wait while another cluster has room.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from gpufleet.engine.choice import acceptable_pools
from gpufleet.engine.scheduler import decide
from gpufleet.engine.types import Snapshot, Workload

# each round sends about half of what is left to send (two clusters); a burst larger than
# 2 ** MAX_ROUNDS times a cluster's room waits for the next call
MAX_ROUNDS = 16


@dataclass(frozen=True)
class Candidate:
    """A workload waiting at the hub, and the cluster it must run in (None: any)."""

    workload: Workload
    cluster: str | None = None


@dataclass(frozen=True)
class Dispatch:
    sent: dict[str, str] = field(default_factory=dict)  # workload -> cluster
    waiting: dict[str, str] = field(default_factory=dict)  # workload -> why it waits


def dispatch(
    snapshots: Mapping[str, Snapshot],
    candidates: Sequence[Candidate],
    unavailable: Mapping[str, str] | None = None,
) -> Dispatch:
    """Send each candidate (in the order given: the hub's queue) to a cluster of `snapshots`
    whose engine cycle admits it. `unavailable` says why a cluster that is not among the
    snapshots takes no work (lost, drained), for the work pinned to it."""
    unavailable = unavailable or {}
    capacity = {c: max(_gpus(s), 1) for c, s in snapshots.items()}
    load = dict.fromkeys(snapshots, 0.0)
    sent: dict[str, list[Workload]] = {c: [] for c in snapshots}
    reasons: dict[str, dict[str, str]] = {}
    result = Dispatch()
    remaining = list(candidates)
    for _ in range(MAX_ROUNDS):
        offers = _offers(snapshots, sent, remaining, reasons)
        if not offers:
            break
        for candidate in remaining:
            options = offers.get(candidate.workload.name)
            if options:
                cluster = min(options, key=lambda c: (load[c] / capacity[c], c))
                workload = candidate.workload
                load[cluster] += workload.gpus * workload.pods
                sent[cluster].append(workload)
                result.sent[workload.name] = cluster
        remaining = [c for c in remaining if c.workload.name not in result.sent]
    for candidate in remaining:
        result.waiting[candidate.workload.name] = _why(candidate, snapshots, unavailable, reasons)
    return result


def _offers(
    snapshots: Mapping[str, Snapshot],
    sent: Mapping[str, list[Workload]],
    candidates: Sequence[Candidate],
    reasons: dict[str, dict[str, str]],
) -> dict[str, set[str]]:
    """The clusters whose cycle admits each candidate, with everything sent there before in
    this round admitted too. Every cluster's queue starts with the same oldest work, so the
    clusters offer the same few workloads: each round sends those, and the next asks again
    about the rest."""
    offers: dict[str, set[str]] = {}
    for cluster in sorted(snapshots):
        snapshot = snapshots[cluster]
        eligible = [c.workload for c in candidates if _may_run(c, cluster, snapshot)]
        if not eligible:
            continue
        decisions = decide(
            replace(snapshot, workloads=(*snapshot.workloads, *sent[cluster], *eligible)),
            with_etas=False,
            explain=False,
        )
        admitted = {a.workload for a in decisions.admitted}
        for workload in eligible:
            reason = decisions.reasons.get(workload.name)
            if reason is not None:
                reasons.setdefault(workload.name, {})[cluster] = str(reason)
        if not all(w.name in admitted for w in sent[cluster]):
            continue  # what it was sent already fills it
        for workload in eligible:
            if workload.name in admitted:
                offers.setdefault(workload.name, set()).add(cluster)
    return offers


def _may_run(candidate: Candidate, cluster: str, snapshot: Snapshot) -> bool:
    if candidate.cluster is not None and candidate.cluster != cluster:
        return False
    workload = candidate.workload
    if workload.pool is None and not workload.gpu_types:
        return True
    return bool(acceptable_pools(workload, snapshot.pools))


def _gpus(snapshot: Snapshot) -> float:
    """The GPUs a cluster has or may launch."""
    held: dict[str, float] = {}
    for node in snapshot.nodes:
        held[node.pool] = held.get(node.pool, 0) + node.gpus
    return sum(
        max(held.get(name, 0), pool.max_gpus if pool.autoscaling else 0)
        for name, pool in snapshot.pools.items()
    )


def _why(
    candidate: Candidate,
    snapshots: Mapping[str, Snapshot],
    unavailable: Mapping[str, str],
    reasons: Mapping[str, Mapping[str, str]],
) -> str:
    workload, pinned = candidate.workload, candidate.cluster
    if pinned is not None and pinned not in snapshots:
        why = unavailable.get(pinned, "is not a cluster of the fleet")
        return f"its cluster {pinned} {why}"
    said = reasons.get(workload.name, {})
    if said:
        return "no cluster admits it now: " + ", ".join(
            f"{cluster} {reason}" for cluster, reason in sorted(said.items())
        )
    if workload.pool is not None:
        return f"no cluster that takes work has its pool {workload.pool}"
    if workload.gpu_types:
        return (
            f"no cluster that takes work has a pool of GPU type {' or '.join(workload.gpu_types)}"
        )
    return "no cluster takes work now" + (
        ": " + ", ".join(f"{c} {why}" for c, why in sorted(unavailable.items()))
        if unavailable
        else ""
    )
