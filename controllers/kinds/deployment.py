"""apps/v1 Deployment, for inference: its `replicas` pods are one gang. A Deployment cannot be
suspended: its pods are created held by gpufleet's scheduling gate and released where the engine
places them; a preempted one's pods are deleted and its ReplicaSet makes them again, held."""

from __future__ import annotations

from typing import Any

from .base import Obj, Outcome, PodSet, TemplatePatch, WorkloadKind, merge_patch, patched

WORKLOAD_LABEL = "gpufleet.io/workload"  # on a gated kind's pods: its GPUWorkload's name
ADMISSION_GATE = "gpufleet.io/admission"  # the scheduling gate that holds them


class Deployment(WorkloadKind):
    kind = "Deployment"
    api_version = "apps/v1"
    plural = "deployments"
    pod_label = WORKLOAD_LABEL
    prefix = "deployment"
    summary = "Deployment; its replicas are the gang, held by a scheduling gate"
    gated = True

    def pod_sets(self, obj: Obj) -> list[PodSet]:
        spec = obj.get("spec") or {}
        replicas = spec.get("replicas")
        return [
            PodSet("pods", 1 if replicas is None else int(replicas), spec.get("template") or {})
        ]

    def pods_named(self, obj: Obj) -> str | None:
        name = (obj.get("metadata") or {}).get("name")
        return self.workload_name(name) if name else None

    def templates_patch(self, obj: Obj, patch_of: TemplatePatch) -> Obj:
        pod_set = self.pod_sets(obj)[0]
        template = patched(pod_set, patch_of)
        # its pods name their workload: the pod webhook holds them, the loop finds them
        label: dict[str, Any] = {"metadata": {"labels": {WORKLOAD_LABEL: self.pods_named(obj)}}}
        return {"template": merge_patch(template, label)}

    def creation_patches(self, obj: Obj, patch_of: TemplatePatch) -> Obj:
        return {"spec": self.templates_patch(obj, patch_of)}

    def admission_patches(self, obj: Obj, patch_of: TemplatePatch) -> list[Obj]:
        return []  # nothing to resume: its pods are released one by one

    def outcome(self, obj: Obj, pods: list[Obj]) -> Outcome | None:
        return None  # it serves until it is deleted

    def suspended(self, obj: Obj) -> bool:
        return False

    def problem(self, obj: Obj) -> str | None:
        if not (obj.get("metadata") or {}).get("name"):
            return "give it a name (generateName is not supported: its pods must name it)"
        return None
