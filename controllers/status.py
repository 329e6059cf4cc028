"""Status of the GitOps objects, from the same snapshot the engine decides on.

Pool: total, allocatable, healthy, allocated and idle GPUs. Team: reserved, used, borrowed GPUs
(the team alone, all pools). Reservation: the same for its team in its pool. Pure.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import timedelta
from typing import Any

from gpufleet.engine import MILLI, Snapshot
from gpufleet.kube.observe import NO_USE, Use, node_of


def _gpus(milli: float) -> float:
    value = milli / MILLI
    return int(value) if value.is_integer() else value


def fleet_status(
    snapshot: Snapshot,
    nodes: list[dict[str, Any]],
    foreign: dict[str, Use],
    reservations: dict[str, tuple[str, str, int]],
    agent_timeout: timedelta | None = None,
) -> dict[tuple[str, str], dict[str, Any]]:
    """(kind, name) -> status fields for every pool, team and reservation of the fleet.

    `reservations` maps each Reservation's name to its (team, pool, gpus); healthy GPUs are
    those that can take work now (as the engine sees them, `agent_timeout` included)."""
    out: dict[tuple[str, str], dict[str, Any]] = {}
    total: dict[str, int] = defaultdict(int)
    healthy: dict[str, int] = defaultdict(int)
    busy: dict[str, float] = defaultdict(float)  # milli, incl. GPUs of foreign pods
    node_pool = {}
    for obj in nodes:
        node = node_of(obj, snapshot.time, agent_timeout)
        if node is None or node.pool not in snapshot.pools:
            continue
        node_pool[node.name] = node.pool
        total[node.pool] += node.gpus
        if node.healthy and node.schedulable:  # GPUs that can take work now
            healthy[node.pool] += node.gpus
        busy[node.pool] += foreign.get(node.name, NO_USE).gpus * MILLI
    usage: dict[tuple[str, str], float] = defaultdict(float)
    for workload in snapshot.workloads:
        if not workload.nodes:
            continue
        pool = node_pool.get(workload.nodes[0])
        if pool is None:
            continue
        busy[pool] += workload.total_milli
        usage[(workload.team, pool)] += workload.total_milli
    for name in snapshot.pools:
        allocated = min(busy[name], total[name] * MILLI)
        out[("GPUPool", name)] = {
            "totalGPUs": total[name],
            "allocatableGPUs": total[name],
            "healthyGPUs": healthy[name],
            "allocatedGPUs": _gpus(allocated),
            "idleGPUs": _gpus(max(healthy[name] * MILLI - allocated, 0)),
        }
    for team in snapshot.teams:
        reserved = used = borrowed = 0.0
        for pool in snapshot.pools:
            mine = usage[(team, pool)]
            have = snapshot.reservations.get((team, pool), 0) * MILLI
            reserved += have
            used += mine
            borrowed += max(mine - have, 0)
        out[("Team", team)] = {
            "reservedGPUs": _gpus(reserved),
            "usedGPUs": _gpus(used),
            "borrowedGPUs": _gpus(borrowed),
        }
    for name, (team, pool, gpus) in reservations.items():
        active = (team, pool) in snapshot.reservations
        have = gpus * MILLI if active else 0
        mine = usage[(team, pool)]
        out[("Reservation", name)] = {
            "reservedGPUs": _gpus(have),
            "usedGPUs": _gpus(min(mine, have)),
            "borrowedGPUs": _gpus(max(mine - have, 0)),
            "expired": not active,
        }
    return out
