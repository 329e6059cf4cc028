"""The real NVML backend (nvidia-ml-py). Every signal is optional: a call a GPU or driver does
not support leaves its field None, so the check is skipped and the metric absent."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from gpufleet.health.signals import EventKind, GPUEvent, GPUProcess, GPUReading

from .backend import NVMLError

log = logging.getLogger("gpufleet.agent")

T = TypeVar("T")
NVLINK_LINKS = 18  # NVML_NVLINK_MAX_LINKS is larger; H100 has 18, B200 18
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


class NVMLBackend:
    def __init__(self) -> None:
        try:
            import pynvml  # type: ignore[import-untyped]
        except ImportError as err:  # pragma: no cover - the dependency is installed
            raise NVMLError(f"nvidia-ml-py is not installed: {err}") from err
        self.nvml: Any = pynvml
        self.handles: list[Any] = []
        self.event_set: Any = None

    def start(self) -> None:
        nvml = self.nvml
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as err:
            raise NVMLError(f"NVML is not available on this machine: {err}") from err
        self.handles = [
            nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())
        ]
        self.event_set = nvml.nvmlEventSetCreate()
        wanted = (
            nvml.nvmlEventTypeXidCriticalError
            | nvml.nvmlEventTypeDoubleBitEccError
            | getattr(nvml, "nvmlEventTypeGpuUnavailableError", 0)
            | getattr(nvml, "nvmlEventTypeGpuRecoveryAction", 0)
        )
        for handle in self.handles:
            try:
                supported = int(nvml.nvmlDeviceGetSupportedEventTypes(handle))
                nvml.nvmlDeviceRegisterEvents(handle, supported & wanted, self.event_set)
            except nvml.NVMLError as err:  # no events from this GPU: the poll still checks it
                log.warning("NVML events unavailable for a GPU: %s", err)

    def _try(self, call: Callable[[], T]) -> T | None:
        try:
            return call()
        except self.nvml.NVMLError_NotSupported:
            return None
        except self.nvml.NVMLError_NoPermission:
            return None

    def device_count(self) -> int:
        try:
            return int(self.nvml.nvmlDeviceGetCount())
        except self.nvml.NVMLError as err:
            raise NVMLError(str(err)) from err

    def processes(self, index: int) -> list[GPUProcess]:
        nvml, handle = self.nvml, self.handles[index]
        # what each process holds is a view, never a health signal: any NVML error is "none"
        try:
            running = nvml.nvmlDeviceGetComputeRunningProcesses(handle) or []
        except nvml.NVMLError:
            return []
        try:  # SM use over the last samples (NotFound while none were taken)
            samples = nvml.nvmlDeviceGetProcessUtilization(handle, 0) or []
        except nvml.NVMLError:
            samples = []
        busy = {s.pid: float(s.smUtil) for s in samples}
        return [
            GPUProcess(
                pid=int(p.pid),
                gpu=index,
                memory_bytes=int(p.usedGpuMemory) if p.usedGpuMemory is not None else None,
                sm_util_pct=busy.get(p.pid),
            )
            for p in running
        ]

    def read(self, index: int) -> GPUReading:
        nvml, handle = self.nvml, self.handles[index]
        try:
            uuid = nvml.nvmlDeviceGetUUID(handle)
            if isinstance(uuid, bytes):
                uuid = uuid.decode()
            memory = self._try(lambda: nvml.nvmlDeviceGetMemoryInfo(handle))
            util = self._try(lambda: nvml.nvmlDeviceGetUtilizationRates(handle))
            power = self._try(lambda: nvml.nvmlDeviceGetPowerUsage(handle))
            remap = self._try(lambda: nvml.nvmlDeviceGetRemappedRows(handle))
            retired = [
                self._retired(handle, cause)
                for cause in (
                    nvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS,
                    nvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR,
                )
            ]
            return GPUReading(
                index=index,
                uuid=str(uuid),
                temperature_c=self._try(
                    lambda: nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)
                ),
                power_w=power / 1000 if power is not None else None,
                utilization_pct=util.gpu if util is not None else None,
                memory_used_bytes=memory.used if memory is not None else None,
                memory_total_bytes=memory.total if memory is not None else None,
                ecc_dbe_volatile=self._ecc(handle, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED),
                ecc_sbe_volatile=self._ecc(handle, nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED),
                retired_pages=sum(r for r in retired if r is not None)
                if any(r is not None for r in retired)
                else None,
                retired_pending=_flag(
                    self._try(lambda: nvml.nvmlDeviceGetRetiredPagesPendingStatus(handle))
                ),
                remap_pending=bool(remap[2]) if remap is not None else None,
                remap_failure=bool(remap[3]) if remap is not None else None,
                nvlink_replay=self._nvlink(handle, nvml.NVML_NVLINK_ERROR_DL_REPLAY),
                nvlink_recovery=self._nvlink(handle, nvml.NVML_NVLINK_ERROR_DL_RECOVERY),
                nvlink_crc=self._nvlink(handle, nvml.NVML_NVLINK_ERROR_DL_CRC_FLIT),
                pcie_replays=self._try(lambda: nvml.nvmlDeviceGetPcieReplayCounter(handle)),
                clock_event_reasons=self._try(
                    lambda: nvml.nvmlDeviceGetCurrentClocksEventReasons(handle)
                ),
                recovery_action=self._field(handle, 230),  # NVML_FI_DEV_GET_GPU_RECOVERY_ACTION
            )
        except nvml.NVMLError_GpuIsLost:
            return GPUReading(index=index, uuid="", lost=True)
        except nvml.NVMLError as err:
            raise NVMLError(f"GPU {index}: {err}") from err

    def _retired(self, handle: Any, cause: int) -> int | None:
        pages = self._try(lambda: self.nvml.nvmlDeviceGetRetiredPages(handle, cause))
        return None if pages is None else len(pages)

    def _ecc(self, handle: Any, error_type: int) -> int | None:
        nvml = self.nvml
        return self._try(
            lambda: nvml.nvmlDeviceGetTotalEccErrors(handle, error_type, nvml.NVML_VOLATILE_ECC)
        )

    def _nvlink(self, handle: Any, counter: int) -> int | None:
        nvml, total, any_link = self.nvml, 0, False
        for link in range(NVLINK_LINKS):
            try:
                total += nvml.nvmlDeviceGetNvLinkErrorCounter(handle, link, counter)
                any_link = True
            except nvml.NVMLError:
                continue  # link absent or not supported
        return total if any_link else None

    def _field(self, handle: Any, field_id: int) -> int | None:
        values = self._try(lambda: self.nvml.nvmlDeviceGetFieldValues(handle, [field_id]))
        if not values or values[0].nvmlReturn != 0:
            return None
        return int(values[0].value.uiVal)

    def wait_event(self, timeout_s: float) -> GPUEvent | None:
        nvml = self.nvml
        try:
            data = nvml.nvmlEventSetWait(self.event_set, int(timeout_s * 1000))
        except nvml.NVMLError_Timeout:
            return None
        except nvml.NVMLError_GpuIsLost:
            return GPUEvent(0, EventKind.GPU_UNAVAILABLE)
        except nvml.NVMLError as err:
            raise NVMLError(str(err)) from err
        index = next((i for i, h in enumerate(self.handles) if _same(h, data.device)), 0)
        kind = {
            nvml.nvmlEventTypeXidCriticalError: EventKind.XID,
            nvml.nvmlEventTypeDoubleBitEccError: EventKind.DOUBLE_BIT_ECC,
            getattr(nvml, "nvmlEventTypeGpuUnavailableError", -1): EventKind.GPU_UNAVAILABLE,
            getattr(nvml, "nvmlEventTypeGpuRecoveryAction", -2): EventKind.RECOVERY_ACTION,
        }.get(data.eventType)
        if kind is None:
            return None
        return GPUEvent(index, kind, int(data.eventData))

    def boot_id(self) -> str:
        try:
            return BOOT_ID.read_text().strip()
        except OSError:
            return "unknown"

    def close(self) -> None:
        if self.event_set is not None:
            self._try(lambda: self.nvml.nvmlEventSetFree(self.event_set))
        self._try(self.nvml.nvmlShutdown)


def _flag(value: Any) -> bool | None:
    return None if value is None else bool(value)


def _same(a: Any, b: Any) -> bool:
    try:
        return bool(a.value == b.value) if hasattr(a, "value") else a == b
    except Exception:  # handle types differ between nvidia-ml-py versions
        return False
