"""KubeRay RayJob (ray.io/v1): the head pod and each worker group (`replicas` x `numOfHosts`
pods) of the Ray cluster it starts, all one gang. KubeRay suspends only a RayJob whose cluster
goes when the job ends (`shutdownAfterJobFinishes: true`), so gpufleet manages only those."""

from __future__ import annotations

from gpufleet.model.states import WorkloadState

from .base import Obj, Outcome, PodSet, TemplatePatch, WorkloadKind, merge_patch, patched

CLUSTER_LABEL = "ray.io/cluster"  # on the pods of a Ray cluster, naming it


class RayJob(WorkloadKind):
    kind = "RayJob"
    api_version = "ray.io/v1"
    plural = "rayjobs"
    pod_label = CLUSTER_LABEL
    prefix = "rayjob"

    def pods_named(self, obj: Obj) -> str | None:
        # the Ray cluster it runs now (a new one each time it is resumed)
        return (obj.get("status") or {}).get("rayClusterName") or None

    def pod_sets(self, obj: Obj) -> list[PodSet]:
        cluster = (obj.get("spec") or {}).get("rayClusterSpec") or {}
        head = (cluster.get("headGroupSpec") or {}).get("template") or {}
        out = [PodSet("head", 1, head)] if head else []
        for group in cluster.get("workerGroupSpecs") or []:
            count = int(group.get("replicas", 0) or 0) * int(group.get("numOfHosts", 1) or 1)
            out.append(PodSet(str(group.get("groupName", "")), count, group.get("template") or {}))
        return out

    def templates_patch(self, obj: Obj, patch_of: TemplatePatch) -> Obj:
        cluster = (obj.get("spec") or {}).get("rayClusterSpec") or {}
        sets = self.pod_sets(obj)
        if not sets:
            return {}
        patch: Obj = {}
        head, workers = sets[0], sets[1:]
        template = patched(head, patch_of)
        if template is not head.template:
            patch["headGroupSpec"] = {"template": template}
        groups = cluster.get("workerGroupSpecs") or []
        rebuilt = [
            merge_patch(group, {"template": patched(pod_set, patch_of)})
            for group, pod_set in zip(groups, workers, strict=True)
        ]
        if rebuilt != groups:
            patch["workerGroupSpecs"] = rebuilt
        return {"rayClusterSpec": patch} if patch else {}

    def outcome(self, obj: Obj, pods: list[Obj]) -> Outcome | None:
        status = obj.get("status") or {}
        deployment = status.get("jobDeploymentStatus")
        reason = status.get("reason") or None
        detail = status.get("message") or ""
        if deployment == "Complete":
            return Outcome(
                WorkloadState.COMPLETED,
                None,
                "the RayJob completed" + (f": {detail}" if detail else ""),
            )
        if deployment in ("Failed", "ValidationFailed"):
            said = "the RayJob failed" + (f" ({reason})" if reason else "")
            return Outcome(WorkloadState.FAILED, reason, said + (f": {detail}" if detail else ""))
        return None

    def problem(self, obj: Obj) -> str | None:
        if not (obj.get("spec") or {}).get("shutdownAfterJobFinishes"):
            return (
                "gpufleet queues and preempts a RayJob by suspending it, which KubeRay allows "
                "only when its Ray cluster goes with it: set spec.shutdownAfterJobFinishes: true"
            )
        return None
