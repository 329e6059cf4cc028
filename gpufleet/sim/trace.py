"""Workload traces for the simulator: the native CSV format.

Columns (header required): `name,team,class,gpus,pods,submit_s,duration_s[,priority]` —
submission time and duration in seconds from the start of the trace; `gpus` per pod.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from pathlib import Path

from gpufleet.model.problems import Problem

COLUMNS = ("name", "team", "class", "gpus", "pods", "submit_s", "duration_s")


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
                f"missing columns: {', '.join(missing)} (expected {','.join(COLUMNS)}[,priority])",
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
            )
        except (TypeError, ValueError) as err:
            problems.append(Problem(file, line, "error", f"bad row: {err}", "TraceRow"))
            continue
        if job.workload_class not in ("reserved", "elastic"):
            problems.append(
                Problem(
                    file,
                    line,
                    "error",
                    f"class {job.workload_class!r} is not reserved or elastic",
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
