"""What every workload kind tells gpufleet, and the lever it is moved with.

A kind adapter reads one object as the API returns it (a dict): its pod sets (how many pods,
each pod's template), whether it is suspended, whether it has finished; and writes merge
patches that suspend it, resume it pinned to the engine's nodes, and mark it at creation (a
kind without a suspend field is held at its pods instead: gated.py). The engine never sees a
kind: a workload is its pod sets. Pure; no Kubernetes client here.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpufleet.model.keys import ADMISSION_GATE, GPU_RESOURCE
from gpufleet.model.states import WorkloadState

from ..quantity import mebibytes, milli_cpu

NODE_NAME_FIELD = "metadata.name"
HOSTNAME_LABEL = "kubernetes.io/hostname"  # how earlier releases pinned pods to nodes

Obj = dict[str, Any]
# a merge patch for one pod template ({"metadata": ..., "spec": ...}), or None: leave it
TemplatePatch = Callable[["PodSet"], Obj | None]


@dataclass(frozen=True)
class PodSet:
    """Pods of one role that run together: `count` pods made from `template`."""

    name: str
    count: int
    template: Obj

    @property
    def gpus(self) -> float:
        """GPUs one pod asks for (limits win over requests, as for extended resources)."""
        return template_gpus(self.template)


@dataclass(frozen=True)
class Outcome:
    """How a finished workload ended."""

    state: WorkloadState  # Completed | Failed
    reason: str | None
    message: str


def container_requests(container: Obj) -> dict[str, Any]:
    """What a container requests: its requests, a limit where no request is set (the API
    server defaults a request to its limit)."""
    resources = container.get("resources") or {}
    return {**(resources.get("limits") or {}), **(resources.get("requests") or {})}


def template_room(template: Obj) -> tuple[int, int]:
    """Milli-CPU and MiB of memory one pod of `template` requests, as the scheduler counts
    them: its containers' requests together, or its largest init container's if more (init
    containers run one at a time, before them)."""
    spec = template.get("spec") or {}

    def room(containers: list[Obj], combine: Any) -> tuple[int, int]:
        asked = [container_requests(c) for c in containers]
        return (
            combine([milli_cpu(a["cpu"]) for a in asked if "cpu" in a] or [0]),
            combine([mebibytes(a["memory"]) for a in asked if "memory" in a] or [0]),
        )

    running = room(spec.get("containers") or [], sum)
    starting = room(spec.get("initContainers") or [], max)
    return max(running[0], starting[0]), max(running[1], starting[1])


def template_gpus(template: Obj) -> float:
    total = 0.0
    for container in (template.get("spec") or {}).get("containers") or []:
        resources = container.get("resources") or {}
        value = (resources.get("limits") or {}).get(GPU_RESOURCE)
        if value is None:
            value = (resources.get("requests") or {}).get(GPU_RESOURCE)
        if value is not None:
            total += float(value)
    return total


def gate_holds(template: Obj) -> bool:
    """Whether gpufleet's scheduling gate holds a pod (or the pods made from a template)."""
    gates = (template.get("spec") or {}).get("schedulingGates") or ()
    return any(g.get("name") == ADMISSION_GATE for g in gates)


def with_gate(template: Obj) -> Obj:
    """The merge patch of a pod template that adds gpufleet's scheduling gate to its gates."""
    gates = list((template.get("spec") or {}).get("schedulingGates") or [])
    if not gate_holds(template):
        gates.append({"name": ADMISSION_GATE})
    return {"spec": {"schedulingGates": gates}}


def merge_patch(target: Obj, patch: Obj) -> Obj:
    """`target` with a JSON merge patch (RFC 7386) applied; `target` is left as it was."""
    merged = dict(target)
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        elif isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = merge_patch(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def pinned_nodes(template: Obj) -> tuple[str, ...]:
    """The nodes a template's required node affinity names (by node name or hostname)."""
    affinity = (template.get("spec") or {}).get("affinity") or {}
    required = (affinity.get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    nodes: list[str] = []
    for term in required.get("nodeSelectorTerms") or []:
        for expression in [*(term.get("matchFields") or ()), *(term.get("matchExpressions") or ())]:
            key = expression.get("key")
            if key in (NODE_NAME_FIELD, HOSTNAME_LABEL) and expression.get("operator") == "In":
                nodes.extend(expression.get("values") or ())
    return tuple(nodes)


class WorkloadKind:
    """One kind of workload gpufleet admits by suspending and resuming it (or, `gated`, by
    holding and releasing its pods). Subclasses say where the kind keeps its pod templates
    (`pod_sets`, `templates_patch`) and how it reports that it finished (`outcome`); the rest
    is common to every kind with `spec.suspend`."""

    kind: str = ""
    api_version: str = ""  # group/version
    plural: str = ""
    pod_label: str = ""  # the label its pods carry, whose value `pods_named` gives
    # what a GPUWorkload's name starts with ("" for Jobs, whose GPUWorkload has their name)
    prefix: str = ""
    # whether a suspended object lets its pods' node affinity change, so an admission can pin
    # them to the engine's nodes; where not, they are pinned to the pool (node selector) and
    # kube-scheduler picks the nodes in it
    pins_nodes: bool = True
    # a kind without a suspend field: its pods are created held by a scheduling gate, released
    # (and pinned) one by one at admission, deleted at preemption; its controller makes new
    # ones, held again
    gated: bool = False
    # the object is a pod of its own (no controller makes it again): gpufleet keeps its
    # manifest in the GPUWorkload and makes it again, held, after a preemption
    bare: bool = False
    # the finalizer the kind's controller keeps on each pod until it has counted the pod (the
    # Job controller's): where set, a preemption suspends the object and then deletes its
    # pods itself, each once this finalizer is off, as that controller does for a suspended
    # object (so no pod counts as failed), instead of waiting for that controller to get to
    # it: under a burst its queue runs many seconds behind (benchmarks/README.md)
    pod_finalizer: str | None = None

    @property
    def group(self) -> str:
        return self.api_version.rpartition("/")[0]

    @property
    def version(self) -> str:
        return self.api_version.rpartition("/")[2]

    # --- reading -----------------------------------------------------------------------------

    def pod_sets(self, obj: Obj) -> list[PodSet]:
        raise NotImplementedError

    def outcome(self, obj: Obj, pods: list[Obj]) -> Outcome | None:
        """How it ended, None while it has not (`pods`: its pods, for kinds that need them)."""
        raise NotImplementedError

    def pods_named(self, obj: Obj) -> str | None:
        """The value of `pod_label` on the object's pods (its name, for most kinds); None
        while it has no pods to find."""
        return str((obj.get("metadata") or {}).get("name") or "") or None

    def suspended(self, obj: Obj) -> bool:
        return bool((obj.get("spec") or {}).get("suspend"))

    def holds_pods(self, obj: Obj) -> bool:
        """Whether the object's pods are created held by gpufleet's scheduling gate, to be
        released (and pinned) at admission: a gated kind's always, a Job's where the holding
        policy put the gate in its template."""
        return self.gated

    def selected(self, obj: Obj) -> bool:
        """Whether gpufleet considers this object at all (every object of most kinds; of
        pods, only bare ones that name a team)."""
        return True

    def workload_name(self, name: str) -> str:
        """The name of the GPUWorkload of the object named `name` (one namespace holds a Job
        and a JobSet of the same name; their GPUWorkloads must differ)."""
        return f"{self.prefix}-{name}" if self.prefix else name

    # --- writing (merge patches) -------------------------------------------------------------

    def templates_patch(self, obj: Obj, patch_of: TemplatePatch) -> Obj:
        """The merge patch of `obj`'s spec that applies `patch_of(pod set)` to each pod set's
        template (lists are replaced whole by a merge patch: the kind rebuilds them)."""
        raise NotImplementedError

    def creation_patches(self, obj: Obj, patch_of: TemplatePatch) -> Obj:
        """What the webhook sets at creation: suspended, and each template patched."""
        return {"spec": {"suspend": True, **self.templates_patch(obj, patch_of)}}

    def admission_patches(self, obj: Obj, patch_of: TemplatePatch) -> list[Obj]:
        """The writes, in order, that resume it with its templates patched (pinned where the
        engine placed it). One write for most kinds."""
        return [{"spec": {"suspend": False, **self.templates_patch(obj, patch_of)}}]

    def suspend_patch(self) -> Obj:
        return {"spec": {"suspend": True}}

    def problem(self, obj: Obj) -> str | None:
        """Why gpufleet cannot manage this object as written (what to change), or None."""
        return None


def owner_kind(obj: Obj) -> tuple[str, str] | None:
    """(apiVersion group, kind) of the object's controlling owner, if any."""
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("controller"):
            return str(ref.get("apiVersion", "")).rpartition("/")[0], str(ref.get("kind", ""))
    return None


def patched(pod_set: PodSet, patch_of: TemplatePatch) -> Obj:
    """The pod set's template with its patch applied (unchanged when there is none)."""
    patch = patch_of(pod_set)
    return pod_set.template if patch is None else merge_patch(pod_set.template, patch)


def condition_outcome(obj: Obj, what: str, complete: str, failed: str) -> Outcome | None:
    """The outcome a kind reports by a condition of type `complete` or `failed` (True)."""
    for condition in (obj.get("status") or {}).get("conditions") or []:
        if condition.get("status") != "True" or condition.get("type") not in (complete, failed):
            continue
        reason = condition.get("reason") or None
        detail = condition.get("message") or ""
        if condition["type"] == complete:
            return Outcome(
                WorkloadState.COMPLETED,
                None,
                f"the {what} completed" + (f": {detail}" if detail else ""),
            )
        said = f"the {what} failed" + (f" ({reason})" if reason else "")
        return Outcome(WorkloadState.FAILED, reason, said + (f": {detail}" if detail else ""))
    return None
