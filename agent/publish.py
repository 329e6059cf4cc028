"""What the agent writes: the node's `GPUHealthy` condition, Kubernetes Events for warnings,
and Prometheus metrics per GPU (including the composite GPU Usage of DESIGN §6)."""

from __future__ import annotations

import functools
import logging
import re
import time
import urllib.request
from collections import deque
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from kubernetes import client
from kubernetes.client import CoreV1Event
from kubernetes.client.exceptions import ApiException
from prometheus_client import CollectorRegistry, Counter, Gauge

from gpufleet.health.signals import Finding, GPUReading
from gpufleet.model.keys import GPU_HEALTHY_CONDITION

log = logging.getLogger("gpufleet.agent")
LABELS = ("node", "gpu", "uuid")


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


class NodePublisher:
    """Writes to the API server as the agent's service account would (node status, Events).

    Never raises: while the API server cannot be reached, the condition is written again at the
    next poll and Events wait in a bounded queue, so a fault found during an outage is reported
    once it ends. The condition is also rewritten every `heartbeat_s` with a fresh
    lastHeartbeatTime, so a silent agent can be told from a healthy one."""

    PENDING_EVENTS = 100  # the oldest are dropped beyond this (the condition still says it)

    def __init__(
        self,
        core: client.CoreV1Api,
        node: str,
        namespace: str = "default",
        heartbeat_s: float = 60.0,
        on_error: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.core, self.node, self.namespace = core, node, namespace
        self.heartbeat_s, self.clock = heartbeat_s, clock
        self.on_error = on_error or (lambda what: None)
        self.last: tuple[str, str, str] | None = None
        self.written_at = 0.0  # monotonic time of the last condition write
        self.transition = ""  # lastTransitionTime we wrote
        self.pending: deque[CoreV1Event] = deque(maxlen=self.PENDING_EVENTS)

    def condition(self, fatal: list[Finding]) -> bool:
        """Set GPUHealthy when it changed or the heartbeat is due; True when the status,
        reason or message changed. The message names every failing GPU."""
        if fatal:
            status, reason = "False", fatal[0].reason
            message = "; ".join(f.message for f in fatal)[:1024]
        else:
            status, reason, message = "True", "AllChecksPassed", "every GPU check passes"
        changed = self.last != (status, reason, message)
        if not changed and self.clock() - self.written_at < self.heartbeat_s:
            return False
        now = datetime.now(UTC).isoformat()
        transition = self.transition
        if self.last is None or self.last[0] != status:
            transition = now  # only a change of status is a transition
        body: dict[str, Any] = {
            "status": {
                "conditions": [
                    {
                        "type": GPU_HEALTHY_CONDITION,
                        "status": status,
                        "reason": reason,
                        "message": message,
                        "lastHeartbeatTime": now,
                        "lastTransitionTime": transition,
                    }
                ]
            }
        }
        if not self._write("condition", lambda: self.core.patch_node_status(self.node, body)):
            return False  # written at the next poll
        self.last, self.transition = (status, reason, message), transition
        self.written_at = self.clock()
        return changed

    def event(self, reason: str, message: str, kind: str = "Warning") -> None:
        now = datetime.now(UTC)
        self.pending.append(
            client.CoreV1Event(
                metadata=client.V1ObjectMeta(
                    generate_name=f"{self.node}.", namespace=self.namespace
                ),
                involved_object=client.V1ObjectReference(
                    kind="Node", name=self.node, api_version="v1"
                ),
                reason=reason,
                message=message[:1024],
                type=kind,
                source=client.V1EventSource(component="gpufleet-agent", host=self.node),
                first_timestamp=now,
                last_timestamp=now,
                count=1,
            )
        )
        self.flush()

    def flush(self) -> None:
        """Send the Events that wait, oldest first; stop at the first that fails."""
        while self.pending:
            event = self.pending[0]
            send = functools.partial(self.core.create_namespaced_event, self.namespace, event)
            # a refused Event would be refused forever: dropped, not retried
            if not self._write(f"event {event.reason}", send, drop_refused=True):
                return
            self.pending.popleft()

    def _write(self, what: str, call: Callable[[], object], drop_refused: bool = False) -> bool:
        """True when written (or refused and `drop_refused`); False: try again later."""
        try:
            call()
        except ApiException as err:
            if err.status and 400 <= err.status < 500 and err.status not in (408, 429):
                log.warning("the API server refused the %s: %s", what, err.reason)
                self.on_error("api")
                return drop_refused
            log.warning("could not write the %s (%s); retrying later", what, err.reason)
            self.on_error("api")
            return False
        except Exception as err:  # the API server is unreachable: connection refused, timeout
            log.warning("could not write the %s (%s); retrying later", what, err)
            self.on_error("api")
            return False
        return True
