"""The host's own metrics, for the standalone agent (a Kubernetes node has node-exporter):
CPU, memory, load, the root filesystem and uptime, read with psutil when Prometheus scrapes."""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator

import psutil
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector


class HostCollector(Collector):
    def __init__(self, node: str, mounts: tuple[str, ...] = ("/",)) -> None:
        self.node, self.mounts = node, mounts
        psutil.cpu_percent(interval=None)  # the first reading is since this one

    def collect(self) -> Iterator[Metric]:
        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            family = GaugeMetricFamily(name, doc, labels=["node"])
            family.add_metric([self.node], value)
            return family

        memory = psutil.virtual_memory()
        yield gauge("gpufleet_host_cpu_utilization_ratio", "CPU busy since the last scrape, 0-1.",
                    psutil.cpu_percent(interval=None) / 100)  # fmt: skip
        yield gauge("gpufleet_host_cpus", "Logical CPUs.", float(psutil.cpu_count() or 0))
        yield gauge("gpufleet_host_memory_used_bytes", "Memory in use.", float(memory.used))
        yield gauge("gpufleet_host_memory_total_bytes", "Memory.", float(memory.total))
        yield gauge("gpufleet_host_load1", "Load average over 1 minute.", psutil.getloadavg()[0])
        yield gauge("gpufleet_host_uptime_seconds", "Seconds since boot.",
                    time.time() - psutil.boot_time())  # fmt: skip
        used = GaugeMetricFamily("gpufleet_host_disk_used_bytes", "Filesystem space in use.",
                                 labels=["node", "mount"])  # fmt: skip
        total = GaugeMetricFamily("gpufleet_host_disk_total_bytes", "Filesystem size.",
                                  labels=["node", "mount"])  # fmt: skip
        for mount in self.mounts:
            try:
                usage = psutil.disk_usage(mount)
            except OSError:
                continue
            used.add_metric([self.node, mount], float(usage.used))
            total.add_metric([self.node, mount], float(usage.total))
        yield used
        yield total

    def describe(self) -> Iterable[Metric]:
        return []
