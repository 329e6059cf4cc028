"""Kubeflow Training Operator v1 PyTorchJob (kubeflow.org/v1): one pod set per replica type
(`Master`, `Worker`) of `spec.pytorchReplicaSpecs`, `replicas` pods each; all of them one gang.
It is suspended through `spec.runPolicy.suspend` (Training Operator 1.7 and later), and a
suspended PyTorchJob has no pods, so an admission may pin them to the engine's nodes."""

from __future__ import annotations

from .base import Obj, Outcome, PodSet, TemplatePatch, WorkloadKind, condition_outcome, patched

JOB_NAME_LABEL = "training.kubeflow.org/job-name"  # the operator labels its pods with it
REPLICAS = "pytorchReplicaSpecs"


class PyTorchJob(WorkloadKind):
    kind = "PyTorchJob"
    api_version = "kubeflow.org/v1"
    plural = "pytorchjobs"
    pod_label = JOB_NAME_LABEL
    prefix = "pytorchjob"

    def pod_sets(self, obj: Obj) -> list[PodSet]:
        specs = (obj.get("spec") or {}).get(REPLICAS) or {}
        # Master first, as the operator starts it: the order of a gang's pods is stable
        return [
            PodSet(role, int(spec.get("replicas", 1)), spec.get("template") or {})
            for role, spec in sorted(specs.items(), key=lambda item: item[0] != "Master")
        ]

    def templates_patch(self, obj: Obj, patch_of: TemplatePatch) -> Obj:
        patches: Obj = {}
        for pod_set in self.pod_sets(obj):
            template = patched(pod_set, patch_of)
            if template is not pod_set.template:
                patches[pod_set.name] = {"template": template}
        return {REPLICAS: patches} if patches else {}

    def suspended(self, obj: Obj) -> bool:
        return bool(((obj.get("spec") or {}).get("runPolicy") or {}).get("suspend"))

    def creation_patches(self, obj: Obj, patch_of: TemplatePatch) -> Obj:
        return {"spec": {"runPolicy": {"suspend": True}, **self.templates_patch(obj, patch_of)}}

    def admission_patches(self, obj: Obj, patch_of: TemplatePatch) -> list[Obj]:
        return [{"spec": {"runPolicy": {"suspend": False}, **self.templates_patch(obj, patch_of)}}]

    def suspend_patch(self) -> Obj:
        return {"spec": {"runPolicy": {"suspend": True}}}

    def outcome(self, obj: Obj, pods: list[Obj]) -> Outcome | None:
        return condition_outcome(obj, "PyTorchJob", "Succeeded", "Failed")
