"""The gpufleet API: pydantic models of the custom resources users keep in git.

Group ``gpufleet.io``, version ``v1alpha1``, all cluster-scoped. Field names are the contract
(DESIGN §3); the CRD manifests in ``charts/gpufleet/crds`` are generated from these classes.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, field_validator, model_validator

from gpufleet.model.azure import AZURE_SUBNET_ID

GROUP = "gpufleet.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"

Provider = Literal["aws", "gcp", "azure", "static"]
# Values of the `gpufleet.io/priority` label besides 0-99 (DESIGN §3).
NAMED_PRIORITIES: dict[str, int] = {
    "critical": 90,
    "high": 75,
    "normal": 50,
    "low": 25,
    "background": 10,
}
CapacityType = Literal["on-demand", "spot", "reserved"]

# DNS-1123 subdomain, as Kubernetes requires for names of cluster-scoped objects.
NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
# Go-style durations as Kubernetes and Karpenter write them: 90s, 5m, 1h30m.
DURATION_PATTERN = r"^([0-9]+(ms|s|m|h))+$"
# A burst limit is a percentage of the team's reservations ("50%") or a GPU count ("16").
BURST_LIMIT_PATTERN = r"^[0-9]+(\.[0-9]+)?%?$"

Name = Annotated[str, Field(min_length=1, max_length=253, pattern=NAME_PATTERN)]
Duration = Annotated[str, Field(pattern=DURATION_PATTERN)]
DurationOrNever = Annotated[str, Field(pattern=r"^(([0-9]+(ms|s|m|h))+|Never)$")]


class _Model(BaseModel):
    """Base for every API struct: unknown fields are errors, aliases are the camelCase names."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class ObjectMeta(_Model):
    name: Name = Field(description="Object name (DNS-1123 subdomain).")
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)


# --- GPUPool -------------------------------------------------------------------------------


class PricePerGPUHour(_Model):
    on_demand: float | None = Field(None, alias="onDemand", ge=0, description="USD per GPU-hour.")
    spot: float | None = Field(None, ge=0, description="USD per GPU-hour.")
    reserved: float | None = Field(None, ge=0, description="USD per GPU-hour.")


class AWSNodeSettings(_Model):
    """How Karpenter launches the nodes of an aws pool (rendered into its EC2NodeClass)."""

    ami_alias: str = Field(
        "al2023@latest",
        alias="amiAlias",
        pattern=r"^[a-z0-9]+@.+$",
        description="Karpenter AMI alias (family@version); pin a version for production.",
    )
    node_role: str | None = Field(
        None,
        alias="nodeRole",
        description="IAM role of the nodes; default KarpenterNodeRole-<cluster name>.",
    )
    root_volume_gib: int = Field(200, alias="rootVolumeGiB", ge=20, le=16384)
    capacity_reservation_ids: list[str] = Field(
        default_factory=list,
        alias="capacityReservationIDs",
        description="EC2 capacity reservations (cr-...) the pool may use; needed for 'reserved'.",
    )


class GCPNodeSettings(_Model):
    """How Karpenter launches the nodes of a gcp pool (rendered into its GCENodeClass)."""

    image_family: Literal["ContainerOptimizedOS", "Ubuntu2404", "Ubuntu2204"] = Field(
        "ContainerOptimizedOS", alias="imageFamily"
    )
    boot_disk_gib: int = Field(200, alias="bootDiskGiB", ge=20, le=65536)
    service_account: str | None = Field(None, alias="serviceAccount")


class AzureNodeSettings(_Model):
    """How Karpenter launches the nodes of an azure pool (rendered into its AKSNodeClass)."""

    image_family: Literal["Ubuntu2204", "Ubuntu2404", "AzureLinux"] = Field(
        "Ubuntu2204", alias="imageFamily"
    )
    os_disk_size_gb: int = Field(
        200,
        alias="osDiskSizeGB",
        ge=30,
        le=2048,
        description="OS disk of each node; GPU images are large, AKS's 128 GB default fills up.",
    )
    vnet_subnet_id: str | None = Field(
        None,
        alias="vnetSubnetID",
        pattern=AZURE_SUBNET_ID,
        description="The subnet of the nodes' NICs; default: the cluster's.",
    )


class GPUPoolSpec(_Model):
    provider: Provider = Field(
        description="aws | gcp | azure | static (existing nodes, no autoscaling)."
    )
    gpu_type: str = Field(
        alias="gpuType", min_length=1, description="Canonical GPU type, e.g. H100, A100, L4."
    )
    gpus_per_node: int = Field(alias="gpusPerNode", ge=1, le=16)
    max_gpus: int = Field(
        alias="maxGPUs", ge=0, description="Capacity ceiling (NodePool limit nvidia.com/gpu)."
    )
    instance_types: list[str] = Field(
        default_factory=list,
        alias="instanceTypes",
        description="AWS instance types, GCP machine types or Azure VM sizes the pool may launch.",
    )
    capacity_types: list[CapacityType] = Field(
        default_factory=lambda: list[CapacityType](["on-demand"]),
        alias="capacityTypes",
        min_length=1,
    )
    zones: list[str] = Field(default_factory=list)
    node_selector: dict[str, str] = Field(
        default_factory=dict,
        alias="nodeSelector",
        description="Static pools: labels that select the existing nodes of the pool.",
    )
    price_per_gpu_hour: PricePerGPUHour | None = Field(None, alias="pricePerGPUHour")
    consolidate_after: Duration = Field(
        "10m",
        alias="consolidateAfter",
        description="How long a node stays empty before Karpenter removes it.",
    )
    expire_after: DurationOrNever = Field(
        "Never",
        alias="expireAfter",
        description="Node lifetime; Never by default so expiry cannot kill long training runs.",
    )
    allow_elastic_scale_up: bool = Field(
        False,
        alias="allowElasticScaleUp",
        description="Let elastic work trigger new nodes; by default only reserved work does.",
    )
    sharing: Literal["time-slicing", "mps", "none"] = Field(
        "time-slicing",
        description="How work that asks a fraction of a GPU shares one of the pool's GPUs "
        "(time-slicing or mps, as NVIDIA's DRA driver offers them); none: whole GPUs only, no "
        "fraction is placed here. The engine, decide and the simulator honour it; the "
        "controllers do not yet admit fractions.",
    )
    aws: AWSNodeSettings | None = None
    gcp: GCPNodeSettings | None = None
    azure: AzureNodeSettings | None = None
    cluster: Name | None = Field(
        None,
        description="The Cluster whose nodes hold the pool, in a fleet of clusters; unset in a "
        "fleet of one cluster.",
    )


class GPUPoolStatus(_Model):
    total_gpus: int = Field(0, alias="totalGPUs", ge=0)
    allocatable_gpus: int = Field(0, alias="allocatableGPUs", ge=0)
    healthy_gpus: int = Field(0, alias="healthyGPUs", ge=0)
    allocated_gpus: float = Field(0, alias="allocatedGPUs", ge=0)
    idle_gpus: float = Field(0, alias="idleGPUs", ge=0)
    observed_generation: int | None = Field(None, alias="observedGeneration")


class SecretKeyRef(_Model):
    """A key of a Kubernetes Secret: where a webhook URL, signing key or password is kept, so
    that none of them is ever in the repository."""

    name: Name
    key: str = Field(min_length=1)
    namespace: Name = Field(
        "gpufleet-system", description="Namespace of the Secret (the controller's by default)."
    )


# --- Cluster -------------------------------------------------------------------------------


class ClusterSpec(_Model):
    region: str | None = Field(None, max_length=63, description="Where it is, for people.")
    kubeconfig_secret_ref: SecretKeyRef = Field(
        alias="kubeconfigSecretRef",
        description="The Secret key (in the hub) holding a kubeconfig for the cluster's API "
        "server, with the rights of gpufleet's hub ClusterRole there.",
    )
    lost_after: Duration = Field(
        "60s",
        alias="lostAfter",
        description="With no heartbeat for this long the cluster is lost: its unfinished work "
        "that the hub dispatched is sent elsewhere.",
    )
    dispatch: bool = Field(
        True, description="Whether the hub sends work here; false drains it of new work."
    )


class ClusterStatus(_Model):
    state: Literal["Unknown", "Ready", "Lost", "Recovering"] = Field(
        "Unknown",
        description="Ready: heartbeats arrive; Lost: none for lostAfter; Recovering: back, and "
        "the copies of work sent elsewhere meanwhile are being removed.",
    )
    message: str | None = None
    last_heartbeat: datetime | None = Field(None, alias="lastHeartbeat")
    kubernetes_version: str | None = Field(None, alias="kubernetesVersion")
    nodes: int = Field(0, ge=0, description="GPU nodes.")
    gpus: float = Field(0, ge=0, description="GPUs of its GPU nodes.")
    allocated_gpus: float = Field(0, alias="allocatedGPUs", ge=0)
    workloads: int = Field(0, ge=0, description="Workloads the hub has running or queued here.")
    pools: list[str] = Field(default_factory=list, max_length=1024)


# --- GPUHost -------------------------------------------------------------------------------


class GPUHostSpec(_Model):
    lost_after: Duration = Field(
        "60s",
        alias="lostAfter",
        description="With no report for this long the host is shown Lost.",
    )


class HostGPUStatus(_Model):
    index: int = Field(ge=0)
    uuid: str = ""
    healthy: bool = True
    utilization: float | None = Field(None, ge=0, description="Busy time, 0-1 (NVML).")
    memory_used_bytes: float | None = Field(None, alias="memoryUsedBytes", ge=0)
    memory_total_bytes: float | None = Field(None, alias="memoryTotalBytes", ge=0)
    temperature_c: float | None = Field(None, alias="temperatureC")
    problems: list[str] = Field(default_factory=list, max_length=64)


class HostProcessStatus(_Model):
    gpu: int = Field(ge=0)
    pid: int = Field(ge=0)
    user: str = ""
    command: str = ""
    framework: str = ""
    workload: str = ""
    memory_bytes: float | None = Field(None, alias="memoryBytes", ge=0)
    utilization: float | None = Field(None, ge=0)


class HostServiceStatus(_Model):
    name: str = Field(description="The service.name its OTLP metrics carry.")
    series: int = Field(ge=0)


class HostUsage(_Model):
    """GPU time of the host, added up from every report received (buffered ones too)."""

    workload: str | None = Field(None, description="None: the whole host.")
    gpu_hours: float = Field(0, alias="gpuHours", ge=0)
    idle_gpu_hours: float = Field(
        0, alias="idleGPUHours", ge=0, description="Of which its GPUs were idle (under 5 %)."
    )


class GPUHostStatus(_Model):
    state: Literal["Ready", "Unhealthy"] = Field(
        "Ready",
        description="As its last report says: Unhealthy while a GPU has a fatal finding. Lost "
        "(no report for lostAfter) is shown by the API, not stored.",
    )
    message: str | None = None
    state_since: datetime | None = Field(
        None, alias="stateSince", description="Since when (on the host) it is in its state."
    )
    agent: str | None = Field(None, description="The id of the agent's report buffer.")
    agent_version: str | None = Field(None, alias="agentVersion")
    last_seen: datetime | None = Field(
        None, alias="lastSeen", description="When the server last took a report of it."
    )
    last_sample: datetime | None = Field(
        None, alias="lastSample", description="When the newest report was taken, on the host."
    )
    last_sequence: int = Field(0, alias="lastSequence", ge=0)
    reports: int = Field(0, ge=0, description="Reports taken (each once).")
    duplicates: int = Field(0, ge=0, description="Reports received again and not counted.")
    gpus: int = Field(0, ge=0)
    healthy_gpus: int = Field(0, alias="healthyGPUs", ge=0)
    cpu_utilization: float | None = Field(None, alias="cpuUtilization", ge=0)
    memory_used_bytes: float | None = Field(None, alias="memoryUsedBytes", ge=0)
    memory_total_bytes: float | None = Field(None, alias="memoryTotalBytes", ge=0)
    devices: list[HostGPUStatus] = Field(default_factory=list, max_length=256)
    processes: list[HostProcessStatus] = Field(default_factory=list, max_length=256)
    services: list[HostServiceStatus] = Field(default_factory=list, max_length=256)
    usage: list[HostUsage] = Field(
        default_factory=list, max_length=257, description="The host's, then each workload's."
    )


# --- Team ----------------------------------------------------------------------------------


class TeamBudget(_Model):
    """A monthly GPU-hour budget: what the team's work (and its sub-teams') may use in a
    calendar month (UTC) before alerts say so. It limits nothing: reservations and quotas do."""

    gpu_hours_per_month: float = Field(
        alias="gpuHoursPerMonth", gt=0, description="GPU-hours per calendar month (UTC)."
    )
    alert_at_percent: list[int] = Field(
        default_factory=lambda: [80, 100],
        alias="alertAtPercent",
        min_length=1,
        description="Alert when the month's use reaches these shares of the budget.",
    )

    @field_validator("alert_at_percent")
    @classmethod
    def _percents(cls, value: list[int]) -> list[int]:
        if any(p < 1 or p > 1000 for p in value):
            raise ValueError("alertAtPercent: each share is a percentage from 1 to 1000")
        return sorted(set(value))


class TeamSpec(_Model):
    parent: Name | None = Field(None, description="Parent team; teams form a tree.")
    budget: TeamBudget | None = Field(
        None, description="A monthly GPU-hour budget, with alerts; unset: none."
    )
    bursting_priority: int = Field(
        1,
        alias="burstingPriority",
        ge=1,
        le=10,
        description="Share of surplus among siblings (1..10).",
    )
    burst_limit: str | None = Field(
        None,
        alias="burstLimit",
        description="How far beyond its reservations the team may burst: '50%' or a GPU count; "
        "'0' disables bursting; unset means unlimited.",
        json_schema_extra={"x-kubernetes-int-or-string": True},
    )
    namespaces: list[str] = Field(
        default_factory=list, description="Workloads in these namespaces belong to this team."
    )

    @field_validator("burst_limit", mode="before")
    @classmethod
    def _burst_limit_text(cls, value: Any) -> Any:
        # YAML turns `burstLimit: 16` into an int; it means the same as "16".
        if isinstance(value, int) and not isinstance(value, bool):
            return str(value)
        return value

    @field_validator("burst_limit")
    @classmethod
    def _burst_limit_format(cls, value: str | None) -> str | None:
        import re

        if value is not None and not re.fullmatch(BURST_LIMIT_PATTERN, value):
            raise ValueError(
                f"burstLimit {value!r} is malformed: write a percentage of the team's "
                "reservations such as '50%', a GPU count such as '16', or '0' to disable bursting"
            )
        return value


class TeamStatus(_Model):
    reserved_gpus: float = Field(0, alias="reservedGPUs", ge=0)
    used_gpus: float = Field(0, alias="usedGPUs", ge=0)
    borrowed_gpus: float = Field(0, alias="borrowedGPUs", ge=0)


# --- Reservation ---------------------------------------------------------------------------


class ReservationSpec(_Model):
    team: Name
    pool: Name
    gpus: int = Field(ge=1, description="Guaranteed GPUs of the team in the pool.")
    expires_at: datetime | None = Field(None, alias="expiresAt")

    @property
    def expires_utc(self) -> datetime | None:
        """expiresAt, read as UTC when it names no time zone."""
        if self.expires_at is None or self.expires_at.tzinfo is not None:
            return self.expires_at
        return self.expires_at.replace(tzinfo=UTC)


class ReservationStatus(_Model):
    reserved_gpus: float = Field(0, alias="reservedGPUs", ge=0)
    used_gpus: float = Field(0, alias="usedGPUs", ge=0)
    borrowed_gpus: float = Field(0, alias="borrowedGPUs", ge=0)
    expired: bool = False


# --- FleetPolicy ---------------------------------------------------------------------------


class AdmissionPolicy(_Model):
    require_team: bool = Field(
        False,
        alias="requireTeam",
        description="Reject GPU workloads whose team cannot be resolved.",
    )
    max_gpus_per_workload: int | None = Field(None, alias="maxGPUsPerWorkload", ge=1)
    max_priority: dict[str, Annotated[int, Field(ge=0, le=99)]] = Field(
        default_factory=dict,
        alias="maxPriority",
        description="Highest elastic priority (0-99) a team may use, by team name.",
    )
    excluded_namespaces: list[str] = Field(
        default_factory=lambda: ["kube-system", "kube-public", "kube-node-lease"],
        alias="excludedNamespaces",
        description="Namespaces the admission rules never touch.",
    )


class PreemptionPolicy(_Model):
    min_runtime: Duration = Field(
        "5m",
        alias="minRuntime",
        description="Elastic work younger than this is preempted only for reserved work.",
    )
    grace_period: Duration = Field("60s", alias="gracePeriod")
    backoff: Duration = Field(
        "10m",
        description="A preempted workload does not borrow the capacity it lost for this long.",
    )


# Xids that quarantine a node (NVIDIA's Xid catalog: RESET_GPU / RESTART_BM / workflow Xids of
# A100-GB200) and Xids caused by applications, which never do (see docs/health.md)
DEFAULT_FATAL_XIDS = [
    46, 48, 62, 64, 74, 79, 95, 109, 110, 119, 120, 136, 140, 143, 144, 145, 146, 147, 148,
    149, 150, 151, 155, 156, 158,
]  # fmt: skip
DEFAULT_IGNORED_XIDS = [13, 31, 43, 45, 68, 94]


class HealthPolicy(_Model):
    max_quarantined_percent: int = Field(
        20,
        alias="maxQuarantinedPercent",
        ge=0,
        le=100,
        description="Most of a pool's nodes quarantined at once; further findings are reported.",
    )
    fatal_xids: list[Annotated[int, Field(ge=1)]] = Field(
        default_factory=lambda: list(DEFAULT_FATAL_XIDS),
        alias="fatalXids",
        description="Xids that quarantine the node; any other Xid raises a warning Event.",
    )
    ignored_xids: list[Annotated[int, Field(ge=1)]] = Field(
        default_factory=lambda: list(DEFAULT_IGNORED_XIDS),
        alias="ignoredXids",
        description="Application Xids: counted in metrics, never an Event or a quarantine.",
    )
    window: Duration = Field("1m", description="Window of the rate checks (PCIe, NVLink, thermal).")
    pcie_replays_per_window: int = Field(
        16,
        alias="pcieReplaysPerWindow",
        ge=1,
        description="PCIe replays in one window that raise a warning (DCGM: Gen4 x16).",
    )
    nvlink_crc_errors_per_second: float = Field(
        100,
        alias="nvlinkCrcErrorsPerSecond",
        gt=0,
        description="NVLink CRC error rate that quarantines (DCGM's limit).",
    )
    retired_pages_limit: int = Field(
        63,
        alias="retiredPagesLimit",
        ge=1,
        description="Retired pages (SBE + DBE) that quarantine (DCGM's limit).",
    )
    probation: Duration = Field(
        "10m",
        description="How long a node must report healthy before it leaves quarantine.",
    )
    breaker_percent: int = Field(
        50,
        alias="breakerPercent",
        ge=1,
        le=100,
        description="Share of all GPU nodes with fatal findings within breakerWindow that stops "
        "all quarantining until the breaker is reset by hand.",
    )
    breaker_window: Duration = Field("5m", alias="breakerWindow")
    escalate_after: int = Field(
        3,
        alias="escalateAfter",
        ge=1,
        description="Quarantines of one node within escalationWindow after which it stays "
        "quarantined until released by hand.",
    )
    escalation_window: Duration = Field("168h", alias="escalationWindow")
    agent_timeout: Duration = Field(
        "3m",
        alias="agentTimeout",
        description="A node whose agent has reported (GPUHealthy) but whose heartbeat is "
        "older than this is of unknown health: it takes no new work, its running work stays.",
    )


# --- notifications ---------------------------------------------------------------------

# what a route may ask for: workload transitions, capacity alerts, digests
WORKLOAD_NOTIFICATIONS = ("admitted", "resumed", "preempted", "failed", "completed", "cancelled")
ALERT_NOTIFICATIONS = (
    "pool-nearly-full",
    "reservation-idle",
    "reservation-expiring",
    "node-quarantined",
    "circuit-breaker-open",
    "host-unhealthy",
    "host-lost",
    "host-idle",
    "budget-threshold",
)
DIGEST_NOTIFICATIONS = ("daily-digest", "weekly-digest")
# news of every run of every workload: a route hears it only when its `events` name it
QUEUE_NOTIFICATIONS = ("submitted", "queued", "started")
NotificationKind = Literal[
    "submitted",
    "queued",
    "started",
    "admitted",
    "resumed",
    "preempted",
    "failed",
    "completed",
    "cancelled",
    "pool-nearly-full",
    "reservation-idle",
    "reservation-expiring",
    "node-quarantined",
    "circuit-breaker-open",
    "host-unhealthy",
    "host-lost",
    "host-idle",
    "budget-threshold",
    "daily-digest",
    "weekly-digest",
]


class EmailSettings(_Model):
    host: str = Field(min_length=1, description="SMTP server.")
    port: int = Field(587, ge=1, le=65535)
    sender: str = Field(alias="from", min_length=3, description="From address.")
    to: list[str] = Field(min_length=1, description="Recipients.")
    username: str | None = None
    starttls: bool = Field(True, description="Upgrade the connection with STARTTLS.")


class NotificationRoute(_Model):
    name: Name
    type: Literal["slack", "slack-dm", "teams", "pagerduty", "webhook", "email"]
    url_secret_ref: SecretKeyRef | None = Field(
        None,
        alias="urlSecretRef",
        description="Secret key holding the URL (Slack: the incoming-webhook URL; Teams: the "
        "workflow's URL; required for both).",
    )
    url: str | None = Field(
        None,
        description="Webhook URL, where it is no secret (type webhook); PagerDuty: the Events "
        "API URL (default https://events.pagerduty.com/v2/enqueue); slack-dm: Slack's "
        "chat.postMessage URL (default https://slack.com/api/chat.postMessage).",
    )
    token_secret_ref: SecretKeyRef | None = Field(
        None,
        alias="tokenSecretRef",
        description="slack-dm: the Secret key holding the Slack app's bot token (xoxb-..., with "
        "the chat:write scope); required.",
    )
    slack_users: dict[str, str] = Field(
        default_factory=dict,
        alias="slackUsers",
        description="slack-dm: each user (as the API server names who submitted the work) and "
        "their Slack member ID (U...): they get their own work's news as direct messages.",
    )
    routing_key_secret_ref: SecretKeyRef | None = Field(
        None,
        alias="routingKeySecretRef",
        description="PagerDuty: the Secret key holding the integration's routing key (required).",
    )
    signing_secret_ref: SecretKeyRef | None = Field(
        None,
        alias="signingSecretRef",
        description="Webhook: key for the X-Gpufleet-Signature HMAC-SHA256 header.",
    )
    email: EmailSettings | None = None
    password_secret_ref: SecretKeyRef | None = Field(
        None, alias="passwordSecretRef", description="Email: the SMTP password."
    )
    teams: list[Name] = Field(
        default_factory=list, description="Only these teams' notifications; empty: every team."
    )
    events: list[NotificationKind] = Field(
        default_factory=list,
        description="Only these kinds; empty: every kind but submitted, queued and started (news "
        "of every run, heard only where named).",
    )
    users: list[str] = Field(
        default_factory=list,
        description="Only news of work these users submitted: a user's own route (their e-mail, "
        "their events); empty: everybody's.",
    )
    namespaces: list[str] = Field(
        default_factory=list,
        description="Only news of workloads in these namespaces; empty: every namespace.",
    )
    pools: list[Name] = Field(
        default_factory=list, description="Only news of these pools (and their work)."
    )
    clusters: list[Name] = Field(
        default_factory=list, description="Only news from these clusters of a fleet."
    )
    rate_limit_per_hour: int = Field(
        60, alias="rateLimitPerHour", ge=1, description="Most messages per hour on this route."
    )
    dedup_window: Duration = Field(
        "10m",
        alias="dedupWindow",
        description="The same notification (kind and subject) is sent once per window.",
    )

    @model_validator(mode="after")
    def _settings_of_type(self) -> NotificationRoute:
        if self.type == "slack" and self.url_secret_ref is None:
            raise ValueError("a slack route needs urlSecretRef (the incoming-webhook URL)")
        if self.type == "teams" and self.url_secret_ref is None:
            raise ValueError("a teams route needs urlSecretRef (the URL of the Teams workflow)")
        if self.type == "slack-dm" and (self.token_secret_ref is None or not self.slack_users):
            raise ValueError(
                "a slack-dm route needs tokenSecretRef (the Slack app's bot token) and "
                "slackUsers (each user's Slack member ID)"
            )
        if self.type != "slack-dm" and (self.token_secret_ref is not None or self.slack_users):
            raise ValueError("tokenSecretRef and slackUsers are for slack-dm routes")
        if self.type == "pagerduty" and self.routing_key_secret_ref is None:
            raise ValueError("a pagerduty route needs routingKeySecretRef (its routing key)")
        if self.type != "pagerduty" and self.routing_key_secret_ref is not None:
            raise ValueError("routingKeySecretRef is for pagerduty routes")
        if self.type == "webhook" and (self.url is None) == (self.url_secret_ref is None):
            raise ValueError("a webhook route needs exactly one of url and urlSecretRef")
        if self.type == "email" and self.email is None:
            raise ValueError("an email route needs email (host, from, to)")
        if self.type not in ("webhook", "pagerduty", "slack-dm") and self.url is not None:
            raise ValueError(f"url is for webhook routes; a {self.type} route takes urlSecretRef")
        return self


class CapacityAlerts(_Model):
    pool_nearly_full_percent: int = Field(
        90,
        alias="poolNearlyFullPercent",
        ge=1,
        le=100,
        description="Alert when this share of a pool's healthy GPUs is allocated.",
    )
    reservation_idle_percent: int = Field(
        80,
        alias="reservationIdlePercent",
        ge=1,
        le=100,
        description="Alert when this share of a reservation stays unused for reservationIdleFor.",
    )
    reservation_idle_for: Duration = Field("24h", alias="reservationIdleFor")
    reservation_expiring_within: Duration = Field(
        "336h", alias="reservationExpiringWithin", description="Alert this long before expiry."
    )
    digest_hour_utc: int = Field(
        9, alias="digestHourUTC", ge=0, le=23, description="Hour (UTC) the digests go out."
    )


class NotificationPolicy(_Model):
    routes: list[NotificationRoute] = Field(default_factory=list)
    alerts: CapacityAlerts = Field(default_factory=CapacityAlerts)

    @model_validator(mode="after")
    def _unique_names(self) -> NotificationPolicy:
        names = [r.name for r in self.routes]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"route names must be unique: {', '.join(twice)} used twice")
        return self


class FleetPolicySpec(_Model):
    admission: AdmissionPolicy = Field(default_factory=AdmissionPolicy)
    preemption: PreemptionPolicy = Field(default_factory=PreemptionPolicy)
    health: HealthPolicy = Field(default_factory=HealthPolicy)
    notifications: NotificationPolicy = Field(default_factory=NotificationPolicy)


# --- GPUWorkload (created by the controllers, one per managed workload) -------------------


WorkloadState = Literal[
    "Pending", "Queued", "Starting", "Running", "Preempted", "Completed", "Failed", "Cancelled"
]


class WorkloadRef(_Model):
    api_version: str = Field(alias="apiVersion")
    kind: str
    name: str
    uid: str | None = None


# What a GPUWorkload stands for and a bare pod's manifest are set once, by the controller, when
# it creates the GPUWorkload: the API server refuses any later change (the uid of a bare pod
# made again may change). A cancel deletes what workloadRef names, and the controller makes a
# bare pod again from podTemplate with its own rights: changed, either would act for whoever
# changed them.
IMMUTABLE_SPEC: list[JsonValue] = [
    {
        "rule": "self.workloadRef.apiVersion == oldSelf.workloadRef.apiVersion && "
        "self.workloadRef.kind == oldSelf.workloadRef.kind && "
        "self.workloadRef.name == oldSelf.workloadRef.name",
        "message": "spec.workloadRef cannot change: a GPUWorkload stands for one object",
    },
    {
        "rule": "has(self.podTemplate) == has(oldSelf.podTemplate) && "
        "(!has(self.podTemplate) || self.podTemplate == oldSelf.podTemplate)",
        "message": "spec.podTemplate cannot change: it is the bare pod as it was created",
    },
]


class GPUWorkloadSpec(_Model):
    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": IMMUTABLE_SPEC})

    team: Name
    workload_class: Literal["reserved", "elastic"] = Field("elastic", alias="class")
    priority: int = Field(50, ge=0, le=99)
    gpus: float = Field(gt=0, description="GPUs per pod.")
    pods: int = Field(1, ge=1)
    pool: str | None = Field(None, description="Requested pool, if any.")
    gpu_types: list[str] = Field(
        default_factory=list,
        alias="gpuTypes",
        max_length=16,
        description="The GPU types it accepts, the most preferred first (annotation "
        "gpufleet.io/gpu-types); empty: any.",
    )
    topology: Literal["block", "clique"] | None = Field(
        None,
        description="A gang that must run inside one network block or NVLink clique (label "
        "gpufleet.io/topology); unset: one domain is preferred, not required.",
    )
    workload_ref: WorkloadRef = Field(alias="workloadRef")
    submitter: str | None = Field(
        None,
        description="Who created the workload, as the API server named them at its create "
        "(admission sets annotation gpufleet.io/submitter over what the manifest says).",
    )
    pod_template: dict[str, Any] | None = Field(
        None,
        alias="podTemplate",
        description="A bare pod's labels, annotations and spec as it was created: what "
        "gpufleet makes it again from after a preemption deleted it.",
    )


class DiagnosisEvidence(_Model):
    exit_codes: list[int] = Field(default_factory=list, alias="exitCodes")
    reasons: list[str] = Field(default_factory=list)
    events: list[str] = Field(default_factory=list)
    xids: list[int] = Field(default_factory=list)
    gpu_unhealthy: bool = Field(False, alias="gpuUnhealthy")
    last_log_lines: list[str] = Field(default_factory=list, alias="lastLogLines")


class WorkloadDiagnosis(_Model):
    pattern: str = Field(description="The matching pattern of policies/diagnosis/, or unknown.")
    owner: str | None = Field(None, description="code, node, cluster or capacity.")
    summary: str
    actions: list[str] = Field(default_factory=list)
    matched: list[str] = Field(default_factory=list, description="The signals that matched.")
    evidence: DiagnosisEvidence = Field(default_factory=DiagnosisEvidence)


class GPUWorkloadStatus(_Model):
    state: WorkloadState = "Pending"
    pool: str | None = None
    nodes: list[str] = Field(
        default_factory=list, max_length=10_000, description="Node of each pod when admitted."
    )
    reason: str | None = None
    message: str | None = None
    position: int | None = Field(None, description="Place in the team's queue while waiting.")
    eta: datetime | None = None
    submitted_at: datetime | None = Field(None, alias="submittedAt")
    admitted_at: datetime | None = Field(None, alias="admittedAt")
    started_at: datetime | None = Field(None, alias="startedAt")
    preempted_at: datetime | None = Field(None, alias="preemptedAt")
    preempted_from: str | None = Field(None, alias="preemptedFrom")
    preempted_by: str | None = Field(
        None, alias="preemptedBy", description="The workload that took its GPUs."
    )
    finished_at: datetime | None = Field(None, alias="finishedAt")
    preemptions: int = Field(0, ge=0)
    pod_deleted_at: datetime | None = Field(
        None,
        alias="podDeletedAt",
        description="When a preemption deleted the bare pod; gpufleet makes it again, held, "
        "once it is gone (then this is cleared).",
    )
    diagnosis: WorkloadDiagnosis | None = Field(
        None, description="Why it failed (written once a failed workload is diagnosed)."
    )


class WorkloadTemplateSpec(_Model):
    """What a submission from the template starts from; the submission may set any of it."""

    description: str | None = Field(None, max_length=1024)
    kind: Literal["job", "jobset", "trainjob", "deployment", "pod"] = Field(
        "job", description="What is created: as `gpufleet submit --kind`."
    )
    image: str = Field(min_length=1, max_length=1024)
    command: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    team: Name | None = Field(None, description="The team it is for, if only one.")
    workload_class: Literal["reserved", "elastic"] = Field("elastic", alias="class")
    priority: str = Field(
        "normal", pattern=r"^(low|normal|high|urgent|[0-9]|[1-9][0-9])$", description="As a label."
    )
    gpus: int = Field(1, ge=1, le=64, description="GPUs per pod.")
    pods: int = Field(1, ge=1, le=1024, description="Pods that run together (a gang).")
    pool: Name | None = None
    cpu: str | None = Field(
        None, pattern=r"^[0-9]+(\.[0-9]+)?m?$", description="CPU per pod (a quantity): 8, 500m."
    )
    memory: str | None = Field(
        None,
        pattern=r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|k|M|G|T)?$",
        description="Memory per pod (a quantity): 64Gi.",
    )


# --- the resources -------------------------------------------------------------------------


class Resource(_Model):
    """Common envelope of every gpufleet resource."""

    kind_name: ClassVar[str]
    plural: ClassVar[str]
    namespaced: ClassVar[bool] = False
    # spec from git, status from the controller: the status subresource keeps them apart
    status_subresource: ClassVar[bool] = True
    short_names: ClassVar[tuple[str, ...]]
    description: ClassVar[str]

    api_version: Literal["gpufleet.io/v1alpha1"] = Field("gpufleet.io/v1alpha1", alias="apiVersion")
    metadata: ObjectMeta

    @property
    def name(self) -> str:
        return self.metadata.name


class GPUPool(Resource):
    kind_name = "GPUPool"
    plural = "gpupools"
    short_names = ("gpool",)
    description = "A logical group of GPU capacity of one GPU type."

    kind: Literal["GPUPool"] = "GPUPool"
    spec: GPUPoolSpec
    status: GPUPoolStatus | None = None


class Cluster(Resource):
    kind_name = "Cluster"
    plural = "clusters"
    short_names = ("gcluster",)
    description = "A Kubernetes cluster of the fleet, seen and sent work by the hub."

    kind: Literal["Cluster"] = "Cluster"
    spec: ClusterSpec
    status: ClusterStatus | None = None


class GPUHost(Resource):
    kind_name = "GPUHost"
    plural = "gpuhosts"
    short_names = ("ghost",)
    description = "A GPU host outside Kubernetes, as its standalone agent reports it."
    # written by the server from its agent's reports, spec and status alike, in one request
    status_subresource = False

    kind: Literal["GPUHost"] = "GPUHost"
    spec: GPUHostSpec = Field(default_factory=GPUHostSpec)
    status: GPUHostStatus | None = None


class Team(Resource):
    kind_name = "Team"
    plural = "teams"
    short_names = ("gteam",)
    description = "A team in the team tree; owns reservations and may burst into idle capacity."

    kind: Literal["Team"] = "Team"
    spec: TeamSpec = Field(default_factory=TeamSpec)
    status: TeamStatus | None = None


class Reservation(Resource):
    kind_name = "Reservation"
    plural = "reservations"
    short_names = ("gres",)
    description = "Guaranteed GPUs of a team in a pool."

    kind: Literal["Reservation"] = "Reservation"
    spec: ReservationSpec
    status: ReservationStatus | None = None


class RouteStatus(_Model):
    name: str
    ready: bool
    message: str = ""


class FleetPolicyStatus(_Model):
    notifications: list[RouteStatus] = Field(
        default_factory=list,
        description="Each notification route: whether its Secrets were found and its last "
        "delivery worked, and if not, why.",
    )


class FleetPolicy(Resource):
    kind_name = "FleetPolicy"
    plural = "fleetpolicies"
    short_names = ("fpol",)
    description = "Cluster-wide admission, preemption, health and notification policy."

    kind: Literal["FleetPolicy"] = "FleetPolicy"
    spec: FleetPolicySpec = Field(default_factory=FleetPolicySpec)
    status: FleetPolicyStatus | None = None


class GPUWorkload(Resource):
    kind_name = "GPUWorkload"
    plural = "gpuworkloads"
    short_names = ("gwl",)
    description = "A workload managed by gpufleet: its request and where it is and why."
    namespaced = True
    # only the controller writes a GPUWorkload, spec and status alike: without the subresource
    # its create carries its first status, one request instead of two for each workload
    status_subresource = False

    kind: Literal["GPUWorkload"] = "GPUWorkload"
    spec: GPUWorkloadSpec
    status: GPUWorkloadStatus | None = None


# --- DiagnosisPattern (policies/diagnosis/; read from files, not a CRD) -------------------


class DiagnosisSignals(_Model):
    """What a failure must show for the pattern to match: every kind of signal given must be
    seen (any one of its values); at least one kind must be given."""

    exit_codes: list[int] = Field(default_factory=list, alias="exitCodes")
    reasons: list[str] = Field(
        default_factory=list,
        description="Container termination or waiting reasons, the pod's reason, or the Job's "
        "failure reason (OOMKilled, ImagePullBackOff, Evicted, DeadlineExceeded, ...).",
    )
    events: list[str] = Field(
        default_factory=list, description="Event reasons on the pods or the Job."
    )
    event_messages: list[str] = Field(
        default_factory=list, alias="eventMessages", description="Regexes over Event messages."
    )
    logs: list[str] = Field(
        default_factory=list, description="Regexes over the last lines of the containers' logs."
    )
    xids: list[int] = Field(
        default_factory=list, description="NVIDIA Xids reported on the node the pod ran on."
    )
    gpu_unhealthy: bool | None = Field(
        None, alias="gpuUnhealthy", description="The node's GPUHealthy condition was False."
    )

    @field_validator("event_messages", "logs")
    @classmethod
    def _regexes_compile(cls, values: list[str]) -> list[str]:
        for value in values:
            try:
                re.compile(value)
            except re.error as err:
                raise ValueError(f"{value!r} is not a valid regular expression: {err}") from err
        return values

    @model_validator(mode="after")
    def _something(self) -> DiagnosisSignals:
        if not self.model_fields_set:
            raise ValueError("give at least one signal (exitCodes, reasons, events, logs, ...)")
        return self


class DiagnosisPatternSpec(_Model):
    diagnosis: str = Field(min_length=1, description="What went wrong, in plain words.")
    owner: Literal["code", "node", "cluster", "capacity"] = Field(
        description="Who most likely has to act."
    )
    signals: DiagnosisSignals
    actions: list[str] = Field(default_factory=list, description="Suggested next steps.")
    priority: int = Field(
        50, ge=0, le=100, description="Among several matching patterns the highest wins."
    )


class DiagnosisPattern(Resource):
    kind_name = "DiagnosisPattern"
    plural = "diagnosispatterns"
    short_names = ("gdiag",)
    description = "A known way for GPU work to fail: its signals, diagnosis and owner."

    kind: Literal["DiagnosisPattern"] = "DiagnosisPattern"
    spec: DiagnosisPatternSpec


# --- RemediationPolicy (policies/remediation.yaml; read from files, not a CRD) ------------

# every action and its risk tier: 0 read-only, 1 the workload itself, 2 a node, 3 capacity
# (tier 3 is only ever written up as a pull request, never applied)
REMEDIATION_TIERS = {
    "collect-logs": 0,
    "requeue": 1,
    "cordon-node": 2,
    "propose-capacity-change": 3,
}
RemediationAction = Literal["collect-logs", "requeue", "cordon-node", "propose-capacity-change"]


class RemediationRule(_Model):
    action: RemediationAction
    patterns: list[str] = Field(
        default_factory=lambda: ["*"], description="Diagnosis patterns it applies to; * all."
    )
    teams: list[str] = Field(default_factory=lambda: ["*"], description="Teams; * all.")
    pre_approved: bool = Field(
        False,
        alias="preApproved",
        description="Tier 2: carry it out without an approval (tiers 0-1 never need one).",
    )


class RemediationPolicySpec(_Model):
    rules: list[RemediationRule] = Field(
        default_factory=list, description="What is allowed; anything else is refused."
    )


class RemediationPolicy(Resource):
    kind_name = "RemediationPolicy"
    plural = "remediationpolicies"
    short_names = ("grem",)
    description = "Which remediation actions are allowed, for which diagnoses and teams."

    kind: Literal["RemediationPolicy"] = "RemediationPolicy"
    spec: RemediationPolicySpec = Field(default_factory=RemediationPolicySpec)


class WorkloadTemplate(Resource):
    kind_name = "WorkloadTemplate"
    plural = "workloadtemplates"
    short_names = ("gwt",)
    description = "A starting point for submissions: image, command, resources, class, kind."
    status_subresource = False  # nothing writes a status

    kind: Literal["WorkloadTemplate"] = "WorkloadTemplate"
    spec: WorkloadTemplateSpec


# The kinds users keep in git; GPUWorkload is written by the controllers only, GPUHost by the
# server from its agent's reports; diagnosis patterns are read from policies/diagnosis/, not
# served by the API server.
RESOURCE_TYPES: tuple[type[Resource], ...] = (
    Cluster,
    GPUPool,
    Team,
    Reservation,
    FleetPolicy,
    WorkloadTemplate,
)
CRD_TYPES: tuple[type[Resource], ...] = (*RESOURCE_TYPES, GPUWorkload, GPUHost)
FILE_TYPES: tuple[type[Resource], ...] = (*RESOURCE_TYPES, DiagnosisPattern, RemediationPolicy)
KINDS: dict[str, type[Resource]] = {cls.kind_name: cls for cls in FILE_TYPES}
