"""A fleet of clusters as the hub sees it: Jobs submitted to the hub, the copies it makes of them
in worker clusters, and each worker's state as an engine snapshot.

Pure functions over objects as the API returns them; the hub's shell (controllers/hub.py) reads
the caches and writes what these compute.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from gpufleet.engine.snapshot import fleet_parts
from gpufleet.engine.types import Snapshot, Workload, WorkloadClass
from gpufleet.model.fleet import Fleet
from gpufleet.model.keys import (
    CLUSTER_LABEL,
    DISPATCHED_TO_ANNOTATION,
    EXTERNAL_ID_ANNOTATION,
    GPU_TYPES_ANNOTATION,
    HUB_JOB_LABEL,
    HUB_MANAGER,
    STALE_IN_ANNOTATION,
)
from gpufleet.model.states import FINISHED_STATES, WAITING_STATES, WorkloadState

from .observe import engine_workload, node_of, parse_time, submitted_at
from .request import request_of

# what a user asks of gpufleet on a hub Job, which its copy takes to the worker's controller
USER_ANNOTATIONS = frozenset({GPU_TYPES_ANNOTATION, EXTERNAL_ID_ANNOTATION})
# what the API server sets on a Job at its creation: a copy gets its own
_JOB_SET_LABELS = (
    "controller-uid",
    "batch.kubernetes.io/controller-uid",
    "job-name",
    "batch.kubernetes.io/job-name",
)
LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"
# the Job status fields a hub Job mirrors from its copy
MIRRORED_STATUS = (
    "active",
    "ready",
    "terminating",
    "succeeded",
    "failed",
    "startTime",
    "completionTime",
    "conditions",
)


def key(obj: dict[str, Any]) -> str:
    metadata = obj["metadata"]
    return f"{metadata['namespace']}/{metadata['name']}"


def is_hub_job(job: dict[str, Any]) -> bool:
    """A Job the hub dispatches: submitted with spec.managedBy gpufleet.io/hub."""
    return (job.get("spec") or {}).get("managedBy") == HUB_MANAGER


def annotation(obj: dict[str, Any], name: str) -> str | None:
    return (obj["metadata"].get("annotations") or {}).get(name)


def dispatched_to(job: dict[str, Any]) -> str | None:
    return annotation(job, DISPATCHED_TO_ANNOTATION) or None


def stale_in(job: dict[str, Any]) -> list[str]:
    return [c for c in (annotation(job, STALE_IN_ANNOTATION) or "").split(",") if c]


def pinned_cluster(job: dict[str, Any]) -> str | None:
    """The cluster the Job must run in; None: any (label gpufleet.io/cluster unset or auto)."""
    value = (job["metadata"].get("labels") or {}).get(CLUSTER_LABEL, "auto")
    return None if value in ("", "auto") else value


def finished(job: dict[str, Any]) -> bool:
    conditions = (job.get("status") or {}).get("conditions") or []
    return any(
        c.get("type") in ("Complete", "Failed") and c.get("status") == "True" for c in conditions
    )


def hub_workload(job: dict[str, Any], fleet: Fleet, now: datetime) -> Workload | None:
    """The engine's view of a hub Job, waiting; None if gpufleet does not manage it. Raises
    RequestError when it is malformed (the message says what to change)."""
    request = request_of(job, fleet)
    if request is None:
        return None
    return Workload(
        name=key(job),
        team=request.team,
        workload_class=WorkloadClass(request.workload_class),
        gpus=request.gpus,
        submitted_at=parse_time(job["metadata"].get("creationTimestamp")) or now,
        pods=request.pods,
        priority=request.priority,
        pool=request.pool,
        gpu_types=request.gpu_types,
        topology=request.topology,
    )


def copy_for_worker(job: dict[str, Any]) -> dict[str, Any]:
    """The Job a worker runs for a hub Job: its spec, without the hub's managedBy and without
    what the hub's API server set at creation; labelled with the hub Job's uid. The copy
    outlives its end (no ttlSecondsAfterFinished): the hub mirrors how it ended before the hub
    Job's own TTL removes both, and a copy gone before that would be sent again."""
    metadata = job["metadata"]
    spec = copy.deepcopy(job["spec"])
    spec.pop("managedBy", None)
    spec.pop("selector", None)
    spec.pop("ttlSecondsAfterFinished", None)
    template_metadata = spec.get("template", {}).get("metadata") or {}
    labels = template_metadata.get("labels") or {}
    for label in _JOB_SET_LABELS:
        labels.pop(label, None)
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": metadata["name"],
            "namespace": metadata["namespace"],
            "labels": {**(metadata.get("labels") or {}), HUB_JOB_LABEL: metadata["uid"]},
            "annotations": {
                k: v for k, v in (metadata.get("annotations") or {}).items() if _copied(k)
            },
        },
        "spec": spec,
    }


def _copied(annotation: str) -> bool:
    """Whether a hub Job's annotation goes with its copy: the user's own and what the user
    asks of gpufleet (the GPU types it accepts, its external id); not gpufleet's other marks
    (the hub's, admission's: the worker makes its own), nor kubectl's record of what was
    applied to the hub."""
    return annotation in USER_ANNOTATIONS or not (
        annotation.startswith("gpufleet.io/") or annotation == LAST_APPLIED
    )


def copies_by_hub_job(copies: Iterable[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """A worker's copies by the uid of the hub Job each copies."""
    found = {}
    for made in copies:
        uid = (made["metadata"].get("labels") or {}).get(HUB_JOB_LABEL)
        if uid:
            found[uid] = made
    return found


def mirrored_status(job: dict[str, Any], copy_job: dict[str, Any]) -> dict[str, Any] | None:
    """The status patch that makes the hub Job show its copy's; None when it already does."""
    have, want = job.get("status") or {}, copy_job.get("status") or {}
    patch = {f: want.get(f) for f in MIRRORED_STATUS if have.get(f) != want.get(f)}
    if have.get("startTime"):
        # the API server keeps a running Job's first start: a copy made again elsewhere (its
        # cluster lost) started later, and the hub Job started when the first copy did
        patch.pop("startTime", None)
    return patch or None


def worker_snapshot(
    fleet: Fleet,
    nodes: Sequence[dict[str, Any]],
    gpuworkloads: Sequence[dict[str, Any]],
    now: datetime,
    sent: Sequence[Workload] = (),
) -> Snapshot:
    """A worker as its own controller's engine sees it, from its nodes and GPUWorkloads (the
    fleet restricted to the worker's pools): GPUs only, since the hub does not watch pods and
    the worker checks CPU and memory itself. `sent` is the work the hub sent that the worker
    has not shown as a GPUWorkload yet: it waits there, first in its queue."""
    pools, teams, reservations, policy = fleet_parts(fleet, now)
    engine_nodes = []
    for obj in nodes:
        node = node_of(obj, now)
        if node is not None and node.pool in pools:
            engine_nodes.append(replace(node, cpu_free=None, memory_free=None))
    known = {n.name for n in engine_nodes}
    workloads = [
        w for w in (_workload(o, known, pools, now) for o in gpuworkloads) if w is not None
    ]
    shown = {w.name for w in workloads}
    workloads += [w for w in sent if w.name not in shown]
    return Snapshot(now, pools, teams, reservations, policy, tuple(engine_nodes), tuple(workloads))


def _workload(
    obj: dict[str, Any], known: set[str], pools: dict[str, Any], now: datetime
) -> Workload | None:
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    state = WorkloadState(status.get("state", "Pending"))
    if state in FINISHED_STATES or spec.get("class") not in ("reserved", "elastic"):
        return None
    nodes: tuple[str, ...] = ()
    if state not in WAITING_STATES:
        nodes = tuple(status.get("nodes") or ())
        pods = int(spec.get("pods", 1))
        # admitted onto nodes the hub does not see (gone, or still to be provisioned: the
        # engine names those after their pool): counted where the engine can, else not at all
        if len(nodes) != pods or not all(n in known or n.split("/")[0] in pools for n in nodes):
            return None
    # the worker's GPUWorkload is named after the copy, which is named after the hub Job
    ref = spec.get("workloadRef") or {}
    name = f"{obj['metadata']['namespace']}/{ref.get('name') or obj['metadata']['name']}"
    return engine_workload(name, spec, status, state, nodes, submitted_at(status, obj, now))
