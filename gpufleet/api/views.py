"""The API's answers, built from the objects the watch caches hold (plain dicts, as the API
server sends them). Pure: no Kubernetes client here; `gpufleet status` and `gpufleet workloads`
print the same views."""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from gpufleet.api import models
from gpufleet.api.prices import list_price
from gpufleet.hosts.report import SERVICE_LABEL
from gpufleet.hosts.report import parse as parse_series
from gpufleet.hosts.status import state_now
from gpufleet.kube.kinds import referred_to
from gpufleet.kube.observe import (
    discovered_pools,
    gpus_by_node,
    node_health,
    node_of,
    parse_time,
    with_observed_pool,
)
from gpufleet.ledger.recommendations import Waiting
from gpufleet.model.api import API_VERSION, WorkloadTemplateSpec
from gpufleet.model.bursting import UNLIMITED, ceiling_for
from gpufleet.model.durations import parse_duration
from gpufleet.model.fleet import Fleet, fleet_from_objects
from gpufleet.model.keys import (
    GPU_RESOURCE,
    QUARANTINE_ESCALATED_ANNOTATION,
    QUARANTINE_REASON_ANNOTATION,
    QUARANTINED_AT_ANNOTATION,
)
from gpufleet.model.states import ADMITTED_STATES, FINISHED_STATES, WAITING_STATES

ORDINAL = {1: "1st", 2: "2nd", 3: "3rd"}
# set by a fleet's source on each object it read from a worker cluster: which one
CLUSTER_KEY = "gpufleetCluster"


@dataclass(frozen=True)
class Objects:
    """What the views read: each list as the API server returns its items."""

    pools: list[dict[str, Any]] = field(default_factory=list)
    teams: list[dict[str, Any]] = field(default_factory=list)
    reservations: list[dict[str, Any]] = field(default_factory=list)
    workloads: list[dict[str, Any]] = field(default_factory=list)
    nodes: list[dict[str, Any]] = field(default_factory=list)
    pods: list[dict[str, Any]] = field(default_factory=list)
    clusters: list[dict[str, Any]] = field(default_factory=list)  # a hub's worker clusters
    templates: list[dict[str, Any]] = field(default_factory=list)  # WorkloadTemplates
    hosts: list[dict[str, Any]] = field(default_factory=list)  # GPUHosts: in no cluster


def tagged(obj: dict[str, Any], cluster: str) -> dict[str, Any]:
    """`obj` (a worker's GPUWorkload, node or pod) marked as read from `cluster`."""
    return {**obj, CLUSTER_KEY: cluster}


def cluster_of(obj: dict[str, Any]) -> str | None:
    """The cluster an object was read from, or that a pool names; None in a fleet of one."""
    found = obj.get(CLUSTER_KEY) or (obj.get("spec") or {}).get("cluster")
    return str(found) if found else None


def of_fleet(own: Objects, workers: dict[str, Objects]) -> Objects:
    """What the views see of a fleet of clusters: the hub's own objects (GitOps kinds,
    Clusters), each worker's workloads, nodes and pods marked with its cluster, and each
    worker's own pools (its controller writes their status) in place of the hub's copies."""
    pools, workloads, nodes, pods = [], [], [], []
    for name, seen in sorted(workers.items()):
        pools += [p for p in seen.pools if cluster_of(p) == name]
        workloads += [tagged(o, name) for o in seen.workloads]
        nodes += [tagged(o, name) for o in seen.nodes]
        pods += [tagged(o, name) for o in seen.pods]
    shown = {p["metadata"]["name"] for p in pools}
    pools += [p for p in own.pools if p["metadata"]["name"] not in shown]
    return replace(own, pools=pools, workloads=workloads, nodes=nodes, pods=pods)


def in_cluster(objects: Objects, cluster: str | None) -> Objects:
    """What the views see of one cluster of a fleet (all of it for None)."""
    if cluster is None:
        return objects
    pools = [p for p in objects.pools if cluster_of(p) == cluster]
    names = {p["metadata"]["name"] for p in pools}
    return Objects(
        pools=pools,
        teams=objects.teams,
        reservations=[r for r in objects.reservations if r["spec"].get("pool") in names],
        workloads=[w for w in objects.workloads if cluster_of(w) == cluster],
        nodes=[n for n in objects.nodes if cluster_of(n) == cluster],
        pods=[p for p in objects.pods if cluster_of(p) == cluster],
        clusters=[c for c in objects.clusters if c["metadata"]["name"] == cluster],
    )


def _percent(part: float, whole: float) -> float:
    return round(100 * part / whole, 1) if whole else 0.0


def _cost(gpus: float, price: float | None) -> float | None:
    return None if price is None else round(gpus * price, 2)


def _pool_price(pool: dict[str, Any]) -> float | None:
    prices = pool["spec"].get("pricePerGPUHour") or {}
    declared = prices.get("reserved", prices.get("onDemand"))
    return float(declared) if declared is not None else list_price(pool["spec"]["gpuType"])


def reserved_by_pool(reservations: Iterable[dict[str, Any]]) -> dict[str, float]:
    held: dict[str, float] = defaultdict(float)
    for r in reservations:
        if not (r.get("status") or {}).get("expired"):
            held[r["spec"]["pool"]] += float(r["spec"]["gpus"])
    return held


def pools(objects: Objects) -> list[models.Pool]:
    """Declared pools with the numbers the controller writes to their status; with none
    declared (observe mode), the GPU nodes grouped by GPU product."""
    if not objects.pools:
        return [
            _pool(row["pool"], row["gpuType"], row, list_price(row["gpuType"]), 0.0)
            for row in discovered_pools(objects.nodes, objects.pods)
        ]
    reserved = reserved_by_pool(objects.reservations)
    return [
        _pool(
            p["metadata"]["name"],
            p["spec"]["gpuType"],
            p.get("status") or {},
            _pool_price(p),
            reserved.get(p["metadata"]["name"], 0.0),
            cluster_of(p),
        )
        for p in sorted(objects.pools, key=lambda p: p["metadata"]["name"])
    ]


def _pool(
    name: str,
    gpu_type: str,
    numbers: dict[str, Any],
    price: float | None,
    reserved: float,
    cluster: str | None = None,
) -> models.Pool:
    total, healthy = int(numbers.get("totalGPUs", 0)), int(numbers.get("healthyGPUs", 0))
    allocated, idle = float(numbers.get("allocatedGPUs", 0)), float(numbers.get("idleGPUs", 0))
    return models.Pool(
        pool=name,
        gpu_type=gpu_type,
        total_gpus=total,
        healthy_gpus=healthy,
        allocated_gpus=allocated,
        idle_gpus=idle,
        unhealthy_gpus=max(total - healthy, 0),
        reserved_gpus=reserved,
        utilisation_percent=_percent(allocated, healthy),
        price_per_gpu_hour=price,
        idle_cost_per_hour=_cost(idle, price),
        cluster=cluster,
    )


def _totals(rows: list[models.Pool]) -> models.Totals:
    healthy = sum(r.healthy_gpus for r in rows)
    allocated = sum(r.allocated_gpus for r in rows)
    costs = [r.idle_cost_per_hour for r in rows if r.idle_cost_per_hour is not None]
    return models.Totals(
        total_gpus=sum(r.total_gpus for r in rows),
        healthy_gpus=healthy,
        allocated_gpus=allocated,
        idle_gpus=sum(r.idle_gpus for r in rows),
        utilisation_percent=_percent(allocated, healthy),
        idle_cost_per_hour=round(sum(costs), 2) if costs else None,
    )


def capacity(objects: Objects) -> models.Capacity:
    rows = pools(objects)
    by_type: dict[str, list[models.Pool]] = defaultdict(list)
    for row in rows:
        by_type[row.gpu_type].append(row)
    unused = []
    for gpu_type, group in sorted(by_type.items()):
        idle = sum(r.idle_gpus for r in group)
        healthy = sum(r.healthy_gpus for r in group)
        costs = [r.idle_cost_per_hour for r in group if r.idle_cost_per_hour is not None]
        unused.append(
            models.UnusedByType(
                gpu_type=gpu_type,
                idle_gpus=idle,
                healthy_gpus=healthy,
                idle_percent=_percent(idle, healthy),
                idle_cost_per_hour=round(sum(costs), 2) if costs else None,
            )
        )
    return models.Capacity(
        observe_mode=not objects.pools, pools=rows, totals=_totals(rows), unused_by_type=unused
    )


def _total_gpus(workload: dict[str, Any]) -> float:
    return float(workload["spec"]["gpus"]) * int(workload["spec"].get("pods", 1))


def _state(workload: dict[str, Any]) -> str:
    return str((workload.get("status") or {}).get("state", "Pending"))


def status(objects: Objects) -> models.Status:
    """The numbers of `gpufleet status`: GPUs by pool, queue depth and top teams."""
    rows = pools(objects)
    queue: dict[str, int] = defaultdict(int)
    used: dict[str, float] = defaultdict(float)
    for w in objects.workloads:
        state, team = _state(w), w["spec"]["team"]
        if state in WAITING_STATES:
            queue[team] += 1
        elif state in ADMITTED_STATES:
            used[team] += _total_gpus(w)
    top = sorted(used.items(), key=lambda kv: (-kv[1], kv[0]))[:5]
    return models.Status(
        observe_mode=not objects.pools,
        pools=rows,
        totals=_totals(rows),
        queue_depth=dict(sorted(queue.items())),
        top_teams=[models.TeamUsage(team=t, used_gpus=g) for t, g in top],
    )


def teams(objects: Objects) -> list[models.Team]:
    running: dict[str, int] = defaultdict(int)
    waiting: dict[str, int] = defaultdict(int)
    for w in objects.workloads:
        state = _state(w)
        if state in ADMITTED_STATES:
            running[w["spec"]["team"]] += 1
        elif state in WAITING_STATES:
            waiting[w["spec"]["team"]] += 1
    rows = []
    for t in sorted(objects.teams, key=lambda t: t["metadata"]["name"]):
        name, spec, numbers = t["metadata"]["name"], t.get("spec") or {}, t.get("status") or {}
        reserved = float(numbers.get("reservedGPUs", 0))
        limit = spec.get("burstLimit")
        ceiling = ceiling_for(None if limit is None else str(limit), reserved)
        rows.append(
            models.Team(
                name=name,
                parent=spec.get("parent"),
                namespaces=list(spec.get("namespaces") or []),
                reserved_gpus=reserved,
                used_gpus=float(numbers.get("usedGPUs", 0)),
                borrowed_gpus=float(numbers.get("borrowedGPUs", 0)),
                burst_limit=None if limit is None else str(limit),
                burst_ceiling_gpus=None if ceiling == UNLIMITED else ceiling,
                running=running[name],
                waiting=waiting[name],
            )
        )
    return rows


def reservations(objects: Objects) -> list[models.Reservation]:
    return [
        models.Reservation(
            name=r["metadata"]["name"],
            team=r["spec"]["team"],
            pool=r["spec"]["pool"],
            gpus=int(r["spec"]["gpus"]),
            used_gpus=float((r.get("status") or {}).get("usedGPUs", 0)),
            borrowed_gpus=float((r.get("status") or {}).get("borrowedGPUs", 0)),
            expires_at=r["spec"].get("expiresAt"),
            expired=bool((r.get("status") or {}).get("expired")),
        )
        for r in sorted(objects.reservations, key=lambda r: r["metadata"]["name"])
    ]


def workload(obj: dict[str, Any]) -> models.Workload:
    meta, spec, st = obj["metadata"], obj["spec"], obj.get("status") or {}
    diagnosis = st.get("diagnosis") or {}
    return models.Workload(
        namespace=meta["namespace"],
        name=meta["name"],
        kind=(spec.get("workloadRef") or {}).get("kind", "Job"),
        team=spec["team"],
        submitter=spec.get("submitter"),
        workload_class=spec.get("class", "elastic"),
        priority=int(spec.get("priority", 50)),
        gpus=_total_gpus(obj),
        pods=int(spec.get("pods", 1)),
        topology=spec.get("topology"),
        gpu_types=list(spec.get("gpuTypes") or []),
        state=_state(obj),
        pool=st.get("pool"),
        nodes=list(st.get("nodes") or []),
        reason=st.get("reason"),
        message=st.get("message"),
        position=st.get("position"),
        eta=st.get("eta"),
        submitted_at=st.get("submittedAt") or meta.get("creationTimestamp"),
        started_at=st.get("startedAt"),
        finished_at=st.get("finishedAt"),
        preemptions=int(st.get("preemptions", 0)),
        preempted_by=st.get("preemptedBy"),
        diagnosis=diagnosis.get("summary"),
        cluster=obj.get(CLUSTER_KEY),
    )


def pods_label(workload: dict[str, Any]) -> tuple[str, str] | None:
    """The label (key, value) a workload's pods carry, None where they carry none to find
    them by (a bare pod is the one pod named in its workloadRef)."""
    target = referred_to(workload)
    if target is None or target[0].bare:
        return None
    kind, name = target
    return kind.pod_label, kind.pods_named({"metadata": {"name": name}}) or name


def pods_of(workload: dict[str, Any], pods: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Those of `pods` that are the workload's own: in its namespace (and cluster), carrying its
    pods' label, or for a bare pod the pod its workloadRef names."""
    meta = workload["metadata"]
    target = referred_to(workload)
    if target is None:
        return []
    label = pods_label(workload)

    def own(pod: dict[str, Any]) -> bool:
        if label is None:
            return bool(pod["metadata"]["name"] == target[1])
        return (pod["metadata"].get("labels") or {}).get(label[0]) == label[1]

    return [
        p
        for p in pods
        if p["metadata"].get("namespace") == meta["namespace"]
        and cluster_of(p) == cluster_of(workload)
        and own(p)
    ]


def involved(workload: dict[str, Any], pods: Iterable[dict[str, Any]]) -> set[tuple[str, str]]:
    """The (kind, name) of what a workload's Events are about: its GPUWorkload, the object it
    stands for and those of `pods` (every pod of the namespace) that are its own."""
    out = {("GPUWorkload", workload["metadata"]["name"])}
    target = referred_to(workload)
    if target is not None:
        out.add((target[0].kind, target[1]))
    return out | {("Pod", p["metadata"]["name"]) for p in pods_of(workload, pods)}


def events(items: Iterable[dict[str, Any]], about: set[tuple[str, str]]) -> list[models.Event]:
    """The Events (as the API server lists them) about `about`, oldest first."""
    out = []
    for e in items:
        obj = e.get("involvedObject") or {}
        if (obj.get("kind"), obj.get("name")) not in about:
            continue
        first = (
            e.get("firstTimestamp") or e.get("eventTime") or e["metadata"].get("creationTimestamp")
        )
        out.append(
            models.Event(
                type=e.get("type") or "Normal",
                reason=e.get("reason") or "",
                message=e.get("message") or "",
                object=f"{obj.get('kind')}/{obj.get('name')}",
                count=int(e.get("count") or 1),
                first_seen=first,
                last_seen=e.get("lastTimestamp") or first,
                source=(e.get("source") or {}).get("component") or e.get("reportingComponent"),
            )
        )
    never = datetime.min.replace(tzinfo=UTC)
    return sorted(out, key=lambda e: (e.last_seen or never, e.object))


@dataclass(frozen=True)
class MetricsPlan:
    """What a workload's metrics are read from: its nodes, the window of its run, the step and
    the PromQL queries (one series each) of the agents' per-GPU metrics on those nodes."""

    nodes: tuple[str, ...]
    start: datetime
    end: datetime
    step_s: float
    exact: bool
    queries: dict[str, str]  # utilization, usage, memoryUsed, memoryTotal


def node_gpus(nodes: Iterable[dict[str, Any]]) -> dict[str, float]:
    """The GPUs of each node (allocatable), by name."""
    return {
        n["metadata"]["name"]: float(
            ((n.get("status") or {}).get("allocatable") or {}).get(GPU_RESOURCE, 0) or 0
        )
        for n in nodes
    }


def _promql_string(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def metrics_plan(
    view: models.Workload,
    node_gpus: dict[str, float],
    now: datetime,
    points: int = 240,
    max_points: int = 10_000,
) -> MetricsPlan | None:
    """The plan of a workload's metrics (None: it has not run, so it has none). `node_gpus`:
    the GPUs of each node; its nodes are its own when its pods take them whole."""
    nodes = tuple(sorted(set(view.nodes)))
    start = view.started_at
    if not nodes or start is None:
        return None
    end = view.finished_at or now
    span = max((end - start).total_seconds(), 1.0)
    step = max(span / points, span / max_points, 1.0)
    per_pod = view.gpus / max(view.pods, 1)
    exact = all(node_gpus.get(n, 0) and per_pod >= node_gpus[n] for n in nodes)
    matcher = "|".join(re.escape(n) for n in nodes)
    on = f"{{node=~{_promql_string(matcher)}}}"
    queries = {
        "utilization": f"avg(gpufleet_gpu_utilization_ratio{on})",
        "usage": f"avg(gpufleet_gpu_usage_ratio{on})",
        "memoryUsed": f"sum(gpufleet_gpu_memory_used_bytes{on})",
        "memoryTotal": f"sum(gpufleet_gpu_memory_total_bytes{on})",
    }
    return MetricsPlan(nodes, start, end, step, exact, queries)


def workload_metrics(
    view: models.Workload, plan: MetricsPlan, series: dict[str, list[tuple[float, float]]]
) -> models.WorkloadMetrics:
    """The answer of the metrics route from the plan's series, as Prometheus gave them."""

    def points(key: str) -> list[models.Point]:
        return [
            models.Point(t=datetime.fromtimestamp(t, UTC), value=v) for t, v in series.get(key, [])
        ]

    utilization, memory = points("utilization"), points("memoryUsed")
    totals = [v for _, v in series.get("memoryTotal", [])]
    note = None
    if not plan.exact:
        note = (
            "its pods shared their nodes with other work: the figures are of all the GPUs of "
            "its nodes"
        )
    if not utilization:
        note = (
            "no agent metrics of its nodes in Prometheus for its run: are the gpufleet agents "
            "scraped (the chart's ServiceMonitor)?"
        )
    return models.WorkloadMetrics(
        namespace=view.namespace,
        name=view.name,
        nodes=list(plan.nodes),
        start=plan.start,
        end=plan.end,
        step_seconds=plan.step_s,
        exact=plan.exact,
        utilization=utilization,
        usage=points("usage"),
        memory_used_bytes=memory,
        memory_total_bytes=max(totals) if totals else None,
        mean_utilization=(
            round(sum(p.value for p in utilization) / len(utilization), 4) if utilization else None
        ),
        peak_memory_used_bytes=max((p.value for p in memory), default=None),
        note=note,
    )


def fleet_metric_queries(window_s: int) -> dict[str, str]:
    """The PromQL of `gpufleet metrics` over the last `window_s` seconds, of the controller's
    metrics; each answers one series per pool or per team."""
    window = f"{window_s}s"
    step = max(15, window_s // 1000)  # of the subqueries: at most about 1,000 points
    over = f"[{window}:{step}s]"
    gpus = "gpufleet_pool_gpus"
    queue = "sum by (team) (gpufleet_queue_depth)"
    return {
        "total": f'avg_over_time({gpus}{{state="total"}}[{window}])',
        "allocated": f'avg_over_time({gpus}{{state="allocated"}}[{window}])',
        # a point every `step` seconds: each counts `step` seconds of its idle GPUs
        "idle": f'sum_over_time({gpus}{{state="idle"}}{over}) * {step} / 3600',
        "queuePeak": f"max_over_time(({queue}){over})",
        "queueMean": f"avg_over_time(({queue}){over})",
        "waitP95": "histogram_quantile(0.95, sum by (team, le) "
        f"(increase(gpufleet_wait_seconds_bucket[{window}])))",
        "admissions": f"sum by (team) (increase(gpufleet_admissions_total[{window}]))",
        "preemptions": f"sum by (team) (increase(gpufleet_preemptions_total[{window}]))",
    }


def fleet_metrics(
    window: str, answers: dict[str, list[tuple[dict[str, str], float]]]
) -> models.FleetMetrics:
    """`gpufleet metrics` from the answers to `fleet_metric_queries`."""

    def by(key: str, label: str) -> dict[str, float]:
        return {
            labels.get(label, ""): value
            for labels, value in answers.get(key, [])
            if value == value  # NaN: a quantile of no observations
        }

    types = {labels.get("pool", ""): labels.get("gpu_type") for labels, _ in answers["total"]}
    total, allocated, idle = by("total", "pool"), by("allocated", "pool"), by("idle", "pool")
    pools = [
        models.PoolMetrics(
            pool=pool,
            gpu_type=types.get(pool),
            mean_total_gpus=round(total[pool], 3),
            mean_allocated_gpus=round(allocated.get(pool, 0.0), 3),
            allocation=round(allocated.get(pool, 0.0) / total[pool], 4) if total[pool] else None,
            idle_gpu_hours=round(idle.get(pool, 0.0), 3),
        )
        for pool in sorted(total)
    ]
    peak, mean, wait = by("queuePeak", "team"), by("queueMean", "team"), by("waitP95", "team")
    admitted, preempted = by("admissions", "team"), by("preemptions", "team")
    teams = [
        models.TeamMetrics(
            team=team,
            peak_queue_depth=peak.get(team, 0.0),
            mean_queue_depth=round(mean.get(team, 0.0), 3),
            wait_p95_seconds=round(wait[team], 3) if team in wait else None,
            admissions=round(admitted.get(team, 0.0)),
            preemptions=round(preempted.get(team, 0.0)),
        )
        for team in sorted({*peak, *admitted, *preempted})
    ]
    return models.FleetMetrics(window=window, pools=pools, teams=teams)


@dataclass(frozen=True)
class WorkloadFilter:
    namespaces: frozenset[str] | None = None  # None: every namespace
    team: str | None = None
    workload_class: str | None = None
    states: frozenset[str] | None = None
    finished_within: timedelta | None = None  # finished ones only if they ended this recently
    cluster: str | None = None  # of a fleet
    search: str | None = None  # a part of the name, any case
    submitter: str | None = None

    @classmethod
    def parsed(
        cls,
        namespaces: frozenset[str] | None = None,
        team: str | None = None,
        workload_class: str | None = None,
        state: str | None = None,
        since: str | None = None,
        search: str | None = None,
        cluster: str | None = None,
        submitter: str | None = None,
    ) -> WorkloadFilter:
        """The filter of the list's words: `state` comma-separated, `since` a duration (48h);
        ValueError naming what is wrong."""
        try:
            within = parse_duration(since) if since else None
        except ValueError as err:
            raise ValueError(f"since={since!r}: {err}") from None
        return cls(
            namespaces=namespaces,
            team=team,
            workload_class=workload_class,
            states=frozenset(s.strip() for s in state.split(",")) if state else None,
            finished_within=within,
            cluster=cluster,
            search=search,
            submitter=submitter,
        )

    def keeps(self, w: models.Workload, now: datetime) -> bool:
        if self.namespaces is not None and w.namespace not in self.namespaces:
            return False
        if self.search is not None and self.search.lower() not in w.name.lower():
            return False
        if self.cluster is not None and w.cluster != self.cluster:
            return False
        if self.team is not None and w.team != self.team:
            return False
        if self.submitter is not None and w.submitter != self.submitter:
            return False
        if self.workload_class is not None and w.workload_class != self.workload_class:
            return False
        if self.states is not None and w.state not in self.states:
            return False
        if self.finished_within is not None and w.state in FINISHED_STATES:
            ended = w.finished_at or w.submitted_at
            return ended is not None and now - ended <= self.finished_within
        return True


def workloads(items: Iterable[dict[str, Any]]) -> list[models.Workload]:
    """Every workload, waiting ones first in queue order, then by namespace and name."""
    return in_queue_order(workload(w) for w in items)


def in_queue_order(rows: Iterable[models.Workload]) -> list[models.Workload]:
    return sorted(
        rows, key=lambda w: (w.state not in WAITING_STATES, w.position or 0, w.namespace, w.name)
    )


def stats(rows: list[models.Workload], now: datetime) -> models.WorkloadStats:
    """Counts by state, team and class, and the GPU-hours of their current or last run."""

    def counted(key: Callable[[models.Workload], str]) -> list[models.Count]:
        groups: dict[str, list[models.Workload]] = defaultdict(list)
        for w in rows:
            groups[key(w)].append(w)
        return [
            models.Count(key=k, workloads=len(v), gpus=sum(w.gpus for w in v))
            for k, v in sorted(groups.items())
        ]

    hours = 0.0
    for w in rows:
        if w.started_at is not None:
            end = w.finished_at if w.state in FINISHED_STATES and w.finished_at else now
            hours += w.gpus * max(0.0, (end - w.started_at).total_seconds()) / 3600
    return models.WorkloadStats(
        total=len(rows),
        by_state=counted(lambda w: w.state),
        by_team=counted(lambda w: w.team),
        by_class=counted(lambda w: w.workload_class),
        gpu_hours=round(hours, 3),
        waiting_gpus=sum(w.gpus for w in rows if w.state in WAITING_STATES),
    )


def health(nodes_now: list[models.Node]) -> models.Health:
    """The nodes' health in numbers, and the nodes that need a look."""
    bad = [n for n in nodes_now if not n.ready or n.gpu_healthy != "True" or n.quarantined]
    return models.Health(
        nodes=len(nodes_now),
        ready=sum(n.ready for n in nodes_now),
        gpu_healthy=sum(n.gpu_healthy == "True" for n in nodes_now),
        gpu_unhealthy=sum(n.gpu_healthy == "False" for n in nodes_now),
        unknown=sum(n.gpu_healthy == "Unknown" for n in nodes_now),
        quarantined=sum(n.quarantined for n in nodes_now),
        escalated=sum(n.escalated for n in nodes_now),
        gpus=sum(n.gpus for n in nodes_now),
        unhealthy_gpus=sum(n.gpus for n in bad if n.gpu_healthy != "True" or n.quarantined),
        problems=bad,
    )


def templates(objects: Objects) -> list[models.Template]:
    """The WorkloadTemplates, by name, each as the model reads it (its spec's defaults)."""
    rows = []
    for obj in sorted(objects.templates, key=lambda o: o["metadata"]["name"]):
        try:
            spec = WorkloadTemplateSpec.model_validate(obj.get("spec") or {})
        except ValueError:
            continue  # the API server checked it against the same schema; an older one's
        rows.append(
            models.Template.model_validate(
                {"name": obj["metadata"]["name"], **spec.model_dump(by_alias=True)}
            )
        )
    return rows


def explain(w: models.Workload) -> str:
    """Where a workload is and why, in plain words."""
    size = f"{w.pods} pod(s) x {w.gpus / w.pods:g} GPU" if w.pods > 1 else f"{w.gpus:g} GPU"
    what = (
        f"{w.namespace}/{w.name} ({w.kind}, {w.workload_class}, team {w.team}, "
        f"priority {w.priority}, {size})"
    )
    if w.state in ADMITTED_STATES:
        nodes = ", ".join(w.nodes) or "nodes not known yet"
        text = f"{what} is {w.state} in pool {w.pool} on {nodes}."
        if w.preemptions:
            text += f" It was preempted {w.preemptions} time(s) before."
        return text
    if w.state in FINISHED_STATES:
        return f"{what} is {w.state}." + (f" Diagnosis: {w.diagnosis}" if w.diagnosis else "")
    lines = [f"{what} is {w.state}, waiting: {w.reason or 'not decided yet'}."]
    if w.message:
        lines.append(f"Why: {w.message}.")
    if w.position:
        place = ORDINAL.get(w.position, f"{w.position}th")
        lines.append(f"It is {place} in team {w.team}'s queue.")
    if w.eta:
        eta = f"{w.eta.astimezone(UTC):%Y-%m-%dT%H:%M:%SZ}"
        lines.append(
            f"It may start around {eta} (the earliest time running work is expected to free "
            "enough GPUs)."
        )
    else:
        lines.append("No start time can be estimated yet (running work has no expected end).")
    return " ".join(lines)


def nodes(objects: Objects, now: datetime) -> list[models.Node]:
    """GPU nodes of pools (label gpufleet.io/pool) with health and quarantine; in observe mode
    (no GPUPool declared) every GPU node, in the pool of its GPU product."""
    # by cluster too: two clusters of a fleet may each have a node of one name
    by_cluster: dict[str | None, list[dict[str, Any]]] = defaultdict(list)
    for pod in objects.pods:
        by_cluster[pod.get(CLUSTER_KEY)].append(pod)
    used = {
        (cluster, node): gpus
        for cluster, pods in by_cluster.items()
        for node, gpus in gpus_by_node(pods).items()
    }
    rows = []
    for obj in sorted(
        objects.nodes, key=lambda n: (n.get(CLUSTER_KEY) or "", n["metadata"]["name"])
    ):
        if not objects.pools:
            obj = with_observed_pool(obj)
        node, health = node_of(obj, now), node_health(obj)
        if node is None or health is None:
            continue
        ready = any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in (obj.get("status") or {}).get("conditions") or []
        )
        notes = health.annotations
        rows.append(
            models.Node(
                node=node.name,
                pool=node.pool,
                gpus=node.gpus,
                allocated_gpus=min(used.get((obj.get(CLUSTER_KEY), node.name), 0.0), node.gpus),
                ready=ready,
                gpu_healthy="Unknown" if health.healthy is None else str(health.healthy),
                reason=health.reason,
                quarantined=health.quarantined,
                escalated=bool(notes.get(QUARANTINE_ESCALATED_ANNOTATION)),
                quarantined_since=notes.get(QUARANTINED_AT_ANNOTATION)
                if health.quarantined
                else None,
                why=notes.get(QUARANTINE_REASON_ANNOTATION, "") if health.quarantined else "",
                cluster=obj.get(CLUSTER_KEY),
            )
        )
    return rows


def clusters(objects: Objects) -> models.Clusters:
    """The fleet's clusters as the hub last saw each (the status it wrote), with totals; none
    in a fleet of one cluster."""
    rows = []
    for obj in sorted(objects.clusters, key=lambda o: o["metadata"]["name"]):
        spec, status = obj.get("spec") or {}, obj.get("status") or {}
        rows.append(
            models.Cluster.model_validate(
                {
                    "name": obj["metadata"]["name"],
                    "region": spec.get("region"),
                    "labels": obj["metadata"].get("labels") or {},
                    **{k: v for k, v in status.items() if k in _CLUSTER_STATUS},
                    "state": status.get("state", "Unknown"),
                }
            )
        )
    totals = models.ClusterTotals.model_validate(
        {
            "clusters": len(rows),
            "ready": sum(1 for r in rows if r.state == "Ready"),
            "nodes": sum(r.nodes for r in rows),
            "gpus": sum(r.gpus for r in rows),
            "allocatedGPUs": sum(r.allocated_gpus for r in rows),
            "workloads": sum(r.workloads for r in rows),
        }
    )
    return models.Clusters(items=rows, totals=totals)


_CLUSTER_STATUS = (
    "kubernetesVersion",
    "lastHeartbeat",
    "nodes",
    "gpus",
    "allocatedGPUs",
    "workloads",
    "pools",
    "message",
)


# --- hosts ---------------------------------------------------------------------------------

_HOST_STATUS = (
    "message",
    "lastSeen",
    "lastSample",
    "agentVersion",
    "gpus",
    "healthyGPUs",
    "cpuUtilization",
    "memoryUsedBytes",
    "memoryTotalBytes",
    "reports",
    "duplicates",
    "devices",
    "processes",
    "services",
    "usage",
)


def hosts(objects: Objects, now: datetime) -> list[models.Host]:
    """The GPU hosts outside Kubernetes, by name, as their agents last reported them; Lost when
    none reported for the host's lostAfter."""
    return [host(o, now) for o in sorted(objects.hosts, key=lambda o: o["metadata"]["name"])]


def host(obj: dict[str, Any], now: datetime) -> models.Host:
    status = obj.get("status") or {}
    state, message = state_now(obj, now)
    busy = [d["utilization"] for d in status.get("devices") or [] if "utilization" in d]
    return models.Host.model_validate(
        {
            "name": obj["metadata"]["name"],
            **{k: v for k, v in status.items() if k in _HOST_STATUS},
            "state": state,
            "message": message,
            "gpuUtilization": round(sum(busy) / len(busy), 4) if busy else None,
            "labels": obj["metadata"].get("labels") or {},
        }
    )


def host_metrics(
    name: str, taken: datetime, text: str, service: str | None = None, prefix: str | None = None
) -> models.HostMetrics:
    """The series of a host's newest report: of one `service` (its service_name), or whose name
    starts with `prefix`, or all."""
    series = [
        models.HostSeries(name=s.name, labels=s.labels, value=s.value)
        for s in parse_series(text)
        if (service is None or s.labels.get(SERVICE_LABEL) == service)
        and (prefix is None or s.name.startswith(prefix))
    ]
    return models.HostMetrics(host=name, time=taken, series=series)


def fleet_of(objects: Objects) -> Fleet:
    """The pools, teams and reservations as a Fleet (their specs, as git declares them)."""
    typed = [
        {**obj, "apiVersion": API_VERSION, "kind": kind}
        for kind, items in (
            ("GPUPool", objects.pools),
            ("Team", objects.teams),
            ("Reservation", objects.reservations),
        )
        for obj in items
    ]
    return fleet_from_objects(typed).fleet


def queue_shape(
    objects: Objects, now: datetime
) -> tuple[list[Waiting], dict[str, dict[str, float]]]:
    """The work waiting now and each pool's free GPUs by node (ready, not quarantined): what
    a fragmentation recommendation reads."""
    every_pool = tuple(sorted(p["metadata"]["name"] for p in objects.pools))
    waiting = []
    for w in objects.workloads:
        if _state(w) not in WAITING_STATES:
            continue
        spec, status = w.get("spec") or {}, w.get("status") or {}
        since = parse_time(status.get("preemptedAt") or status.get("submittedAt"))
        waiting.append(
            Waiting(
                workload=f"{w['metadata']['namespace']}/{w['metadata']['name']}",
                team=str(spec.get("team", "")),
                gpus_per_pod=float(spec.get("gpus", 0)),
                pods=int(spec.get("pods", 1)),
                waited_s=(now - since).total_seconds() if since else 0.0,
                pools=(spec["pool"],) if spec.get("pool") else every_pool,
            )
        )
    free: dict[str, dict[str, float]] = defaultdict(dict)
    for node in nodes(objects, now):
        if node.ready and not node.quarantined:
            free[node.pool][node.node] = max(node.gpus - node.allocated_gpus, 0.0)
    return waiting, dict(free)
