"""The agent's two loops: NVML events (Xid, double-bit ECC, GPU lost, recovery action) as they
happen, and a poll of every GPU's counters. Fatal findings flip the node's GPUHealthy condition
at once; warnings become Events; every poll refreshes the metrics and, every heartbeat period,
the condition's lastHeartbeatTime.

Neither loop ever ends on an error: an NVML or API failure is logged, counted
(`gpufleet_agent_errors_total`) and retried with back-off, and `/healthz` fails only when a loop has
not completed an iteration for a long while (hung, or failing every time)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from gpufleet.health.checks import HealthMonitor
from gpufleet.health.signals import EventKind, Finding, GPUReading, Severity

from .backend import Backend, NVMLError
from .metrics import Metrics, ProcessInfoLike, gpu_usage, scrape

log = logging.getLogger("gpufleet.agent")
EVENT_WAIT_S = 1.0  # one wait for an NVML event; the event loop's period
BACKOFF_S = (1.0, 30.0)  # first and longest wait after consecutive failures of a loop


@dataclass
class LoopHealth:
    """When a loop last completed an iteration, and how many failed since."""

    name: str
    period_s: float
    last_ok: float = field(default_factory=time.monotonic)
    failures: int = 0

    def ok(self) -> None:
        self.last_ok, self.failures = time.monotonic(), 0

    def failed(self) -> float:
        """Count a failure; how long to wait before the next try."""
        self.failures += 1
        first, longest = BACKOFF_S
        return float(min(longest, first * 2 ** (self.failures - 1)))

    def problem(self, now: float) -> str | None:
        # a slow NVML call or a back-off must not restart the agent: only a long silence
        limit = max(10 * self.period_s, 2 * BACKOFF_S[1])
        silent = now - self.last_ok
        if silent > limit:
            return f"{self.name} loop: no iteration completed for {silent:.0f}s"
        return None


class Publisher(Protocol):
    """Where the agent reports (NodePublisher writes to the API server as the node)."""

    def condition(self, fatal: list[Finding]) -> bool: ...
    def event(self, reason: str, message: str, kind: str = "Warning") -> None: ...
    def flush(self) -> None: ...


@dataclass
class Agent:
    node: str
    backend: Backend
    monitor: HealthMonitor
    publisher: Publisher | None = None  # None: report to the log only (dry run)
    metrics: Metrics | None = None
    poll_interval_s: float = 5.0
    dcgm_exporter_url: str | None = None
    policy_source: Callable[[], HealthMonitor | None] | None = None  # re-read thresholds
    lock: threading.Lock = field(default_factory=threading.Lock)
    boot: str = ""
    readings: list[GPUReading] = field(default_factory=list)
    loops: dict[str, LoopHealth] = field(default_factory=dict)
    dcgm_reachable: bool | None = None  # as last logged: a change is logged, not every scrape
    # who each GPU process is (`processes.ProcessNames`); None: processes are not shown
    describe: Callable[[int], ProcessInfoLike] | None = None

    def __post_init__(self) -> None:
        self.loops = {
            "poll": LoopHealth("poll", self.poll_interval_s),
            "events": LoopHealth("events", EVENT_WAIT_S),
        }

    def run(self, stop: threading.Event) -> None:
        self._until_started(stop)
        events = threading.Thread(target=self._event_loop, args=(stop,), daemon=True)
        events.start()
        loop = self.loops["poll"]
        wait = self.poll_interval_s
        while not stop.wait(wait):
            try:
                self.poll()
                loop.ok()
                wait = self.poll_interval_s
            except Exception as err:  # keep checking: a failed poll must not end the agent
                log.exception("poll failed; retrying")
                self._count_error("poll", err)
                wait = max(self.poll_interval_s, loop.failed())
        events.join(timeout=5)
        self.backend.close()

    def _until_started(self, stop: threading.Event) -> None:
        """NVML up and the first poll (the first condition, before any event), retried with
        back-off: a driver that is still loading must not end the agent."""
        loop = self.loops["poll"]
        while not stop.is_set():
            try:
                self.backend.start()
                self.boot = self.backend.boot_id()
                self.poll()
                loop.ok()
                return
            except Exception as err:
                log.warning("could not start checking the GPUs (%s); retrying", err)
                self._count_error("poll", err)
                stop.wait(loop.failed())

    def _event_loop(self, stop: threading.Event) -> None:
        loop = self.loops["events"]
        while not stop.is_set():
            try:
                self._next_event()
                loop.ok()
            except NVMLError as err:
                self._count_error("events", err)
                with self.lock:
                    self._handle(self.monitor.on_event_error(str(err), time.monotonic()))
                stop.wait(loop.failed())
            except Exception as err:  # anything else: the loop goes on, Xids must not go unseen
                log.exception("event loop failed; retrying")
                self._count_error("events", err)
                stop.wait(loop.failed())

    def _next_event(self) -> None:
        event = self.backend.wait_event(EVENT_WAIT_S)
        if event is None:
            return
        with self.lock:
            if event.kind is EventKind.XID and self.metrics is not None:
                uuid = self.monitor.uuids.get(event.gpu, "")
                self.metrics.xids.labels(self.node, str(event.gpu), uuid, str(event.value)).inc()
            self._handle(self.monitor.on_event(event))

    def _count_error(self, loop: str, err: Exception) -> None:
        if self.metrics is not None:
            kind = "nvml" if isinstance(err, NVMLError) else "internal"
            self.metrics.agent_errors.labels(self.node, loop, kind).inc()

    def health_problem(self) -> str | None:
        """Why `/healthz` should fail (a loop silent for long), or None."""
        now = time.monotonic()
        problems = [p for p in (h.problem(now) for h in self.loops.values()) if p]
        return "; ".join(problems) or None

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
            self._record_processes()
            self._handle(found, refresh=True)
            if self.publisher is not None:
                self.publisher.flush()  # Events held back while the API server was away
            return found

    def _record_processes(self) -> None:
        if self.describe is None or self.metrics is None:
            return
        found = [
            (process, reading.uuid, self.describe(process.pid))
            for reading in self.readings
            if not reading.lost
            for process in self.backend.processes(reading.index)
        ]
        self.metrics.record_processes(self.node, found)

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
                if (text is not None) != self.dcgm_reachable:
                    self.dcgm_reachable = text is not None
                    log.info(
                        "DCGM exporter at %s %s",
                        self.dcgm_exporter_url,
                        "answers: GPU Usage is exported"
                        if text is not None
                        else "is not reachable: GPU Usage is not exported until it answers",
                    )
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
