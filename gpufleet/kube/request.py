"""What a workload (an object of any managed kind) asks of gpufleet: team, class,
priority, GPUs per pod, pods; and what its templates get at creation.

Pure functions over the object as a dict (as the API returns it) and its kind's adapter; no
Kubernetes client here.
"""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass
from typing import Any

from gpufleet.model.api import NAMED_PRIORITIES
from gpufleet.model.fleet import Fleet
from gpufleet.model.gpu_types import UnknownGPUType, canonical_gpu_types, split_list
from gpufleet.model.keys import (
    CLASS_LABEL,
    GANG_LABEL,
    GPU_RESOURCE,
    GPU_TYPES_ANNOTATION,
    MANAGED_ANNOTATION,
    POOL_LABEL,
    PRIORITY_LABEL,
    SUBMITTER_ANNOTATION,
    TEAM_LABEL,
    TOPOLOGY_LABEL,
    ZONE_LABEL,
)
from gpufleet.model.suggest import did_you_mean
from gpufleet.render.priorityclasses import priority_value

from .kinds import PodSet, WorkloadKind, adapter_of, kind_of, made_by_managed_kind
from .kinds.base import merge_patch


@dataclass(frozen=True)
class Request:
    team: str
    workload_class: str
    priority: int
    gpus: float  # per pod
    pods: int
    pool: str | None
    topology: str | None = None
    gpu_types: tuple[str, ...] = ()  # the most preferred first; (): any


class RequestError(ValueError):
    """The Job cannot be managed as written; the message says what to change."""


def team_of(obj: dict[str, Any], fleet: Fleet) -> str | None:
    """The workload's team: its label, else the team that owns its namespace."""
    labels = obj.get("metadata", {}).get("labels") or {}
    if labels.get(TEAM_LABEL):
        return str(labels[TEAM_LABEL])
    namespace = obj.get("metadata", {}).get("namespace")
    for team in sorted(fleet.teams.values(), key=lambda t: t.name):
        if namespace in team.spec.namespaces:
            return team.name
    return None


def foreign_team(team: str, namespace: str, fleet: Fleet) -> str | None:
    """Why a workload in `namespace` may not claim `team` (None where it may): the team label
    must name a team whose Team lists the namespace, or any tenant could run reserved work on
    another team's reservation and bill it to them. The API server checks the same
    (kube/policies.py); the words are the same."""
    namespaces = fleet.teams[team].spec.namespaces
    if namespace in namespaces:
        return None
    return team_namespace_message(team, ",".join(namespaces), namespace)


def team_namespace_message(team: str, namespaces: str, namespace: str) -> str:
    """The refusal of a team label in a namespace the team does not list (`namespaces`: the
    team's, comma-separated)."""
    return (
        f"team {team} runs in namespace(s) {namespaces or '(none listed)'}; {namespace} is not "
        f"one of them: set {TEAM_LABEL} to a team of {namespace}, or add {namespace} to the "
        f"Team's spec.namespaces by pull request"
    )


def gpu_pod_sets(obj: dict[str, Any], kind: WorkloadKind) -> list[PodSet]:
    """The pod sets that ask for GPUs (a Ray head or a launcher without GPUs is not placed)."""
    return [p for p in kind.pod_sets(obj) if p.gpus > 0 and p.count > 0]


def request_of(obj: dict[str, Any], fleet: Fleet) -> Request | None:
    """The gpufleet request of a workload, None if gpufleet leaves it alone (a kind it does not
    manage, one made by a workload it manages, no GPUs, no team, or an excluded namespace).
    Raises RequestError when the workload is ours but malformed."""
    kind = kind_of(obj)
    if kind is None or made_by_managed_kind(obj) or not kind.selected(obj):
        return None
    sets = gpu_pod_sets(obj, kind)
    namespace = obj.get("metadata", {}).get("namespace", "")
    policy = fleet.policy.admission
    if not sets or namespace in policy.excluded_namespaces:
        return None
    gpus = sets[0].gpus
    name = f"{kind.kind} {namespace}/{obj.get('metadata', {}).get('name', '?')}"
    if any(p.gpus != gpus for p in sets):
        asks = ", ".join(f"{p.name}: {p.gpus:g}" for p in sets)
        raise RequestError(
            f"{name}: its pod sets ask for different GPUs per pod ({asks}); gpufleet places "
            "gangs of equal pods: give every pod that needs GPUs the same number"
        )
    problem = kind.problem(obj)
    if problem is not None:
        raise RequestError(f"{name}: {problem}")
    team = team_of(obj, fleet)
    if team is None:
        if policy.require_team:
            teams = ", ".join(sorted(fleet.teams)) or "none defined"
            raise RequestError(
                f"{name} requests {gpus:g} GPUs per pod but belongs to no team: add the label "
                f"{TEAM_LABEL}=<team> (teams: {teams}) or run it in a namespace a Team lists"
            )
        return None
    if team not in fleet.teams:
        raise RequestError(
            f"{name}: team {team!r} does not exist"
            f"{did_you_mean(team, list(fleet.teams))}; set {TEAM_LABEL} to a "
            f"defined Team ({', '.join(sorted(fleet.teams))})"
        )
    problem = foreign_team(team, namespace, fleet)
    if problem is not None:
        raise RequestError(f"{name}: {problem}")
    labels = obj.get("metadata", {}).get("labels") or {}
    workload_class = labels.get(CLASS_LABEL, "elastic")
    if workload_class not in ("reserved", "elastic"):
        raise RequestError(
            f"{name}: {CLASS_LABEL}={workload_class!r} is not a class; use "
            "'reserved' (within the team's reservation, never preempted) or "
            "'elastic' (idle capacity, may be preempted)"
        )
    priority = _priority(labels.get(PRIORITY_LABEL, "normal"), name)
    if gpus != math.floor(gpus):
        raise RequestError(f"{name}: asks {gpus:g} GPUs per pod; workloads take whole GPUs")
    pods = sum(p.count for p in sets)
    limit = policy.max_gpus_per_workload
    if limit is not None and gpus * pods > limit:
        raise RequestError(
            f"{name} asks {gpus * pods:g} GPUs ({pods} pods x {gpus:g}); the "
            f"FleetPolicy allows at most {limit} per workload"
        )
    pool = labels.get(POOL_LABEL)
    if pool is not None and pool not in fleet.pools:
        raise RequestError(
            f"{name}: pool {pool!r} does not exist{did_you_mean(pool, list(fleet.pools))}"
        )
    gpu_types = _gpu_types(obj, name, pool, fleet)
    topology = labels.get(TOPOLOGY_LABEL)
    if topology is not None and topology not in ("block", "clique"):
        raise RequestError(
            f"{name}: {TOPOLOGY_LABEL}={topology!r} is not a topology level; use 'block' (its "
            "pods in one network block) or 'clique' (in one NVLink clique), or leave it out "
            "(one block is then preferred, not required)"
        )
    # one pod is always inside one domain: the requirement is a gang's
    return Request(
        team, workload_class, priority, gpus, pods, pool, topology if pods > 1 else None, gpu_types
    )


def _gpu_types(obj: dict[str, Any], name: str, pool: str | None, fleet: Fleet) -> tuple[str, ...]:
    """The GPU types the workload accepts (its annotation), as the pools spell them, the most
    preferred first."""
    annotations = obj.get("metadata", {}).get("annotations") or {}
    written = annotations.get(GPU_TYPES_ANNOTATION)
    if written is None:
        return ()
    pool_types = [p.spec.gpu_type for p in fleet.pools.values()]
    try:
        types = canonical_gpu_types(split_list(str(written)), pool_types)
    except UnknownGPUType as err:
        raise RequestError(f"{name}: {GPU_TYPES_ANNOTATION}: {err}") from None
    if not types:
        raise RequestError(
            f"{name}: {GPU_TYPES_ANNOTATION} is empty; list the GPU types it accepts, the most "
            "preferred first (e.g. H100,A100), or remove the annotation"
        )
    if pool is not None and fleet.pools[pool].spec.gpu_type not in types:
        raise RequestError(
            f"{name}: pool {pool} has GPU type {fleet.pools[pool].spec.gpu_type}, which "
            f"{GPU_TYPES_ANNOTATION}={written} does not accept: remove one of the two"
        )
    return types


def _priority(value: str, name: str) -> int:
    if value in NAMED_PRIORITIES:
        return NAMED_PRIORITIES[value]
    if value.isdigit() and 0 <= int(value) <= 99:
        return int(value)
    raise RequestError(
        f"{name}: {PRIORITY_LABEL}={value!r} is not a priority; use one of "
        f"{', '.join(NAMED_PRIORITIES)} or a number from 0 to 99"
    )


KAI_SCHEDULER = "kai-scheduler"
KAI_QUEUE_LABEL = "kai.scheduler/queue"


def creation_patch(
    obj: dict[str, Any],
    request: Request,
    priority_class: str,
    scheduler_name: str | None,
    queue: str,
    submitter: str = "",
) -> dict[str, Any]:
    """What the mutating webhook sets on a managed workload at creation: suspended, marked as
    ours (with its `submitter`, the user the API server names) and, on each pod template, its
    PriorityClass, a toleration for the GPU taint, for a gang a pod affinity that keeps its
    pods in one zone and, when pods are handed to another scheduler, its name (immutable
    later) and, for KAI, the team's leaf queue."""
    kind = adapter_of(obj)
    templates = [p.template for p in kind.pod_sets(obj)]
    gang = (
        next(
            (
                ((t.get("metadata") or {}).get("labels") or {}).get(GANG_LABEL)
                for t in templates
                if ((t.get("metadata") or {}).get("labels") or {}).get(GANG_LABEL)
            ),
            None,
        )
        or uuid.uuid4().hex[:16]
    )

    def template_patch(pod_set: PodSet) -> dict[str, Any]:
        spec = pod_set.template.get("spec") or {}
        tolerations = list(spec.get("tolerations") or [])
        if not any(t.get("key") == GPU_RESOURCE for t in tolerations):
            tolerations.append({"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"})
        pod_spec: dict[str, Any] = {"priorityClassName": priority_class, "tolerations": tolerations}
        if kind.bare:
            # the API server resolved a bare pod's PriorityClass before the webhook saw it:
            # its priority is set with the class, or the pod would keep the default
            pod_spec["priority"] = priority_value(priority_class)
            pod_spec["preemptionPolicy"] = "Never"
        pod_labels: dict[str, str] = {}
        if scheduler_name:
            pod_spec["schedulerName"] = scheduler_name
            if scheduler_name == KAI_SCHEDULER:
                pod_labels[KAI_QUEUE_LABEL] = queue
        if request.pods > 1 and not (spec.get("affinity") or {}).get("podAffinity"):
            # A gang runs in one zone, as the engine places it. Pinned to existing nodes it is
            # anyway, and onto nodes still to be provisioned the admission pins it to one zone
            # (`gang_zone`); this holds a replacement pod in its mates' zone after a node is
            # lost, and kinds whose suspended templates keep no node affinity. Pod affinity
            # cannot be added at admission: a suspended workload's template lets only node
            # affinity change.
            pod_labels[GANG_LABEL] = gang
            pod_spec["affinity"] = {
                "podAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": [
                        {
                            "labelSelector": {"matchLabels": {GANG_LABEL: gang}},
                            "topologyKey": ZONE_LABEL,
                        }
                    ]
                }
            }
        patch: dict[str, Any] = {"spec": pod_spec}
        if pod_labels:
            patch["metadata"] = {"labels": pod_labels}
        return patch

    marked = {
        "metadata": {
            "annotations": {
                MANAGED_ANNOTATION: "true",
                **({SUBMITTER_ANNOTATION: submitter} if submitter else {}),
            },
            "labels": {TEAM_LABEL: request.team, CLASS_LABEL: request.workload_class},
        }
    }
    # merged, not joined: a bare pod's own patch has metadata too
    return merge_patch(marked, kind.creation_patches(obj, template_patch))
