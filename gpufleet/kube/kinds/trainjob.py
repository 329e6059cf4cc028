"""Kubeflow TrainJob (trainer.kubeflow.org/v1alpha1, Trainer v2): `spec.trainer.numNodes` pods
of `spec.trainer.resourcesPerNode` each, one gang. A TrainJob has no pod template: its runtime
has. gpufleet reads the TrainJob only (a runtime's own node count or resources are not seen)
and reaches the pods through a runtime patch of its own on the runtime's `node` Job; a runtime
patch carries labels, tolerations, node selector and affinity, not a PriorityClass or
scheduler name.
"""

from __future__ import annotations

from typing import Any

from .base import (
    Obj,
    Outcome,
    PodSet,
    TemplatePatch,
    WorkloadKind,
    condition_outcome,
    merge_patch,
    patched,
)
from .jobset import JOBSET_NAME_LABEL

TRAINER_JOB = "node"  # the runtime's Job that runs the trainer (every bundled runtime has it)
MANAGER = "gpufleet.io/admission"  # gpufleet's entry among the TrainJob's runtime patches
# what a runtime patch may set of a pod (Trainer v2.2's PodSpecPatch), of what gpufleet sets
PATCHABLE = ("nodeSelector", "affinity", "tolerations")


class TrainJob(WorkloadKind):
    kind = "TrainJob"
    api_version = "trainer.kubeflow.org/v1alpha1"
    plural = "trainjobs"
    pod_label = JOBSET_NAME_LABEL  # its pods run in a JobSet of the TrainJob's name
    prefix = "trainjob"
    # its runtime patch reaches a JobSet that exists from the TrainJob's creation on, whose
    # webhook refuses a change of node affinity
    pins_nodes = False

    def pod_sets(self, obj: Obj) -> list[PodSet]:
        trainer = (obj.get("spec") or {}).get("trainer") or {}
        ours = _our_pod_patch(obj)
        template: Obj = {
            "metadata": ours.get("metadata") or {},
            "spec": {
                **(ours.get("spec") or {}),
                "containers": [
                    {"name": TRAINER_JOB, "resources": trainer.get("resourcesPerNode") or {}}
                ],
            },
        }
        return [PodSet(TRAINER_JOB, int(trainer.get("numNodes") or 1), template)]

    def templates_patch(self, obj: Obj, patch_of: TemplatePatch) -> Obj:
        pod_set = self.pod_sets(obj)[0]
        template = patched(pod_set, patch_of)
        if template is pod_set.template:
            return {}
        pod_spec = {k: template["spec"][k] for k in PATCHABLE if k in template["spec"]}
        pod: dict[str, Any] = {"spec": pod_spec}
        labels = (template.get("metadata") or {}).get("labels")
        if labels:
            pod["metadata"] = {"labels": labels}
        entry = {
            "manager": MANAGER,
            "trainingRuntimeSpec": {
                "template": {
                    "spec": {
                        "replicatedJobs": [
                            {"name": TRAINER_JOB, "template": {"spec": {"template": pod}}}
                        ]
                    }
                }
            },
        }
        others = [
            p
            for p in (obj.get("spec") or {}).get("runtimePatches") or []
            if p.get("manager") != MANAGER
        ]
        return {"runtimePatches": [*others, entry]}

    def admission_patches(self, obj: Obj, patch_of: TemplatePatch) -> list[Obj]:
        # Trainer lets runtime patches change only while the TrainJob stays suspended
        placement = self.templates_patch(obj, patch_of)
        resume = {"spec": {"suspend": False}}
        return [{"spec": placement}, resume] if placement else [resume]

    def outcome(self, obj: Obj, pods: list[Obj]) -> Outcome | None:
        return condition_outcome(obj, "TrainJob", "Complete", "Failed")


def _our_pod_patch(obj: Obj) -> Obj:
    """The pod template gpufleet's runtime patch sets on the trainer Job ({} when none)."""
    for entry in (obj.get("spec") or {}).get("runtimePatches") or []:
        if entry.get("manager") != MANAGER:
            continue
        spec = ((entry.get("trainingRuntimeSpec") or {}).get("template") or {}).get("spec") or {}
        for replicated in spec.get("replicatedJobs") or []:
            if replicated.get("name") == TRAINER_JOB:
                job = replicated.get("template") or {}
                return merge_patch({}, (job.get("spec") or {}).get("template") or {})
    return {}
