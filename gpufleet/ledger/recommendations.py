"""What to change, from what the ledger recorded, each with the figures behind it: elastic work
paid at on-demand rates that spot capacity would have run for less, teams whose runs fail
too often, reservations mostly idle, and large work that waits while the pool's free GPUs are
scattered over nodes (from the queue as it is now). Pure.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from gpufleet.model.fleet import Fleet

from .cost import Interval, Segment, _hours, _round

FAILURE_RATE = 0.20  # a team's share of failed runs past which it is told
MIN_FINISHED = 5  # runs a team must have finished before its failure rate means anything
IDLE_SHARE = 0.5  # a reservation used less than this over the window is mostly idle
HEADROOM = 1.25  # a smaller reservation keeps this much above the mean use
FRAGMENTED_WAIT_S = 600.0  # large work waiting this long is worth a look


@dataclass(frozen=True)
class Waiting:
    """Work waiting now: its GPUs per pod, pods, how long, and in which pool it may run."""

    workload: str
    team: str
    gpus_per_pod: float
    pods: int
    waited_s: float
    pools: tuple[str, ...]


def recommendations(
    fleet: Fleet | None,
    segments: Sequence[Segment],
    reservations: Sequence[Interval],
    since: datetime,
    until: datetime,
    waiting: Sequence[Waiting] = (),
    free_by_node: dict[str, dict[str, float]] | None = None,
) -> list[dict[str, Any]]:
    """The recommendations over [since, until), largest saving first within each kind.
    Without `fleet` (its pools' prices), no spot recommendation; without `waiting` and
    `free_by_node` (pool -> node -> free GPUs, now), no fragmentation one."""
    out = _spot(fleet, segments, since, until) if fleet is not None else []
    out += _failing(segments, since, until)
    out += _idle(reservations, segments, since, until)
    if free_by_node is not None:
        out += _fragmented(waiting, free_by_node)
    return out


def _spot(
    fleet: Fleet, segments: Sequence[Segment], since: datetime, until: datetime
) -> list[dict[str, Any]]:
    on_demand: dict[str, float] = defaultdict(float)
    for s in segments:
        pool = fleet.pools.get(s.pool or "")
        if s.workload_class != "elastic" or pool is None:
            continue
        only_on_demand = list(pool.spec.capacity_types) == ["on-demand"]
        if s.capacity_type == "on-demand" or (s.capacity_type is None and only_on_demand):
            on_demand[pool.name] += _hours(s.start, s.end, since, until) * s.gpus
    out = []
    for name, hours in sorted(on_demand.items()):
        prices = fleet.pools[name].spec.price_per_gpu_hour
        if prices is None or prices.spot is None or prices.on_demand is None or hours < 1:
            continue
        saving = hours * (prices.on_demand - prices.spot)
        if saving <= 0:
            continue
        has_spot = "spot" in fleet.pools[name].spec.capacity_types
        action = (
            "elastic work is preempted and resumed anyway: let it run on spot nodes (pin it "
            "there with a node selector on karpenter.sh/capacity-type: spot)"
            if has_spot
            else f"add spot to GPUPool {name}'s capacityTypes: elastic work is preempted and "
            "resumed anyway, and a spot reclaim is one more preemption"
        )
        out.append(
            {
                "kind": "elastic-on-spot",
                "subject": f"pool {name}",
                "title": f"elastic work in {name} would have cost ${saving:,.2f} less on spot",
                "action": action,
                "saving": _round(saving, 2),
                "figures": {
                    "elasticOnDemandGPUHours": _round(hours, 2),
                    "onDemandPerGPUHour": prices.on_demand,
                    "spotPerGPUHour": prices.spot,
                },
            }
        )
    return sorted(out, key=lambda r: -r["saving"])


def _failing(segments: Sequence[Segment], since: datetime, until: datetime) -> list[dict[str, Any]]:
    finished: dict[str, int] = defaultdict(int)
    failed: dict[str, int] = defaultdict(int)
    wasted: dict[str, float] = defaultdict(float)
    wasted_cost: dict[str, float] = defaultdict(float)
    for s in segments:
        if s.end is None or not since <= s.end < until or s.outcome not in ("completed", "failed"):
            continue
        finished[s.team] += 1
        if s.outcome == "failed":
            failed[s.team] += 1
            hours = (s.end - s.start).total_seconds() / 3600 * s.gpus
            wasted[s.team] += hours
            wasted_cost[s.team] += hours * (s.price_per_gpu_hour or 0.0)
    out = []
    for team in sorted(finished):
        rate = failed[team] / finished[team]
        if finished[team] < MIN_FINISHED or rate <= FAILURE_RATE:
            continue
        out.append(
            {
                "kind": "failing-team",
                "subject": f"team {team}",
                "title": f"{100 * rate:.0f}% of team {team}'s runs failed",
                "action": "look at why (gpufleet workloads get NAME shows each failure's "
                "diagnosis); fix the common cause before more GPU-hours go to runs that fail",
                "saving": _round(wasted_cost[team], 2),
                "figures": {
                    "finishedRuns": finished[team],
                    "failedRuns": failed[team],
                    "failureRate": _round(rate),
                    "failedGPUHours": _round(wasted[team], 2),
                },
            }
        )
    return sorted(out, key=lambda r: (-r["figures"]["failureRate"], r["subject"]))


def _idle(
    reservations: Sequence[Interval],
    segments: Sequence[Segment],
    since: datetime,
    until: datetime,
) -> list[dict[str, Any]]:
    reserved: dict[tuple[str, str], float] = defaultdict(float)
    gpus: dict[tuple[str, str], float] = {}
    names: dict[tuple[str, str], str] = {}
    for r in reservations:
        key = (r.team, r.pool)
        reserved[key] += _hours(r.start, r.end, since, until) * r.gpus
        if r.end is None or r.end >= until:  # in force at the end: its size now
            gpus[key], names[key] = r.gpus, r.key
    used: dict[tuple[str, str], float] = defaultdict(float)
    for s in segments:
        if s.workload_class == "reserved" and s.pool:
            used[(s.team, s.pool)] += _hours(s.start, s.end, since, until) * s.gpus
    hours = (until - since).total_seconds() / 3600
    out = []
    for key in sorted(reserved):
        have, mine = reserved[key], used.get(key, 0.0)
        if key not in gpus or not have or mine / have >= IDLE_SHARE:
            continue
        team, pool = key
        mean = mine / hours if hours else 0.0
        smaller = min(math.ceil(mean * HEADROOM), int(gpus[key]))
        out.append(
            {
                "kind": "idle-reservation",
                "subject": f"reservation {names[key]}",
                "title": f"team {team}'s reservation in {pool} was {100 * (1 - mine / have):.0f}% "
                "idle",
                "action": f"shrink it to {smaller} GPUs (the mean use and a quarter more) by pull "
                "request, or keep it: its idle GPUs are lent to elastic work meanwhile",
                "saving": None,
                "figures": {
                    "reservedGPUs": gpus[key],
                    "meanUsedGPUs": _round(mean, 2),
                    "reservedGPUHours": _round(have, 2),
                    "usedGPUHours": _round(mine, 2),
                    "suggestedGPUs": smaller,
                },
            }
        )
    return out


def _fragmented(
    waiting: Sequence[Waiting], free_by_node: dict[str, dict[str, float]]
) -> list[dict[str, Any]]:
    """Work waiting long whose GPUs are free in its pool in all, but on no set of nodes that
    fits its pods: the free GPUs are scattered."""
    out = []
    for w in sorted(waiting, key=lambda w: -w.waited_s):
        if w.waited_s < FRAGMENTED_WAIT_S:
            continue
        for pool in w.pools:
            free = free_by_node.get(pool) or {}
            total = sum(free.values())
            fits = sum(int(g // w.gpus_per_pod) for g in free.values()) if w.gpus_per_pod else 0
            if total >= w.gpus_per_pod * w.pods and fits < w.pods:
                out.append(
                    {
                        "kind": "fragmented-pool",
                        "subject": f"pool {pool}",
                        "title": f"{w.workload} has waited {w.waited_s / 3600:.1f} h for "
                        f"{w.pods} × {w.gpus_per_pod:g} GPUs while {total:g} are free in {pool}",
                        "action": "the free GPUs are scattered over nodes: give large work "
                        "a pool (or reservation) of whole nodes, or run small work in a pool "
                        "of its own so that it does not spread over the large work's nodes",
                        "saving": None,
                        "figures": {
                            "workload": w.workload,
                            "team": w.team,
                            "freeGPUs": total,
                            "largestFreeOnANode": max(free.values(), default=0.0),
                            "podsThatFit": fits,
                        },
                    }
                )
                break
    return out
