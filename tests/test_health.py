"""The GPU checks (with the scripted NVML), the agent loop, and the quarantine decisions."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import urllib3
from conftest import REPO
from prometheus_client import CollectorRegistry

from gpufleet.agent import runner
from gpufleet.agent.fake import FakeBackend, TimelineError
from gpufleet.agent.metrics import Metrics, gpu_usage
from gpufleet.agent.publish import NodePublisher
from gpufleet.agent.runner import Agent, check_once
from gpufleet.health.checks import HealthMonitor, Thresholds
from gpufleet.health.quarantine import ActionKind, NodeHealth, agent_silent, decide, fault_score
from gpufleet.health.signals import EventKind, Finding, GPUEvent, GPUReading, Severity
from gpufleet.kube.observe import node_of
from gpufleet.model.api import HealthPolicy
from gpufleet.model.keys import (
    QUARANTINE_ESCALATED_ANNOTATION,
    QUARANTINE_HISTORY_ANNOTATION,
    RELEASE_ANNOTATION,
)

FAULTS = REPO / "examples" / "faults"
OK = GPUReading(0, "GPU-a", temperature_c=40, ecc_dbe_volatile=0, pcie_replays=0,
                nvlink_replay=0, nvlink_recovery=0, nvlink_crc=0, clock_event_reasons=0,
                retired_pages=0, recovery_action=0)  # fmt: skip


def poll(monitor: HealthMonitor, reading: GPUReading, t: float) -> list[tuple[str, str]]:
    return [(f.reason, f.severity.value) for f in monitor.on_poll([reading], t, 1)]


# --- events ----------------------------------------------------------------------------------


def test_xid_classes() -> None:
    m = HealthMonitor()
    m.on_poll([OK], 0, 1)
    assert [(f.reason, f.severity) for f in m.on_event(GPUEvent(0, EventKind.XID, 79))] == [
        ("Xid79", Severity.FATAL)
    ]
    assert m.on_event(GPUEvent(0, EventKind.XID, 79)) == []  # already known: no new finding
    assert m.on_event(GPUEvent(0, EventKind.XID, 13)) == []  # application Xid: ignored
    assert m.xid_counts[(0, 13)] == 1  # but counted
    (warning,) = m.on_event(GPUEvent(0, EventKind.XID, 92))  # in neither list: a warning
    assert warning.severity is Severity.WARNING
    assert "GPU-a" in m.fatal()[0].message
    custom = HealthMonitor(Thresholds(fatal_xids=frozenset({13}), ignored_xids=frozenset()))
    assert custom.on_event(GPUEvent(0, EventKind.XID, 13))[0].severity is Severity.FATAL


def test_event_kinds_and_event_errors() -> None:
    m = HealthMonitor()
    m.on_poll([OK, replace(OK, index=1, uuid="GPU-b")], 0, 2)
    assert m.on_event(GPUEvent(1, EventKind.DOUBLE_BIT_ECC))[0].reason == "VolatileDBE"
    assert m.on_event(GPUEvent(0, EventKind.GPU_UNAVAILABLE))[0].reason == "GPULost"
    assert m.on_event(GPUEvent(0, EventKind.RECOVERY_ACTION, 0)) == []
    drain = m.on_event(GPUEvent(0, EventKind.RECOVERY_ACTION, 3))[0]
    assert (drain.reason, drain.severity) == ("RecoveryAction", Severity.WARNING)
    # a failing event wait (not a timeout): every GPU is suspect
    assert {f.gpu for f in m.on_event_error("Unknown Error", 5)} == {0, 1}
    m.reset()  # new boot / GPU reset
    assert m.fatal() == []


# --- polled checks ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "reason", "severity"),
    [
        ({"lost": True}, "GPULost", "fatal"),
        ({"ecc_dbe_volatile": 2}, "VolatileDBE", "fatal"),
        ({"remap_failure": True}, "RowRemapFailure", "fatal"),
        ({"remap_pending": True}, "RowRemapPending", "fatal"),
        ({"retired_pages": 63}, "RetiredPagesLimit", "fatal"),
        ({"retired_pages": 62, "retired_pending": True}, "RetiredPagesPending", "warning"),
        ({"nvlink_down": 1}, "NVLinkDown", "fatal"),
        ({"nvlink_replay": 1}, "NVLinkError", "fatal"),
        ({"nvlink_recovery": 3}, "NVLinkError", "fatal"),
        ({"clock_event_reasons": 0x40, "temperature_c": 92}, "ThermalThrottling", "warning"),
        ({"clock_event_reasons": 0x80}, "PowerBrake", "warning"),
        ({"recovery_action": 2}, "RecoveryAction", "fatal"),
    ],
)
def test_each_polled_check(change: dict[str, object], reason: str, severity: str) -> None:
    m = HealthMonitor()
    assert poll(m, OK, 0) == []
    assert poll(m, replace(OK, **change), 5) == [(reason, severity)]  # type: ignore[arg-type]


def test_retired_pages_threshold_is_configurable() -> None:
    m = HealthMonitor(Thresholds(retired_pages_limit=10))
    assert poll(m, replace(OK, retired_pages=10), 0) == [("RetiredPagesLimit", "fatal")]
    assert poll(HealthMonitor(), replace(OK, retired_pages=10), 0) == []


def test_rates_are_measured_over_the_window() -> None:
    # PCIe: more than 16 replays within the 60 s window is a warning; spread out, it is not
    m = HealthMonitor()
    for t, replays in ((0, 0), (20, 8), (40, 16), (60, 16)):
        assert poll(m, replace(OK, pcie_replays=replays), t) == []
    assert poll(m, replace(OK, pcie_replays=40), 70) == [("PCIeReplays", "warning")]
    slow = HealthMonitor()
    for t in range(0, 400, 30):  # 8 replays per 30 s: never more than 16 in a window
        assert poll(slow, replace(OK, pcie_replays=8 * t // 30), t) == []
    # NVLink CRC: a rate, errors per second over the window
    crc = HealthMonitor(Thresholds(nvlink_crc_per_s=100))
    assert poll(crc, replace(OK, nvlink_crc=0), 0) == []
    assert poll(crc, replace(OK, nvlink_crc=500), 10) == []  # 50/s
    assert poll(crc, replace(OK, nvlink_crc=3000), 20) == [("NVLinkCRCErrors", "fatal")]  # 150/s


def test_a_flapping_signal_keeps_the_finding_until_quiet_for_a_window() -> None:
    m = HealthMonitor(Thresholds(window_s=60))
    bad, good = replace(OK, remap_pending=True), OK
    assert poll(m, bad, 0) == [("RowRemapPending", "fatal")]
    for t in range(10, 60, 10):  # flaps every 10 s: still one finding, never cleared
        poll(m, bad if t % 20 == 0 else good, t)
        assert [f.reason for f in m.fatal()] == ["RowRemapPending"]
    for t in range(60, 120, 10):
        poll(m, good, t)
    assert m.fatal() == []  # quiet since t=40 for a whole window


def test_device_count_drop_is_fatal() -> None:
    m = HealthMonitor()
    m.on_poll([OK, replace(OK, index=1, uuid="GPU-b")], 0, 2)
    found = m.on_poll([OK], 5, 1)
    assert [f.reason for f in found] == ["DeviceCountMismatch"]


# --- the scripted NVML and the agent -------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class Recorder:
    """Collects what the agent would write to the API server."""

    def __init__(self) -> None:
        self.conditions: list[tuple[bool, str]] = []
        self.events: list[str] = []

    def condition(self, fatal: list[Finding]) -> bool:
        state = (not fatal, getattr(fatal[0], "reason", "") if fatal else "AllChecksPassed")
        if self.conditions and self.conditions[-1] == state:
            return False
        self.conditions.append(state)
        return True

    def event(self, reason: str, message: str, kind: str = "Warning") -> None:
        self.events.append(reason)

    def flush(self) -> None:
        pass


def agent_for(name: str, clock: Clock) -> tuple[Agent, Recorder]:
    backend = FakeBackend(FAULTS / name, clock=clock)
    recorder = Recorder()
    agent = Agent("node-a", backend, HealthMonitor(), recorder)
    backend.start()
    agent.boot = backend.boot_id()
    return agent, recorder


def drain_events(agent: Agent) -> None:
    while (event := agent.backend.wait_event(0)) is not None:
        agent._handle(agent.monitor.on_event(event))


@pytest.mark.parametrize(
    ("timeline", "reason", "fatal"),
    [("xid79.yaml", "Xid79", True), ("dbe.yaml", "VolatileDBE", True),
     ("thermal.yaml", "ThermalThrottling", False)],
)  # fmt: skip
def test_example_faults(timeline: str, reason: str, fatal: bool) -> None:
    clock = Clock()
    agent, seen = agent_for(timeline, clock)
    agent.poll()
    assert seen.conditions == [(True, "AllChecksPassed")]
    clock.t += 9
    agent.poll()
    drain_events(agent)
    assert seen.events == []
    clock.t += 2  # 11 s in
    drain_events(agent)
    agent.poll()
    assert reason in seen.events
    assert seen.conditions[-1] == ((False, reason) if fatal else (True, "AllChecksPassed"))


def test_recovery_after_a_new_boot() -> None:
    clock = Clock()
    agent, seen = agent_for("recovery.yaml", clock)
    agent.poll()
    clock.t += 6
    drain_events(agent)
    assert seen.conditions[-1] == (False, "Xid79")
    clock.t += 20
    agent.poll()
    assert seen.conditions[-1] == (False, "Xid79")  # an Xid holds until reset or reboot
    clock.t += 20  # 46 s: the node was rebooted at 40 s
    agent.poll()
    assert seen.conditions[-1] == (True, "AllChecksPassed")


def test_event_errors_and_lost_gpus_from_the_timeline(tmp_path: Path) -> None:
    path = tmp_path / "t.yaml"
    path.write_text(
        "gpus: 2\ntimeline:\n"
        "  - {at: 1s, eventError: Unknown Error}\n"
        "  - {at: 2s, gpu: 1, set: {lost: true}}\n"
    )
    clock = Clock()
    agent, _ = agent_for(str(path), clock)
    agent.poll()
    clock.t += 1.5
    with pytest.raises(Exception, match="Unknown Error"):
        agent.backend.wait_event(0)
    clock.t += 1
    found = agent.poll()
    assert {f.reason for f in found} == {"GPULost", "DeviceCountMismatch"}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("timeline: []\n", "needs `gpus: N`"),
        ("gpus: 2\ntimeline:\n  - {at: 1s, gpu: 5, xid: 79}\n", "must be an index from 0 to 1"),
        ("gpus: 2\ntimeline:\n  - {at: soon, gpu: 0, xid: 79}\n", "timeline entry 1"),
        ("gpus: 2\ntimeline:\n  - {at: 1s, gpu: 0, set: {temp: 3}}\n", "reading field(s) temp"),
        ("gpus: 2\ntimeline:\n  - {at: 1s, gpu: 0, event: boom}\n", "unknown event 'boom'"),
    ],
)  # fmt: skip
def test_bad_timelines_are_reported_with_the_file(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(TimelineError) as err:
        FakeBackend(path)
    assert str(path) in str(err.value) and message in str(err.value)


def test_check_once() -> None:
    readings, findings = check_once(FakeBackend(FAULTS / "thermal.yaml"), HealthMonitor())
    assert len(readings) == 8 and findings == []


def test_gpu_usage_from_dcgm_exporter() -> None:
    text = "\n".join(
        [
            'DCGM_FI_PROF_SM_ACTIVE{gpu="0",UUID="GPU-a"} 0.4',
            'DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{gpu="0",UUID="GPU-a"} 0.7',
            'DCGM_FI_PROF_DRAM_ACTIVE{gpu="0",UUID="GPU-a"} 0.2',
            'DCGM_FI_DEV_POWER_USAGE{gpu="0",UUID="GPU-a"} 300',
            'DCGM_FI_DEV_POWER_MGMT_LIMIT{gpu="0",UUID="GPU-a"} 700',
            'DCGM_FI_PROF_SM_ACTIVE{gpu="1",UUID="GPU-b"} 0.9',
            'DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{gpu="1",UUID="GPU-b"} 0.9',
            'DCGM_FI_PROF_DRAM_ACTIVE{gpu="1",UUID="GPU-b"} 0.9',
            'DCGM_FI_DEV_POWER_USAGE{gpu="1",UUID="GPU-b"} 50',
            'DCGM_FI_DEV_POWER_MGMT_LIMIT{gpu="1",UUID="GPU-b"} 700',
            'DCGM_FI_PROF_SM_ACTIVE{gpu="2",UUID="GPU-c"} 0.9',
        ]
    )
    # max of the three; below 10 % of the power limit it counts as 0; missing fields: absent
    assert gpu_usage(text) == {"GPU-a": 0.7, "GPU-b": 0.0}


# --- quarantine decisions ----------------------------------------------------------------


NOW = datetime(2026, 6, 1, 12, tzinfo=UTC)


def node(
    name: str, pool: str = "p", healthy: bool | None = True, ago: float = 600, **kw: object
) -> NodeHealth:
    return NodeHealth(name, pool, healthy, "Xid79" if healthy is False else "", "",
                      NOW - timedelta(seconds=ago), **kw)  # type: ignore[arg-type]  # fmt: skip


def kinds(plan: object) -> list[tuple[str, ActionKind]]:
    return [(a.node, a.kind) for a in plan.actions]  # type: ignore[attr-defined]


def test_at_most_max_quarantined_percent_of_a_pool() -> None:
    nodes = [node(f"n{i}", healthy=i >= 3, ago=100 - i) for i in range(5)]  # 60 % faulty
    nodes += [node(f"other{i}", pool="q") for i in range(5)]
    plan = decide(nodes, HealthPolicy(), NOW, breaker_open=False)
    assert kinds(plan) == [
        ("n0", ActionKind.QUARANTINE),  # the oldest finding first
        ("n1", ActionKind.BLOCKED_LIMIT),
        ("n2", ActionKind.BLOCKED_LIMIT),
    ]
    assert plan.blocked == {"p": 2} and not plan.trip_breaker


def test_a_small_pool_can_still_isolate_one_node() -> None:
    plan = decide([node("a", healthy=False), node("b")], HealthPolicy(), NOW, False)
    assert kinds(plan) == [("a", ActionKind.QUARANTINE)]


def test_circuit_breaker_trips_and_stays_open() -> None:
    nodes = [node(f"n{i}", healthy=i >= 5, ago=30) for i in range(8)]  # 5 of 8 in 5 minutes
    plan = decide(nodes, HealthPolicy(), NOW, breaker_open=False)
    assert plan.trip_breaker
    assert {k for _, k in kinds(plan)} == {ActionKind.BLOCKED_BREAKER}
    old = [node(f"n{i}", healthy=i >= 1, ago=3600) for i in range(8)]  # one old finding
    assert kinds(decide(old, HealthPolicy(), NOW, breaker_open=True)) == [
        ("n0", ActionKind.BLOCKED_BREAKER)
    ]


def test_release_after_probation_and_escalation() -> None:
    policy = HealthPolicy(probation="10m", escalateAfter=2)
    waiting = node("a", healthy=True, ago=300, quarantined=True)
    assert kinds(decide([waiting, node("b")], policy, NOW, False)) == []
    done = node("a", healthy=True, ago=601, quarantined=True)
    assert kinds(decide([done, node("b")], policy, NOW, False)) == [("a", ActionKind.RELEASE)]
    earlier = (NOW - timedelta(hours=2)).isoformat()
    again = node("a", healthy=False, annotations={QUARANTINE_HISTORY_ANNOTATION: earlier})
    plan = decide([again, node("b")], policy, NOW, False)
    assert kinds(plan) == [("a", ActionKind.QUARANTINE), ("a", ActionKind.ESCALATE)]
    escalated = node("a", healthy=True, ago=9999, quarantined=True,
                     annotations={QUARANTINE_ESCALATED_ANNOTATION: "x"})  # fmt: skip
    assert kinds(decide([escalated, node("b")], policy, NOW, False)) == []  # stays
    marks = {QUARANTINE_ESCALATED_ANNOTATION: "x", RELEASE_ANNOTATION: "ana"}
    released = node("a", healthy=False, quarantined=True, annotations=marks)
    plan = decide([released, node("b")], policy, NOW, False)
    assert kinds(plan) == [("a", ActionKind.MANUAL_RELEASE)]
    assert "ana" in plan.actions[0].message


# --- agent resilience ------------------------------------------------------------------------


class FlakyCore:
    """The two calls the publisher makes, failing as an unreachable API server does."""

    def __init__(self) -> None:
        self.down = True
        self.conditions: list[dict[str, str]] = []
        self.events: list[str] = []

    def _call(self) -> None:
        if self.down:
            raise urllib3.exceptions.MaxRetryError(None, "/", "connection refused")  # type: ignore[arg-type]

    def patch_node_status(self, node: str, body: dict[str, Any]) -> None:
        self._call()
        self.conditions.append(body["status"]["conditions"][0])

    def create_namespaced_event(self, namespace: str, event: Any) -> None:
        self._call()
        self.events.append(event.reason)


def test_the_publisher_keeps_what_it_could_not_write_until_the_api_server_answers() -> None:
    core, errors, now = FlakyCore(), list[str](), [1000.0]
    publisher = NodePublisher(
        core, "node-a", heartbeat_s=60, on_error=errors.append, clock=lambda: now[0]
    )
    fault = Finding("xid", "Xid79", Severity.FATAL, 3, "GPU-3", "GPU 3 fell off the bus", 0.0)
    publisher.event("Xid79", "GPU 3 fell off the bus")  # no exception while the API is away
    assert not publisher.condition([fault])
    assert core.conditions == [] and errors == ["api", "api"]
    core.down = False
    publisher.flush()
    assert core.events == ["Xid79"]
    assert publisher.condition([fault])  # written now
    assert (core.conditions[-1]["status"], core.conditions[-1]["reason"]) == ("False", "Xid79")
    now[0] += 59
    assert not publisher.condition([fault]) and len(core.conditions) == 1  # nothing new
    now[0] += 1
    time.sleep(0.001)  # lastHeartbeatTime is the wall clock's: it must move on
    assert not publisher.condition([fault])  # no change, but the heartbeat was due
    assert len(core.conditions) == 2
    first, second = core.conditions
    assert second["lastHeartbeatTime"] > first["lastHeartbeatTime"]
    assert second["lastTransitionTime"] == first["lastTransitionTime"]


class HiccupBackend(FakeBackend):
    """An event wait that fails twice with an error NVML never raises, then works."""

    hiccups = 2

    def wait_event(self, timeout_s: float) -> GPUEvent | None:
        if self.hiccups:
            self.hiccups -= 1
            time.sleep(0.01)
            raise RuntimeError("driver hiccup")
        return super().wait_event(timeout_s)


def test_the_event_loop_survives_any_error_and_still_sees_the_xid(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runner, "BACKOFF_S", (0.05, 0.1))
    path = tmp_path / "t.yaml"
    path.write_text("gpus: 4\ntimeline:\n  - {at: 1s, gpu: 3, xid: 79}\n")
    registry = CollectorRegistry()
    recorder = Recorder()
    agent = Agent(
        "node-a",
        HiccupBackend(path),
        HealthMonitor(),
        recorder,
        Metrics(registry),
        0.2,
    )
    stop = threading.Event()
    thread = threading.Thread(target=agent.run, args=(stop,))
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while recorder.conditions[-1:] != [(False, "Xid79")] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert recorder.conditions[-1] == (False, "Xid79")
        errors = registry.get_sample_value(
            "gpufleet_agent_errors_total", {"node": "node-a", "loop": "events", "kind": "internal"}
        )
        assert errors == 2
        assert agent.health_problem() is None
    finally:
        stop.set()
        thread.join(10)
    assert not thread.is_alive()


def test_healthz_fails_only_after_a_long_silence_of_a_loop() -> None:
    loop = runner.LoopHealth("events", 1.0)
    now = time.monotonic()
    assert loop.problem(now + 30) is None  # a back-off is no reason to restart
    assert "events loop: no iteration completed" in (loop.problem(now + 120) or "")
    assert [loop.failed() for _ in range(7)] == [1, 2, 4, 8, 16, 30, 30]
    loop.ok()
    assert loop.failures == 0


def test_a_silent_agent_makes_its_node_unknown_not_unhealthy() -> None:
    now = datetime(2026, 1, 1, 12, tzinfo=UTC)
    timeout = timedelta(minutes=3)
    recent, old = now - timedelta(seconds=30), now - timedelta(minutes=5)
    assert not agent_silent(True, recent, now, timeout)
    assert agent_silent(True, old, now, timeout)
    assert agent_silent(False, old, now, timeout)
    assert not agent_silent(None, None, now, timeout)  # no agent on the node: left as it is
    node: dict[str, Any] = {
        "metadata": {"name": "n1", "labels": {"gpufleet.io/pool": "p"}},
        "spec": {},
        "status": {
            "allocatable": {"nvidia.com/gpu": "8"},
            "conditions": [
                {"type": "Ready", "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"},
                {
                    "type": "GPUHealthy",
                    "status": "True",
                    "lastHeartbeatTime": old.isoformat(),
                    "lastTransitionTime": "2026-01-01T00:00:00Z",
                },
            ],
        },
    }
    silent = node_of(node, now, timeout)
    assert silent is not None and silent.healthy and not silent.schedulable  # work stays
    node["status"]["conditions"][1]["lastHeartbeatTime"] = recent.isoformat()
    alive = node_of(node, now, timeout)
    assert alive is not None and alive.schedulable


def test_a_node_fault_history_decays_into_its_lemon_score() -> None:
    now = datetime(2026, 1, 8, tzinfo=UTC)
    week = timedelta(days=7)
    assert fault_score([now - week], now, week) == pytest.approx(0.5)
    assert fault_score([now - timedelta(days=1), now - 2 * week], now, week) == pytest.approx(
        0.5 ** (1 / 7) + 0.25
    )
    node: dict[str, Any] = {
        "metadata": {
            "name": "n1",
            "labels": {"gpufleet.io/pool": "p"},
            "annotations": {
                "gpufleet.io/quarantine-history": "2026-01-07T00:00:00+00:00",
            },
        },
        "spec": {},
        "status": {"allocatable": {"nvidia.com/gpu": "8"}, "conditions": []},
    }
    seen = node_of(node, now)
    assert seen is not None and seen.lemon and seen.faults == pytest.approx(0.5 ** (1 / 7))
    later = node_of(node, now + 2 * week)
    assert later is not None and not later.lemon  # three weeks on, it is trusted again


@pytest.mark.parametrize(
    ("command", "option"),
    [
        (["agent", "run", "--node-name", "gpu-1", "--dry-run",
          "--nvml", "fake:examples/faults/dbe.yaml"], "--metrics-port"),
        (["controller", "run", "--kubeconfig", "/nonexistent"], "--metrics-port"),
    ],
)  # fmt: skip
def test_a_port_in_use_is_named_with_the_option_that_moves_it(
    command: list[str], option: str
) -> None:
    """A second agent (or controller) on one machine says which port is taken and how to
    choose another, instead of an internal error with a traceback."""
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "gpufleet", *command, f"--metrics-port={port}"],
            capture_output=True, text=True, timeout=60, cwd=REPO,
        )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    said = done.stdout + done.stderr
    assert f"port {port}" in said and "already in use" in said and option in said, said
    assert "Traceback" not in said and "gpufleet bug" not in said
