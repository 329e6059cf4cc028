"""The controller's Prometheus metrics (DESIGN §8: `gpufleet_` prefix; labels pool, team,
gpu_type, class). Gauges are set from each cycle's snapshot; counters and histograms count
the cycle's decisions."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
)

from gpufleet.engine import Decisions, Snapshot
from gpufleet.lifecycle import LifecycleEvent

REGISTRY = CollectorRegistry()

POOL_GPUS = Gauge(
    "gpufleet_pool_gpus",
    "GPUs of a pool by state (total, healthy, unhealthy, allocated, idle).",
    ["pool", "gpu_type", "state"],
    registry=REGISTRY,
)
TEAM_GPUS = Gauge(
    "gpufleet_team_gpus",
    "GPUs of a team: reserved, used and borrowed.",
    ["team", "kind"],
    registry=REGISTRY,
)
QUEUE_DEPTH = Gauge(
    "gpufleet_queue_depth",
    "Workloads waiting, by team and class.",
    ["team", "class"],
    registry=REGISTRY,
)
EFFICIENCY = Gauge(
    "gpufleet_cluster_efficiency", "Allocated GPUs / healthy GPUs of all pools.", registry=REGISTRY
)
WAIT_SECONDS = Histogram(
    "gpufleet_wait_seconds",
    "Time from submission (or preemption) to admission.",
    ["team", "class"],
    registry=REGISTRY,
    buckets=(1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600, 86400),
)
PREEMPTIONS = Counter(
    "gpufleet_preemptions_total",
    "Workloads preempted.",
    ["pool", "team", "reason"],
    registry=REGISTRY,
)
RESUMES = Counter(
    "gpufleet_resumes_total", "Preempted workloads admitted again.", ["team"], registry=REGISTRY
)
ADMISSIONS = Counter(
    "gpufleet_admissions_total", "Workloads admitted.", ["pool", "team", "class"], registry=REGISTRY
)
CYCLE_SECONDS = Histogram(
    "gpufleet_cycle_seconds",
    "Duration of one workload-loop cycle (read the cluster, decide, apply).",
    registry=REGISTRY,
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
RECONCILE_ERRORS = Counter(
    "gpufleet_reconcile_errors_total", "Workload-loop cycles that failed.", registry=REGISTRY
)


def record_state(snapshot: Snapshot, status: dict[tuple[str, str], dict[str, Any]]) -> None:
    healthy_total = allocated_total = 0.0
    for name, pool in snapshot.pools.items():
        values = status.get(("GPUPool", name), {})
        total, healthy = values.get("totalGPUs", 0), values.get("healthyGPUs", 0)
        allocated, idle = values.get("allocatedGPUs", 0), values.get("idleGPUs", 0)
        for state, value in (
            ("total", total),
            ("healthy", healthy),
            ("unhealthy", total - healthy),
            ("allocated", allocated),
            ("idle", idle),
        ):
            POOL_GPUS.labels(name, pool.gpu_type, state).set(value)
        healthy_total += healthy
        allocated_total += allocated
    EFFICIENCY.set(allocated_total / healthy_total if healthy_total else 0.0)
    for team in snapshot.teams:
        values = status.get(("Team", team), {})
        for kind in ("reserved", "used", "borrowed"):
            TEAM_GPUS.labels(team, kind).set(values.get(f"{kind}GPUs", 0))
    waiting: dict[tuple[str, str], int] = defaultdict(int)
    for workload in snapshot.workloads:
        if not workload.nodes:
            waiting[(workload.team, str(workload.workload_class))] += 1
    for team in snapshot.teams:
        for cls in ("reserved", "elastic"):
            QUEUE_DEPTH.labels(team, cls).set(waiting.get((team, cls), 0))


def record_decisions(
    decisions: Decisions, snapshot: Snapshot, workloads: dict[str, dict[str, Any]], now: datetime
) -> None:
    by_name = {w.name: w for w in snapshot.workloads}
    for admission in decisions.admitted:
        workload = by_name[admission.workload]
        cls = str(workload.workload_class)
        ADMISSIONS.labels(admission.pool, workload.team, cls).inc()
        since = workload.preempted_at or workload.submitted_at
        WAIT_SECONDS.labels(workload.team, cls).observe(max((now - since).total_seconds(), 0))
        if workload.preempted_at is not None:
            RESUMES.labels(workload.team).inc()
    for preemption in decisions.preempted:
        workload = by_name[preemption.workload]
        status = workloads.get(preemption.workload, {}).get("status") or {}
        PREEMPTIONS.labels(status.get("pool") or "", workload.team, str(preemption.reason)).inc()


def record_discovered(pools: list[dict[str, Any]]) -> None:
    """Observe mode: GPUs by discovered pool (one per GPU product)."""
    healthy_total = allocated_total = 0.0
    for pool in pools:
        for state, key in (
            ("total", "totalGPUs"),
            ("healthy", "healthyGPUs"),
            ("allocated", "allocatedGPUs"),
            ("idle", "idleGPUs"),
        ):
            POOL_GPUS.labels(pool["pool"], pool["gpuType"], state).set(pool[key])
        POOL_GPUS.labels(pool["pool"], pool["gpuType"], "unhealthy").set(
            pool["totalGPUs"] - pool["healthyGPUs"]
        )
        healthy_total += pool["healthyGPUs"]
        allocated_total += pool["allocatedGPUs"]
    EFFICIENCY.set(allocated_total / healthy_total if healthy_total else 0.0)


QUARANTINED_NODES = Gauge(
    "gpufleet_quarantined_nodes",
    "Nodes quarantined for GPU faults (taint gpufleet.io/gpu-unhealthy), by pool.",
    ["pool"],
    registry=REGISTRY,
)
AGENT_SILENT_NODES = Gauge(
    "gpufleet_agent_silent_nodes",
    "GPU nodes whose agent sent no heartbeat within FleetPolicy health.agentTimeout: health "
    "unknown, no new work placed there (running work stays), by pool.",
    ["pool"],
    registry=REGISTRY,
)
QUARANTINE_BLOCKED = Gauge(
    "gpufleet_quarantine_blocked_nodes",
    "Nodes with fatal GPU findings left in service by a guard rail (pool limit or breaker).",
    ["pool"],
    registry=REGISTRY,
)
HEALTH_BREAKER_OPEN = Gauge(
    "gpufleet_health_breaker_open",
    "1 while the health circuit breaker is open (no new quarantines until reset by hand).",
    registry=REGISTRY,
)
QUARANTINE_ACTIONS = Counter(
    "gpufleet_quarantine_actions_total",
    "Health controller actions, by kind (Quarantined, Released, ReleasedManually, ...).",
    ["action"],
    registry=REGISTRY,
)

LEDGER_BACKLOG = Gauge(
    "gpufleet_ledger_backlog",
    "Ledger writes waiting (lifecycle events, capacity, reconciliations): grows while the "
    "database is unreachable and drains when it is back.",
    registry=REGISTRY,
)
LEDGER_DROPPED = Counter(
    "gpufleet_ledger_writes_dropped_total",
    "Ledger writes dropped because the backlog was full (the database unreachable for long): "
    "the controller reconciles the ledger with the cluster once the database is back.",
    registry=REGISTRY,
)
LEDGER_FAILURES = Counter(
    "gpufleet_ledger_write_failures_total",
    "Ledger writes that failed and will be retried.",
    registry=REGISTRY,
)
TRANSITIONS = Counter(
    "gpufleet_workload_transitions_total",
    "Lifecycle transitions of managed workloads (admitted, resumed, running, preempted, "
    "requeued, completed, failed, cancelled).",
    ["transition", "team", "class"],
    registry=REGISTRY,
)


def record_transitions(events: Sequence[LifecycleEvent]) -> None:
    for event in events:
        TRANSITIONS.labels(str(event.transition), event.team, event.workload_class).inc()


NOTIFICATIONS_SENT = Counter(
    "gpufleet_notifications_sent_total",
    "Notifications delivered, by route and kind.",
    ["route", "kind"],
    registry=REGISTRY,
)
NOTIFICATION_FAILURES = Counter(
    "gpufleet_notification_failures_total",
    "Notification deliveries that failed (each retry counts).",
    ["route"],
    registry=REGISTRY,
)
NOTIFICATIONS_DROPPED = Counter(
    "gpufleet_notifications_dropped_total",
    "Notifications not sent: duplicate (within the route's dedupWindow), rate-limited, or "
    "failed after every retry.",
    ["route", "reason"],
    registry=REGISTRY,
)
DIAGNOSES = Counter(
    "gpufleet_diagnoses_total",
    "Failed workloads diagnosed, by the pattern that matched (unknown: none) and its owner.",
    ["pattern", "owner"],
    registry=REGISTRY,
)
