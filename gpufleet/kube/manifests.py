"""Workload manifests built from a few fields (the short form `gpufleet submit`, the API's
`POST /api/v1/workloads` and the SDK take) or from a project's run plan (`gpufleet run`, the
SDK's `run`), or a user's manifest labelled for gpufleet. Pure functions over dicts."""

from __future__ import annotations

import re
import secrets
import string
from collections.abc import Mapping, Sequence
from typing import Any

from gpufleet.kube.kinds import KINDS, kind_of
from gpufleet.model.api import NAMED_PRIORITIES
from gpufleet.model.gpu_types import split_list
from gpufleet.model.keys import CLUSTER_LABEL, GPU_TYPES_ANNOTATION, HUB_MANAGER
from gpufleet.project.config import RunConfig
from gpufleet.project.plan import RunPlan

SUFFIX = string.ascii_lowercase + string.digits


CLUSTER_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")  # a Cluster's name, or auto


def for_hub(job: dict[str, Any], cluster: str) -> dict[str, Any]:
    """The Job as the hub of a fleet takes it: managed by the hub (so the hub's own Job
    controller leaves it alone), pinned to `cluster` unless that is auto. ValueError where
    it cannot go through the hub."""
    if job.get("apiVersion") != "batch/v1" or job.get("kind") != "Job":
        raise ValueError("the hub sends batch/v1 Jobs only")
    if not cluster or not CLUSTER_NAME.fullmatch(cluster):
        raise ValueError("use auto or the name of a Cluster of the fleet")
    job.setdefault("spec", {})["managedBy"] = HUB_MANAGER
    job["metadata"].setdefault("labels", {})[CLUSTER_LABEL] = cluster
    return job


def job_manifest(
    name: str,
    namespace: str,
    team: str,
    workload_class: str,
    priority: str,
    gpus: int,
    pods: int,
    image: str,
    command: list[str],
    pool: str | None,
    run_for: str | None,
    gpu_types: Sequence[str] = (),
) -> dict[str, Any]:
    """A Job whose `pods` pods (a gang when more than one) each ask for `gpus` GPUs, of one of
    `gpu_types` (the most preferred first) where given."""
    labels = {
        "gpufleet.io/team": team,
        "gpufleet.io/class": workload_class,
        "gpufleet.io/priority": priority,
    }
    if pool:
        labels["gpufleet.io/pool"] = pool
    container: dict[str, Any] = {
        "name": "main",
        "image": image,
        "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
    }
    if command:
        container["command"] = command
    template: dict[str, Any] = {"spec": {"restartPolicy": "Never", "containers": [container]}}
    if run_for:
        template["metadata"] = {"annotations": {"gpufleet.io/run-for": run_for}}
    metadata: dict[str, Any] = {"name": name, "namespace": namespace, "labels": labels}
    if gpu_types:
        metadata["annotations"] = {GPU_TYPES_ANNOTATION: ",".join(gpu_types)}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": metadata,
        "spec": {"parallelism": pods, "completions": pods, "backoffLimit": 0, "template": template},
    }


def as_kind(job: dict[str, Any], kind: str, runtime: str) -> dict[str, Any]:
    """The Job `job_manifest` built, as a JobSet (one replicated Job of the same pods), a
    TrainJob (its pods as nodes of the ClusterTrainingRuntime `runtime`), a Deployment (its
    pods as replicas, which serve until deleted) or a bare pod (its one pod)."""
    if kind == "job":
        return job
    metadata, spec = job["metadata"], job["spec"]
    if kind == "pod":
        if spec["parallelism"] != 1:
            raise ValueError("a bare pod is one pod: use --pods 1, or --kind job for a gang")
        template = spec["template"]
        own = template.get("metadata", {})
        pod_metadata = {**metadata, **own}
        if metadata.get("annotations") and own.get("annotations"):  # the Job's and the pod's
            pod_metadata["annotations"] = {**metadata["annotations"], **own["annotations"]}
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": pod_metadata,
            "spec": template["spec"],
        }
    if kind == "deployment":
        selector = {"app.kubernetes.io/name": metadata["name"]}
        template = {**spec["template"], "metadata": {**spec["template"].get("metadata", {})}}
        template["metadata"]["labels"] = dict(selector)  # a copy: YAML output has no anchors
        template["spec"] = {k: v for k, v in template["spec"].items() if k != "restartPolicy"}
        return {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": metadata,
            "spec": {
                "replicas": spec["parallelism"],
                "selector": {"matchLabels": selector},
                "template": template,
            },
        }
    if kind == "jobset":
        return {
            "apiVersion": "jobset.x-k8s.io/v1alpha2",
            "kind": "JobSet",
            "metadata": metadata,
            "spec": {
                "replicatedJobs": [{"name": "workers", "replicas": 1, "template": {"spec": spec}}]
            },
        }
    (container,) = spec["template"]["spec"]["containers"]
    trainer: dict[str, Any] = {
        "image": container["image"],
        "numNodes": spec["parallelism"],
        "resourcesPerNode": container["resources"],
    }
    if container.get("command"):
        trainer["command"] = container["command"]
    if container.get("env"):
        trainer["env"] = container["env"]
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": metadata,
        "spec": {"runtimeRef": {"name": runtime}, "trainer": trainer},
    }


def label_manifest(
    job: dict[str, Any], team: str, workload_class: str, priority: str, namespace: str | None
) -> dict[str, Any]:
    """A user's manifest of a kind gpufleet manages with gpufleet's labels added (its own
    labels are kept)."""
    if not isinstance(job, dict) or kind_of(job) is None:
        kinds = ", ".join(f"{k.kind} ({k.api_version})" for k in KINDS)
        raise ValueError(f"the manifest is not of a kind gpufleet manages: {kinds}")
    metadata = job.setdefault("metadata", {})
    labels = metadata.setdefault("labels", {}) or {}
    labels.setdefault("gpufleet.io/team", team)
    labels.setdefault("gpufleet.io/class", workload_class)
    labels.setdefault("gpufleet.io/priority", priority)
    metadata["labels"] = labels
    if namespace:
        metadata["namespace"] = namespace
    return job


def is_priority(value: str) -> bool:
    """A named priority, or a number from 0 to 99."""
    return value in NAMED_PRIORITIES or (value.isdigit() and int(value) <= 99)


def run_workload(
    chosen: RunPlan, config: RunConfig, image: str, environ: Mapping[str, str]
) -> tuple[dict[str, Any], list[str]]:
    """The workload of a project's run (its name made unique), with the variables `config`
    sets and those it forwards from `environ`; and the forwarded ones `environ` lacks."""
    suffix = "".join(secrets.choice(SUFFIX) for _ in range(5))
    job = job_manifest(
        f"{chosen.name}-{suffix}",
        config.namespace or "default",
        config.team or "TEAM",
        config.workload_class or "elastic",
        config.priority or "normal",
        chosen.gpus,
        chosen.nodes,
        image,
        list(chosen.command),
        config.pool,
        None,
        split_list(config.gpu_type),
    )
    container = job["spec"]["template"]["spec"]["containers"][0]
    variables = [{"name": k, "value": v} for k, v in config.env.items()]
    missing = []
    for key in config.forward_env:
        if key in config.env:
            continue
        if key not in environ:
            missing.append(key)
            continue
        variables.append({"name": key, "value": environ[key]})
    if variables:
        container["env"] = variables
    if chosen.kind == "rayjob":
        return ray_job(job, chosen), missing
    return as_kind(job, chosen.kind, "torch-distributed"), missing


def ray_job(job: dict[str, Any], chosen: RunPlan) -> dict[str, Any]:
    """A RayJob: a head without GPUs and `nodes` workers of `gpus` GPUs; the entrypoint is
    submitted to the Ray cluster by KubeRay."""
    (container,) = job["spec"]["template"]["spec"]["containers"]
    head = {"name": "ray-head", "image": container["image"],
            "resources": {"limits": {"cpu": "1", "memory": "2Gi"}}}  # fmt: skip
    worker = {"name": "ray-worker", "image": container["image"],
              "resources": container["resources"]}  # fmt: skip
    if container.get("env"):
        head["env"] = worker["env"] = container["env"]
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": job["metadata"],
        "spec": {
            "entrypoint": " ".join(chosen.command),
            "shutdownAfterJobFinishes": True,
            "rayClusterSpec": {
                "headGroupSpec": {
                    "rayStartParams": {},
                    "template": {"spec": {"containers": [head]}},
                },
                "workerGroupSpecs": [
                    {
                        "groupName": "workers",
                        "replicas": chosen.nodes,
                        "minReplicas": chosen.nodes,
                        "maxReplicas": chosen.nodes,
                        "rayStartParams": {},
                        "template": {"spec": {"containers": [worker]}},
                    }
                ],
            },
        },
    }


def with_image(workload: dict[str, Any], image: str) -> dict[str, Any]:
    """`workload` with every container's image set to `image` (the one pushed)."""

    def visit(node: Any) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "image" and isinstance(value, str):
                    node[key] = image
                else:
                    visit(value)
        elif isinstance(node, list):
            for item in node:
                visit(item)

    visit(workload)
    return workload
