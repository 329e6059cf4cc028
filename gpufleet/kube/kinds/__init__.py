"""The workload kinds gpufleet manages: one adapter per kind, one line each in `KINDS`."""

from __future__ import annotations

from .base import Obj, Outcome, PodSet, WorkloadKind, owner_kind
from .deployment import Deployment
from .job import Job
from .jobset import JobSet
from .leaderworkerset import LeaderWorkerSet
from .pod import Pod
from .pytorchjob import PyTorchJob
from .rayjob import RayJob
from .trainjob import TrainJob

JOB = Job()
DEPLOYMENT = Deployment()
LEADER_WORKER_SET = LeaderWorkerSet()
POD = Pod()  # bare pods, which gpufleet makes again after a preemption
KINDS: tuple[WorkloadKind, ...] = (
    JOB,
    JobSet(),
    TrainJob(),
    RayJob(),
    PyTorchJob(),
    DEPLOYMENT,
    LEADER_WORKER_SET,
    POD,
)
# the kinds watched and admitted as objects of their own: a bare pod is one of the pods
OBJECT_KINDS = tuple(k for k in KINDS if not k.bare)
_BY_GROUP_KIND = {(k.group, k.kind): k for k in KINDS}


def kind_of(obj: Obj) -> WorkloadKind | None:
    """The adapter of `obj`'s kind, None for a kind gpufleet does not manage."""
    group = str(obj.get("apiVersion", "")).rpartition("/")[0]
    return _BY_GROUP_KIND.get((group, str(obj.get("kind", ""))))


def adapter_of(obj: Obj) -> WorkloadKind:
    """The adapter of a managed workload's object: a Job's for an object that names no kind
    (GPUWorkloads of the first release stand for Jobs and were written without one)."""
    return kind_of(obj) or JOB


def kind_list(last: str = "or") -> str:
    """The managed kinds in words, for help texts: "Job, JobSet, ... or bare Pod"."""
    names = [k.kind for k in OBJECT_KINDS] + ["bare Pod"]
    return f"{', '.join(names[:-1])} {last} {names[-1]}"


def referred_to(workload: Obj) -> tuple[WorkloadKind, str] | None:
    """The kind and name of the object a GPUWorkload stands for (`spec.workloadRef`; a
    GPUWorkload of an earlier release without one stands for the Job of its name)."""
    ref = (workload.get("spec") or {}).get("workloadRef") or {}
    kind = kind_of(
        {"apiVersion": ref.get("apiVersion", "batch/v1"), "kind": ref.get("kind", "Job")}
    )
    return None if kind is None else (kind, ref.get("name") or workload["metadata"]["name"])


def stamped(obj: Obj, kind: WorkloadKind) -> Obj:
    """`obj` with its apiVersion and kind (a LIST's items of built-in kinds come without)."""
    obj["apiVersion"], obj["kind"] = kind.api_version, kind.kind
    return obj


def made_by_managed_kind(obj: Obj) -> bool:
    """Whether a kind gpufleet manages made `obj` (a JobSet's Jobs, a TrainJob's JobSet): the
    owner is admitted, so its parts are not admitted again."""
    owner = owner_kind(obj)
    return owner is not None and owner in _BY_GROUP_KIND


__all__ = [
    "JOB",
    "KINDS",
    "LEADER_WORKER_SET",
    "OBJECT_KINDS",
    "POD",
    "Outcome",
    "PodSet",
    "WorkloadKind",
    "adapter_of",
    "kind_list",
    "kind_of",
    "made_by_managed_kind",
    "referred_to",
    "stamped",
]
