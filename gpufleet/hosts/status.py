"""A GPUHost's status after a batch of its agent's reports: each report is taken once (by its
agent's id and sequence: a batch sent again after a lost answer adds nothing), its GPU time
added to the host's usage and its workloads', and the newest report shows the host now.
Pure: the server reads the old status and writes the new one."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from gpufleet.hosts.report import HostReading, read
from gpufleet.model.durations import parse_duration
from gpufleet.model.keys import QUARANTINE_REASON_ANNOTATION, QUARANTINED_AT_ANNOTATION

IDLE_UTILIZATION = 0.05  # a GPU busier than this is in use
MAX_LISTED = 256  # devices, processes, services and workloads kept in a status


@dataclass(frozen=True)
class Report:
    agent: str  # the id of the agent's buffer: its sequences count from 1
    sequence: int
    time: datetime  # when it was taken, on the host
    interval_s: float  # the time it stands for: the agent's poll interval
    metrics: str  # the agent's /metrics text then


@dataclass(frozen=True)
class Applied:
    status: dict[str, Any]
    accepted: int
    duplicates: int
    reading: HostReading | None  # the newest report taken, None when none was
    drain: str | None = None  # why the host is drained (its GPUHost quarantined), else None


def apply(
    status: dict[str, Any] | None,
    reports: Sequence[Report],
    now: datetime,
    agent_version: str | None = None,
) -> Applied:
    """The status after `reports` (in any order); `now` is when the server took them.
    Raises `report.ReportError` for a report that is not Prometheus text: nothing of the batch
    is taken then."""
    old = dict(status or {})
    agent = old.get("agent")
    last = int(old.get("lastSequence") or 0)
    usage = {u.get("workload"): dict(u) for u in old.get("usage") or []}
    accepted = duplicates = 0
    newest: tuple[Report, HostReading] | None = None
    for report in sorted(reports, key=lambda r: (r.agent, r.sequence)):
        if report.agent != agent:  # a new buffer (reinstalled, or its disk wiped): from 1 again
            agent, last = report.agent, 0
        if report.sequence <= last:
            duplicates += 1
            continue
        reading = read(report.metrics)
        _accrue(usage, reading, report.interval_s)
        last, accepted = report.sequence, accepted + 1
        newest = (report, reading)
    new = {
        **old,
        "agent": agent,
        "lastSeen": _iso(now),
        "lastSequence": last,
        "reports": int(old.get("reports") or 0) + accepted,
        "duplicates": int(old.get("duplicates") or 0) + duplicates,
        "usage": _usage_list(usage),
    }
    if agent_version:
        new["agentVersion"] = agent_version
    if newest is not None:
        report, reading = newest
        new.update(_now(reading))
        new["lastSample"] = _iso(report.time)
        if new["state"] != old.get("state") or not old.get("stateSince"):
            new["stateSince"] = _iso(report.time)  # what probation counts from
    # a field the newest report no longer has (a message once healthy again) goes
    return Applied(_drop_none(new), accepted, duplicates, newest[1] if newest else None)


def _accrue(usage: dict[str | None, dict[str, Any]], reading: HostReading, seconds: float) -> None:
    """Add one report's GPU time: each GPU's to the host, and to the workloads of the
    processes on it (shared evenly among them); idle where the GPU was under IDLE_UTILIZATION."""
    hours = max(seconds, 0.0) / 3600
    by_gpu: dict[int, list[str]] = {}
    for process in reading.processes:
        by_gpu.setdefault(process.gpu, []).append(process.workload or "unknown")
    for gpu in reading.gpus:
        idle = gpu.utilization is not None and gpu.utilization < IDLE_UTILIZATION
        workloads = by_gpu.get(gpu.index, [])
        shares = [(None, hours)] + [(w, hours / len(workloads)) for w in workloads]
        for workload, share in shares:
            if workload not in usage and len(usage) > MAX_LISTED:
                workload = "other"  # a host running thousands of short jobs stays bounded
            row = usage.setdefault(workload, {"workload": workload})
            row["gpuHours"] = float(row.get("gpuHours") or 0) + share
            if idle:
                row["idleGPUHours"] = float(row.get("idleGPUHours") or 0) + share


def _usage_list(usage: dict[str | None, dict[str, Any]]) -> list[dict[str, Any]]:
    """The host's row first (no workload), then its workloads', most GPU time first."""
    workloads = sorted((w for w in usage if w is not None), key=lambda w: -usage[w]["gpuHours"])
    return [
        _drop_none(
            {
                "workload": workload,
                "gpuHours": float(usage.get(workload, {}).get("gpuHours") or 0),
                "idleGPUHours": float(usage.get(workload, {}).get("idleGPUHours") or 0),
            }
        )
        for workload in [None, *workloads][: MAX_LISTED + 1]
    ]


def _now(reading: HostReading) -> dict[str, Any]:
    """What the newest report says of the host now."""
    devices = [
        _drop_none(
            {
                "index": g.index,
                "uuid": g.uuid,
                "healthy": g.healthy,
                "utilization": g.utilization,
                "memoryUsedBytes": g.memory_used_bytes,
                "memoryTotalBytes": g.memory_total_bytes,
                "temperatureC": g.temperature_c,
                "problems": list(g.problems) or None,
            }
        )
        for g in reading.gpus
    ]
    processes = [
        _drop_none(
            {
                "gpu": p.gpu,
                "pid": p.pid,
                "user": p.user,
                "command": p.command,
                "framework": p.framework,
                "workload": p.workload,
                "memoryBytes": p.memory_bytes,
                "utilization": p.utilization,
            }
        )
        for p in reading.processes
    ]
    return {
        "state": "Ready" if reading.healthy else "Unhealthy",
        "message": reading.problem(),
        "gpus": len(reading.gpus),
        "healthyGPUs": sum(1 for g in reading.gpus if g.healthy),
        "cpuUtilization": reading.cpu_utilization,
        "memoryUsedBytes": reading.memory_used_bytes,
        "memoryTotalBytes": reading.memory_total_bytes,
        "devices": devices[:MAX_LISTED],
        "processes": processes[:MAX_LISTED],
        "services": [{"name": n, "series": c} for n, c in reading.services.items()][:MAX_LISTED],
    }


def _drop_none(row: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in row.items() if v is not None}


def _iso(at: datetime) -> str:
    return at.isoformat().replace("+00:00", "Z")


def state_now(obj: dict[str, Any], now: datetime) -> tuple[str, str | None]:
    """A GPUHost's state and why, now: as its newest report said, Lost when none came for
    its spec.lostAfter, Unknown before the first."""
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    seen = moment(status.get("lastSeen"))
    if seen is None:
        return "Unknown", "no report yet"
    silent = now - seen
    if silent > lost_after(spec.get("lostAfter")):
        return "Lost", f"no report for {int(silent.total_seconds())}s: is its agent running?"
    return str(status.get("state", "Ready")), status.get("message")


def lost_after(text: str | None) -> timedelta:
    try:
        return parse_duration(text or "60s")
    except ValueError:
        return timedelta(seconds=60)


def moment(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        found = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return found if found.tzinfo else found.replace(tzinfo=UTC)


def drained(obj: dict[str, Any]) -> str | None:
    """Why the GPUHost is quarantined (its agent then drains the host's Slurm node), or None."""
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    if QUARANTINED_AT_ANNOTATION not in annotations:
        return None
    return annotations.get(QUARANTINE_REASON_ANNOTATION) or "quarantined by gpufleet"
