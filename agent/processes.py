"""Who holds each GPU: the user, command, framework and workload of a process NVML names, read
with psutil (its command line and environment; a process of another user whose environment
may not be read is named from its command line alone). Cached by PID and start time, so a PID
used again is read again."""

from __future__ import annotations

import os
from dataclasses import dataclass

import psutil

from gpufleet.hosts.processes import recognise

CACHE_MAX = 4096


@dataclass(frozen=True)
class ProcessInfo:
    user: str
    command: str
    framework: str
    workload: str


GONE = ProcessInfo("", "", "unknown", "unknown")


class ProcessNames:
    def __init__(self) -> None:
        self.cache: dict[tuple[int, float], ProcessInfo] = {}

    def __call__(self, pid: int) -> ProcessInfo:
        try:
            process = psutil.Process(pid)
            key = (pid, process.create_time())
            if key in self.cache:
                return self.cache[key]
            with process.oneshot():
                cmdline = process.cmdline()
                user = process.username()
                name = process.name()
            try:
                environ = process.environ()
            except psutil.AccessDenied:  # another user's: its command line still says much
                environ = {}
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            return GONE  # ended between NVML's answer and this one
        except psutil.AccessDenied:
            return ProcessInfo("", "", "unknown", "unknown")
        found = recognise(cmdline, environ)
        command = os.path.basename(cmdline[0]) if cmdline else name
        if len(self.cache) >= CACHE_MAX:
            self.cache.clear()
        self.cache[key] = ProcessInfo(user, command, found.framework, found.workload)
        return self.cache[key]
