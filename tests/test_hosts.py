"""GPU hosts outside Kubernetes: a standalone agent's report read (GPUs, processes, services,
health), a GPUHost's status after batches of reports (each taken once, GPU-hours and idle
added up by host and workload), the agent's on-disk buffer (numbers go on across restarts,
bounded, the oldest dropped and counted), and the upload to a real `gpufleet server` app on
uvicorn: a batch whose answer was lost is sent again and not counted twice. The same on the
real control plane, with a token of `gpufleet hosts token`: tests/cluster/test_hosts.py."""

from __future__ import annotations

import functools
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from conftest import skip_unless_ci
from google.protobuf import json_format
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from prometheus_client import CollectorRegistry, generate_latest

from gpufleet.agent.metrics import Metrics
from gpufleet.agent.upload import ReportBuffer, Server, Uploader, buffer_size
from gpufleet.api import views
from gpufleet.api.access import LocalAccess
from gpufleet.api.app import create_app
from gpufleet.api.context import Refused
from gpufleet.api.hosts import Latest
from gpufleet.api.source import CacheSource, new_cache
from gpufleet.health.signals import GPUProcess, GPUReading
from gpufleet.hosts.report import ReportError, read
from gpufleet.hosts.status import Applied, Report, apply
from gpufleet.otlp.store import MetricStore, StoreCollector
from gpufleet.testing.slurm import Slurm
from gpufleet.testing.slurm import missing as slurm_missing

NOW = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)


@dataclass(frozen=True)
class Who:
    user: str = "alice"
    command: str = "python"
    framework: str = "pytorch"
    workload: str = "llama-sft"


def exposition(busy: float = 0.8, idle_gpu: int | None = None, fatal: bool = False) -> str:
    """What `gpufleet agent standalone` serves: 2 GPUs (GPU 1 at `busy`, GPU 0 idle when
    `idle_gpu` is 0), a process on GPU 1, and an OTLP counter of service trainer."""
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    for index in (0, 1):
        utilization = 1.0 if idle_gpu == index else busy * 100
        reading = GPUReading(index, f"GPU-{index}", utilization_pct=utilization,
                             memory_used_bytes=2**30, memory_total_bytes=80 * 2**30,
                             temperature_c=50)  # fmt: skip
        metrics.record("host-a", reading, fatal and index == 0)
    if fatal:
        metrics.findings.labels("host-a", "0", "GPU-0", "Xid79", "fatal").inc()
    metrics.record_processes("host-a", [(GPUProcess(4242, 1, 5 * 2**30, 70), "GPU-1", Who())])
    store = MetricStore()
    registry.register(StoreCollector(store))
    request = json_format.ParseDict(
        {
            "resourceMetrics": [
                {
                    "resource": {"attributes": [
                        {"key": "service.name", "value": {"stringValue": "trainer"}}
                    ]},
                    "scopeMetrics": [{"metrics": [{
                        "name": "tokens.processed",
                        "sum": {"isMonotonic": True, "aggregationTemporality": 2,
                                "dataPoints": [{"asInt": "42", "timeUnixNano": "1"}]},
                    }]}],
                }
            ]
        },
        ExportMetricsServiceRequest(),
    )  # fmt: skip
    store.apply(request, 0.0)
    return generate_latest(registry).decode()


def test_a_report_says_what_the_host_has() -> None:
    reading = read(exposition(busy=0.8))
    assert [(g.index, g.uuid, g.utilization) for g in reading.gpus] == [
        (0, "GPU-0", 0.8),
        (1, "GPU-1", 0.8),
    ]
    assert reading.gpus[0].memory_total_bytes == 80 * 2**30 and reading.healthy
    (process,) = reading.processes
    assert (process.gpu, process.pid, process.user, process.framework, process.workload) == (
        1, 4242, "alice", "pytorch", "llama-sft",
    )  # fmt: skip
    assert process.memory_bytes == 5 * 2**30 and process.utilization == 0.7
    assert reading.services == {"trainer": 1}
    unhealthy = read(exposition(fatal=True))
    assert not unhealthy.healthy
    assert unhealthy.problem() == "GPU 0 (GPU-0) is unhealthy: Xid79"
    with pytest.raises(ReportError, match="not Prometheus text"):
        read('gpufleet_gpu_healthy{gpu="0" 1\n')


def report(sequence: int, agent: str = "a1", **kwargs: Any) -> Report:
    return Report(agent, sequence, NOW + timedelta(seconds=sequence), 36.0, exposition(**kwargs))


def test_each_report_is_taken_once_and_its_gpu_time_added_up() -> None:
    first = apply(None, [report(1), report(2)], NOW, "0.1.0")
    assert (first.accepted, first.duplicates) == (2, 0)
    status = first.status
    assert status["lastSequence"] == 2 and status["reports"] == 2 and status["gpus"] == 2
    assert status["state"] == "Ready" and "message" not in status
    host, sft = status["usage"]
    # 2 reports of 36 s, 2 GPUs: 0.04 GPU-hours; the process holds GPU 1 only
    assert host == {"gpuHours": pytest.approx(0.04), "idleGPUHours": 0}
    assert sft["workload"] == "llama-sft" and sft["gpuHours"] == pytest.approx(0.02)
    # a batch sent again (its answer lost), with one new report: only the new one counts
    again = apply(status, [report(2), report(1), report(3, idle_gpu=0)], NOW)
    assert (again.accepted, again.duplicates) == (1, 2)
    assert again.status["reports"] == 3 and again.status["duplicates"] == 2
    host = again.status["usage"][0]
    assert host["gpuHours"] == pytest.approx(0.06)
    assert host["idleGPUHours"] == pytest.approx(0.01)  # GPU 0 idle for one report
    assert again.status["agentVersion"] == "0.1.0"  # kept from the first batch
    # a new buffer (the agent reinstalled) counts from 1 again
    fresh = apply(again.status, [report(1, agent="a2")], NOW)
    assert fresh.accepted == 1 and fresh.status["agent"] == "a2"
    # unhealthy while a GPU has a fatal finding, and the message goes once it is healthy
    sick = apply(fresh.status, [report(2, agent="a2", fatal=True)], NOW)
    assert sick.status["state"] == "Unhealthy" and "Xid79" in sick.status["message"]
    well = apply(sick.status, [report(3, agent="a2")], NOW)
    assert well.status["state"] == "Ready" and "message" not in well.status


def test_the_buffer_numbers_go_on_after_a_restart_and_drop_its_oldest_past_its_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    buffer = ReportBuffer(tmp_path, limit=3)
    numbers = [buffer.put(NOW, 5, f"m {i}\n") for i in range(5)]
    assert numbers == [1, 2, 3, 4, 5] and len(buffer) == 3 and buffer.dropped == 2
    assert [r["sequence"] for r in buffer.oldest(10)] == [3, 4, 5]
    buffer.remove([3])
    reopened = ReportBuffer(tmp_path, limit=3)  # the agent restarted
    assert reopened.agent_id == buffer.agent_id
    assert [r["metrics"] for r in reopened.oldest(10)] == ["m 3\n", "m 4\n"]
    assert reopened.put(NOW, 5, "m 5\n") == 6
    reopened.remove([4, 5, 6])
    assert ReportBuffer(tmp_path, limit=3).put(NOW, 5, "x") == 7  # none waits, the number goes on
    monkeypatch.setenv("GPUFLEET_AGENT_BUFFER_REPORTS", "many")
    with pytest.raises(ValueError, match="GPUFLEET_AGENT_BUFFER_REPORTS='many'"):
        buffer_size()


@dataclass
class MemoryHosts:
    """`HostReports` over a dict: the status `apply` computes, kept in memory (the real one,
    on the API server, is tested in tests/cluster/test_hosts.py)."""

    statuses: dict[str, dict[str, Any]] = field(default_factory=dict)
    kept: Latest = field(default_factory=Latest)
    lose_answers: int = 0  # answer this many batches with an error after taking them

    def take(
        self, name: str, reports: Sequence[Report], agent_version: str | None, now: datetime
    ) -> Applied:
        applied = apply(self.statuses.get(name), reports, now, agent_version)
        self.statuses[name] = applied.status
        self.kept.keep(name, reports)
        if self.lose_answers:
            self.lose_answers -= 1
            raise Refused(503, "the answer was lost")  # taken, and the agent never knew
        return applied

    def latest(self, name: str) -> tuple[datetime, str] | None:
        return self.kept.latest(name)


def test_the_upload_sends_the_buffer_and_a_resent_batch_counts_once(tmp_path: Path) -> None:
    from test_api import serve

    hosts = MemoryHosts(lose_answers=1)
    app = create_app(CacheSource(new_cache()), LocalAccess(), host_reports=hosts)
    registry = CollectorRegistry()
    with serve(app) as url:
        server = Server(url, "host-a", lambda: "token")
        buffer = ReportBuffer(tmp_path, limit=100)
        uploader = Uploader(buffer, server, registry, 5.0, "0.1.0", clock=lambda: NOW)
        for _ in range(3):
            buffer.put(NOW, 5.0, exposition())
        assert not uploader.send_once()  # taken, but answered 503: the reports stay
        assert len(buffer) == 3 and hosts.statuses["host-a"]["reports"] == 3
        assert uploader.send_once() and len(buffer) == 0  # sent again: none counted twice
        assert hosts.statuses["host-a"]["reports"] == 3
        assert hosts.statuses["host-a"]["duplicates"] == 3
        uploader.make_one()
        assert uploader.send_once()
        assert hosts.statuses["host-a"]["reports"] == 4
        sent = registry.get_sample_value("gpufleet_agent_reports_total", {"outcome": "sent"})
        assert sent == 4
        bad = Server(url, "Host_A", lambda: "token")  # not an object name: refused, said why
        buffer.put(NOW, 5.0, exposition())
        answer = bad.post({"agent": "a", "reports": buffer.oldest(1)})
        assert answer.status == 422 and "--host-name" in answer.message
        gone = Server(f"http://127.0.0.1:{_closed_port()}", "host-a", lambda: "t").post({})
        assert gone.status == 0


def _closed_port() -> int:
    from gpufleet.testing.cluster import free_port

    return free_port()


def test_a_host_report_does_not_make_the_other_views_be_built_again() -> None:
    """Hosts report every few seconds: the workload views must not be rebuilt for each."""
    cache = new_cache()
    source = CacheSource(cache)
    cache.replace("gpuhosts", [])
    before = source.version()
    cache.apply_event("gpuhosts", "ADDED", {
        "apiVersion": "gpufleet.io/v1alpha1", "kind": "GPUHost",
        "metadata": {"name": "host-a", "resourceVersion": "7"},
        "status": apply(None, [report(1)], NOW).status,
    })  # fmt: skip
    assert source.version() == before
    (shown,) = [h.name for h in views.hosts(views.Objects(hosts=source.hosts()), NOW)]
    assert shown == "host-a"


def test_a_host_is_told_unhealthy_lost_and_idle_once_each() -> None:
    from gpufleet.model.api import CapacityAlerts
    from gpufleet.notify.alerts import HostWatch

    alerts = CapacityAlerts.model_validate({"reservationIdleFor": "1h"})
    watch = HostWatch()

    def gpuhost(at: datetime, **kwargs: Any) -> dict[str, Any]:
        status = apply(None, [report(1, **kwargs)], at).status
        return {"metadata": {"name": "host-a"}, "spec": {"lostAfter": "60s"}, "status": status}

    sick = gpuhost(NOW, fatal=True)
    (told,) = watch.check([sick], alerts, NOW)
    assert told.kind == "host-unhealthy" and told.severity == "critical"
    assert "GPU 0 (GPU-0) is unhealthy: Xid79" in told.text
    assert watch.check([sick], alerts, NOW + timedelta(seconds=10)) == []  # told once
    (lost,) = watch.check([sick], alerts, NOW + timedelta(minutes=5))  # no report since
    assert lost.kind == "host-lost" and "no report for 300s" in lost.text
    later = NOW + timedelta(minutes=6)
    assert watch.check([gpuhost(later)], alerts, later) == []  # back, and healthy
    assert [n.kind for n in watch.check([gpuhost(later, fatal=True)], alerts, later)] == [
        "host-unhealthy"  # a new episode is told again
    ]
    # both GPUs idle (under 5 %) for reservationIdleFor: told once, after the hour
    idle = HostWatch()
    start = NOW
    assert idle.check([gpuhost(start, busy=0.01)], alerts, start) == []
    at = start + timedelta(minutes=61)
    (quiet,) = idle.check([gpuhost(at, busy=0.01)], alerts, at)
    assert quiet.kind == "host-idle" and quiet.fields["idle GPUs"] == "2"
    assert idle.check([gpuhost(at, busy=0.01)], alerts, at + timedelta(minutes=1)) == []


def test_the_digest_names_the_hosts_and_their_idle_gpu_hours() -> None:
    from gpufleet.notify.digest import digest

    totals = {"gpuHours": 10.0, "gpuCost": 40.0, "capacityCost": 80.0, "idleCost": 40.0,
              "allocation": 0.5, "wasteGPUHours": 0}  # fmt: skip
    hosts = [
        {"host": "vm-1", "gpuHours": 48.0, "idleGPUHours": 30.0},
        {"host": "vm-1", "workload": "sft", "gpuHours": 18.0, "idleGPUHours": 0.0},
    ]
    note = digest("daily-digest", {"totals": totals, "groups": [], "hosts": hosts}, [], NOW)
    assert "Hosts outside Kubernetes: 1 reported 48.0 GPU-hours, 30.0 of them idle." in note.text
    assert "vm-1: 48.0 GPU-hours, 30.0 idle" in note.text


@pytest.fixture
def slurm(tmp_path: Path) -> Iterator[Slurm]:
    absent = slurm_missing()
    if absent:
        skip_unless_ci(f"Slurm not installed ({', '.join(absent)}): apt-get install slurmctld "
                       "slurmd munge (make test does)")  # fmt: skip
    with Slurm(tmp_path / "slurm", "gpu-vm-1") as started:
        yield started


def test_the_agent_drains_its_slurm_node_and_resumes_only_its_own_drain(slurm: Slurm) -> None:
    from gpufleet.agent.slurm import SlurmDrain, node_state

    run = functools.partial(subprocess.run, env=slurm.env)
    registry = CollectorRegistry()
    drain = SlurmDrain("gpu-vm-1", registry, run)
    drain.follow(None)  # not quarantined, not drained: nothing to do
    assert node_state("gpu-vm-1", run)[0] == "IDLE"
    drain.follow("Xid79 on GPU 1")
    state, reason = node_state("gpu-vm-1", run)
    assert "DRAIN" in state.split("+") and reason.startswith("gpufleet: Xid79 on GPU 1")
    drain.follow(None)  # released by gpufleet: resumed
    assert "DRAIN" not in node_state("gpu-vm-1", run)[0].split("+")
    # a person's drain is never undone
    slurm.scontrol("update", "NodeName=gpu-vm-1", "State=DRAIN", "Reason=disk swap")
    drain.follow("Xid79 on GPU 1")
    drain.follow(None)
    state, reason = node_state("gpu-vm-1", run)
    assert "DRAIN" in state.split("+") and reason.startswith("disk swap")
    counted = {a: registry.get_sample_value("gpufleet_agent_slurm_actions_total", {"action": a})
               for a in ("drained", "resumed", "kept", "failed")}  # fmt: skip
    assert counted == {"drained": 1, "resumed": 1, "kept": 1, "failed": None}
    # scontrol failing (a node Slurm does not know) is counted, and tried again next time
    other = CollectorRegistry()
    lost = SlurmDrain("no-such-node", other, run)
    lost.follow("Xid79")
    assert other.get_sample_value("gpufleet_agent_slurm_actions_total", {"action": "failed"}) == 1
    assert lost.followed is False
