"""The NVML interface the agent needs; `nvml.py` implements it with nvidia-ml-py, `fake.py`
with a scripted timeline."""

from __future__ import annotations

from typing import Protocol

from gpufleet.health.signals import GPUEvent, GPUProcess, GPUReading


class NVMLError(Exception):
    """An NVML call failed for a reason other than a lost GPU or a timeout."""


class Backend(Protocol):
    def start(self) -> None: ...

    def device_count(self) -> int: ...

    def read(self, index: int) -> GPUReading:
        """One poll of one GPU; a lost GPU is a reading with `lost=True`, not an error."""
        ...

    def processes(self, index: int) -> list[GPUProcess]:
        """The compute processes on one GPU now; [] where NVML cannot say."""
        ...

    def wait_event(self, timeout_s: float) -> GPUEvent | None:
        """The next NVML event, or None after `timeout_s`; raises NVMLError on failure."""
        ...

    def boot_id(self) -> str:
        """Changes when the node boots again or the GPUs are reset: old findings no longer hold."""
        ...

    def close(self) -> None: ...
