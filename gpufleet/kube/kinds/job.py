"""batch/v1 Job: one pod set of `parallelism` pods (a gang when more than one).

A Job is created with gpufleet's scheduling gate in its pod template (the holding policy puts it
there), not suspended: the Job controller makes its pods at once, as in plain Kubernetes, and
they wait at the gate until the admission releases them where the engine placed them. A
preemption deletes its running pods uncounted (`actions.uncounted_pod_writes`) and does not
suspend it: the Job controller makes new pods at once, held again. A Job without the gate in
its template (made before the policy held Jobs this way) is admitted as before: resumed with
its template pinned, and suspended to preempt it."""

from __future__ import annotations

from gpufleet.model.states import WorkloadState

from .base import (
    Obj,
    Outcome,
    PodSet,
    TemplatePatch,
    WorkloadKind,
    gate_holds,
    merge_patch,
    with_gate,
)

JOB_NAME_LABEL = "batch.kubernetes.io/job-name"  # the Job controller labels its pods with it
# the Job controller's finalizer on each pod it has not counted yet as succeeded or failed
JOB_TRACKING_FINALIZER = "batch.kubernetes.io/job-tracking"


def pod_count(job: Obj) -> int:
    """Pods that run together: the Job's parallelism, at most its completions."""
    spec = job.get("spec") or {}
    parallelism = spec.get("parallelism", 1)
    completions = spec.get("completions")
    if completions is not None:
        parallelism = min(parallelism, completions)
    return max(int(parallelism), 1)


class Job(WorkloadKind):
    kind = "Job"
    api_version = "batch/v1"
    plural = "jobs"
    pod_label = JOB_NAME_LABEL
    pod_finalizer = JOB_TRACKING_FINALIZER

    def pod_sets(self, obj: Obj) -> list[PodSet]:
        template = (obj.get("spec") or {}).get("template") or {}
        return [PodSet("job", pod_count(obj), template)]

    def templates_patch(self, obj: Obj, patch_of: TemplatePatch) -> Obj:
        patch = patch_of(self.pod_sets(obj)[0])
        return {"template": patch} if patch else {}

    def holds_pods(self, obj: Obj) -> bool:
        return gate_holds((obj.get("spec") or {}).get("template") or {})

    def creation_patches(self, obj: Obj, patch_of: TemplatePatch) -> Obj:
        """What the webhook sets on a Job the holding policy handed it: the gate, as that
        policy sets it (it is there already), never a suspension."""
        template = (obj.get("spec") or {}).get("template") or {}
        patch = patch_of(self.pod_sets(obj)[0]) or {}
        return {"spec": {"template": merge_patch(patch, with_gate(template))}}

    def admission_patches(self, obj: Obj, patch_of: TemplatePatch) -> list[Obj]:
        if not self.holds_pods(obj):
            return super().admission_patches(obj, patch_of)
        # its pods are pinned as they are released; resumed where a preemption suspended it
        return [{"spec": {"suspend": False}}] if self.suspended(obj) else []

    def outcome(self, obj: Obj, pods: list[Obj]) -> Outcome | None:
        status = obj.get("status") or {}
        for condition in status.get("conditions") or []:
            if condition.get("status") != "True" or condition.get("type") not in (
                "Complete",
                "Failed",
            ):
                continue
            if condition["type"] == "Complete":
                return completed(status)
            reason = condition.get("reason") or None
            detail = condition.get("message") or f"{status.get('failed', 0)} pod(s) failed"
            return Outcome(
                WorkloadState.FAILED,
                reason,
                f"the Job failed{f' ({reason})' if reason else ''}: {detail}",
            )
        live = [p for p in pods if (p.get("status") or {}).get("phase") in ("Pending", "Running")]
        succeeded = sum((p.get("status") or {}).get("phase") == "Succeeded" for p in pods)
        wanted = (obj.get("spec") or {}).get("completions") or pod_count(obj)
        if pods and not live and succeeded >= int(wanted):
            # every pod has finished, the Job controller has yet to say so
            return completed(status)
        return None


def completed(status: Obj) -> Outcome:
    return Outcome(
        WorkloadState.COMPLETED,
        None,
        f"the Job completed: {status.get('succeeded', 0)} pod(s) succeeded",
    )
