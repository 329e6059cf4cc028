"""Cost and usage from the ledger's records: GPU-hours and cost by group, idle capacity, waste,
reservation use (forecasts: `forecast.py`). Pure: the same figures from a live cluster's ledger
and from a simulation's.

Field names follow OpenCost where it has one: gpuHours, gpuCost, idleCost, efficiency (here the
share of GPU-hours that were not wasted; OpenCost's is use against request, which needs
per-GPU utilisation the ledger does not keep).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

GROUP_KEYS = ("team", "user", "pool", "gpu-type", "capacity-type", "class", "namespace", "cluster")
UNKNOWN = "(none)"


@dataclass(frozen=True)
class Segment:
    """One run of one workload: from its admission until it stopped holding GPUs."""

    uid: str
    workload: str
    namespace: str
    team: str
    workload_class: str
    pool: str | None
    gpu_type: str | None
    gpus: float
    nodes: int
    price_per_gpu_hour: float | None
    start: datetime
    end: datetime | None  # None: still running
    outcome: str
    reason: str | None = None
    lost_gpu_seconds: float | None = None
    cluster: str | None = None  # of a fleet sharing the ledger
    submitter: str | None = None  # who created it (the "user" grouping); None: not known
    capacity_type: str | None = None  # on-demand, spot, reserved, mixed; None: not known

    def group(self, key: str) -> str:
        value = {
            "team": self.team,
            "user": self.submitter,
            "pool": self.pool,
            "gpu-type": self.gpu_type,
            "capacity-type": self.capacity_type,
            "class": self.workload_class,
            "namespace": self.namespace,
            "cluster": self.cluster,
        }[key]
        return value or UNKNOWN


@dataclass(frozen=True)
class Interval:
    """Values that held from `start` to `end`: a pool's capacity or a reservation."""

    key: str
    pool: str
    gpu_type: str
    gpus: float
    start: datetime
    end: datetime | None
    price_per_gpu_hour: float | None = None
    allocated_gpus: float = 0.0
    unhealthy_gpus: float = 0.0
    team: str = ""
    cluster: str | None = None


def _hours(start: datetime, end: datetime | None, since: datetime, until: datetime) -> float:
    """Hours of [start, end) inside [since, until)."""
    stop = min(end or until, until)
    begin = max(start, since)
    return max((stop - begin).total_seconds(), 0.0) / 3600


def _round(value: float, digits: int = 4) -> float:
    return round(value, digits) + 0.0  # + 0.0: no "-0.0" in the output


@dataclass
class _Sums:
    gpu_hours: float = 0.0
    gpu_cost: float = 0.0
    waste_gpu_hours: float = 0.0
    waste_cost: float = 0.0
    idle_cost: float = 0.0
    runs: int = 0
    outcomes: dict[str, int] | None = None
    unpriced_gpu_hours: float = 0.0

    def add(self, hours: float, waste: float, price: float | None, outcome: str) -> None:
        self.gpu_hours += hours
        self.waste_gpu_hours += waste
        if price is None:
            self.unpriced_gpu_hours += hours
        else:
            self.gpu_cost += hours * price
            self.waste_cost += waste * price
        self.runs += 1
        self.outcomes = self.outcomes or defaultdict(int)
        self.outcomes[outcome] += 1

    def fields(self, share_idle: bool) -> dict[str, Any]:
        out: dict[str, Any] = {
            "gpuHours": _round(self.gpu_hours),
            "gpuCost": _round(self.gpu_cost, 2),
        }
        if share_idle:
            out["idleCost"] = _round(self.idle_cost, 2)
        out["totalCost"] = _round(self.gpu_cost + (self.idle_cost if share_idle else 0.0), 2)
        out["wasteGPUHours"] = _round(self.waste_gpu_hours)
        out["wasteCost"] = _round(self.waste_cost, 2)
        out["efficiency"] = (
            _round(1 - self.waste_gpu_hours / self.gpu_hours) if self.gpu_hours else None
        )
        out["runs"] = self.runs
        out["outcomes"] = dict(sorted((self.outcomes or {}).items()))
        if self.unpriced_gpu_hours:
            out["unpricedGPUHours"] = _round(self.unpriced_gpu_hours)
        return out


def waste_gpu_hours(segment: Segment, hours: float, short_s: float, ends_inside: bool) -> float:
    """GPU-hours of `segment` (of which `hours` fall in the window) that bought nothing: all of
    a failed run, and of a preempted or cancelled run shorter than `short_s`; of a longer
    preempted run the work lost since its last checkpoint where that is known."""
    gpu_hours = hours * segment.gpus
    if segment.outcome == "failed":
        return gpu_hours
    if segment.end is None or segment.outcome not in ("preempted", "cancelled"):
        return 0.0
    if (segment.end - segment.start).total_seconds() < short_s:
        return gpu_hours
    if segment.lost_gpu_seconds is not None and ends_inside:
        return min(segment.lost_gpu_seconds / 3600, gpu_hours)
    return 0.0


def report(
    segments: Sequence[Segment],
    capacity: Sequence[Interval],
    reservations: Sequence[Interval],
    since: datetime,
    until: datetime,
    now: datetime,
    by: Sequence[str] = ("team",),
    share_idle: bool = False,
    short_s: float = 300.0,
) -> dict[str, Any]:
    """Usage and cost over [since, until), grouped by the keys of `by` (GROUP_KEYS). A
    segment still running counts until `now`. With `share_idle`, each pool's idle cost (its
    capacity cost less the cost of what ran on it) is shared among the groups in proportion to
    their GPU-hours in that pool; otherwise it is reported on its own."""
    for name in by:
        if name not in GROUP_KEYS:
            raise ValueError(f"cannot group by {name!r}: use {', '.join(GROUP_KEYS)}")
    running_until = min(until, now)
    groups: dict[tuple[str, ...], _Sums] = defaultdict(_Sums)
    total = _Sums()
    used_cost: dict[str, float] = defaultdict(float)
    used_hours: dict[str, float] = defaultdict(float)
    group_pool_hours: dict[tuple[tuple[str, ...], str], float] = defaultdict(float)
    reserved_used: dict[tuple[str, str], float] = defaultdict(float)
    for segment in segments:
        hours = _hours(segment.start, segment.end or running_until, since, until)
        if hours <= 0:
            continue
        ends_inside = segment.end is not None and since <= segment.end <= until
        waste = waste_gpu_hours(segment, hours, short_s, ends_inside)
        group = tuple(segment.group(k) for k in by)
        price = segment.price_per_gpu_hour
        groups[group].add(hours * segment.gpus, waste, price, segment.outcome)
        total.add(hours * segment.gpus, waste, price, segment.outcome)
        pool = segment.pool or UNKNOWN
        used_hours[pool] += hours * segment.gpus
        used_cost[pool] += hours * segment.gpus * (price or 0.0)
        group_pool_hours[(group, pool)] += hours * segment.gpus
        if segment.workload_class == "reserved":
            reserved_used[(segment.team, pool)] += hours * segment.gpus
    pools = _pools(capacity, since, until, used_hours, used_cost)
    idle_cost_total = sum(p["idleCost"] for p in pools.values())
    if share_idle:
        for (group, pool), hours in group_pool_hours.items():
            if used_hours[pool] > 0 and pool in pools:
                groups[group].idle_cost += pools[pool]["idleCost"] * hours / used_hours[pool]
        total.idle_cost = sum(g.idle_cost for g in groups.values())
    capacity_hours = sum(p["capacityGPUHours"] for p in pools.values())
    capacity_cost = sum(p["capacityCost"] for p in pools.values())
    totals = total.fields(share_idle)
    totals.update(
        {
            "capacityGPUHours": _round(capacity_hours),
            "capacityCost": _round(capacity_cost, 2),
            "idleGPUHours": _round(sum(p["idleGPUHours"] for p in pools.values())),
            "idleCost": _round(idle_cost_total, 2),
            "unhealthyGPUHours": _round(sum(p["unhealthyGPUHours"] for p in pools.values())),
            "allocation": _round(total.gpu_hours / capacity_hours) if capacity_hours else None,
        }
    )
    if share_idle:
        totals["unsharedIdleCost"] = _round(idle_cost_total - total.idle_cost, 2)
    rows = [
        {**dict(zip(by, key, strict=True)), **sums.fields(share_idle)}
        for key, sums in sorted(groups.items(), key=lambda kv: (-kv[1].gpu_cost, kv[0]))
    ]
    return {
        "window": {
            "since": _iso(since),
            "until": _iso(until),
            "hours": _round(_hours(since, until, since, until)),
        },
        "by": list(by),
        "groups": rows,
        "totals": totals,
        "pools": [{"pool": name, **fields} for name, fields in sorted(pools.items())],
        "reservations": _reservation_use(reservations, reserved_used, since, until),
    }


def cost_events(
    segments: Sequence[Segment],
    since: datetime,
    until: datetime,
    now: datetime,
    short_s: float = 300.0,
) -> list[dict[str, Any]]:
    """One row per run that held GPUs in [since, until), oldest first: who, where, from when
    to when, its GPUs, the GPU-hours and cost inside the window at its rate, and what of it
    was waste and why (the same sums as `report`)."""
    running_until = min(until, now)
    rows = []
    for segment in segments:
        hours = _hours(segment.start, segment.end or running_until, since, until)
        if hours <= 0:
            continue
        ends_inside = segment.end is not None and since <= segment.end <= until
        gpu_hours = hours * segment.gpus
        waste = waste_gpu_hours(segment, hours, short_s, ends_inside)
        price = segment.price_per_gpu_hour
        rows.append(
            {
                "workload": segment.workload,
                "team": segment.team,
                "user": segment.submitter,
                "class": segment.workload_class,
                "cluster": segment.cluster,
                "pool": segment.pool,
                "gpuType": segment.gpu_type,
                "capacityType": segment.capacity_type,
                "start": _iso(segment.start),
                "end": _iso(segment.end) if segment.end else None,
                "gpus": segment.gpus,
                "gpuHours": _round(gpu_hours),
                "pricePerGPUHour": price,
                "cost": _round(gpu_hours * price, 2) if price is not None else None,
                "outcome": segment.outcome,
                "reason": segment.reason,
                "wasteGPUHours": _round(waste),
                "wasteCost": _round(waste * price, 2) if price is not None else None,
                "wasteReason": _waste_reason(segment, waste, short_s),
            }
        )
    return rows


def _waste_reason(segment: Segment, waste: float, short_s: float) -> str | None:
    """Why `waste_gpu_hours` counted what it did as waste, in words; None when nothing."""
    if waste <= 0:
        return None
    if segment.outcome == "failed":
        return "failed: all of the run"
    if segment.end is not None and (segment.end - segment.start).total_seconds() < short_s:
        return f"{segment.outcome} after less than {short_s / 60:g} minutes"
    return f"{segment.outcome}: the work since its last checkpoint"


def _pools(
    capacity: Sequence[Interval],
    since: datetime,
    until: datetime,
    used_hours: dict[str, float],
    used_cost: dict[str, float],
) -> dict[str, dict[str, Any]]:
    hours: dict[str, float] = defaultdict(float)
    cost: dict[str, float] = defaultdict(float)
    unhealthy: dict[str, float] = defaultdict(float)
    priced: dict[str, bool] = {}
    gpu_type: dict[str, str] = {}
    cluster: dict[str, str | None] = {}
    for interval in capacity:
        span = _hours(interval.start, interval.end, since, until)
        hours[interval.pool] += span * interval.gpus
        unhealthy[interval.pool] += span * interval.unhealthy_gpus
        cost[interval.pool] += span * interval.gpus * (interval.price_per_gpu_hour or 0.0)
        priced[interval.pool] = priced.get(interval.pool, True) and (
            interval.price_per_gpu_hour is not None
        )
        gpu_type[interval.pool] = interval.gpu_type
        cluster[interval.pool] = interval.cluster
    out = {}
    for pool in sorted(set(hours) | set(used_hours)):
        idle_hours = max(hours[pool] - used_hours[pool], 0.0) if pool in hours else 0.0
        idle_cost = max(cost[pool] - used_cost[pool], 0.0) if priced.get(pool) else 0.0
        out[pool] = {
            "gpuType": gpu_type.get(pool),
            **({"cluster": cluster[pool]} if cluster.get(pool) else {}),
            "capacityGPUHours": _round(hours[pool]),
            "capacityCost": _round(cost[pool], 2),
            "gpuHours": _round(used_hours[pool]),
            "gpuCost": _round(used_cost[pool], 2),
            "idleGPUHours": _round(idle_hours),
            "idleCost": _round(idle_cost, 2),
            "unhealthyGPUHours": _round(unhealthy[pool]),
            "allocation": _round(used_hours[pool] / hours[pool]) if hours[pool] else None,
            "priced": priced.get(pool, False),
        }
    return out


def _reservation_use(
    reservations: Sequence[Interval],
    used: dict[tuple[str, str], float],
    since: datetime,
    until: datetime,
) -> list[dict[str, Any]]:
    """Per team and pool: GPU-hours reserved, used by the team's reserved work, and the share."""
    reserved: dict[tuple[str, str], float] = defaultdict(float)
    for interval in reservations:
        reserved[(interval.team, interval.pool)] += (
            _hours(interval.start, interval.end, since, until) * interval.gpus
        )
    out = []
    for team, pool in sorted(reserved):
        have, mine = reserved[(team, pool)], used.get((team, pool), 0.0)
        out.append(
            {
                "team": team,
                "pool": pool,
                "reservedGPUHours": _round(have),
                "usedGPUHours": _round(mine),
                "utilisation": _round(mine / have) if have else None,
            }
        )
    return out


def daily_cost(
    segments: Iterable[Segment],
    capacity: Sequence[Interval],
    days: Sequence[datetime],
    span: timedelta = timedelta(days=1),
) -> list[float]:
    """Cost of each `span` (a day) starting at `days`: what the pools cost where their
    capacity is known, else what the work cost."""
    out = []
    segments = list(segments)
    for day in days:
        nxt = day + span
        if capacity:
            out.append(
                sum(
                    _hours(i.start, i.end, day, nxt) * i.gpus * (i.price_per_gpu_hour or 0.0)
                    for i in capacity
                )
            )
        else:
            out.append(
                sum(
                    _hours(s.start, s.end, day, nxt) * s.gpus * (s.price_per_gpu_hour or 0.0)
                    for s in segments
                )
            )
    return out


def daily_series(
    segments: Sequence[Segment],
    capacity: Sequence[Interval],
    since: datetime,
    until: datetime,
    now: datetime,
) -> list[dict[str, Any]]:
    """Per UTC day of [since, until): the work's GPU-hours and cost, the pools' capacity
    GPU-hours and cost, and allocation: the trend charts' points. One pass over each row,
    day by day of its span."""
    first = since.replace(hour=0, minute=0, second=0, microsecond=0)
    count = max(math.ceil((until - first).total_seconds() / 86400), 0)
    sums = [[0.0, 0.0, 0.0, 0.0] for _ in range(count)]  # work h, work $, capacity h, capacity $

    def spread(start: datetime, end: datetime, gpus: float, price: float, at: int) -> None:
        begin, stop = max(start, since), min(end, until)
        day = max(int((begin - first).total_seconds() // 86400), 0)
        while day < count:
            day_start = first + timedelta(days=day)
            hours = _hours(begin, stop, day_start, day_start + timedelta(days=1)) * gpus
            if hours <= 0 and day_start >= stop:
                break
            sums[day][at] += hours
            sums[day][at + 1] += hours * price
            day += 1

    running_until = min(until, now)
    for s in segments:
        spread(s.start, s.end or running_until, s.gpus, s.price_per_gpu_hour or 0.0, 0)
    for i in capacity:
        spread(i.start, i.end or until, i.gpus, i.price_per_gpu_hour or 0.0, 2)
    return [
        {
            "day": (first + timedelta(days=d)).date().isoformat(),
            "gpuHours": _round(work_h),
            "gpuCost": _round(work_c, 2),
            "capacityGPUHours": _round(cap_h),
            "capacityCost": _round(cap_c, 2),
            "allocation": _round(work_h / cap_h) if cap_h else None,
        }
        for d, (work_h, work_c, cap_h, cap_c) in enumerate(sums)
    ]


def leaderboard(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Teams ranked by cost, with their efficiency (from `report(..., by=("team",))` rows)."""
    ranked = sorted(rows, key=lambda r: (-r["gpuCost"], r["team"]))
    return [
        {
            "rank": i + 1,
            "team": r["team"],
            "gpuCost": r["gpuCost"],
            "gpuHours": r["gpuHours"],
            "efficiency": r["efficiency"],
        }
        for i, r in enumerate(ranked)
    ]


def _iso(at: datetime) -> str:
    return at.astimezone(UTC).isoformat().replace("+00:00", "Z")
