"""The GPU time of hosts outside Kubernetes in the ledger: what a GPUHost's totals
(`status.usage`, which the server adds up from its agent's reports) grew by since last seen,
and the sums of those rows over a window. Pure."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

Totals = dict[tuple[str, str | None], tuple[float, float]]  # (host, workload) -> gpu, idle hours
EPSILON = 1e-9


@dataclass(frozen=True)
class HostUse:
    host: str
    workload: str | None  # None: the host as a whole
    at: datetime
    gpu_hours: float
    idle_gpu_hours: float
    cluster: str | None = None


def grown(
    hosts: Iterable[dict[str, Any]], seen: Totals, at: datetime
) -> tuple[list[HostUse], Totals]:
    """The growth of each host's and workload's totals since `seen` (the totals last
    recorded), and the totals now. A total lower than seen (the GPUHost deleted and made
    again) counts from zero."""
    rows: list[HostUse] = []
    now: Totals = dict(seen)
    for obj in hosts:
        name = obj["metadata"]["name"]
        for use in (obj.get("status") or {}).get("usage") or []:
            key = (name, use.get("workload"))
            gpu, idle = float(use.get("gpuHours") or 0), float(use.get("idleGPUHours") or 0)
            before = seen.get(key, (0.0, 0.0))
            if gpu < before[0] - EPSILON:
                before = (0.0, 0.0)
            more_gpu, more_idle = gpu - before[0], max(idle - before[1], 0.0)
            now[key] = (gpu, idle)
            if more_gpu > EPSILON:
                rows.append(HostUse(name, key[1], at, more_gpu, more_idle))
    return rows, now


def host_report(rows: Iterable[HostUse]) -> list[dict[str, Any]]:
    """GPU-hours and idle GPU-hours by host, each host's row (no workload) before its
    workloads', most GPU time first."""
    sums: dict[tuple[str, str | None], list[float]] = {}
    for row in rows:
        held = sums.setdefault((row.host, row.workload), [0.0, 0.0])
        held[0] += row.gpu_hours
        held[1] += row.idle_gpu_hours
    order = sorted(sums, key=lambda k: (k[0], k[1] is not None, -sums[k][0], k[1] or ""))
    return [
        {
            "host": host,
            **({"workload": workload} if workload is not None else {}),
            "gpuHours": round(sums[(host, workload)][0], 4),
            "idleGPUHours": round(sums[(host, workload)][1], 4),
        }
        for host, workload in order
    ]
