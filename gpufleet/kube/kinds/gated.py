"""Kinds without a suspend field (Deployments, LeaderWorkerSets): their pods are created held by
gpufleet's scheduling gate and released where the engine places them; a preempted workload's
pods are deleted and its controller makes them again, held. The webhook labels the pod
templates with the workload at creation, so its pods are found and held."""

from __future__ import annotations

from typing import Any

from gpufleet.model.keys import WORKLOAD_LABEL

from .base import Obj, Outcome, TemplatePatch, WorkloadKind, merge_patch, patched


class GatedKind(WorkloadKind):
    pod_label = WORKLOAD_LABEL
    gated = True

    def pods_named(self, obj: Obj) -> str | None:
        name = (obj.get("metadata") or {}).get("name")
        return self.workload_name(name) if name else None

    def template_paths(self, obj: Obj) -> list[tuple[str, ...]]:
        """Where under `spec` each pod set's template is, in the order of `pod_sets`."""
        raise NotImplementedError

    def templates_patch(self, obj: Obj, patch_of: TemplatePatch) -> Obj:
        # each template patched and labelled with its workload (the pod webhook holds the
        # pods that carry the label, the loop finds them by it); paths are maps, not lists,
        # so a merge patch reaches each template alone
        label: dict[str, Any] = {"metadata": {"labels": {WORKLOAD_LABEL: self.pods_named(obj)}}}
        out: Obj = {}
        for path, pod_set in zip(self.template_paths(obj), self.pod_sets(obj), strict=True):
            node = out
            for key in path[:-1]:
                node = node.setdefault(key, {})
            node[path[-1]] = merge_patch(patched(pod_set, patch_of), label)
        return out

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
