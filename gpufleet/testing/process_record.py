"""What identifies a process beyond its pid, so that a state folder read back later (after a
reboot, or a crash that left it stale) never makes us signal a process we did not start.

A pid is reused by the kernel; (boot id, start time in clock ticks after boot, executable) is
not: a process with the same pid and start time in the same boot is the same process. Linux
only (/proc); elsewhere no record can be made, so nothing is ever signalled from a state file.
"""

from __future__ import annotations

import contextlib
import os
import signal
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


@dataclass(frozen=True)
class ProcessRecord:
    pid: int
    started: int  # clock ticks after boot (/proc/PID/stat, field 22)
    exe: str
    boot: str

    @classmethod
    def of(cls, pid: int) -> ProcessRecord | None:
        """The record of the live process `pid`, or None when there is none (or it is a zombie,
        or /proc cannot tell)."""
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            exe = os.readlink(f"/proc/{pid}/exe")
            boot = BOOT_ID.read_text().strip()
        except OSError:
            return None
        # the command name (field 2) is in parentheses and may hold spaces: split after it
        fields = stat.rsplit(")", 1)[1].split()
        if fields[0] == "Z":
            return None
        return cls(pid, int(fields[19]), exe, boot)

    @classmethod
    def load(cls, data: Any) -> ProcessRecord | None:
        """A record read back from a state file; None when it is not one (an older format)."""
        try:
            return cls(int(data["pid"]), int(data["started"]), str(data["exe"]), str(data["boot"]))
        except (TypeError, KeyError, ValueError):
            return None

    def dump(self) -> dict[str, Any]:
        return asdict(self)

    def alive(self) -> bool:
        """The process this record was made of still runs (same pid, boot, start, executable)."""
        return ProcessRecord.of(self.pid) == self

    def why_stale(self) -> str:
        now = ProcessRecord.of(self.pid)
        if now is None:
            return f"pid {self.pid} no longer runs"
        if now.boot != self.boot:
            return f"pid {self.pid} was recorded before the machine restarted"
        return f"pid {self.pid} is now another process ({now.exe})"

    def signal_group(self, sig: signal.Signals) -> bool:
        """Send `sig` to the process group this process leads, only while the record still
        matches; False (and nothing sent) when it does not."""
        if not self.alive():
            return False
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if os.getpgid(self.pid) != self.pid:
                return False  # it no longer leads its own group: signal nothing else
            os.killpg(self.pid, sig)
        return True
