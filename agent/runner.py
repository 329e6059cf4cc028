"""The agent's two loops: NVML events (Xid, double-bit ECC, GPU lost, recovery action) as they
happen, and a poll of every GPU's counters. Fatal findings flip the node's GPUHealthy condition
at once; warnings become Events; every poll refreshes the metrics."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from gpufleet.health.checks import HealthMonitor
from gpufleet.health.signals import EventKind, Finding, GPUReading, Severity

from .backend import Backend, NVMLError
from .publish import Metrics, NodePublisher, gpu_usage, scrape

log = logging.getLogger("gpufleet.agent")


@dataclass
class Agent:
    node: str
    backend: Backend
    monitor: HealthMonitor
    publisher: NodePublisher | None = None  # None: report to the log only (dry run)
    metrics: Metrics | None = None
    poll_interval_s: float = 5.0
    dcgm_exporter_url: str | None = None
    policy_source: Callable[[], HealthMonitor | None] | None = None  # re-read thresholds
    lock: threading.Lock = field(default_factory=threading.Lock)
    boot: str = ""
    readings: list[GPUReading] = field(default_factory=list)

    def run(self, stop: threading.Event) -> None:
        self.backend.start()
        self.boot = self.backend.boot_id()
        self.poll()  # the first condition, before any event
        events = threading.Thread(target=self._event_loop, args=(stop,), daemon=True)
        events.start()
        while not stop.wait(self.poll_interval_s):
            try:
                self.poll()
            except Exception:  # keep checking: one failed poll must not end the agent
                log.exception("poll failed")
        events.join(timeout=5)
        self.backend.close()

    def _event_loop(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                event = self.backend.wait_event(1.0)
            except NVMLError as err:
                with self.lock:
                    self._handle(self.monitor.on_event_error(str(err), time.monotonic()))
                stop.wait(1.0)
                continue
            if event is not None:
                with self.lock:
                    if event.kind is EventKind.XID and self.metrics is not None:
                        uuid = self.monitor.uuids.get(event.gpu, "")
                        self.metrics.xids.labels(
                            self.node, str(event.gpu), uuid, str(event.value)
                        ).inc()
                    self._handle(self.monitor.on_event(event))

    def poll(self) -> list[Finding]:
        now = time.monotonic()
        with self.lock:
            boot = self.backend.boot_id()
            if boot != self.boot:
                log.info(
                    "new boot or GPU reset (%s -> %s): earlier findings cleared", self.boot, boot
                )
                self.boot = boot
                self.monitor.reset()
            count = self.backend.device_count()
            readings, errors = [], []
            for index in range(len(self.monitor.uuids) or count):
                try:
                    readings.append(self.backend.read(index))
                except NVMLError as err:
                    errors.append(
                        Finding("nvml", "NVMLError", Severity.WARNING, index, "", str(err), now)
                    )
            self.readings = readings
            found = self.monitor.on_poll(readings, now, count) + errors
            self._handle(found, refresh=True)
            return found

    def _handle(self, findings: list[Finding], refresh: bool = False) -> None:
        for finding in findings:
            log.warning("%s %s: %s", finding.severity, finding.reason, finding.message)
            if self.metrics is not None:
                self.metrics.findings.labels(
                    self.node, str(finding.gpu), finding.uuid, finding.reason, finding.severity
                ).inc()
            if self.publisher is not None:
                self.publisher.event(finding.reason, finding.message)
        fatal = self.monitor.fatal()
        publish = self.publisher is not None and bool(findings or refresh)
        if publish and self.publisher is not None and self.publisher.condition(fatal):
            log.info("GPUHealthy=%s on %s", not fatal, self.node)
        if self.metrics is not None and refresh:
            bad = {f.gpu for f in fatal}
            for reading in self.readings:
                self.metrics.record(self.node, reading, reading.index in bad)
            if self.dcgm_exporter_url:
                text = scrape(self.dcgm_exporter_url)
                for uuid, usage in (gpu_usage(text) if text else {}).items():
                    index = next((r.index for r in self.readings if r.uuid == uuid), -1)
                    self.metrics.usage.labels(self.node, str(index), uuid).set(usage)


def check_once(backend: Backend, monitor: HealthMonitor) -> tuple[list[GPUReading], list[Finding]]:
    """Every check once (for `gpufleet agent check` on a real GPU machine): a poll, then the
    events NVML has queued."""
    backend.start()
    try:
        count = backend.device_count()
        readings = [backend.read(i) for i in range(count)]
        findings = monitor.on_poll(readings, time.monotonic(), count)
        while (event := backend.wait_event(0.2)) is not None:
            findings += monitor.on_event(event)
        return readings, findings
    finally:
        backend.close()
