"""A scripted NVML for tests and demos: a YAML timeline of readings and events per GPU.

    gpus: 8                      # GPUs on the node
    uuidPrefix: GPU-node-a       # optional; GPU i has UUID <prefix>-<i>
    baseline:                    # optional; every GPU's readings at start (camelCase fields of
      temperatureC: 45           #   gpufleet.health.signals.GPUReading)
    timeline:
      - at: 10s                  # time since the agent started
        gpu: 3
        xid: 79                  # an Xid event
      - at: 12s
        gpu: 1
        event: dbe               # dbe | gpu-unavailable | recovery-action (with value: N)
      - at: 20s
        gpu: 2
        set: {eccDbeVolatile: 1} # readings from then on (until a reset)
      - at: 30s
        eventError: "Unknown Error"   # the event wait fails (not a timeout)
      - at: 60s
        reset: true              # GPU reset / reboot: baseline readings, a new boot id
    processes:                   # optional; compute processes the GPUs hold throughout
      - {pid: 4242, gpu: 0, memoryBytes: 40000000000, smUtilPct: 85}

The format is documented in docs/health.md; examples are in examples/faults/.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import yaml

from gpufleet.health.signals import EventKind, GPUEvent, GPUProcess, GPUReading
from gpufleet.model.durations import parse_duration

from .backend import NVMLError

FIELDS = {
    re.sub(r"_(\w)", lambda m: m.group(1).upper(), f.name): f.name for f in fields(GPUReading)
}
EVENT_KINDS = {k.value: k for k in EventKind if k is not EventKind.XID}


class TimelineError(ValueError):
    """The timeline file is not valid; the message names the file and the entry."""


@dataclass(frozen=True)
class Step:
    at: float
    gpu: int | None = None
    xid: int | None = None
    event: EventKind | None = None
    value: int = 0
    set: dict[str, Any] | None = None
    reset: bool = False
    event_error: str | None = None


def load_processes(path: str | Path, gpus: int) -> list[GPUProcess]:
    """The timeline's `processes`: the compute processes its GPUs hold throughout."""
    file = str(path)
    data = yaml.safe_load(Path(path).read_text()) or {}
    out = []
    for i, raw in enumerate(data.get("processes") or [], start=1):
        where = f"{file}: process {i}"
        if not isinstance(raw, dict) or not isinstance(raw.get("pid"), int):
            raise TimelineError(f"{where}: needs `pid: N` (and gpu, memoryBytes, smUtilPct)")
        unknown = set(raw) - {"pid", "gpu", "memoryBytes", "smUtilPct"}
        if unknown:
            raise TimelineError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}")
        gpu = raw.get("gpu", 0)
        if not isinstance(gpu, int) or not 0 <= gpu < gpus:
            raise TimelineError(f"{where}: `gpu` must be an index from 0 to {gpus - 1}")
        out.append(GPUProcess(raw["pid"], gpu, raw.get("memoryBytes"), raw.get("smUtilPct")))
    return out


def load_timeline(path: str | Path) -> tuple[int, str, dict[str, Any], list[Step]]:
    file = str(path)
    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as err:
        raise TimelineError(f"{file}: cannot read the timeline: {err}") from err
    if not isinstance(data, dict) or not isinstance(data.get("gpus"), int) or data["gpus"] < 1:
        raise TimelineError(f"{file}: needs `gpus: N` (N >= 1) at the top")
    gpus = data["gpus"]
    baseline = _fields(file, "baseline", data.get("baseline") or {})
    steps = []
    for i, raw in enumerate(data.get("timeline") or [], start=1):
        where = f"{file}: timeline entry {i}"
        if not isinstance(raw, dict) or "at" not in raw:
            raise TimelineError(f"{where}: each entry needs `at: <duration>` (e.g. 10s)")
        try:
            at = parse_duration(str(raw["at"])).total_seconds()
        except ValueError as err:
            raise TimelineError(f"{where}: {err}") from err
        gpu = raw.get("gpu")
        needs_gpu = any(k in raw for k in ("xid", "event", "set"))
        if needs_gpu and (not isinstance(gpu, int) or not 0 <= gpu < gpus):
            raise TimelineError(f"{where}: `gpu` must be an index from 0 to {gpus - 1}")
        event = raw.get("event")
        if event is not None and event not in EVENT_KINDS:
            raise TimelineError(
                f"{where}: unknown event {event!r}; use one of {', '.join(EVENT_KINDS)}"
            )
        known = {"at", "gpu", "xid", "event", "value", "set", "reset", "eventError"}
        unknown = set(raw) - known
        if unknown:
            raise TimelineError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}")
        steps.append(
            Step(
                at,
                gpu,
                int(raw["xid"]) if "xid" in raw else None,
                EVENT_KINDS[event] if event else None,
                int(raw.get("value", 0)),
                _fields(where, "set", raw["set"]) if "set" in raw else None,
                bool(raw.get("reset", False)),
                str(raw["eventError"]) if "eventError" in raw else None,
            )
        )
    prefix = str(data.get("uuidPrefix") or "GPU-fake")
    return gpus, prefix, baseline, sorted(steps, key=lambda s: s.at)


def _fields(where: str, what: str, values: Any) -> dict[str, Any]:
    if not isinstance(values, dict):
        raise TimelineError(f"{where}: `{what}` must be a mapping of reading fields")
    unknown = [k for k in values if k not in FIELDS]
    if unknown:
        raise TimelineError(
            f"{where}: unknown reading field(s) {', '.join(unknown)} in `{what}`; known: "
            f"{', '.join(sorted(FIELDS))}"
        )
    return {FIELDS[k]: v for k, v in values.items()}


class FakeBackend:
    def __init__(self, path: str | Path, clock: Callable[[], float] = time.monotonic) -> None:
        self.gpus, self.prefix, self.baseline, self.steps = load_timeline(path)
        self.running = load_processes(path, self.gpus)
        self.clock = clock
        self.started = 0.0
        self.applied = 0
        self.boots = 1
        self.readings: list[GPUReading] = []
        self.events: list[GPUEvent | str] = []
        self.lock = threading.Lock()

    def start(self) -> None:
        self.started = self.clock()
        self._reset_readings()

    def _reset_readings(self) -> None:
        self.readings = [
            GPUReading(index=i, uuid=f"{self.prefix}-{i}", **self.baseline)
            for i in range(self.gpus)
        ]

    def _advance(self) -> None:
        now = self.clock() - self.started
        with self.lock:
            while self.applied < len(self.steps) and self.steps[self.applied].at <= now:
                step = self.steps[self.applied]
                self.applied += 1
                if step.reset:
                    self.boots += 1
                    self._reset_readings()
                    self.events.clear()
                if step.event_error is not None:
                    self.events.append(step.event_error)
                if step.gpu is None:
                    continue
                if step.set:
                    self.readings[step.gpu] = replace(self.readings[step.gpu], **step.set)
                if step.xid is not None:
                    self.events.append(GPUEvent(step.gpu, EventKind.XID, step.xid, now))
                if step.event is not None:
                    self.events.append(GPUEvent(step.gpu, step.event, step.value, now))

    def device_count(self) -> int:
        self._advance()
        return sum(not r.lost for r in self.readings)

    def read(self, index: int) -> GPUReading:
        self._advance()
        return self.readings[index]

    def processes(self, index: int) -> list[GPUProcess]:
        return [p for p in self.running if p.gpu == index]

    def wait_event(self, timeout_s: float) -> GPUEvent | None:
        deadline = self.clock() + timeout_s
        while True:
            self._advance()
            with self.lock:
                if self.events:
                    head = self.events.pop(0)
                    if isinstance(head, str):
                        raise NVMLError(head)
                    return head
            if self.clock() >= deadline:
                return None
            time.sleep(min(0.05, max(deadline - self.clock(), 0)))

    def boot_id(self) -> str:
        self._advance()
        return f"fake-boot-{self.boots}"

    def close(self) -> None:
        pass
