"""Workload traces for the simulator: the native CSV format, the Philly trace and openb pod lists.

Columns (header required): `name,team,class,gpus,pods,submit_s,duration_s[,priority]
[,gpu_types]` — submission time and duration in seconds from the start of the trace; `gpus`
per pod; `class` is reserved, elastic or auto; `gpu_types` the GPU types a job accepts, the
most preferred first, separated by `|` (`H100|A100`; empty: any).
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from gpufleet.model.problems import Problem

COLUMNS = ("name", "team", "class", "gpus", "pods", "submit_s", "duration_s")
# auto: reserved while the team's reserved work fits its reservations, elastic beyond
CLASSES = ("reserved", "elastic", "auto")


@dataclass(frozen=True)
class TraceJob:
    name: str
    team: str
    workload_class: str
    gpus: float
    pods: int
    submit_s: float
    duration_s: float
    priority: int = 50
    submitted_at: datetime | None = None  # where the trace gives the time itself (Philly)
    gpu_types: tuple[str, ...] = ()  # the most preferred first; (): any


def read_native(path: str | Path) -> tuple[list[TraceJob], list[Problem]]:
    """Read a native trace; every bad row is reported with its line, none raised."""
    file = str(path)
    jobs: list[TraceJob] = []
    problems: list[Problem] = []
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        return [], [Problem(file, 0, "error", f"cannot read trace: {err}", "IO")]
    reader = csv.DictReader(io.StringIO(text))
    missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
    if missing:
        return [], [
            Problem(
                file,
                1,
                "error",
                f"missing columns: {', '.join(missing)} "
                f"(expected {','.join(COLUMNS)}[,priority][,gpu_types])",
                "TraceHeader",
            )
        ]
    for line, row in enumerate(reader, start=2):
        try:
            job = TraceJob(
                row["name"],
                row["team"],
                row["class"],
                float(row["gpus"]),
                int(row["pods"]),
                float(row["submit_s"]),
                float(row["duration_s"]),
                int(row.get("priority") or 50),
                gpu_types=tuple(
                    t.strip() for t in (row.get("gpu_types") or "").split("|") if t.strip()
                ),
            )
        except (TypeError, ValueError) as err:
            problems.append(Problem(file, line, "error", f"bad row: {err}", "TraceRow"))
            continue
        if job.workload_class not in CLASSES:
            problems.append(
                Problem(
                    file,
                    line,
                    "error",
                    f"class {job.workload_class!r} is not reserved, elastic or auto",
                    "TraceRow",
                )
            )
        elif job.gpus <= 0 or job.pods < 1 or job.duration_s <= 0 or job.submit_s < 0:
            problems.append(
                Problem(
                    file,
                    line,
                    "error",
                    "gpus, pods and duration_s must be positive and submit_s not negative",
                    "TraceRow",
                )
            )
        else:
            jobs.append(job)
    return jobs, problems


FORMATS = ("native", "philly", "openb")
PHILLY_COLUMNS = ("timestamp", "duration", "num_gpus", "cluster")
OPENB_COLUMNS = ("name", "num_gpu", "gpu_milli", "creation_time", "deletion_time")


def read_trace(
    path: str | Path,
    trace_format: str = "native",
    start: datetime | None = None,
    end: datetime | None = None,
    gpus_per_node: int = 8,
) -> tuple[list[TraceJob], list[Problem]]:
    """Read a trace of any supported format. Philly traces may be cut to [start, end)."""
    if trace_format == "native":
        return read_native(path)
    if trace_format == "philly":
        return read_philly(path, start, end, gpus_per_node)
    if trace_format == "openb":
        return read_openb(path)
    return [], [
        Problem(
            str(path),
            0,
            "error",
            f"unknown trace format {trace_format!r}: use {', '.join(FORMATS)}",
            "TraceFormat",
        )
    ]


def _rows(
    path: str | Path, columns: tuple[str, ...], kind: str
) -> tuple[list[tuple[int, dict[str, str]]], list[Problem]]:
    file = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        return [], [Problem(file, 0, "error", f"cannot read trace: {err}", "IO")]
    reader = csv.DictReader(io.StringIO(text))
    missing = [c for c in columns if c not in (reader.fieldnames or [])]
    if missing:
        return [], [
            Problem(
                file,
                1,
                "error",
                f"not a {kind} trace: missing columns {', '.join(missing)} "
                f"(expected {','.join(columns)})",
                "TraceHeader",
            )
        ]
    return list(enumerate(reader, start=2)), []


def gang_shape(gpus: int, gpus_per_node: int) -> tuple[int, int]:
    """(GPUs per pod, pods) for a job of `gpus` GPUs on nodes of `gpus_per_node`."""
    if gpus <= gpus_per_node:
        return gpus, 1
    if gpus % gpus_per_node == 0:
        return gpus_per_node, gpus // gpus_per_node
    return 1, gpus


def read_philly(
    path: str | Path,
    start: datetime | None = None,
    end: datetime | None = None,
    gpus_per_node: int = 8,
) -> tuple[list[TraceJob], list[Problem]]:
    """The Philly trace as published by the adaptdl artifact
    (`timestamp,duration,num_gpus,gpu_time,cluster`): the virtual cluster is the team, every
    job is of class auto, jobs larger than a node are gangs of whole nodes, and submission times
    count from `start` (default: the first job)."""
    rows, problems = _rows(path, PHILLY_COLUMNS, "Philly")
    parsed: list[tuple[datetime, int, float, str, int]] = []
    for line, row in rows:
        if not any(row.values()):
            continue
        try:
            submitted = datetime.fromisoformat(row["timestamp"]).replace(tzinfo=UTC)
            duration, gpus = float(row["duration"]), int(float(row["num_gpus"]))
        except (TypeError, ValueError) as err:
            problems.append(Problem(str(path), line, "error", f"bad row: {err}", "TraceRow"))
            continue
        if (start is not None and submitted < start) or (end is not None and submitted >= end):
            continue
        if gpus <= 0 or duration <= 0:
            continue  # jobs that asked for nothing or ran for nothing have no effect
        parsed.append((submitted, gpus, duration, row["cluster"], line))
    origin = start or min((p[0] for p in parsed), default=datetime(1970, 1, 1, tzinfo=UTC))
    jobs = []
    for submitted, gpus, duration, team, line in sorted(parsed):
        per_pod, pods = gang_shape(gpus, gpus_per_node)
        jobs.append(
            TraceJob(
                f"philly-{line}",
                team,
                "auto",
                per_pod,
                pods,
                (submitted - origin).total_seconds(),
                duration,
                submitted_at=submitted,
            )
        )
    return jobs, problems


def read_openb(path: str | Path) -> tuple[list[TraceJob], list[Problem]]:
    """An openb pod list replayed in time (creation to deletion): the QoS class is the team,
    GPU-sharing requests are rounded up to the quarter GPUs gpufleet shares, and pods without
    GPUs or without a deletion time are left out."""
    rows, problems = _rows(path, OPENB_COLUMNS, "openb pod list")
    jobs = []
    for line, row in rows:
        try:
            gpus, milli = int(row["num_gpu"]), int(row["gpu_milli"])
            created, deleted = float(row["creation_time"]), float(row["deletion_time"] or 0)
        except (TypeError, ValueError) as err:
            problems.append(Problem(str(path), line, "error", f"bad row: {err}", "TraceRow"))
            continue
        if gpus == 0 or deleted <= created:
            continue
        per_pod = float(gpus) if milli >= 1000 else math.ceil(milli / 250) / 4
        team = (row.get("qos") or "default").lower()
        jobs.append(TraceJob(row["name"], team, "auto", per_pod, 1, created, deleted - created))
    return jobs, problems
