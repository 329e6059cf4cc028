"""v1 Pod, a bare one: no controller owns it and it carries the team label. The pod is a
workload of its own, one pod, held by gpufleet's scheduling gate until admitted (see gated.py).
Nothing else makes a deleted bare pod again, so gpufleet keeps its manifest in the GPUWorkload
(`spec.podTemplate`) and, when a preemption deleted it, makes it again, held, under its name."""

from __future__ import annotations

from typing import Any

from gpufleet.model.keys import ADMISSION_GATE, TEAM_LABEL, WORKLOAD_LABEL
from gpufleet.model.states import WorkloadState

from .base import Obj, Outcome, PodSet, TemplatePatch, merge_patch, owner_kind
from .gated import GatedKind

# what a manifest made again keeps of the pod's metadata (the rest is the API server's)
KEPT_METADATA = ("labels", "annotations")
# what the API server or the scheduler set on the pod: a pod made again gets them anew
DROPPED_SPEC = ("nodeName", "priority")


class Pod(GatedKind):
    kind = "Pod"
    api_version = "v1"
    plural = "pods"
    prefix = "pod"
    bare = True

    def selected(self, obj: Obj) -> bool:
        labels = (obj.get("metadata") or {}).get("labels") or {}
        return bool(labels.get(TEAM_LABEL)) and owner_kind(obj) is None

    def pod_sets(self, obj: Obj) -> list[PodSet]:
        metadata = obj.get("metadata") or {}
        template = {
            "metadata": {k: metadata[k] for k in KEPT_METADATA if k in metadata},
            "spec": obj.get("spec") or {},
        }
        return [PodSet("pod", 1, template)]

    def templates_patch(self, obj: Obj, patch_of: TemplatePatch) -> Obj:
        # the pod is its own template: the patch applies to it, with gpufleet's gate added to
        # the gates it has and, where its name is known (not generateName), the label that
        # names its workload, for people's selectors (the loop needs none: the pod is itself)
        patch: dict[str, Any] = patch_of(self.pod_sets(obj)[0]) or {}
        named = self.pods_named(obj)
        if named:
            patch = merge_patch(patch, {"metadata": {"labels": {WORKLOAD_LABEL: named}}})
        gates = list((obj.get("spec") or {}).get("schedulingGates") or [])
        if not any(g.get("name") == ADMISSION_GATE for g in gates):
            patch.setdefault("spec", {})["schedulingGates"] = [*gates, {"name": ADMISSION_GATE}]
        return patch

    def creation_patches(self, obj: Obj, patch_of: TemplatePatch) -> Obj:
        return self.templates_patch(obj, patch_of)

    def problem(self, obj: Obj) -> str | None:
        return None  # a name made from generateName is known by the time the loop sees it

    def outcome(self, obj: Obj, pods: list[Obj]) -> Outcome | None:
        if (obj.get("metadata") or {}).get("deletionTimestamp"):
            return None  # deleted (a preemption, or its owner), it did not end on its own
        status = obj.get("status") or {}
        phase = status.get("phase")
        if phase == "Succeeded":
            return Outcome(
                WorkloadState.COMPLETED, None, "the pod completed: its containers succeeded"
            )
        if phase == "Failed":
            reason = status.get("reason") or None
            said = "the pod failed" + (f" ({reason})" if reason else "")
            detail = status.get("message") or _exit_codes(status)
            return Outcome(WorkloadState.FAILED, reason, said + (f": {detail}" if detail else ""))
        return None

    def manifest(self, obj: Obj) -> Obj:
        """What the pod is made again from after a preemption: its labels, annotations and
        spec as created (held), less what the API server and the scheduler set."""
        template = self.pod_sets(obj)[0].template
        spec = {k: v for k, v in template["spec"].items() if k not in DROPPED_SPEC}
        return {"metadata": template["metadata"], "spec": spec}

    def remade(self, namespace: str, name: str, manifest: Obj) -> Obj:
        """The pod `name` made again from its manifest, held by gpufleet's gate."""
        spec = dict(manifest.get("spec") or {})
        gates = [g for g in spec.get("schedulingGates") or [] if g.get("name") != ADMISSION_GATE]
        spec["schedulingGates"] = [*gates, {"name": ADMISSION_GATE}]
        metadata = {**(manifest.get("metadata") or {}), "name": name, "namespace": namespace}
        return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def _exit_codes(status: Obj) -> str:
    codes = [
        str(((c.get("state") or {}).get("terminated") or {}).get("exitCode"))
        for c in status.get("containerStatuses") or []
        if ((c.get("state") or {}).get("terminated") or {}).get("exitCode") not in (None, 0)
    ]
    return f"exit code {', '.join(codes)}" if codes else ""
