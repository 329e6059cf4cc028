"""JobSet (sigs.k8s.io/jobset): one pod set per replicated Job, `replicas` Jobs of
`parallelism` pods each; all of them one gang."""

from __future__ import annotations

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
from .job import pod_count

JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"


class JobSet(WorkloadKind):
    kind = "JobSet"
    api_version = "jobset.x-k8s.io/v1alpha2"
    plural = "jobsets"
    pod_label = JOBSET_NAME_LABEL
    prefix = "jobset"
    # JobSet's webhook lets a suspended JobSet's pod templates change labels, annotations,
    # node selector, tolerations and scheduling gates only
    pins_nodes = False

    def pod_sets(self, obj: Obj) -> list[PodSet]:
        out = []
        for replicated in (obj.get("spec") or {}).get("replicatedJobs") or []:
            job = replicated.get("template") or {}
            replicas = int(replicated.get("replicas", 1))
            template = (job.get("spec") or {}).get("template") or {}
            out.append(PodSet(str(replicated.get("name", "")), replicas * pod_count(job), template))
        return out

    def templates_patch(self, obj: Obj, patch_of: TemplatePatch) -> Obj:
        replicated_jobs = (obj.get("spec") or {}).get("replicatedJobs") or []
        rebuilt = []
        changed = False
        for replicated, pod_set in zip(replicated_jobs, self.pod_sets(obj), strict=True):
            template = patched(pod_set, patch_of)
            changed = changed or template is not pod_set.template
            rebuilt.append(merge_patch(replicated, {"template": {"spec": {"template": template}}}))
        return {"replicatedJobs": rebuilt} if changed else {}

    def outcome(self, obj: Obj, pods: list[Obj]) -> Outcome | None:
        return condition_outcome(obj, "JobSet", "Completed", "Failed")
