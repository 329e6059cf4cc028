"""The agent's Prometheus metrics per GPU (including the composite GPU Usage of DESIGN §6, read
from a DCGM exporter). No Kubernetes here: the standalone agent imports it too."""

from __future__ import annotations

import contextlib
import logging
import re
import urllib.request
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge

from gpufleet.health.signals import GPUProcess, GPUReading

log = logging.getLogger("gpufleet.agent")


class ProcessInfoLike(Protocol):
    """Who a process is (`processes.ProcessInfo`)."""

    @property
    def user(self) -> str: ...
    @property
    def command(self) -> str: ...
    @property
    def framework(self) -> str: ...
    @property
    def workload(self) -> str: ...


LABELS = ("node", "gpu", "uuid")
PROCESS_LABELS = (*LABELS, "pid", "user", "command", "framework", "workload")


class Metrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, LABELS, registry=registry)

        self.utilization = gauge("gpufleet_gpu_utilization_ratio", "GPU busy time, 0-1 (NVML).")
        self.memory_used = gauge("gpufleet_gpu_memory_used_bytes", "GPU memory in use.")
        self.memory_total = gauge("gpufleet_gpu_memory_total_bytes", "GPU memory.")
        self.temperature = gauge("gpufleet_gpu_temperature_celsius", "GPU temperature.")
        self.power = gauge("gpufleet_gpu_power_watts", "GPU power draw.")
        self.healthy = gauge("gpufleet_gpu_healthy", "1 when the GPU has no fatal finding.")
        self.usage = gauge(
            "gpufleet_gpu_usage_ratio",
            "GPU Usage: max(SM, tensor, DRAM active), 0 below 10 % of the power limit "
            "(DCGM profiling fields; absent without a DCGM exporter).",
        )
        self.errors = Gauge(
            "gpufleet_gpu_errors",
            "Error counters as NVML reports them (volatile ECC, PCIe replays, NVLink).",
            (*LABELS, "kind"),
            registry=registry,
        )
        self.xids = Counter(
            "gpufleet_gpu_xid_events_total", "Xid events seen.", (*LABELS, "xid"), registry=registry
        )
        self.agent_errors = Counter(
            "gpufleet_agent_errors_total",
            "Errors the agent's loops met and survived (retried with back-off), by loop "
            "(poll, events) and kind (nvml, api, internal).",
            ("node", "loop", "kind"),
            registry=registry,
        )
        self.findings = Counter(
            "gpufleet_gpu_findings_total",
            "Findings of the health checks.",
            (*LABELS, "reason", "severity"),
            registry=registry,
        )

        self.process_memory = Gauge(
            "gpufleet_process_gpu_memory_bytes",
            "GPU memory a process holds, with who runs it and what (framework, workload).",
            PROCESS_LABELS,
            registry=registry,
        )
        self.process_utilization = Gauge(
            "gpufleet_process_gpu_utilization_ratio",
            "A process's share of its GPU's SM time over the last samples, 0-1.",
            PROCESS_LABELS,
            registry=registry,
        )
        self.processes_shown: set[tuple[str, ...]] = set()

    def record_processes(
        self, node: str, found: list[tuple[GPUProcess, str, ProcessInfoLike]]
    ) -> None:
        """The processes on the GPUs now, each with its GPU's UUID and who it is; the series
        of processes gone are removed (a PID's series must not outlive it)."""
        shown: set[tuple[str, ...]] = set()
        for process, uuid, info in found:
            labels = (node, str(process.gpu), uuid, str(process.pid), info.user,
                      info.command, info.framework, info.workload)  # fmt: skip
            shown.add(labels)
            if process.memory_bytes is not None:
                self.process_memory.labels(*labels).set(process.memory_bytes)
            if process.sm_util_pct is not None:
                self.process_utilization.labels(*labels).set(process.sm_util_pct / 100)
        for gone in self.processes_shown - shown:
            for gauge in (self.process_memory, self.process_utilization):
                with contextlib.suppress(KeyError):  # never set: NVML gave no figure
                    gauge.remove(*gone)
        self.processes_shown = shown

    def record(self, node: str, reading: GPUReading, fatal: bool) -> None:
        labels = (node, str(reading.index), reading.uuid)
        self.healthy.labels(*labels).set(0 if fatal else 1)
        for gauge, value in (
            (
                self.utilization,
                None if reading.utilization_pct is None else reading.utilization_pct / 100,
            ),
            (self.memory_used, reading.memory_used_bytes),
            (self.memory_total, reading.memory_total_bytes),
            (self.temperature, reading.temperature_c),
            (self.power, reading.power_w),
        ):
            if value is not None:  # absent, not zero, when NVML cannot say
                gauge.labels(*labels).set(value)
        for kind in ("ecc_dbe_volatile", "ecc_sbe_volatile", "pcie_replays", "nvlink_replay",
                     "nvlink_recovery", "nvlink_crc", "retired_pages"):  # fmt: skip
            value = getattr(reading, kind)
            if value is not None:
                self.errors.labels(*labels, kind).set(value)


PROFILING = {
    "DCGM_FI_PROF_SM_ACTIVE": "sm",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": "tensor",
    "DCGM_FI_PROF_DRAM_ACTIVE": "dram",
    "DCGM_FI_DEV_POWER_USAGE": "power",
    "DCGM_FI_DEV_POWER_MGMT_LIMIT": "limit",
}
SAMPLE = re.compile(r"^(\w+)\{([^}]*)\}\s+([0-9.eE+-]+)")


def gpu_usage(exposition: str) -> dict[str, float]:
    """GPU Usage by GPU UUID from a DCGM exporter's /metrics text; a GPU without all three
    profiling fields is left out (absent, not zero)."""
    fields: dict[str, dict[str, float]] = {}
    for line in exposition.splitlines():
        match = SAMPLE.match(line)
        if not match or match.group(1) not in PROFILING:
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', match.group(2)))
        uuid = labels.get("UUID") or labels.get("uuid")
        if uuid:
            fields.setdefault(uuid, {})[PROFILING[match.group(1)]] = float(match.group(3))
    usage = {}
    for uuid, f in fields.items():
        if not {"sm", "tensor", "dram"} <= set(f):
            continue
        idle = "power" in f and f.get("limit") and f["power"] < 0.1 * f["limit"]
        usage[uuid] = 0.0 if idle else max(f["sm"], f["tensor"], f["dram"])
    return usage


def scrape(url: str, timeout_s: float = 5) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return str(response.read().decode())
    except OSError as err:
        # the caller logs when reachability changes; each failure only at debug level
        log.debug("DCGM exporter at %s not reachable: %s", url, err)
        return None
