"""Carrying out a remediation action on the cluster (tier 3 is written up, never applied)."""

from __future__ import annotations

import json
from typing import Any

from kubernetes import client

from gpufleet.kube.calls import API_TIMEOUT_S

# labels and annotations Kubernetes sets on a Job and its template: a resubmission gets new ones
GENERATED = ("controller-uid", "job-name", "batch.kubernetes.io/controller-uid",
             "batch.kubernetes.io/job-name")  # fmt: skip


def execute(
    action: str,
    workload: dict[str, Any],
    job: dict[str, Any] | None,
    core: client.CoreV1Api,
    batch: client.BatchV1Api,
    actor: str,
    dry_run: bool = False,
) -> str:
    """Carry out `action` for a failed workload; returns what was done (for the audit log)."""
    status = workload.get("status") or {}
    diagnosis = status.get("diagnosis") or {}
    namespace, name = workload["metadata"]["namespace"], workload["metadata"]["name"]
    if action == "collect-logs":
        evidence = diagnosis.get("evidence") or {}
        return "evidence: " + json.dumps(evidence, sort_keys=True)[:4000]
    if action == "requeue":
        if job is None:
            raise ValueError(f"Job {namespace}/{name} is gone: nothing to resubmit")
        body = resubmission(job, _retry_name(batch, namespace, name))
        if dry_run:
            return f"would create Job {namespace}/{body['metadata']['name']}"
        batch.create_namespaced_job(namespace, body, _request_timeout=API_TIMEOUT_S)
        return f"created Job {namespace}/{body['metadata']['name']} (a resubmission of {name})"
    if action == "cordon-node":
        nodes = sorted(set(status.get("nodes") or []))
        if not nodes:
            raise ValueError(f"{namespace}/{name} records no node to cordon")
        if dry_run:
            return f"would cordon {', '.join(nodes)}"
        for node in nodes:
            core.patch_node(
                node,
                {
                    "spec": {"unschedulable": True},
                    "metadata": {
                        "annotations": {
                            "gpufleet.io/cordoned-by": actor,
                            "gpufleet.io/cordoned-for": f"{namespace}/{name}: "
                            f"{diagnosis.get('pattern', 'unknown')}",
                        }
                    },
                },
                _request_timeout=API_TIMEOUT_S,
            )
        return f"cordoned {', '.join(nodes)}"
    if action == "propose-capacity-change":
        return capacity_proposal(workload)
    raise ValueError(f"unknown action {action!r}")


def resubmission(job: dict[str, Any], name: str) -> dict[str, Any]:
    """A new Job with the failed one's labels, annotations and pod template (it resumes from
    its own last checkpoint, if it writes any)."""
    metadata, spec = job["metadata"], job["spec"]
    template = json.loads(json.dumps(spec["template"]))
    labels = template.get("metadata", {}).get("labels") or {}
    for key in GENERATED:
        labels.pop(key, None)
    kept = ("parallelism", "completions", "backoffLimit", "activeDeadlineSeconds",
            "completionMode", "ttlSecondsAfterFinished", "podFailurePolicy")  # fmt: skip
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": metadata["namespace"],
            "labels": {
                k: v for k, v in (metadata.get("labels") or {}).items() if k not in GENERATED
            },
            "annotations": {"gpufleet.io/resubmission-of": metadata["name"]},
        },
        "spec": {**{k: spec[k] for k in kept if k in spec}, "template": template},
    }


def capacity_proposal(workload: dict[str, Any]) -> str:
    """A pull-request text for the capacity owners; gpufleet never applies it."""
    spec, status = workload["spec"], workload.get("status") or {}
    diagnosis = status.get("diagnosis") or {}
    name = f"{workload['metadata']['namespace']}/{workload['metadata']['name']}"
    gpus = spec["gpus"] * spec.get("pods", 1)
    return (
        f"Proposed pull request (not applied): capacity for team {spec['team']}\n\n"
        f"{name} failed ({diagnosis.get('pattern', 'unknown')}: {diagnosis.get('summary', '')})\n"
        f"It needs {gpus:g} GPUs ({spec.get('pods', 1)} pod(s) of {spec['gpus']:g}) in pool "
        f"{status.get('pool') or spec.get('pool') or 'any'}.\n"
        "Consider: a Reservation for the team in that pool, a higher maxGPUs for the pool, or "
        "an on-demand pool for work that cannot be interrupted. Review the simulated effect "
        "with `gpufleet plan` before merging."
    )


def _retry_name(batch: client.BatchV1Api, namespace: str, name: str) -> str:
    base = name.split("-retry-")[0]
    taken = {
        j.metadata.name
        for j in batch.list_namespaced_job(namespace, _request_timeout=API_TIMEOUT_S).items
    }
    n = 1
    while f"{base}-retry-{n}"[:63] in taken:
        n += 1
    return f"{base}-retry-{n}"[:63]
