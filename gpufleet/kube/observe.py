"""From cluster objects to an engine snapshot: what runs where, what waits, what is free.

Pure: takes the objects as the API returns them (dicts) and the fleet; no client calls.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from functools import cached_property, partial
from typing import Any, NamedTuple

from gpufleet.engine import Node, Snapshot, Workload, WorkloadClass
from gpufleet.engine.placed import Placed
from gpufleet.engine.snapshot import fleet_parts
from gpufleet.engine.types import FAULT_HALF_LIFE
from gpufleet.health.quarantine import NodeHealth, fault_score
from gpufleet.model.durations import parse_duration
from gpufleet.model.fleet import Fleet
from gpufleet.model.keys import (
    ADMITTED_AT_ANNOTATION,
    ADMITTED_NODES_ANNOTATION,
    ADMITTED_POOL_ANNOTATION,
    BLOCK_LABEL,
    CLIQUE_LABEL,
    GPU_HEALTHY_CONDITION,
    GPU_RESOURCE,
    MANAGED_ANNOTATION,
    POOL_LABEL,
    PRODUCT_LABEL,
    QUARANTINE_TAINT,
    QUARANTINED_AT_ANNOTATION,
    ZONE_LABEL,
)
from gpufleet.model.states import (
    ADMITTED_STATES,
    FINISHED_STATES,
    WAITING_STATES,
    WorkloadState,
)
from gpufleet.model.virtual_nodes import room_in, to_be_provisioned

from .kinds import WorkloadKind, adapter_of
from .kinds.base import gate_holds, pinned_nodes, template_gpus, template_room
from .quantity import mebibytes, milli_cpu

# how long a NotReady node keeps its work (Kubernetes' default toleration of an unreachable
# node): a missed heartbeat must not preempt a week-long training run
NOT_READY_GRACE_S = 300

# a node Karpenter is still registering, or draining (consolidation, interruption, deletion of
# its NodeClaim): no new work goes there
AUTOSCALER_TAINTS = ("karpenter.sh/unregistered", "karpenter.sh/disrupted")


def parse_time(value: str | None) -> datetime | None:
    if not value:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00")).astimezone(UTC)


def node_of(
    obj: dict[str, Any], now: datetime | None = None, agent_timeout: timedelta | None = None
) -> Node | None:
    """A GPU node of a pool (label gpufleet.io/pool), None for any other node. A node not Ready
    (or cordoned) takes no new work; its work is evicted only once it has not been Ready for
    NOT_READY_GRACE_S (as of `now`; at once without `now`), or when it is quarantined. A node
    whose GPU agent went silent (no heartbeat for `agent_timeout`) takes no new work either; its
    work stays (silence is no fault)."""
    metadata, status = obj["metadata"], obj.get("status", {})
    pool = (metadata.get("labels") or {}).get(POOL_LABEL)
    gpus = int(float(status.get("allocatable", {}).get(GPU_RESOURCE, 0)))
    if pool is None or gpus <= 0:
        return None
    condition: dict[str, Any] = next(
        (c for c in status.get("conditions", []) if c["type"] == "Ready"), {}
    )
    ready = condition.get("status") == "True"
    since = parse_time(condition.get("lastTransitionTime"))
    taints = obj.get("spec", {}).get("taints") or []
    lost = not ready and (
        now is None or since is None or (now - since).total_seconds() >= NOT_READY_GRACE_S
    )
    healthy = not lost and not any(t.get("key") == QUARANTINE_TAINT for t in taints)
    schedulable = (
        ready
        and not obj.get("spec", {}).get("unschedulable")
        and not any(t.get("key") in AUTOSCALER_TAINTS for t in taints)
    )
    faults = 0.0
    health = node_health(obj) if now is not None else None
    if health is not None and now is not None:
        if schedulable and agent_timeout is not None:
            schedulable = not health.agent_silent(now, agent_timeout)
        faults = fault_score(health.history(), now, FAULT_HALF_LIFE)
    labels = metadata.get("labels") or {}
    allocatable = status.get("allocatable", {})
    cpu, memory = allocatable.get("cpu"), allocatable.get("memory")
    return Node(
        metadata["name"],
        pool,
        gpus,
        labels.get(ZONE_LABEL, ""),
        healthy,
        schedulable,
        faults,
        labels.get(BLOCK_LABEL, ""),
        labels.get(CLIQUE_LABEL, ""),
        cpu_free=None if cpu is None else milli_cpu(cpu, round_up=False),
        memory_free=None if memory is None else mebibytes(memory, round_up=False),
    )


def node_health(obj: dict[str, Any]) -> NodeHealth | None:
    """What the health controller and the engine read of a GPU node's health (None for a node
    of no pool): its GPUHealthy condition with heartbeat, quarantine taint, annotations."""
    metadata = obj["metadata"]
    pool = (metadata.get("labels") or {}).get(POOL_LABEL)
    if pool is None:
        return None
    condition = next(
        (
            c
            for c in obj.get("status", {}).get("conditions") or []
            if c["type"] == GPU_HEALTHY_CONDITION
        ),
        None,
    )
    healthy = None if condition is None else condition["status"] == "True"
    return NodeHealth(
        metadata["name"],
        pool,
        healthy,
        (condition or {}).get("reason", ""),
        (condition or {}).get("message", ""),
        parse_time((condition or {}).get("lastTransitionTime")),
        any(t.get("key") == QUARANTINE_TAINT for t in obj.get("spec", {}).get("taints") or []),
        dict(metadata.get("annotations") or {}),
        parse_time((condition or {}).get("lastHeartbeatTime")),
    )


HOST_PREFIX = "gpuhost/"  # a host's name among the nodes the health controller decides on
HOSTS_POOL = "hosts"  # hosts outside Kubernetes count as one pool in maxQuarantinedPercent


def host_health(obj: dict[str, Any]) -> NodeHealth:
    """A host outside Kubernetes (GPUHost) as the health controller reads a GPU node: healthy
    as its agent's newest report says (unknown before the first), quarantined while its
    quarantine annotation is set (its agent drains its Slurm node then)."""
    metadata, status = obj["metadata"], obj.get("status") or {}
    state = status.get("state")
    healthy = None if not status.get("lastSeen") else state != "Unhealthy"
    annotations = dict(metadata.get("annotations") or {})
    return NodeHealth(
        HOST_PREFIX + metadata["name"],
        HOSTS_POOL,
        healthy,
        "GPUUnhealthy" if healthy is False else "",
        status.get("message") or "",
        parse_time(status.get("stateSince")),
        QUARANTINED_AT_ANNOTATION in annotations,
        annotations,
        parse_time(status.get("lastSeen")),
    )


@dataclass(frozen=True)
class Observed:
    """One managed workload (an object of a kind in `kinds.KINDS`) as the controller sees it."""

    obj: dict[str, Any]  # the workload's own object
    workload: dict[str, Any]  # its GPUWorkload
    state: WorkloadState  # derived from the object, its GPUWorkload and its pods
    nodes: tuple[str, ...]  # node of each pod (bound, else planned at admission)
    # its pods, for a kind whose pods gpufleet writes: a gated kind's (released or deleted
    # one by one), a Job's (deleted once it is suspended)
    pods: tuple[dict[str, Any], ...] = ()

    @cached_property  # the adapter of its kind, found once per observation
    def kind(self) -> WorkloadKind:
        return adapter_of(self.obj)

    @cached_property  # read many times per cycle for each of thousands of workloads
    def key(self) -> str:
        """namespace/name of its GPUWorkload: the engine's name for it."""
        metadata = self.workload["metadata"]
        return f"{metadata['namespace']}/{metadata['name']}"


Seen = tuple[Observed, tuple[dict[str, Any], ...]]  # a workload as observed, and its pods


def unchanged(
    seen: Seen | None, obj: dict[str, Any], workload: dict[str, Any], pods: list[dict[str, Any]]
) -> Observed | None:
    """The workload as a cycle observed it, when its object, GPUWorkload and pods are the very
    objects that cycle read (a cache replaces an object that changed, it never edits one, and
    the state depends on nothing else); None when it must be observed again. Across thousands
    of workloads in a burst of creates, deriving every state again each cycle took a quarter of
    the loop's CPU."""
    if seen is None:
        return None
    item, before = seen
    if item.obj is not obj or item.workload is not workload or len(before) != len(pods):
        return None
    return item if all(a is b for a, b in zip(before, pods, strict=True)) else None


def workload_state(
    obj: dict[str, Any], workload: dict[str, Any], pods: list[dict[str, Any]]
) -> tuple[WorkloadState, tuple[str, ...]]:
    """State and GPU pod nodes of a managed workload, from its object, its GPUWorkload and
    its pods (those without GPUs, such as a Ray head, are not counted)."""
    kind = adapter_of(obj)
    status = workload.get("status") or {}
    outcome = kind.outcome(obj, pods)
    if outcome is not None:
        return outcome.state, ()
    live = [
        p
        for p in pods
        if p.get("status", {}).get("phase") in ("Pending", "Running")
        and not p["metadata"].get("deletionTimestamp")
        and template_gpus(p) > 0  # a pod has a template's shape
        and not held(p)
    ]
    if kind.suspended(obj):
        # The loop suspends a workload before it records why: a suspended one recorded as
        # admitted or running was preempted and the record was lost (a crash in between).
        evicted = status.get("state") in {WorkloadState.PREEMPTED, *ADMITTED_STATES}
        return (WorkloadState.PREEMPTED if evicted else WorkloadState.PENDING), ()
    if kind.holds_pods(obj) and not live and not _admitted(status):
        # one held at its pods waits while none of them is released and no admission is
        # recorded
        preempted = status.get("state") == WorkloadState.PREEMPTED
        return (WorkloadState.PREEMPTED if preempted else WorkloadState.PENDING), ()
    pods_wanted = int(workload["spec"].get("pods", 1))
    # where it was admitted: recorded in the status, else (a controller crashed between the
    # admission and its record) in the node affinity the admission gave the object itself (of
    # pods it released one by one, where they are bound)
    planned = (
        tuple(status.get("nodes") or ())
        or _admitted_to(obj, pods_wanted)
        or tuple(recorded_admission(pods).get("nodes") or ())
    )
    running = [p for p in live if p.get("status", {}).get("phase") == "Running"]
    if len(running) >= pods_wanted:
        nodes = tuple(sorted(p["spec"]["nodeName"] for p in running))
        return WorkloadState.RUNNING, nodes[:pods_wanted]
    state = WorkloadState.STARTING if live else WorkloadState.QUEUED
    bound = sorted(p["spec"]["nodeName"] for p in live if p.get("spec", {}).get("nodeName"))
    # bound pods are where they are; the others go where the admission planned them (a pod
    # that replaces one lost with its node goes wherever its pool has room)
    unbound = list(planned)
    for node in bound:
        if node in unbound:
            unbound.remove(node)
    return state, (*bound, *unbound)[:pods_wanted] if bound else planned


def recorded_admission(pods: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """The admission the first pod released at it records (`actions.release`): its pool,
    nodes and time, as GPUWorkload status fields; {} where no pod records one. What a
    controller that crashed before writing the GPUWorkload's record leaves behind."""
    for pod in pods:
        annotations = pod["metadata"].get("annotations") or {}
        if ADMITTED_AT_ANNOTATION in annotations:
            nodes = annotations.get(ADMITTED_NODES_ANNOTATION) or ""
            return {
                "pool": annotations.get(ADMITTED_POOL_ANNOTATION),
                "nodes": [n for n in nodes.split(",") if n],
                "admittedAt": annotations[ADMITTED_AT_ANNOTATION],
            }
    return {}


def held(pod: dict[str, Any]) -> bool:
    """Whether gpufleet's scheduling gate still holds the pod."""
    return gate_holds(pod)


def _admitted(status: dict[str, Any]) -> bool:
    return status.get("state") in ("Queued", "Starting", "Running") and bool(status.get("nodes"))


def _admitted_to(obj: dict[str, Any], pods: int) -> tuple[str, ...]:
    """The nodes of the admission's node affinity, one per pod, when that is unambiguous."""
    nodes = pinned_to(obj)
    if len(nodes) == pods:
        return nodes
    if len(nodes) == 1:
        return nodes * pods
    return ()


def pinned_to(obj: dict[str, Any]) -> tuple[str, ...]:
    """The nodes an admission pinned the workload's GPU pods to by name; () where it pinned
    them to the pool only (nodes still to be provisioned)."""
    kind = adapter_of(obj)
    nodes: list[str] = []
    for pod_set in kind.pod_sets(obj):  # only GPU pod sets are ever pinned
        nodes.extend(n for n in pinned_nodes(pod_set.template) if n not in nodes)
    return tuple(nodes)


def holds_node(pod: dict[str, Any]) -> bool:
    """Whether a pod holds what it requests of a node: bound, and not finished."""
    return bool((pod.get("spec") or {}).get("nodeName")) and (pod.get("status") or {}).get(
        "phase"
    ) not in ("Succeeded", "Failed")


def pod_gpus(pod: dict[str, Any]) -> float:
    """GPUs a pod holds on its node: none until it is bound and once it has finished; limits
    win over requests, as for extended resources."""
    if not holds_node(pod):
        return 0.0
    gpus = 0.0
    for container in pod["spec"].get("containers") or []:
        resources = container.get("resources") or {}
        value = (resources.get("limits") or {}).get(
            GPU_RESOURCE, (resources.get("requests") or {}).get(GPU_RESOURCE)
        )
        gpus += float(value or 0)
    return gpus


def gpus_by_node(pods: Iterable[dict[str, Any]]) -> dict[str, float]:
    """GPUs held per node by `pods`."""
    used: dict[str, float] = {}
    for pod in pods:
        gpus = pod_gpus(pod)
        if gpus:
            node = pod["spec"]["nodeName"]
            used[node] = used.get(node, 0.0) + gpus
    return used


class Use(NamedTuple):
    """What pods take of a node: whole GPUs, milli-CPU, MiB of memory."""

    gpus: int = 0
    cpu: int = 0
    memory: int = 0


def foreign_use(
    pods: list[dict[str, Any]], managed: set[tuple[str, str]], room_on: set[str] | None = None
) -> dict[str, Use]:
    """What pods gpufleet does not count as its workloads' take per node (they still take the
    GPUs, CPU and memory they request: DaemonSets, unmanaged work); `managed`: (namespace, pod
    name) of the pods it counts. CPU and memory are counted only on the nodes of `room_on`
    (None: every node): a cycle reads every pod of the cluster, most of them on nodes
    without GPUs, where their requests change no decision."""
    used: dict[str, Use] = {}
    for pod in pods:
        metadata = pod["metadata"]
        if (metadata["namespace"], metadata["name"]) in managed or not holds_node(pod):
            continue
        node = pod["spec"]["nodeName"]
        gpus = int(pod_gpus(pod))
        cpu, memory = template_room(pod) if room_on is None or node in room_on else (0, 0)
        if gpus or cpu or memory:
            was = used.get(node, NO_USE)
            used[node] = Use(was.gpus + gpus, was.cpu + cpu, was.memory + memory)
    return used


def gpu_nodes(nodes: Iterable[dict[str, Any]]) -> set[str]:
    """The names of the nodes with GPUs (any `nvidia.com/gpu` allocatable)."""
    return {
        n["metadata"]["name"]
        for n in nodes
        if float((n.get("status") or {}).get("allocatable", {}).get(GPU_RESOURCE, 0) or 0) > 0
    }


NO_USE = Use()


class Kept:
    """What a loop keeps between its cycles so that the engine's state carries over (its
    placements, passed to `decide` as `placed`): the same objects for what did not change. The
    engine places again only what changed where its inputs are the very objects of the last
    cycle."""

    def __init__(self) -> None:
        self.placed = Placed()
        # per workload: (its object, its GPUWorkload, state, nodes) and the Workload made of them
        self.workloads: dict[str, tuple[tuple[Any, ...], Workload]] = {}
        self.parts: dict[str, Any] = {}

    def same(self, name: str, value: Any) -> Any:
        """`value`, or the equal one kept from the last cycle."""
        kept = self.parts.get(name)
        if kept is not None and kept == value:
            return kept
        self.parts[name] = value
        return value

    def workload(
        self, item: Observed, nodes: tuple[str, ...], make: Callable[[], Workload]
    ) -> Workload:
        """The engine's workload for `item`: the one of the last cycle while nothing it is
        made from changed (its objects are compared by identity: the caches replace an object
        that changes, and the kept tuple holds them, so an identity is never reused)."""
        kept = self.workloads.get(item.key)
        if kept is not None:
            (obj, workload, state, was_on), made = kept
            unchanged = obj is item.obj and workload is item.workload
            if unchanged and state == item.state and was_on == nodes:
                return made
        made = make()
        self.workloads[item.key] = ((item.obj, item.workload, item.state, nodes), made)
        return made

    def forget_gone(self, present: set[str]) -> None:
        for key in self.workloads.keys() - present:
            del self.workloads[key]


def snapshot(
    fleet: Fleet,
    nodes: list[dict[str, Any]],
    observed: list[Observed],
    now: datetime,
    foreign: dict[str, Use] | None = None,
    kept: Kept | None = None,
) -> Snapshot:
    """The engine's snapshot. With `kept` (a loop's, between its cycles), unchanged parts are
    the objects of the last cycle and the engine's placements carry over."""
    pools, teams, reservations, policy = fleet_parts(fleet, now)
    foreign = foreign or {}
    agent_timeout = parse_duration(fleet.policy.health.agent_timeout)
    engine_nodes = []
    for obj in nodes:
        node = node_of(obj, now, agent_timeout)
        if node is None or node.pool not in pools:
            continue  # not a GPU node of a declared pool: gpufleet does not place work there
        use = foreign.get(node.name, NO_USE)
        free = node.gpus - use.gpus
        if free > 0:
            engine_nodes.append(
                replace(
                    node,
                    gpus=free,
                    cpu_free=None if node.cpu_free is None else node.cpu_free - use.cpu,
                    memory_free=None if node.memory_free is None else node.memory_free - use.memory,
                )
            )
    known = {n.name for n in engine_nodes}
    workloads = []
    for item in observed:
        if item.state in FINISHED_STATES:
            continue
        spec, status = item.workload["spec"], item.workload.get("status") or {}
        state = WorkloadState(item.state)
        node_names = item.nodes
        if state not in WAITING_STATES:
            counted = counted_nodes(item, known, fleet)
            if counted is None:
                continue  # `partition` keeps such workloads out; never re-admit a started Job
            node_names = counted
        placed_on = tuple(node_names)
        make = partial(_workload, item, spec, status, state, placed_on, now)
        workloads.append(make() if kept is None else kept.workload(item, placed_on, make))
    engine_nodes_tuple = tuple(binding_room(engine_nodes, workloads))
    if kept is not None:
        kept.forget_gone({item.key for item in observed})
        pools, teams = kept.same("pools", pools), kept.same("teams", teams)
        reservations, policy = kept.same("reservations", reservations), kept.same("policy", policy)
        engine_nodes_tuple = kept.same("nodes", engine_nodes_tuple)
    return Snapshot(
        now,
        pools,
        teams,
        reservations,
        policy,
        engine_nodes_tuple,
        tuple(workloads),
    )


def binding_room(nodes: list[Node], workloads: list[Workload]) -> list[Node]:
    """`nodes`, each with its free CPU or memory only where it could keep a pod off the node:
    where even all its GPUs going to the hungriest work (the most CPU, or memory, per GPU)
    would leave some, it cannot, and the engine then places by GPUs alone, through its index
    (a scan of the pool's nodes per pod otherwise). The decisions are the same."""
    per_gpu = [(w.cpu / w.gpus, w.memory / w.gpus) for w in workloads if w.gpus > 0]
    cpu = max((c for c, _ in per_gpu), default=0.0)
    memory = max((m for _, m in per_gpu), default=0.0)

    def binding(free: int | None, per: float, gpus: int) -> int | None:
        return None if free is None or free >= math.ceil(per * gpus) else free

    return [
        replace(
            n,
            cpu_free=binding(n.cpu_free, cpu, n.gpus),
            memory_free=binding(n.memory_free, memory, n.gpus),
        )
        for n in nodes
    ]


def _workload(
    item: Observed,
    spec: dict[str, Any],
    status: dict[str, Any],
    state: WorkloadState,
    nodes: tuple[str, ...],
    now: datetime,
) -> Workload:
    cpu, memory = workload_room(item)
    submitted = submitted_at(status, item.obj, now)
    return engine_workload(item.key, spec, status, state, nodes, submitted, cpu, memory)


def submitted_at(status: dict[str, Any], obj: dict[str, Any], now: datetime) -> datetime:
    """When work was submitted: as its GPUWorkload's `status` says, else when `obj` (the
    object it stands for, or the GPUWorkload itself) was made."""
    return (
        parse_time(status.get("submittedAt"))
        or parse_time(obj["metadata"].get("creationTimestamp"))
        or now
    )


def engine_workload(
    name: str,
    spec: dict[str, Any],
    status: dict[str, Any],
    state: WorkloadState,
    nodes: tuple[str, ...],
    submitted: datetime,
    cpu: int = 0,
    memory: int = 0,
) -> Workload:
    """The engine's workload from a GPUWorkload's spec and status (the controller's own, or
    a worker's as the hub reads it)."""
    return Workload(
        name=name,
        team=spec["team"],
        workload_class=WorkloadClass(spec["class"]),
        gpus=float(spec["gpus"]),
        pods=int(spec.get("pods", 1)),
        priority=int(spec.get("priority", 50)),
        state=state,
        pool=spec.get("pool"),
        gpu_types=tuple(spec.get("gpuTypes") or ()),
        topology=spec.get("topology"),
        submitted_at=submitted,
        started_at=parse_time(status.get("startedAt")),
        nodes=nodes,
        preempted_at=parse_time(status.get("preemptedAt")),
        preempted_from=status.get("preemptedFrom"),
        preempted_by=status.get("preemptedBy"),
        cpu=cpu,
        memory=memory,
    )


def workload_room(item: Observed) -> tuple[int, int]:
    """Milli-CPU and MiB of memory per GPU pod of the workload (the largest of its GPU pod
    sets': a gang's pods are placed alike)."""
    rooms = [template_room(s.template) for s in item.kind.pod_sets(item.obj) if s.gpus > 0]
    return (max(r[0] for r in rooms), max(r[1] for r in rooms)) if rooms else (0, 0)


def counted_nodes(item: Observed, known: set[str], fleet: Fleet) -> tuple[str, ...] | None:
    """Where the engine counts an admitted workload's pods: on their nodes (bound, planned, or
    still to be provisioned); a pod planned on a node that is gone, when its Job is pinned to
    the pool only, waits for room anywhere in the pool. None where the workload cannot be
    counted: a pod pinned by name to a node that is gone, or an unknown pool."""
    pods = int(item.workload["spec"].get("pods", 1))
    if len(item.nodes) != pods:
        return None
    gone = {n for n in item.nodes if n not in known and not to_be_provisioned(n, fleet)}
    if not gone:
        return item.nodes
    pool = (item.workload.get("status") or {}).get("pool")
    if item.state == "Running" or pool not in fleet.pools or pinned_to(item.obj):
        return None
    return tuple(room_in(pool) if n in gone else n for n in item.nodes)


@dataclass(frozen=True)
class Partition:
    """Which managed workloads the engine sees, and which it must not."""

    included: list[Observed]  # the engine decides about these
    # admitted, pods not all running, planned nodes gone (pinned there): suspend to re-place
    requeue: list[Observed]
    hidden: list[Observed]  # running outside the declared pools, or waiting for a removed team


def partition(fleet: Fleet, nodes: list[dict[str, Any]], observed: list[Observed]) -> Partition:
    """Sort managed workloads by what the engine may do with them. A workload that was
    resumed is never admitted again (its pod templates can no longer change): it runs where it
    is, or is suspended again first."""
    known = {n.name for n in (node_of(o) for o in nodes) if n and n.pool in fleet.pools}
    included: list[Observed] = []
    requeue: list[Observed] = []
    hidden: list[Observed] = []
    for item in observed:
        if item.state in FINISHED_STATES:
            continue
        state = WorkloadState(item.state)
        if state in WAITING_STATES:
            (included if item.workload["spec"]["team"] in fleet.teams else hidden).append(item)
        elif counted_nodes(item, known, fleet) is not None:
            included.append(item)
        elif state is WorkloadState.QUEUED or (
            state is WorkloadState.STARTING and pinned_to(item.obj)
        ):
            requeue.append(item)
        else:
            hidden.append(item)
    return Partition(included, requeue, hidden)


def admissions_to_undo(workloads: Iterable[Workload], name: str) -> tuple[str, ...]:
    """The admissions to undo where the engine found workload `name` on more GPUs than a node
    has. A controller that stopped between an admission and the evictions it needed leaves one
    behind: the admitted workload, not running yet, recorded on GPUs its victims still hold.
    Its admission is the part that is only a plan: `name` itself where it is such an admission,
    else the admissions recorded on the running workload's nodes; () where there is none (the
    running workload is then left out of the cycle)."""
    by_name = {w.name: w for w in workloads}
    found = by_name.get(name)
    if found is None:
        return ()
    planned = {WorkloadState.QUEUED, WorkloadState.STARTING}
    if found.state in planned:
        return (name,)
    if found.state != WorkloadState.RUNNING:
        return ()
    nodes = set(found.nodes)
    return tuple(
        w.name for w in by_name.values() if w.state in planned and nodes.intersection(w.nodes)
    )


def is_managed(obj: dict[str, Any]) -> bool:
    return (obj["metadata"].get("annotations") or {}).get(MANAGED_ANNOTATION) == "true"


def observed_pool(node: dict[str, Any]) -> str:
    """The pool observe mode counts a GPU node in: one per GPU product."""
    product = (node["metadata"].get("labels") or {}).get(PRODUCT_LABEL, "unknown")
    return "observed-" + "".join(c if c.isalnum() else "-" for c in product.lower())


def with_observed_pool(node: dict[str, Any]) -> dict[str, Any]:
    """`node` labelled with its observed pool, as if a GPUPool selected it."""
    labels = {**(node["metadata"].get("labels") or {}), POOL_LABEL: observed_pool(node)}
    return {**node, "metadata": {**node["metadata"], "labels": labels}}


def discovered_pools(
    nodes: list[dict[str, Any]], pods: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Observe mode: with no GPUPool declared, every GPU node is counted in a static pool per
    GPU product (`nvidia.com/gpu.product`), so a fresh install shows GPUs by type at once."""
    by_node = gpus_by_node(pods)
    pools: dict[str, dict[str, Any]] = {}
    for obj in nodes:
        gpus = int(float(obj.get("status", {}).get("allocatable", {}).get(GPU_RESOURCE, 0)))
        if gpus <= 0:
            continue
        product = (obj["metadata"].get("labels") or {}).get(PRODUCT_LABEL, "unknown")
        name = observed_pool(obj)
        pool = pools.setdefault(
            name,
            {
                "pool": name,
                "gpuType": product,
                "totalGPUs": 0,
                "healthyGPUs": 0,
                "allocatedGPUs": 0.0,
                "idleGPUs": 0.0,
            },
        )
        node = node_of(with_observed_pool(obj))
        used = min(by_node.get(obj["metadata"]["name"], 0), gpus)
        pool["totalGPUs"] += gpus
        pool["allocatedGPUs"] += used
        if node is not None and node.healthy and node.schedulable:
            pool["healthyGPUs"] += gpus
            pool["idleGPUs"] += gpus - used
    return [pools[name] for name in sorted(pools)]


def next_timer(cluster: Snapshot, now: datetime) -> datetime | None:
    """The next moment the engine could decide differently without any change in the cluster:
    a back-off ends (R6) or elastic work passes its minimum runtime and may yield to other
    elastic work (only matters while something waits). Reservations' expiry is left to the
    resync interval."""
    waiting = [w for w in cluster.workloads if w.state in WAITING_STATES]
    if not waiting:
        return None
    times = [
        w.preempted_at + cluster.policy.backoff
        for w in waiting
        if w.preempted_at is not None and w.preempted_at + cluster.policy.backoff > now
    ]
    times.extend(
        w.started_at + cluster.policy.min_runtime
        for w in cluster.workloads
        if w.state not in WAITING_STATES
        and not w.reserved
        and w.started_at is not None
        and w.started_at + cluster.policy.min_runtime > now
    )
    return min(times, default=None)
