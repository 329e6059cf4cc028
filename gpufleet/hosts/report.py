"""What one report of a standalone agent says about its host: its GPUs, the processes that hold
them, the services that send it OTLP metrics and the host's own figures, read from the agent's
/metrics exposition (the report carries that text: one format for the agent's page, its
upload and the server's view of it). Pure: no I/O, no Kubernetes."""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

SERVICE_LABEL = "service_name"
# the agent's own families: everything else with a service_name came over OTLP
OWN_PREFIX = "gpufleet_"
PROCESS_GAUGES = ("gpufleet_process_gpu_memory_bytes", "gpufleet_process_gpu_utilization_ratio")
PROCESS_KEY = ("gpu", "pid", "user", "command", "framework", "workload")


class ReportError(ValueError):
    """A report whose metrics are not Prometheus text."""


@dataclass(frozen=True)
class Series:
    name: str  # as exposed: with _bucket, _sum, _count, _total where it has one
    labels: dict[str, str]
    value: float


@dataclass(frozen=True)
class HostGPU:
    index: int
    uuid: str
    healthy: bool = True
    utilization: float | None = None  # 0-1
    memory_used_bytes: float | None = None
    memory_total_bytes: float | None = None
    temperature_c: float | None = None
    problems: tuple[str, ...] = ()  # the reasons of its fatal findings


@dataclass(frozen=True)
class HostProcess:
    gpu: int
    pid: int
    user: str
    command: str
    framework: str
    workload: str
    memory_bytes: float | None = None
    utilization: float | None = None


@dataclass(frozen=True)
class HostReading:
    gpus: tuple[HostGPU, ...] = ()
    processes: tuple[HostProcess, ...] = ()
    services: dict[str, int] = field(default_factory=dict)  # service_name -> series
    cpu_utilization: float | None = None
    memory_used_bytes: float | None = None
    memory_total_bytes: float | None = None
    series: tuple[Series, ...] = ()  # every series of the report, the agent's and OTLP's

    @property
    def healthy(self) -> bool:
        return all(g.healthy for g in self.gpus)

    def problem(self) -> str | None:
        """Why the host is unhealthy, for people; None when every GPU is healthy."""
        bad = [g for g in self.gpus if not g.healthy]
        if not bad:
            return None
        return "; ".join(
            f"GPU {g.index} ({g.uuid}) is unhealthy"
            + (f": {', '.join(g.problems)}" if g.problems else "")
            for g in bad
        )


def parse(text: str) -> list[Series]:
    try:
        families = list(text_string_to_metric_families(text))
    except (ValueError, TypeError, IndexError) as err:
        raise ReportError(f"its metrics are not Prometheus text: {err}") from None
    return [
        Series(s.name, dict(s.labels), float(s.value))
        for family in families
        for s in family.samples
        if not math.isnan(s.value)
    ]


def read(text: str) -> HostReading:
    """The host as one exposition of `gpufleet agent standalone` shows it."""
    series = parse(text)
    gpu_fields: dict[int, dict[str, object]] = defaultdict(dict)
    process_fields: dict[tuple[str, ...], dict[str, float]] = defaultdict(dict)
    problems: dict[int, set[str]] = defaultdict(set)
    services: dict[str, int] = defaultdict(int)
    host: dict[str, float] = {}
    gauges = {
        "gpufleet_gpu_utilization_ratio": "utilization",
        "gpufleet_gpu_memory_used_bytes": "memory_used_bytes",
        "gpufleet_gpu_memory_total_bytes": "memory_total_bytes",
        "gpufleet_gpu_temperature_celsius": "temperature_c",
    }
    for s in series:
        labels = s.labels
        if not s.name.startswith(OWN_PREFIX):
            if SERVICE_LABEL in labels:
                services[labels[SERVICE_LABEL]] += 1
            continue
        gpu = _int(labels.get("gpu"))
        if s.name == "gpufleet_gpu_healthy" and gpu is not None:
            gpu_fields[gpu]["uuid"] = labels.get("uuid", "")
            gpu_fields[gpu]["healthy"] = s.value >= 1
        elif s.name in gauges and gpu is not None:
            gpu_fields[gpu]["uuid"] = labels.get("uuid", "")
            gpu_fields[gpu][gauges[s.name]] = s.value
        elif s.name == "gpufleet_gpu_findings_total" and gpu is not None:
            if labels.get("severity") == "fatal" and s.value > 0:
                problems[gpu].add(labels.get("reason", ""))
        elif s.name in PROCESS_GAUGES:
            key = tuple(labels.get(k, "") for k in PROCESS_KEY)
            kind = "memory" if "memory" in s.name else "utilization"
            process_fields[key][kind] = s.value
        elif s.name == "gpufleet_host_cpu_utilization_ratio":
            host["cpu"] = s.value
        elif s.name == "gpufleet_host_memory_used_bytes":
            host["used"] = s.value
        elif s.name == "gpufleet_host_memory_total_bytes":
            host["total"] = s.value
    gpus = tuple(
        HostGPU(
            index=index,
            uuid=str(fields.get("uuid", "")),
            healthy=bool(fields.get("healthy", True)),
            utilization=_float(fields.get("utilization")),
            memory_used_bytes=_float(fields.get("memory_used_bytes")),
            memory_total_bytes=_float(fields.get("memory_total_bytes")),
            temperature_c=_float(fields.get("temperature_c")),
            # a fatal finding is cleared by a reset: only a GPU unhealthy now names its reasons
            problems=tuple(sorted(problems[index])) if not fields.get("healthy", True) else (),
        )
        for index, fields in sorted(gpu_fields.items())
    )
    processes = sorted(
        (
            HostProcess(
                gpu=_int(key[0]) or 0,
                pid=_int(key[1]) or 0,
                user=key[2],
                command=key[3],
                framework=key[4],
                workload=key[5],
                memory_bytes=fields.get("memory"),
                utilization=fields.get("utilization"),
            )
            for key, fields in process_fields.items()
        ),
        key=lambda p: (p.gpu, p.pid),
    )
    return HostReading(
        gpus=gpus,
        processes=tuple(processes),
        services=dict(sorted(services.items())),
        cpu_utilization=host.get("cpu"),
        memory_used_bytes=host.get("used"),
        memory_total_bytes=host.get("total"),
        series=tuple(series),
    )


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def _float(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) else None
