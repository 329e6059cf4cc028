"""What the API answers, one model per resource. Field names are the CRDs' camelCase; the SDK
returns these same models."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from gpufleet.model.api import (
    HostGPUStatus,
    HostProcessStatus,
    HostServiceStatus,
    HostUsage,
    WorkloadTemplateSpec,
)

WorkloadClass = Literal["reserved", "elastic"]


class ApiModel(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, frozen=True)


class Pool(ApiModel):
    pool: str
    gpu_type: str = Field(alias="gpuType")
    total_gpus: int = Field(alias="totalGPUs")
    healthy_gpus: int = Field(alias="healthyGPUs")
    allocated_gpus: float = Field(alias="allocatedGPUs")
    idle_gpus: float = Field(alias="idleGPUs")
    unhealthy_gpus: int = Field(alias="unhealthyGPUs", description="Not healthy or quarantined.")
    reserved_gpus: float = Field(0, alias="reservedGPUs", description="Held by Reservations.")
    utilisation_percent: float = Field(alias="utilisationPercent")
    price_per_gpu_hour: float | None = Field(
        None, alias="pricePerGPUHour", description="The pool's price, else a public list price."
    )
    idle_cost_per_hour: float | None = Field(None, alias="idleCostPerHour")
    cluster: str | None = Field(
        None, description="The cluster of a fleet it is in (a hub's server); else none."
    )


class Totals(ApiModel):
    total_gpus: int = Field(alias="totalGPUs")
    healthy_gpus: int = Field(alias="healthyGPUs")
    allocated_gpus: float = Field(alias="allocatedGPUs")
    idle_gpus: float = Field(alias="idleGPUs")
    utilisation_percent: float = Field(alias="utilisationPercent")
    idle_cost_per_hour: float | None = Field(None, alias="idleCostPerHour")


class UnusedByType(ApiModel):
    gpu_type: str = Field(alias="gpuType")
    idle_gpus: float = Field(alias="idleGPUs")
    healthy_gpus: int = Field(alias="healthyGPUs")
    idle_percent: float = Field(alias="idlePercent")
    idle_cost_per_hour: float | None = Field(None, alias="idleCostPerHour")


class Capacity(ApiModel):
    observe_mode: bool = Field(
        alias="observeMode",
        description="No GPUPool is declared: GPU nodes are grouped by GPU product.",
    )
    pools: list[Pool]
    totals: Totals
    unused_by_type: list[UnusedByType] = Field(alias="unusedByType")


class TeamUsage(ApiModel):
    team: str
    used_gpus: float = Field(alias="usedGPUs")


class Status(ApiModel):
    """The numbers of `gpufleet status`."""

    observe_mode: bool = Field(alias="observeMode")
    pools: list[Pool]
    totals: Totals
    queue_depth: dict[str, int] = Field(alias="queueDepth")
    top_teams: list[TeamUsage] = Field(alias="topTeams")


class Team(ApiModel):
    name: str
    parent: str | None = None
    namespaces: list[str]
    reserved_gpus: float = Field(alias="reservedGPUs")
    used_gpus: float = Field(alias="usedGPUs")
    borrowed_gpus: float = Field(alias="borrowedGPUs")
    burst_limit: str | None = Field(None, alias="burstLimit")
    burst_ceiling_gpus: float | None = Field(
        None, alias="burstCeilingGPUs", description="Reservations plus burst limit; None: no limit."
    )
    running: int
    waiting: int


class Reservation(ApiModel):
    name: str
    team: str
    pool: str
    gpus: int
    used_gpus: float = Field(alias="usedGPUs")
    borrowed_gpus: float = Field(alias="borrowedGPUs")
    expires_at: datetime | None = Field(None, alias="expiresAt")
    expired: bool = False


class Workload(ApiModel):
    namespace: str
    name: str
    kind: str = Field(description="The kind of the workload it stands for, e.g. Job.")
    team: str
    submitter: str | None = Field(
        None, description="Who created it, as the API server named them (set at admission)."
    )
    workload_class: WorkloadClass = Field(alias="class")
    priority: int
    gpus: float = Field(description="GPUs of all its pods together.")
    pods: int
    topology: str | None = Field(None, description="block or clique: a gang kept in one.")
    gpu_types: list[str] = Field(
        default_factory=list,
        alias="gpuTypes",
        description="The GPU types it accepts, the most preferred first; empty: any.",
    )
    state: str
    pool: str | None = None
    nodes: list[str] = Field(default_factory=list)
    reason: str | None = None
    message: str | None = None
    position: int | None = None
    eta: datetime | None = None
    submitted_at: datetime | None = Field(None, alias="submittedAt")
    started_at: datetime | None = Field(None, alias="startedAt")
    finished_at: datetime | None = Field(None, alias="finishedAt")
    preemptions: int = 0
    preempted_by: str | None = Field(None, alias="preemptedBy")
    diagnosis: str | None = Field(None, description="Why it failed, when diagnosed.")
    cluster: str | None = Field(
        None, description="The cluster of a fleet it is in (a hub's server); else none."
    )


class Cluster(ApiModel):
    name: str
    state: str = Field(description="Unknown, Ready, Lost or Recovering, as the hub saw it.")
    region: str | None = None
    kubernetes_version: str | None = Field(None, alias="kubernetesVersion")
    last_heartbeat: datetime | None = Field(None, alias="lastHeartbeat")
    nodes: int = 0
    gpus: float = 0
    allocated_gpus: float = Field(0, alias="allocatedGPUs")
    workloads: int = Field(0, description="The hub's workloads running or queued there.")
    pools: list[str] = Field(default_factory=list)
    labels: dict[str, str] = Field(default_factory=dict)
    message: str | None = None


class ClusterTotals(ApiModel):
    clusters: int
    ready: int
    nodes: int
    gpus: float
    allocated_gpus: float = Field(alias="allocatedGPUs")
    workloads: int


class Clusters(ApiModel):
    items: list[Cluster]
    totals: ClusterTotals


class Event(ApiModel):
    """A Kubernetes Event of a workload: of its GPUWorkload, its object or one of its pods."""

    type: str = Field(description="Normal or Warning.")
    reason: str
    message: str
    object: str = Field(description="What it is about: kind/name, e.g. Pod/train-0-x7k2p.")
    count: int = 1
    first_seen: datetime | None = Field(None, alias="firstSeen")
    last_seen: datetime | None = Field(None, alias="lastSeen")
    source: str | None = Field(None, description="The component that reported it.")


class Point(ApiModel):
    t: datetime
    value: float


class WorkloadMetrics(ApiModel):
    """A workload's GPUs over its run, from the gpufleet agents' metrics in Prometheus."""

    namespace: str
    name: str
    nodes: list[str] = Field(description="The nodes of its current or last run.")
    start: datetime
    end: datetime
    step_seconds: float = Field(alias="stepSeconds")
    exact: bool = Field(
        description="Whether the nodes' GPUs are all its own (each pod had whole nodes): else "
        "the figures are of every GPU of its nodes, its neighbours' too."
    )
    utilization: list[Point] = Field(
        default_factory=list, description="Mean GPU busy time of its GPUs, 0-1 (NVML)."
    )
    usage: list[Point] = Field(
        default_factory=list,
        description="Mean GPU Usage, 0-1 (DCGM profiling fields; empty without them).",
    )
    memory_used_bytes: list[Point] = Field(default_factory=list, alias="memoryUsedBytes")
    memory_total_bytes: float | None = Field(None, alias="memoryTotalBytes")
    mean_utilization: float | None = Field(None, alias="meanUtilization")
    peak_memory_used_bytes: float | None = Field(None, alias="peakMemoryUsedBytes")
    note: str | None = None


class PoolMetrics(ApiModel):
    pool: str
    gpu_type: str | None = Field(None, alias="gpuType")
    mean_total_gpus: float = Field(alias="meanTotalGPUs")
    mean_allocated_gpus: float = Field(alias="meanAllocatedGPUs")
    allocation: float | None = Field(None, description="Mean allocated / mean total GPUs.")
    idle_gpu_hours: float = Field(alias="idleGPUHours")


class TeamMetrics(ApiModel):
    team: str
    peak_queue_depth: float = Field(alias="peakQueueDepth")
    mean_queue_depth: float = Field(alias="meanQueueDepth")
    wait_p95_seconds: float | None = Field(None, alias="waitP95Seconds")
    admissions: float = 0
    preemptions: float = 0


class FleetMetrics(ApiModel):
    """The fleet over a window, from the controller's metrics in Prometheus."""

    window: str
    pools: list[PoolMetrics] = Field(default_factory=list)
    teams: list[TeamMetrics] = Field(default_factory=list)


class Explanation(ApiModel):
    workload: Workload
    text: str = Field(description="Where it is and why, in plain words.")


class Node(ApiModel):
    node: str
    pool: str
    gpus: int
    allocated_gpus: float = Field(alias="allocatedGPUs")
    ready: bool
    gpu_healthy: Literal["True", "False", "Unknown"] = Field(alias="gpuHealthy")
    reason: str = ""
    quarantined: bool = False
    escalated: bool = False
    quarantined_since: str | None = Field(None, alias="quarantinedSince")
    why: str = ""
    cluster: str | None = Field(
        None, description="The cluster of a fleet it is in (a hub's server); else none."
    )


class Host(ApiModel):
    """A GPU host outside Kubernetes, as its standalone agent last reported it (GPUHost)."""

    name: str
    state: Literal["Ready", "Unhealthy", "Lost", "Unknown"] = Field(
        description="Ready; Unhealthy (a GPU has a fatal finding); Lost (no report for its "
        "lostAfter); Unknown (no report yet)."
    )
    message: str | None = None
    last_seen: datetime | None = Field(None, alias="lastSeen")
    last_sample: datetime | None = Field(None, alias="lastSample")
    agent_version: str | None = Field(None, alias="agentVersion")
    gpus: int = 0
    healthy_gpus: int = Field(0, alias="healthyGPUs")
    gpu_utilization: float | None = Field(
        None, alias="gpuUtilization", description="Its GPUs' mean busy time, 0-1."
    )
    cpu_utilization: float | None = Field(None, alias="cpuUtilization")
    memory_used_bytes: float | None = Field(None, alias="memoryUsedBytes")
    memory_total_bytes: float | None = Field(None, alias="memoryTotalBytes")
    reports: int = 0
    duplicates: int = 0
    devices: list[HostGPUStatus] = Field(default_factory=list)
    processes: list[HostProcessStatus] = Field(default_factory=list)
    services: list[HostServiceStatus] = Field(default_factory=list)
    usage: list[HostUsage] = Field(
        default_factory=list, description="GPU-hours, the host's then each workload's."
    )
    labels: dict[str, str] = Field(default_factory=dict)


class HostSeries(ApiModel):
    name: str
    labels: dict[str, str]
    value: float


class HostMetrics(ApiModel):
    """The series of a host's newest report that this server took: the agent's own and its
    programs' OTLP metrics (those labelled service_name)."""

    host: str
    time: datetime = Field(description="When the report was taken, on the host.")
    series: list[HostSeries]


class HostReport(ApiModel):
    sequence: int = Field(ge=1)
    time: datetime
    interval: float = Field(gt=0, le=86_400, description="Seconds the report stands for.")
    metrics: str = Field(max_length=16 * 1024 * 1024, description="The agent's /metrics text.")


class HostReports(ApiModel):
    """What a standalone agent uploads: its buffer's id and its oldest reports."""

    agent: str = Field(min_length=1, max_length=64)
    agent_version: str | None = Field(None, alias="agentVersion", max_length=64)
    reports: list[HostReport] = Field(max_length=100)


class HostReportsTaken(ApiModel):
    accepted: int = Field(description="Reports taken now.")
    duplicates: int = Field(description="Reports already taken before: not counted again.")
    last_sequence: int = Field(alias="lastSequence")
    drain: str | None = Field(
        None,
        description="Why the host is quarantined (the health controller's guard rails decided "
        "it): its agent drains the host's Slurm node, and resumes it once this is gone.",
    )


Item = TypeVar("Item", bound=ApiModel)


class Page(ApiModel, Generic[Item]):
    items: list[Item]
    total: int = Field(description="Items that matched the filters (before limit/offset).")
    offset: int = 0
    next: str | None = Field(
        None,
        description="In name order: the cursor of the next page (pass it as `cursor`); none "
        "after the last page.",
    )


class Count(ApiModel):
    key: str
    workloads: int
    gpus: float = Field(description="GPUs of all their pods together.")


class WorkloadStats(ApiModel):
    """Counts of the workloads that matched the filters."""

    total: int
    by_state: list[Count] = Field(alias="byState")
    by_team: list[Count] = Field(alias="byTeam")
    by_class: list[Count] = Field(alias="byClass")
    gpu_hours: float = Field(
        alias="gpuHours",
        description="GPU-hours of their current or last run (started to finished, or to now); "
        "the usage ledger (/usage) counts every run.",
    )
    waiting_gpus: float = Field(alias="waitingGPUs", description="GPUs the waiting ones ask.")


class Health(ApiModel):
    """The GPU nodes' health at a glance (each node: /nodes)."""

    nodes: int
    ready: int
    gpu_healthy: int = Field(alias="gpuHealthy", description="GPUHealthy=True.")
    gpu_unhealthy: int = Field(alias="gpuUnhealthy", description="GPUHealthy=False.")
    unknown: int = Field(description="No GPUHealthy condition: no agent, or a silent one.")
    quarantined: int
    escalated: int = Field(description="Quarantined again and again: a person should look.")
    gpus: int
    unhealthy_gpus: int = Field(alias="unhealthyGPUs", description="On nodes not healthy.")
    problems: list[Node] = Field(description="The nodes not ready, not healthy or quarantined.")


class Identity(ApiModel):
    user: str
    groups: list[str] = Field(default_factory=list)
    insecure_local: bool = Field(False, alias="insecureLocal")


class Done(ApiModel):
    ok: bool = True
    message: str


class Submission(ApiModel):
    """What `POST /api/v1/workloads` creates: a full manifest of a kind gpufleet manages, or
    the short form (a batch/v1 Job built from the fields, as `gpufleet submit` builds it)."""

    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, frozen=True, extra="forbid"
    )

    namespace: str = Field(description="Where it is created; the caller must be allowed there.")
    manifest: dict[str, Any] | None = Field(
        None,
        description="A Job, JobSet, TrainJob, RayJob, Deployment or Pod; gpufleet's labels "
        "(team, class, priority) are added where it has none. The short form's fields are "
        "then not allowed, but team and class.",
    )
    name: str | None = Field(None, description="The short form: the Job's name.")
    template: str | None = Field(
        None,
        description="A WorkloadTemplate the short form starts from: each field not sent here "
        "is the template's (its kind, image, command, env, class, GPUs, pods, pool, CPU and "
        "memory).",
    )
    team: str | None = None
    workload_class: WorkloadClass = Field("elastic", alias="class")
    priority: str = Field("normal", description="low, normal, high, urgent or 0-99.")
    gpus: int = Field(1, ge=1, description="GPUs per pod.")
    pods: int = Field(1, ge=1, description="Pods that run together (a gang).")
    pool: str | None = Field(None, description="Only this pool.")
    gpu_types: list[str] = Field(
        default_factory=list,
        alias="gpuTypes",
        max_length=16,
        description="The GPU types it accepts, the most preferred first (e.g. [H100, A100]): "
        "the engine tries their pools in this order. Empty: any.",
    )
    image: str | None = None
    command: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    external_id: str | None = Field(
        None,
        alias="externalId",
        max_length=253,
        description="Your own id for it (e.g. an experiment tracker's run), kept as the "
        "annotation gpufleet.io/external-id.",
    )
    run_for: str | None = Field(
        None, alias="runFor", description="Simulated run time on a dev cluster (kwok), e.g. 10m."
    )
    dry_run: bool = Field(
        False, alias="dryRun", description="Only have the API server check it; nothing is made."
    )
    cluster: str | None = Field(
        None,
        description="Only on the hub of a fleet of clusters (`gpufleet server --fleet`), where "
        "it is needed: `auto` sends the Job to the cluster that admits it soonest, a Cluster's "
        "name runs it there. A batch/v1 Job only; it is created in the hub, which sends it on.",
    )


class Submitted(ApiModel):
    namespace: str
    name: str = Field(description="The created object's name.")
    kind: str
    uid: str | None = Field(None, description="None on a dry run.")
    workload: str = Field(
        description="The name of its GPU workload (GET /api/v1/workloads/{namespace}/{name}): "
        "the controller records it once it decides about it."
    )
    created_by: str = Field(alias="createdBy", description="The identity it was created as.")
    dry_run: bool = Field(False, alias="dryRun")
    manifest: dict[str, Any] = Field(description="What was sent to the API server.")


class Template(WorkloadTemplateSpec):
    """A WorkloadTemplate: its name and spec (docs/api.md#workloadtemplate)."""

    name: str
