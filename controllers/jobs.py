"""What a batch/v1 Job asks of gpufleet: team, class, priority, GPUs per pod, pods.

Pure functions over the Job as a dict (as the API returns it); no Kubernetes client here.
"""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass
from typing import Any

from gpufleet.model.api import NAMED_PRIORITIES
from gpufleet.model.fleet import Fleet
from gpufleet.model.suggest import did_you_mean
from gpufleet.render.common import ZONE_LABEL

TEAM_LABEL = "gpufleet.io/team"
CLASS_LABEL = "gpufleet.io/class"
PRIORITY_LABEL = "gpufleet.io/priority"
POOL_LABEL = "gpufleet.io/pool"
TOPOLOGY_LABEL = "gpufleet.io/topology"  # block | clique: a gang must run inside one (R8)
MANAGED_ANNOTATION = "gpufleet.io/managed"
GPU_RESOURCE = "nvidia.com/gpu"
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"  # the Job controller labels its pods with it
GANG_LABEL = "gpufleet.io/gang"  # the pods of one gang (the Job's name may not be known yet)


@dataclass(frozen=True)
class Request:
    team: str
    workload_class: str
    priority: int
    gpus: float  # per pod
    pods: int
    pool: str | None
    topology: str | None = None


class RequestError(ValueError):
    """The Job cannot be managed as written; the message says what to change."""


def gpus_per_pod(job: dict[str, Any]) -> float:
    """GPUs one pod of the Job asks for (limits win over requests, as for extended resources)."""
    spec = job.get("spec", {}).get("template", {}).get("spec", {})
    total = 0.0
    for container in spec.get("containers", []):
        resources = container.get("resources", {})
        value = resources.get("limits", {}).get(GPU_RESOURCE)
        if value is None:
            value = resources.get("requests", {}).get(GPU_RESOURCE)
        if value is not None:
            total += float(value)
    return total


def pod_count(job: dict[str, Any]) -> int:
    """Pods that run together: the Job's parallelism (a gang when more than one)."""
    spec = job.get("spec", {})
    parallelism = spec.get("parallelism", 1)
    completions = spec.get("completions")
    if completions is not None:
        parallelism = min(parallelism, completions)
    return max(int(parallelism), 1)


def team_of(job: dict[str, Any], fleet: Fleet) -> str | None:
    """The Job's team: its label, else the team that owns its namespace."""
    labels = job.get("metadata", {}).get("labels") or {}
    if labels.get(TEAM_LABEL):
        return str(labels[TEAM_LABEL])
    namespace = job.get("metadata", {}).get("namespace")
    for team in sorted(fleet.teams.values(), key=lambda t: t.name):
        if namespace in team.spec.namespaces:
            return team.name
    return None


def request_of(job: dict[str, Any], fleet: Fleet) -> Request | None:
    """The gpufleet request of a Job, None if gpufleet leaves it alone (no GPUs, no team, or an
    excluded namespace). Raises RequestError when the Job is ours but malformed."""
    gpus = gpus_per_pod(job)
    namespace = job.get("metadata", {}).get("namespace", "")
    policy = fleet.policy.admission
    if gpus <= 0 or namespace in policy.excluded_namespaces:
        return None
    team = team_of(job, fleet)
    name = f"Job {namespace}/{job.get('metadata', {}).get('name', '?')}"
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
    labels = job.get("metadata", {}).get("labels") or {}
    workload_class = labels.get(CLASS_LABEL, "elastic")
    if workload_class not in ("reserved", "elastic"):
        raise RequestError(
            f"{name}: {CLASS_LABEL}={workload_class!r} is not a class; use "
            "'reserved' (within the team's reservation, never preempted) or "
            "'elastic' (idle capacity, may be preempted)"
        )
    priority = _priority(labels.get(PRIORITY_LABEL, "normal"), name)
    if gpus != math.floor(gpus):
        raise RequestError(f"{name}: asks {gpus:g} GPUs per pod; Jobs take whole GPUs")
    pods = pod_count(job)
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
    topology = labels.get(TOPOLOGY_LABEL)
    if topology is not None and topology not in ("block", "clique"):
        raise RequestError(
            f"{name}: {TOPOLOGY_LABEL}={topology!r} is not a topology level; use 'block' (its "
            "pods in one network block) or 'clique' (in one NVLink clique), or leave it out "
            "(one block is then preferred, not required)"
        )
    # one pod is always inside one domain: the requirement is a gang's
    return Request(team, workload_class, priority, gpus, pods, pool, topology if pods > 1 else None)


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
    job: dict[str, Any],
    request: Request,
    priority_class: str,
    scheduler_name: str | None,
    queue: str,
) -> dict[str, Any]:
    """What the mutating webhook sets on a managed Job at creation: suspended, marked as ours,
    its PriorityClass, a toleration for the GPU taint, for a gang a pod affinity that keeps its
    pods in one zone and, when pods are handed to another scheduler, its name (immutable
    later) and, for KAI, the team's leaf queue."""
    template = job.get("spec", {}).get("template", {})
    tolerations = list(template.get("spec", {}).get("tolerations") or [])
    if not any(t.get("key") == GPU_RESOURCE for t in tolerations):
        tolerations.append({"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"})
    pod_spec: dict[str, Any] = {"priorityClassName": priority_class, "tolerations": tolerations}
    pod_labels: dict[str, str] = {}
    pod_template: dict[str, Any] = {"spec": pod_spec}
    if scheduler_name:
        pod_spec["schedulerName"] = scheduler_name
        if scheduler_name == KAI_SCHEDULER:
            pod_labels[KAI_QUEUE_LABEL] = queue
    affinity = template.get("spec", {}).get("affinity") or {}
    if request.pods > 1 and not affinity.get("podAffinity"):
        # A gang runs in one zone, as the engine places it. Pinned to existing nodes it is
        # anyway; onto nodes still to be provisioned only this holds it there (Karpenter
        # launches all its nodes in the zone of the first), and pod affinity cannot be added
        # at admission: a suspended Job's template lets only node affinity change.
        gang = (template.get("metadata", {}).get("labels") or {}).get(GANG_LABEL)
        gang = gang or uuid.uuid4().hex[:16]
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
    if pod_labels:
        pod_template["metadata"] = {"labels": pod_labels}
    return {
        "metadata": {
            "annotations": {MANAGED_ANNOTATION: "true"},
            "labels": {TEAM_LABEL: request.team, CLASS_LABEL: request.workload_class},
        },
        "spec": {"suspend": True, "template": pod_template},
    }
