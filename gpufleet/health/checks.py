"""The GPU checks of the node agent: NVML events and polled counters in, findings out.

Fatal findings quarantine the node; warnings become Kubernetes Events. Thresholds and Xid
classes come from `FleetPolicy.spec.health` (defaults from DCGM and NVIDIA's Xid catalog; see
docs/health.md). Event findings (an Xid, a lost GPU) stay until the GPU is reset or the node
boots again; polled findings clear once their signal has been quiet for a whole window, so a
flapping signal does not flap the quarantine.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from gpufleet.health.signals import (
    HW_POWER_BRAKE_SLOWDOWN,
    RECOVERY_DRAIN_P2P,
    RECOVERY_NONE,
    THERMAL_REASONS,
    EventKind,
    Finding,
    GPUEvent,
    GPUReading,
    Severity,
)
from gpufleet.model.api import DEFAULT_FATAL_XIDS, DEFAULT_IGNORED_XIDS, HealthPolicy
from gpufleet.model.durations import parse_duration

RECOVERY_NAMES = {1: "GPU reset", 2: "node reboot", 3: "drain P2P", 4: "drain and reset"}


@dataclass(frozen=True)
class Thresholds:
    fatal_xids: frozenset[int] = frozenset(DEFAULT_FATAL_XIDS)
    ignored_xids: frozenset[int] = frozenset(DEFAULT_IGNORED_XIDS)
    window_s: float = 60.0
    pcie_replays_per_window: int = 16
    nvlink_crc_per_s: float = 100.0
    retired_pages_limit: int = 63

    @classmethod
    def from_policy(cls, policy: HealthPolicy) -> Thresholds:
        return cls(
            frozenset(policy.fatal_xids),
            frozenset(policy.ignored_xids),
            parse_duration(policy.window).total_seconds(),
            policy.pcie_replays_per_window,
            policy.nvlink_crc_errors_per_second,
            policy.retired_pages_limit,
        )


@dataclass
class HealthMonitor:
    thresholds: Thresholds = field(default_factory=Thresholds)
    expected_gpus: int | None = None  # device count at start; fewer later is a lost GPU
    sticky: dict[tuple[int, str], Finding] = field(default_factory=dict)  # from events
    polled: dict[tuple[int, str], tuple[Finding, float]] = field(default_factory=dict)  # last seen
    warned: dict[tuple[int, str], float] = field(default_factory=dict)  # active warning: last seen
    history: dict[int, deque[tuple[float, GPUReading]]] = field(default_factory=dict)
    xid_counts: dict[tuple[int, int], int] = field(default_factory=dict)  # (gpu, xid) -> count
    uuids: dict[int, str] = field(default_factory=dict)

    # --- events --------------------------------------------------------------------------

    def on_event(self, event: GPUEvent) -> list[Finding]:
        """Findings the event raises now (fatal ones also stay until `reset`)."""
        uuid = self.uuids.get(event.gpu, "")
        if event.kind is EventKind.XID:
            xid = event.value
            self.xid_counts[(event.gpu, xid)] = self.xid_counts.get((event.gpu, xid), 0) + 1
            if xid in self.thresholds.ignored_xids:
                return []
            fatal = xid in self.thresholds.fatal_xids
            finding = Finding(
                "xid",
                f"Xid{xid}",
                Severity.FATAL if fatal else Severity.WARNING,
                event.gpu,
                uuid,
                f"GPU {event.gpu} ({uuid}) reported Xid {xid}"
                + (" (fatal in the health policy)" if fatal else ""),
                event.time,
            )
        elif event.kind is EventKind.DOUBLE_BIT_ECC:
            finding = Finding(
                "volatile-dbe",
                "VolatileDBE",
                Severity.FATAL,
                event.gpu,
                uuid,
                f"GPU {event.gpu} ({uuid}) reported an uncorrectable (double-bit) ECC error",
                event.time,
            )
        elif event.kind is EventKind.GPU_UNAVAILABLE:
            finding = self._lost(event.gpu, uuid, "NVML reported the GPU unavailable", event.time)
        else:
            action = event.value
            if action == RECOVERY_NONE:
                return []
            finding = self._recovery(event.gpu, uuid, action, event.time)
        if finding.severity is Severity.FATAL:
            key = (finding.gpu, finding.reason)
            if key in self.sticky:
                return []
            self.sticky[key] = finding
        return [finding]

    def on_event_error(self, message: str, now: float) -> list[Finding]:
        """The event wait failed with something other than a timeout: like NVIDIA's device
        plugin, every GPU is suspect until the node is reset."""
        findings = []
        for gpu in sorted(self.uuids) or [0]:
            finding = Finding(
                "nvml-events",
                "NVMLEventError",
                Severity.FATAL,
                gpu,
                self.uuids.get(gpu, ""),
                f"waiting for NVML events failed: {message}",
                now,
            )
            if (gpu, finding.reason) not in self.sticky:
                self.sticky[(gpu, finding.reason)] = finding
                findings.append(finding)
        return findings

    # --- polling -------------------------------------------------------------------------

    def on_poll(
        self, readings: list[GPUReading], now: float, device_count: int | None = None
    ) -> list[Finding]:
        """Evaluate one poll; returns findings that are new (fatal) or newly active (warning)."""
        seen: list[Finding] = []
        for reading in readings:
            self.uuids[reading.index] = reading.uuid
            past = self.history.setdefault(reading.index, deque())
            past.append((now, reading))
            while past and now - past[0][0] > self.thresholds.window_s:
                past.popleft()
            seen.extend(self._check(reading, past[0][1], now - past[0][0], now))
        if self.expected_gpus is None and device_count is not None:
            self.expected_gpus = device_count
        if device_count is not None and self.expected_gpus and device_count < self.expected_gpus:
            seen.append(
                Finding(
                    "device-count",
                    "DeviceCountMismatch",
                    Severity.FATAL,
                    -1,
                    "",
                    f"NVML sees {device_count} GPUs, {self.expected_gpus} were present at start",
                    now,
                )
            )
        return self._update(seen, now)

    def _check(self, r: GPUReading, old: GPUReading, span: float, now: float) -> list[Finding]:
        out: list[Finding] = []
        t = self.thresholds
        gpu = f"GPU {r.index} ({r.uuid})"

        def add(check: str, reason: str, severity: Severity, message: str) -> None:
            out.append(Finding(check, reason, severity, r.index, r.uuid, f"{gpu} {message}", now))

        if r.lost:
            out.append(self._lost(r.index, r.uuid, "NVML_ERROR_GPU_IS_LOST", now))
            return out
        if r.ecc_dbe_volatile:
            add("volatile-dbe", "VolatileDBE", Severity.FATAL,
                f"has {r.ecc_dbe_volatile} volatile uncorrectable ECC errors")  # fmt: skip
        if r.remap_failure:
            add("row-remap", "RowRemapFailure", Severity.FATAL, "failed to remap a memory row")
        elif r.remap_pending:
            add("row-remap", "RowRemapPending", Severity.FATAL,
                "has a row remap pending: it needs a GPU reset")  # fmt: skip
        if r.retired_pages is not None and r.retired_pages >= t.retired_pages_limit:
            add("retired-pages", "RetiredPagesLimit", Severity.FATAL,
                f"has {r.retired_pages} retired pages (limit {t.retired_pages_limit})")  # fmt: skip
        elif r.retired_pending:
            add("retired-pages", "RetiredPagesPending", Severity.WARNING,
                "has a page retirement pending")  # fmt: skip
        if r.nvlink_down:
            add("nvlink", "NVLinkDown", Severity.FATAL, f"has {r.nvlink_down} NVLink link(s) down")
        for name, new, before in (
            ("replay", r.nvlink_replay, old.nvlink_replay),
            ("recovery", r.nvlink_recovery, old.nvlink_recovery),
        ):
            if new is not None and before is not None and new > before:
                add("nvlink", "NVLinkError", Severity.FATAL,
                    f"had {new - before} NVLink {name} errors in {span:.0f}s")  # fmt: skip
        if r.nvlink_crc is not None and old.nvlink_crc is not None and span > 0:
            rate = (r.nvlink_crc - old.nvlink_crc) / span
            if rate >= t.nvlink_crc_per_s:
                limit = f"limit {t.nvlink_crc_per_s:g}"
                add("nvlink-crc", "NVLinkCRCErrors", Severity.FATAL,
                    f"has {rate:.0f} NVLink CRC errors/s ({limit})")  # fmt: skip
        if r.pcie_replays is not None and old.pcie_replays is not None:
            replays = r.pcie_replays - old.pcie_replays
            if replays > t.pcie_replays_per_window:
                add("pcie", "PCIeReplays", Severity.WARNING,
                    f"had {replays} PCIe replays in {span:.0f}s "
                    f"(limit {t.pcie_replays_per_window} per window)")  # fmt: skip
        thermal = (r.clock_event_reasons or 0) & THERMAL_REASONS
        violated = (
            r.thermal_violation_us is not None
            and old.thermal_violation_us is not None
            and r.thermal_violation_us > old.thermal_violation_us
        )
        if thermal or violated:
            add("thermal", "ThermalThrottling", Severity.WARNING,
                f"is throttled for heat (clock event reasons {hex(r.clock_event_reasons or 0)}"
                f", {r.temperature_c if r.temperature_c is not None else '?'} °C)")  # fmt: skip
        if (r.clock_event_reasons or 0) & HW_POWER_BRAKE_SLOWDOWN:
            add("power", "PowerBrake", Severity.WARNING, "is slowed by the power brake")
        if r.recovery_action not in (None, RECOVERY_NONE):
            out.append(self._recovery(r.index, r.uuid, r.recovery_action or 0, now))
        return out

    def _update(self, seen: list[Finding], now: float) -> list[Finding]:
        new: list[Finding] = []
        for finding in seen:
            key = (finding.gpu, finding.reason)
            if finding.severity is Severity.FATAL:
                if key not in self.polled and key not in self.sticky:
                    new.append(finding)
                earlier = self.polled.get(key)
                first = earlier[0] if earlier else finding
                self.polled[key] = (first, now)
            else:
                if key not in self.warned:
                    new.append(finding)
                self.warned[key] = now
        # quiet for a whole window: cleared (a flapping signal stays raised)
        window = self.thresholds.window_s
        for key in [k for k, (_, seen_at) in self.polled.items() if now - seen_at >= window]:
            del self.polled[key]
        for key in [k for k, seen_at in self.warned.items() if now - seen_at >= window]:
            del self.warned[key]
        return new

    # --- state ---------------------------------------------------------------------------

    def reset(self) -> None:
        """The GPUs were reset or the node booted again: event findings no longer hold."""
        self.sticky.clear()
        self.polled.clear()
        self.warned.clear()
        self.history.clear()
        self.expected_gpus = None

    def fatal(self) -> list[Finding]:
        """Every fatal finding that holds now, stable order."""
        found = {**self.sticky, **{k: f for k, (f, _) in self.polled.items()}}
        return sorted(found.values(), key=lambda f: (f.gpu, f.reason))

    def _lost(self, index: int, uuid: str, why: str, now: float) -> Finding:
        return Finding(
            "gpu-lost",
            "GPULost",
            Severity.FATAL,
            index,
            uuid,
            f"GPU {index} ({uuid}) fell off the bus: {why} (Xid 79 class)",
            now,
        )

    def _recovery(self, index: int, uuid: str, action: int, now: float) -> Finding:
        name = RECOVERY_NAMES.get(action, f"action {action}")
        severity = Severity.WARNING if action == RECOVERY_DRAIN_P2P else Severity.FATAL
        return Finding(
            "recovery-action",
            "RecoveryAction",
            severity,
            index,
            uuid,
            f"GPU {index} ({uuid}): the driver asks for {name}",
            now,
        )
