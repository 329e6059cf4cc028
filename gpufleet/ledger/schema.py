"""The ledger's tables (SQLAlchemy Core). Changes to them are Alembic migrations in
`migrations/versions/`, never edits here alone: a ledger is kept across upgrades."""

from __future__ import annotations

from sqlalchemy import (
    Column,
    DateTime,
    Float,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
)

metadata = MetaData()

# One row per run segment: from an admission until the work stops holding its GPUs.
segments = Table(
    "segments",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("uid", String(64), nullable=False),  # the workload object's uid
    Column("workload", String(320), nullable=False),  # namespace/name
    Column("namespace", String(64), nullable=False),
    Column("team", String(64), nullable=False),
    Column("workload_class", String(16), nullable=False),
    Column("pool", String(64), nullable=True),
    Column("gpu_type", String(64), nullable=True),
    Column("gpus", Float, nullable=False),  # all its pods together
    Column("nodes", Integer, nullable=False),
    Column("price_per_gpu_hour", Float, nullable=True),
    Column("started_at", DateTime, nullable=False),  # UTC
    Column("ended_at", DateTime, nullable=True),  # null: still running
    Column("outcome", String(16), nullable=False),  # running|completed|failed|preempted|cancelled
    Column("reason", String(128), nullable=True),
    Column("lost_gpu_seconds", Float, nullable=True),
    Column("cluster", String(64), nullable=True),  # of a fleet sharing the ledger; else null
    Column("submitter", String(253), nullable=True),  # who created it; null: not known
    Column("capacity_type", String(16), nullable=True),  # on-demand|spot|reserved|mixed
    # a segment is recorded once, however often its admission is published (restarts, replays)
    UniqueConstraint("uid", "started_at", name="uq_segments_uid_started"),
    Index("ix_segments_started_at", "started_at"),
    Index("ix_segments_ended_at", "ended_at"),
    Index("ix_segments_outcome", "outcome"),
    Index("ix_segments_cluster", "cluster"),
)


def _interval_table(name: str, *key: Column) -> Table:  # type: ignore[type-arg]
    """Intervals over which some observed values held: closed when they change."""
    return Table(
        name,
        metadata,
        Column("id", Integer, primary_key=True, autoincrement=True),
        *key,
        Column("started_at", DateTime, nullable=False),
        Column("ended_at", DateTime, nullable=True),  # null: still open
        Column("seen_at", DateTime, nullable=False),  # last time the values were observed
        Column("cluster", String(64), nullable=True),  # as in segments
        UniqueConstraint(key[0].name, "started_at", name=f"uq_{name}_key_started"),
        Index(f"ix_{name}_ended_at", "ended_at"),
        Index(f"ix_{name}_cluster", "cluster"),
    )


# GPUs a pool had, and how many were allocated and unhealthy, over time
capacity = _interval_table(
    "capacity",
    Column("pool", String(64), nullable=False),
    Column("gpu_type", String(64), nullable=False),
    Column("price_per_gpu_hour", Float, nullable=True),
    Column("gpus", Float, nullable=False),
    Column("allocated_gpus", Float, nullable=False),
    Column("unhealthy_gpus", Float, nullable=False),
)

# GPUs a team had reserved in a pool, over time
reservations = _interval_table(
    "reservations",
    Column("name", String(64), nullable=False),
    Column("team", String(64), nullable=False),
    Column("pool", String(64), nullable=False),
    Column("gpus", Float, nullable=False),
)

# GPU time of hosts outside Kubernetes (their standalone agents' reports), added as it grows:
# one row per host, and per workload on it, each time the controller sees its total grow
host_usage = Table(
    "host_usage",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("host", String(253), nullable=False),
    Column("workload", String(253), nullable=True),  # null: the host as a whole
    Column("at", DateTime, nullable=False),  # UTC: when the growth was seen
    Column("gpu_hours", Float, nullable=False),
    Column("idle_gpu_hours", Float, nullable=False),
    Column("cluster", String(64), nullable=True),  # the cluster whose controller recorded it
    Index("ix_host_usage_at", "at"),
    Index("ix_host_usage_host", "host"),
)

# The notifications' delivery log: one row per message a route delivered or gave up on
deliveries = Table(
    "deliveries",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("at", DateTime, nullable=False),  # UTC: when it was delivered or given up on
    Column("happened_at", DateTime, nullable=False),  # when what it tells happened
    Column("route", String(64), nullable=False),
    Column("kind", String(32), nullable=False),  # a NotificationKind
    Column("dedup_key", String(512), nullable=False),  # kind, cluster and subject
    Column("team", String(64), nullable=True),
    Column("severity", String(16), nullable=False),
    Column("title", String(512), nullable=False),
    Column("outcome", String(16), nullable=False),  # sent|failed
    Column("attempts", Integer, nullable=False),
    Column("error", Text, nullable=True),  # why it failed (no secret: the route scrubs them)
    Column("cluster", String(64), nullable=True),  # as in segments
    Index("ix_deliveries_at", "at"),
    Index("ix_deliveries_route_key", "route", "dedup_key"),
)

# What the controller's alerts remember (JSON), per cluster: episodes told, idle clocks,
# digests sent. The key is "<cluster>/<name>", "/<name>" for a ledger of one cluster.
alert_state = Table(
    "alert_state",
    metadata,
    Column("key", String(160), primary_key=True),
    Column("state", Text, nullable=False),
    Column("updated_at", DateTime, nullable=False),
)

# The remediation audit log: append-only, one row per proposal, refusal, approval, action
audit = Table(
    "audit",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("at", DateTime, nullable=False),
    Column("actor", String(128), nullable=False),
    Column("entry", String(16), nullable=False),  # proposed|refused|approved|executed|failed|...
    Column("proposal", Integer, nullable=True),  # the proposal this row is about
    Column("workload", String(320), nullable=False),
    Column("pattern", String(64), nullable=False),
    Column("team", String(64), nullable=False),
    Column("action", String(64), nullable=False),
    Column("tier", Integer, nullable=False),
    Column("detail", Text, nullable=False),
    Index("ix_audit_proposal", "proposal"),
)
