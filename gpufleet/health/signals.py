"""What the agent reads from a GPU, what NVML reports as events, and what the checks find."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

# clock event reasons (nvmlClocksEventReason*): thermal and power-brake slowdowns
HW_SLOWDOWN = 0x8
SW_THERMAL_SLOWDOWN = 0x20
HW_THERMAL_SLOWDOWN = 0x40
HW_POWER_BRAKE_SLOWDOWN = 0x80
THERMAL_REASONS = SW_THERMAL_SLOWDOWN | HW_THERMAL_SLOWDOWN | HW_SLOWDOWN
# NVML_FI_DEV_GET_GPU_RECOVERY_ACTION values
RECOVERY_NONE, RECOVERY_GPU_RESET, RECOVERY_NODE_REBOOT = 0, 1, 2
RECOVERY_DRAIN_P2P, RECOVERY_DRAIN_AND_RESET = 3, 4


@dataclass(frozen=True)
class GPUProcess:
    """A process that holds a GPU, as NVML sees it."""

    pid: int
    gpu: int
    memory_bytes: int | None = None
    sm_util_pct: float | None = None  # over the last sampling period; None: not reported


@dataclass(frozen=True)
class GPUReading:
    """One poll of one GPU. Counters are cumulative as NVML reports them; None: not supported
    (the check is skipped, the metric is absent)."""

    index: int
    uuid: str
    lost: bool = False  # NVML_ERROR_GPU_IS_LOST on any call
    temperature_c: float | None = None
    power_w: float | None = None
    utilization_pct: float | None = None
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    ecc_dbe_volatile: int | None = None
    ecc_sbe_volatile: int | None = None
    retired_pages: int | None = None  # SBE + DBE
    retired_pending: bool | None = None
    remap_pending: bool | None = None
    remap_failure: bool | None = None
    nvlink_replay: int | None = None  # summed over links
    nvlink_recovery: int | None = None
    nvlink_crc: int | None = None
    nvlink_down: int | None = None  # links down that should be up
    pcie_replays: int | None = None
    clock_event_reasons: int | None = None
    thermal_violation_us: int | None = None  # cumulative time throttled for thermal reasons
    recovery_action: int | None = None


class EventKind(StrEnum):
    XID = "xid"
    DOUBLE_BIT_ECC = "dbe"
    GPU_UNAVAILABLE = "gpu-unavailable"
    RECOVERY_ACTION = "recovery-action"


@dataclass(frozen=True)
class GPUEvent:
    gpu: int  # index
    kind: EventKind
    value: int = 0  # the Xid, the recovery action, ...
    time: float = 0.0  # seconds (monotonic clock of the agent)


class Severity(StrEnum):
    FATAL = "fatal"  # the node is quarantined
    WARNING = "warning"  # a Kubernetes Event, nothing more


@dataclass(frozen=True)
class Finding:
    check: str  # stable id, e.g. "xid", "volatile-dbe"
    reason: str  # CamelCase, used as condition/Event reason: Xid79, VolatileDBE, ...
    severity: Severity
    gpu: int
    uuid: str
    message: str
    since: float = field(default=0.0, compare=False)
