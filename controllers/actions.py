"""From engine decisions to the changes the controller makes: patches of the workloads' own
objects (Jobs, JobSets, ...) and GPUWorkload status.

Pure. Every change is idempotent (a merge patch of the desired values), so applying the changes
twice, or after a restart, converges on the same state.
"""

from __future__ import annotations

import zlib
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from gpufleet.engine import Decisions, PreemptionReason
from gpufleet.kube.holding import pointer_key
from gpufleet.kube.kinds import PodSet, adapter_of
from gpufleet.kube.kinds.base import NODE_NAME_FIELD, pinned_nodes
from gpufleet.kube.observe import Observed, held, parse_time, recorded_admission
from gpufleet.lifecycle import LifecycleEvent, PoolFacts, Transition
from gpufleet.model.keys import (
    ADMISSION_GATE,
    ADMITTED_AT_ANNOTATION,
    ADMITTED_NODES_ANNOTATION,
    ADMITTED_POOL_ANNOTATION,
    POOL_LABEL,
    ZONE_LABEL,
)
from gpufleet.model.states import ADMITTED_STATES
from gpufleet.model.virtual_nodes import virtual_pool

# Pods usually run within seconds of an admission; recording the passing state Starting for
# each would cost a status write per Job in a burst. It is recorded once pods have been
# starting this long (an image pull, a pod the scheduler cannot place): then it tells people
# something. The admission's own record waits for the pods to run, and is written with Running
# (or Starting) in one request; a crash meanwhile loses nothing: the admission patch records it
# on the object (`recorded`, `lost_admission_record`).
STARTING_RECORDED_AFTER_S = 10.0
# why an admitted workload is placed again: its reason and what happened
REQUEUED_GONE = ("NodesGone", "the nodes it was admitted to are gone")
REQUEUED_TAKEN = (
    "NodesTaken",
    "the GPUs it was admitted to are still held by work that was to make room for it "
    "(a controller stopped during the preemption)",
)


@dataclass(frozen=True)
class PodWrite:
    """A write to one pod: a JSON patch that releases it (a gated kind's), or its deletion."""

    name: str
    patch: list[dict[str, Any]] | None  # None: delete it
    after: dict[str, Any]  # the pod as the write leaves it (what the cache assumes meanwhile)
    # a deletion's first write, the JSON patch that takes its controller's finalizer off
    # (`unfinalize`); where it fails, the pod changed meanwhile and is left to its controller
    unfinalize: list[dict[str, Any]] | None = None


@dataclass(frozen=True)
class Change:
    """One object to patch, and the event that tells people why."""

    namespace: str
    name: str  # of the GPUWorkload
    # merge patches of the workload's own object, written in this order
    patches: tuple[dict[str, Any], ...] = ()
    pod_writes: tuple[PodWrite, ...] = ()  # a gated kind's pods, released or deleted
    status: dict[str, Any] = field(default_factory=dict)  # GPUWorkload status fields to set
    event: tuple[str, str] | None = None  # (reason, message) on the Job
    lifecycle: LifecycleEvent | None = None  # the transition it makes, for the ledger & co.
    status_first: bool = False  # the status is written before the object and its pods
    # the status may wait this long to be written together with the workload's next status
    # (an admission's record with Running: the object's own patch already carries the decision;
    # a wait that this decision's preemptions are ending, with the admission that follows)
    status_may_wait: float = 0.0
    evicts: bool = False  # it gives GPUs back (a suspension or the deletion of pods)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def _iso(value: datetime | None) -> str | None:
    return value.isoformat().replace("+00:00", "Z") if value else None


def admission_patches(
    obj: dict[str, Any], pool: str, nodes: tuple[str, ...], zone: str | None = None
) -> tuple[dict[str, Any], ...]:
    """The writes that resume a workload with its GPU pods pinned where the engine placed
    them (its pods without GPUs, such as a Ray head, go where the scheduler puts them). A
    kind whose suspended objects keep their node affinity is pinned to the pool only."""
    kind = adapter_of(obj)
    template = placement(pool, nodes, kind.pins_nodes, zone)

    def patch_of(pod_set: PodSet) -> dict[str, Any] | None:
        return template if pod_set.gpus > 0 else None

    return tuple(kind.admission_patches(obj, patch_of))


def recorded(
    patches: tuple[dict[str, Any], ...], pool: str, now: datetime
) -> tuple[dict[str, Any], ...]:
    """`patches` with the last (the one that resumes the object) recording the admission on
    the object itself: its pool and time, what its GPUWorkload's record says (so that record
    may be written later, with Running, and is never lost)."""
    if not patches:
        return patches
    *first, last = patches
    metadata = last.get("metadata") or {}
    annotations = {
        **(metadata.get("annotations") or {}),
        ADMITTED_POOL_ANNOTATION: pool,
        ADMITTED_AT_ANNOTATION: _iso(now),
    }
    return (*first, {**last, "metadata": {**metadata, "annotations": annotations}})


def lost_admission_record(item: Observed, status: dict[str, Any]) -> dict[str, Any]:
    """The status fields of the admission the object (or, where it was released at its pods,
    a pod) records where its GPUWorkload's status does not ({} where it does, none records
    one, or the workload is not admitted)."""
    annotations = item.obj["metadata"].get("annotations") or {}
    if ADMITTED_AT_ANNOTATION in annotations:
        pool, at = annotations.get(ADMITTED_POOL_ANNOTATION), annotations[ADMITTED_AT_ANNOTATION]
    else:
        on_pods = recorded_admission(item.pods)
        pool, at = on_pods.get("pool"), on_pods.get("admittedAt")
    if item.state not in ADMITTED_STATES or not at or at == status.get("admittedAt"):
        return {}
    return {"pool": pool, "nodes": list(item.nodes), "admittedAt": at}


def gang_zone(workload: str, nodes: tuple[str, ...], zones: tuple[str, ...]) -> str | None:
    """The zone a gang admitted onto nodes still to be provisioned is held in, where its pool
    has more than one: Karpenter, left to keep a gang together by pod affinity alone, was seen
    to launch a node in another zone when the gang's pods were simulated in separate rounds
    (the mate it needs not yet bound), leaving a pod unschedulable and a node too many. A
    stable hash of the workload spreads gangs over the zones; None where nothing is to be
    pinned (one pod, existing nodes, one zone)."""
    if len(nodes) < 2 or len(zones) < 2 or any(virtual_pool(n) is None for n in nodes):
        return None
    return zones[zlib.crc32(workload.encode()) % len(zones)]


def placement(
    pool: str, nodes: tuple[str, ...], pin: bool = True, zone: str | None = None
) -> dict[str, Any]:
    """The pod template patch that pins pods to the pool and, where the engine chose existing
    nodes and `pin`, to those nodes (by name: a node's hostname label need not be its name,
    and is not on nodes Karpenter's kwok provider launches), or to `zone` (`gang_zone`).
    Node affinity is the only affinity a suspended Job's template lets change: it is set, or
    removed (a merge patch's null) so that an earlier admission's pinning does not outlive
    it."""
    if not pin:
        return {"spec": {"nodeSelector": {POOL_LABEL: pool}}}
    existing = sorted({n for n in nodes if virtual_pool(n) is None})
    node_affinity: dict[str, Any] | None = None
    if existing and len(existing) == len(set(nodes)):
        node_affinity = {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                # a node field selector takes one name: one term per node (terms are ORed)
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": NODE_NAME_FIELD, "operator": "In", "values": [n]}]}
                    for n in existing
                ]
            }
        }
    elif zone is not None:
        node_affinity = {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": ZONE_LABEL, "operator": "In", "values": [zone]}]}
                ]
            }
        }
    return {
        "spec": {"nodeSelector": {POOL_LABEL: pool}, "affinity": {"nodeAffinity": node_affinity}}
    }


def release_writes(
    item: Observed,
    pool: str,
    nodes: tuple[str, ...],
    zone: str | None = None,
    at: datetime | None = None,
) -> tuple[PodWrite, ...]:
    """Release the held pods of a workload admitted to `nodes`: each onto a node of the
    admission no released pod of it holds yet (pinned by name where the node exists and the
    pod has no required node affinity of its own; else to the pool, and to `zone` where one
    is given). `at`: the admission's time, recorded on each pod with its pool, so that its
    GPUWorkload's record may wait (`lost_admission_record`)."""
    kind = item.kind
    free = list(nodes)
    released = 0
    for pod in item.pods:
        if held(pod) or pod["metadata"].get("deletionTimestamp"):
            continue
        released += 1
        # a pod released but not bound yet holds the node it is pinned to: counting only
        # bound pods would pin the next one onto the same node (a race seen in CI)
        node = (pod.get("spec") or {}).get("nodeName") or _the_pinned_node(pod)
        if node in free:
            free.remove(node)
    out = []
    for pod in sorted((p for p in item.pods if held(p)), key=lambda p: p["metadata"]["name"]):
        if released >= len(nodes):
            break  # more pods than it was admitted with (a scale-up): they stay held
        node = free.pop(0) if free else None
        released += 1
        out.append(release(pod, pool, node if kind.pins_nodes else None, zone, at, nodes))
    return tuple(out)


def _the_pinned_node(pod: dict[str, Any]) -> str | None:
    nodes = pinned_nodes(pod)
    return nodes[0] if len(nodes) == 1 else None


def release(
    pod: dict[str, Any],
    pool: str,
    node: str | None,
    zone: str | None = None,
    at: datetime | None = None,
    admitted: tuple[str, ...] = (),
) -> PodWrite:
    """The JSON patch that lifts gpufleet's gate from a held pod and pins it (a held pod's
    node selector may grow, and a node affinity it has none of may be set); with `at`, the
    admission recorded in its annotations: pool, time and the nodes of the whole admission
    (`admitted`), for a controller that crashes before the GPUWorkload's record is written
    (`observe.recorded_admission`)."""
    spec = pod.get("spec") or {}
    gates = [g for g in spec.get("schedulingGates") or [] if g.get("name") != ADMISSION_GATE]
    selector = {**(spec.get("nodeSelector") or {}), POOL_LABEL: pool}
    ops: list[dict[str, Any]] = [
        {"op": "replace", "path": "/spec/schedulingGates", "value": gates}
        if gates
        else {"op": "remove", "path": "/spec/schedulingGates"},
        {"op": "add", "path": "/spec/nodeSelector", "value": selector},
    ]
    after_spec = {**spec, "schedulingGates": gates, "nodeSelector": selector}
    affinity = spec.get("affinity") or {}
    required = (affinity.get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    )
    existing = node is not None and virtual_pool(node) is None
    if required is None and (existing or zone is not None):
        pinned = placement(pool, (node,) if node and existing else (), zone=zone)["spec"][
            "affinity"
        ]["nodeAffinity"]
        node_affinity = {**(affinity.get("nodeAffinity") or {}), **pinned}
        ops.append(
            {
                "op": "add",
                "path": "/spec/affinity",
                "value": {**affinity, "nodeAffinity": node_affinity},
            }
        )
        after_spec["affinity"] = {**affinity, "nodeAffinity": node_affinity}
    metadata = pod["metadata"]
    if at is not None:
        record = {
            ADMITTED_POOL_ANNOTATION: pool,
            ADMITTED_AT_ANNOTATION: _iso(at),
            ADMITTED_NODES_ANNOTATION: ",".join(admitted),
        }
        if "annotations" in metadata:  # each key on its own: the others are left as they are
            ops.extend(
                {"op": "add", "path": "/metadata/annotations/" + pointer_key(k), "value": v}
                for k, v in record.items()
            )
        else:
            ops.append({"op": "add", "path": "/metadata/annotations", "value": record})
        metadata = {**metadata, "annotations": {**(metadata.get("annotations") or {}), **record}}
    return PodWrite(metadata["name"], ops, {**pod, "metadata": metadata, "spec": after_spec})


def delete_writes(item: Observed) -> tuple[PodWrite, ...]:
    """Delete the released pods of a gated workload (its controller makes them again, held)."""
    return tuple(
        _deletion(pod)
        for pod in item.pods
        if not held(pod) and not pod["metadata"].get("deletionTimestamp")
    )


def suspended_pod_writes(item: Observed, finalizer: str) -> tuple[PodWrite, ...]:
    """Delete the live pods of a workload being suspended, as its controller would once it
    saw the suspension: each without `finalizer` first, so that it counts as neither failed
    nor succeeded. Finished pods stay for the controller to count."""
    return tuple(
        _deletion(pod, finalizer)
        for pod in item.pods
        if not _deleting_or_done(pod) and finalizer in (pod["metadata"].get("finalizers") or ())
    )


def uncounted_pod_writes(item: Observed, finalizer: str | None) -> tuple[PodWrite, ...]:
    """Delete the released, live pods of a workload held at its pods and left running (its
    controller makes new ones, held again): each without its controller's `finalizer` first,
    so that it counts as neither failed nor succeeded. Held pods hold no GPU and stay;
    finished ones stay for the controller to count."""
    return tuple(
        _deletion(pod, finalizer)
        for pod in item.pods
        if not held(pod) and not _deleting_or_done(pod)
    )


def unfinalize(pod: dict[str, Any], finalizer: str) -> list[dict[str, Any]]:
    """The JSON patch that removes `finalizer` from the pod, failing (422) unless it is still
    where the pod as cached has it."""
    index = list(pod["metadata"].get("finalizers") or ()).index(finalizer)
    path = f"/metadata/finalizers/{index}"
    return [{"op": "test", "path": path, "value": finalizer}, {"op": "remove", "path": path}]


def _deletion(pod: dict[str, Any], finalizer: str | None = None) -> PodWrite:
    """The pod's deletion, `finalizer` taken off first where the pod has it."""
    metadata = pod["metadata"]
    after = {**metadata, "deletionTimestamp": "deleting"}
    first = None
    if finalizer is not None and finalizer in (metadata.get("finalizers") or ()):
        after["finalizers"] = [f for f in metadata["finalizers"] if f != finalizer]
        first = unfinalize(pod, finalizer)
    return PodWrite(metadata["name"], None, {**pod, "metadata": after}, first)


def _deleting_or_done(pod: dict[str, Any]) -> bool:
    phase = (pod.get("status") or {}).get("phase")
    return bool(pod["metadata"].get("deletionTimestamp")) or phase in ("Succeeded", "Failed")


def _evict(item: Observed, status: dict[str, Any], now: datetime) -> dict[str, Any]:
    """How a workload gives its GPUs back (the Change's fields, `status` with them):
    suspended (and, where its controller would only get to them later, its pods deleted
    right after), or a gated kind's pods deleted. Nothing makes a bare pod again but
    gpufleet: that it owes one is recorded before the pod is deleted, so no crash can lose
    it."""
    kind = item.kind
    if kind.holds_pods(item.obj) and not kind.gated and not kind.suspended(item.obj):
        # A Job held at its pods loses them and is not suspended: the Job controller makes
        # new ones at once, held at the gate, and is not kept from the reserved work's pods by
        # hundreds of suspensions. Its pods tell nothing of the preemption, so its record goes
        # first: a crash after the deletions cannot leave it recorded as admitted, its new
        # pods released again where it was.
        writes = uncounted_pod_writes(item, kind.pod_finalizer)
        return {"pod_writes": writes, "status": status, "status_first": True, "evicts": True}
    if not kind.gated:
        writes = suspended_pod_writes(item, kind.pod_finalizer) if kind.pod_finalizer else ()
        return {
            "patches": (kind.suspend_patch(),),
            "pod_writes": writes,
            "status": status,
            "evicts": True,
        }
    writes = delete_writes(item)
    if kind.bare and writes:
        return {
            "pod_writes": writes,
            "status": {**status, "podDeletedAt": _iso(now)},
            "status_first": True,
            "evicts": True,
        }
    return {"pod_writes": writes, "status": status, "evicts": bool(writes)}


def changes_for(
    decisions: Decisions,
    observed: list[Observed],
    now: datetime,
    requeue: list[Observed] | None = None,
    settled: set[str] | frozenset[str] = frozenset(),
    pools: Mapping[str, PoolFacts] | None = None,
    undone: Collection[str] = frozenset(),
) -> list[Change]:
    """The writes that carry out `decisions`, each with the lifecycle transition it makes
    (`pools`: the GPU type and price the transitions record). `requeue`: admitted workloads
    placed again, because their nodes are gone or, for those in `undone`, held by work that was
    to be evicted for them (`observe.admissions_to_undo`). Waiting workloads in `settled`
    (their status was written a moment ago) get a new status only when their state or reason
    changes: a burst of arrivals moves every queue position and ETA each cycle, and writing
    them all each time would cost a request per waiting workload per cycle."""
    by_key = {o.key: o for o in observed}
    facts = pools or {}

    def transition(
        kind: Transition,
        item: Observed,
        pool: str | None = None,
        placed: Sequence[str] | None = None,
        **extra: Any,
    ) -> LifecycleEvent:
        return lifecycle_event(kind, item, now, facts, pool, placed, **extra)

    changes: list[Change] = []
    for item in requeue or []:
        reason, why = REQUEUED_TAKEN if item.key in undone else REQUEUED_GONE
        changes.append(
            Change(
                *_name(item),
                **_evict(
                    item,
                    {
                        "state": "Pending",
                        "nodes": [],
                        "reason": reason,
                        "message": f"{why}; it waits to be placed again",
                    },
                    now,
                ),
                event=("Requeued", f"{why}; placing it again"),
                lifecycle=transition(Transition.REQUEUED, item, reason=reason),
            )
        )
    decided: set[str] = {item.key for item in requeue or []}
    for admission in decisions.admitted:
        item = by_key[admission.workload]
        decided.add(item.key)
        pool_facts = facts.get(admission.pool)
        zone = gang_zone(item.key, admission.nodes, pool_facts.zones if pool_facts else ())
        patches = recorded(
            admission_patches(item.obj, admission.pool, admission.nodes, zone),
            admission.pool,
            now,
        )
        releases = (
            release_writes(item, admission.pool, admission.nodes, zone, now)
            if item.kind.holds_pods(item.obj)
            else ()
        )
        changes.append(
            Change(
                *_name(item),
                patches=patches,
                pod_writes=releases,
                status={
                    "state": "Queued",
                    "pool": admission.pool,
                    "nodes": list(admission.nodes),
                    "reason": None,
                    "message": f"admitted to pool {admission.pool}",
                    "position": None,
                    "eta": None,
                    "admittedAt": _iso(now),
                },
                event=(
                    "Admitted",
                    f"admitted to pool {admission.pool} on "
                    f"{', '.join(sorted(set(admission.nodes)))}",
                )
                if _waited(item)
                else None,
                lifecycle=transition(
                    Transition.RESUMED if _ran_before(item) else Transition.ADMITTED,
                    item,
                    admission.pool,
                    placed=admission.nodes,
                ),
                # the object's patch (or its pods' releases, now or as they come) records the
                # admission: the status may wait for Running
                status_may_wait=2 * STARTING_RECORDED_AFTER_S
                if patches or item.kind.holds_pods(item.obj)
                else 0.0,
            )
        )
    for preemption in decisions.preempted:
        item = by_key[preemption.workload]
        decided.add(item.key)
        status = item.workload.get("status") or {}
        changes.append(
            Change(
                *_name(item),
                **_evict(
                    item,
                    {
                        "state": "Preempted",
                        "reason": str(preemption.reason),
                        "message": preemption.message,
                        "preemptedAt": _iso(now),
                        # a health eviction is no reason to keep the workload off the pool (R6)
                        "preemptedFrom": None
                        if preemption.reason is PreemptionReason.NODE_UNHEALTHY
                        else status.get("pool"),
                        "preemptedBy": preemption.by or None,
                        "nodes": [],
                        "preemptions": int(status.get("preemptions", 0)) + 1,
                    },
                    now,
                ),
                event=(
                    "Preempted",
                    f"preempted by {preemption.by}: {preemption.message}"
                    if preemption.by
                    else f"preempted: {preemption.message}",
                ),
                lifecycle=transition(
                    Transition.PREEMPTED,
                    item,
                    reason=str(preemption.reason),
                    message=preemption.message,
                    by=preemption.by or None,
                ),
            )
        )
    # workloads whose GPUs this decision's preemptions free: their wait ends as the victims' pods
    # go, and is recorded only if it lasts (with the admission that follows, in one write)
    freed_for = {p.by for p in decisions.preempted}
    for waiting in decisions.pending:
        item = by_key[waiting.workload]
        decided.add(item.key)
        wanted = {
            "state": item.state,
            "reason": str(waiting.reason),
            "message": waiting.message,
            "position": waiting.position,
            "eta": _iso(waiting.eta),
        }
        status = item.workload.get("status") or {}
        if item.key in settled and all(status.get(k) == wanted[k] for k in ("state", "reason")):
            continue
        may_wait = 2 * STARTING_RECORDED_AFTER_S if item.key in freed_for else 0.0
        _add_if_changed(changes, item, wanted, None, may_wait=may_wait)
    for item in observed:
        if item.key in decided:
            continue
        sync: dict[str, Any] = {"state": item.state}
        status = item.workload.get("status") or {}
        late = late_pods(item, facts)
        if late:  # a gated workload's pods made after its admission: released as they come
            changes.append(Change(*_name(item), pod_writes=late))
        if item.state == "Starting" and _starting_is_passing(status, now):
            continue
        event = None
        lifecycle = None
        # its record lost (a crash while it was held back): the object's own
        sync.update(lost_admission_record(item, status))
        if item.state == "Running" and not status.get("startedAt"):
            sync["startedAt"] = _iso(now)
            sync["reason"] = None
            sync["message"] = "all pods running"
            # no Event: the pods' own events say so, and in a burst one request per Job counts
            lifecycle = transition(Transition.RUNNING, item, sync.get("pool"))
        if item.state in ("Completed", "Failed") and not status.get("finishedAt"):
            sync["finishedAt"] = _iso(now)
            sync["reason"], sync["message"] = finished(item)
            event = (item.state, sync["message"])
            kind = Transition.COMPLETED if item.state == "Completed" else Transition.FAILED
            lifecycle = transition(kind, item, reason=sync["reason"], message=sync["message"])
        _add_if_changed(changes, item, sync, event, lifecycle)
    return changes


def lifecycle_event(
    kind: Transition,
    item: Observed,
    at: datetime,
    pools: Mapping[str, PoolFacts],
    pool: str | None = None,
    placed: Sequence[str] | None = None,
    **extra: Any,
) -> LifecycleEvent:
    """The transition `kind` of a managed workload at `at` (its pool: `pool`, else where its
    GPUWorkload says it was admitted; its nodes: `placed`, those an admission gives it, else
    those it has)."""
    spec = item.workload.get("spec") or {}
    status = item.workload.get("status") or {}
    pool = pool or status.get("pool")
    facts = pools.get(pool or "")
    on = sorted(set(placed or item.nodes or status.get("nodes") or ()))
    if "nodes" not in extra:
        extra["nodes"] = len(on)
    price, capacity_type = facts.rate(on) if facts else (None, None)
    return LifecycleEvent(
        transition=kind,
        workload=item.key,
        uid=item.obj["metadata"].get("uid") or item.key,
        at=at,
        team=spec.get("team", ""),
        workload_class=spec.get("class", "elastic"),
        gpus=float(spec.get("gpus", 0)) * int(spec.get("pods", 1)),
        pool=pool,
        gpu_type=facts.gpu_type if facts else None,
        price_per_gpu_hour=price,
        capacity_type=capacity_type,
        submitter=spec.get("submitter") or None,
        **extra,
    )


def late_pods(item: Observed, pools: Mapping[str, PoolFacts]) -> tuple[PodWrite, ...]:
    """Releases for the held pods of an admitted workload (made after its admission, or again
    after one was lost), onto the nodes of its admission (in the zone it was given), each
    recording the admission (its GPUWorkload's record may still be held back)."""
    if item.state not in ADMITTED_STATES or not any(held(p) for p in item.pods):
        return ()
    status = item.workload.get("status") or {}
    if not status.get("pool"):  # its record lost with a controller: the one on its pods
        status = recorded_admission(item.pods)
    pool = status.get("pool") or ""
    nodes = tuple(status.get("nodes") or ())
    facts = pools.get(pool)
    zone = gang_zone(item.key, nodes, facts.zones if facts else ())
    return release_writes(item, pool, nodes, zone, parse_time(status.get("admittedAt")))


def _waited(item: Observed) -> bool:
    """Whether the admission is news to someone: the workload was told why it waited, or ran
    before (one admitted at the first decision about it has its pods' events, and in a burst
    an Event each would be a request per workload)."""
    status = item.workload.get("status") or {}
    return bool(status.get("reason")) or _ran_before(item)


def _ran_before(item: Observed) -> bool:
    """Whether this admission resumes work that held GPUs before (preempted or requeued)."""
    status = item.workload.get("status") or {}
    return bool(status.get("preemptions")) or status.get("admittedAt") is not None


def _starting_is_passing(status: dict[str, Any], now: datetime) -> bool:
    admitted = parse_time(status.get("admittedAt"))
    return (
        status.get("state") == "Queued"
        and admitted is not None
        and (now - admitted).total_seconds() < STARTING_RECORDED_AFTER_S
    )


def finished(item: Observed) -> tuple[str | None, str]:
    """(reason, message) of finished work, as its own object tells how it finished."""
    kind = item.kind
    outcome = kind.outcome(item.obj, [])
    if outcome is None:  # every pod succeeded; the object has yet to say so
        succeeded = (item.obj.get("status") or {}).get("succeeded")
        done = "all its pods" if succeeded is None else f"{succeeded} pod(s)"
        return None, f"the {kind.kind} completed: {done} succeeded"
    return outcome.reason, outcome.message


def _name(item: Observed) -> tuple[str, str]:
    return item.workload["metadata"]["namespace"], item.workload["metadata"]["name"]


def _add_if_changed(
    changes: list[Change],
    item: Observed,
    wanted: dict[str, Any],
    event: tuple[str, str] | None,
    lifecycle: LifecycleEvent | None = None,
    may_wait: float = 0.0,
) -> None:
    status = item.workload.get("status") or {}
    if any(status.get(key) != value for key, value in wanted.items()):
        changes.append(
            Change(
                *_name(item),
                status=wanted,
                event=event,
                lifecycle=lifecycle,
                status_may_wait=may_wait,
            )
        )
