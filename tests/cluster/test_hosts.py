"""A GPU host outside Kubernetes on the real control plane: `gpufleet agent standalone` (scripted
NVML, a process that holds a GPU) reports to a real `gpufleet server` with the token `gpufleet
hosts token` made (TokenReview and SubjectAccessReview by the API server: it may update its own
GPUHost only). A real OpenTelemetry SDK program sends a counter, a gauge and a histogram to the
agent; the server's API shows them, the GPUs and the process. The server is stopped for 60 s
and started again: every report made meanwhile waits on the agent's disk, arrives, and is
counted once; the GPU-hours cover the outage too."""

from __future__ import annotations

import functools
import json
import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import skip_unless_ci
from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from prometheus_client.parser import text_string_to_metric_families
from receivers import Receiver
from test_report_browser import run_browser

from gpufleet.agent.slurm import node_state
from gpufleet.model.keys import (
    HEALTH_BREAKER,
    QUARANTINE_HISTORY_ANNOTATION,
    QUARANTINED_AT_ANNOTATION,
)
from gpufleet.testing.cluster import ControlPlane, free_port
from gpufleet.testing.slurm import Slurm
from gpufleet.testing.slurm import missing as slurm_missing

from .conftest import ControllerProcess, ServerProcess, gpufleet_cli

OUTAGE_S = 60
POLL_S = 1.0


class Host:
    """The agent of host `name`, reporting to `server_url`, and a trainer process on GPU 1."""

    def __init__(
        self,
        name: str,
        server_url: str,
        token: Path,
        work: Path,
        timeline: str = "",
        slurm: Slurm | None = None,
    ) -> None:
        self.name, self.work = name, work
        self.metrics, self.grpc = free_port(), free_port()
        self.buffer = work / "buffer"
        self.trainer = subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(600)", "train.py"],
            env={**os.environ, "OTEL_SERVICE_NAME": "trainer", "LOCAL_RANK": "0"},
        )
        gpus = work / "gpus.yaml"
        gpus.write_text(
            "gpus: 2\nbaseline: {temperatureC: 45, utilizationPct: 60}\n"
            f"processes: [{{pid: {self.trainer.pid}, gpu: 1, memoryBytes: 5000000000, "
            "smUtilPct: 70}]\n" + timeline
        )
        self.log = (work / "agent.log").open("wb")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "gpufleet", "agent", "standalone", f"--host-name={name}",
             f"--nvml=fake:{gpus}", f"--poll-interval={POLL_S}", f"--metrics-port={self.metrics}",
             f"--otlp-grpc-port={self.grpc}", "--otlp-http-port=0", f"--server={server_url}",
             f"--token-file={token}", f"--buffer-dir={self.buffer}",
             f"--slurm-drain={'on' if slurm else 'off'}"],
            stdout=self.log, stderr=subprocess.STDOUT, env=slurm.env if slurm else None,
        )  # fmt: skip

    def scrape(self) -> dict[str, float]:
        text = httpx.get(f"http://127.0.0.1:{self.metrics}/metrics", timeout=2).text
        return {
            s.name + json.dumps(s.labels, sort_keys=True): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
            if s.name.startswith("gpufleet_agent_reports")
        }

    def buffered(self) -> float:
        try:
            return self.scrape().get("gpufleet_agent_reports_buffered{}", -1)
        except httpx.HTTPError:
            return -1

    def made(self) -> int:
        """Reports numbered so far (the buffer's own record: the agent may be stopped)."""
        return int((self.buffer / "sequence").read_text())

    def waiting(self) -> int:
        return len(list((self.buffer / "reports").glob("*.json.gz")))

    def stop(self) -> None:
        for process in (self.process, self.trainer):
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
        self.log.close()


def account(cluster: ControlPlane, name: str, rules: list[dict[str, Any]]) -> str:
    cluster.apply(
        [
            {"apiVersion": "v1", "kind": "ServiceAccount",
             "metadata": {"name": name, "namespace": "default"}},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
             "metadata": {"name": name}, "rules": rules},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
             "metadata": {"name": name},
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                         "name": name},
             "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": "default"}]},
        ]
    )  # fmt: skip
    return cluster.kubectl("create", "token", name, "-n", "default").stdout.strip()


@pytest.fixture
def host_token(cluster: ControlPlane, tmp_path: Path) -> Iterator[tuple[str, Path]]:
    name = f"gpu-vm-{uuid.uuid4().hex[:6]}"
    token = tmp_path / "token"
    gpufleet_cli(cluster, "hosts", "token", name, "--write", str(token), "--duration", "1h",
                 "--namespace", "default")  # fmt: skip
    assert token.stat().st_mode & 0o777 == 0o600
    yield name, token
    for kind in ("clusterrolebinding", "clusterrole"):
        cluster.kubectl("delete", kind, f"gpufleet-host-{name}", check=False)
    cluster.kubectl("delete", "gpuhosts.gpufleet.io", name, check=False)


def test_a_host_reports_its_gpus_processes_and_programs_and_loses_nothing_in_an_outage(
    cluster: ControlPlane,
    controller: ControllerProcess,  # it installed the CRDs, GPUHost's among them
    host_token: tuple[str, Path],
    tmp_path: Path,
) -> None:
    name, token = host_token
    viewer = account(cluster, f"host-viewer-{name}", [
        {"apiGroups": ["gpufleet.io"], "resources": ["gpuhosts"], "verbs": ["get", "list"]},
    ])  # fmt: skip
    read = {"Authorization": f"Bearer {viewer}"}
    port = free_port()
    server = ServerProcess(cluster, port=port)
    host = Host(name, server.url, token, tmp_path)
    try:
        # a real OpenTelemetry SDK program on the host sends to its agent
        exporter = OTLPMetricExporter(endpoint=f"127.0.0.1:{host.grpc}", insecure=True)
        reader = PeriodicExportingMetricReader(exporter, export_interval_millis=3_600_000)
        provider = MeterProvider(
            resource=Resource.create({"service.name": "trainer"}), metric_readers=[reader]
        )
        meter = provider.get_meter("train")
        meter.create_counter("tokens.processed", unit="{token}").add(42, {"model": "llama-3"})
        meter.create_gauge("batch.size").set(32)
        step = meter.create_histogram("step.duration", unit="s")
        for seconds in (0.3, 7.0):
            step.record(seconds)
        cluster.wait_until(lambda: _exported(provider), 30, "the SDK to export to the agent")
        provider.shutdown()

        def shown() -> dict[str, Any]:
            answer = httpx.get(f"{server.url}/api/v1/hosts/{name}", headers=read, timeout=5)
            return answer.json() if answer.status_code == 200 else {}

        cluster.wait_until(
            lambda: [s["name"] for s in shown().get("services", [])] == ["trainer"], 60,
            "the host and its program's series at the server",
        )  # fmt: skip
        found = shown()
        assert found["state"] == "Ready" and found["gpus"] == 2 and found["healthyGPUs"] == 2
        assert found["gpuUtilization"] == pytest.approx(0.6)
        (process,) = found["processes"]
        assert (process["gpu"], process["pid"], process["workload"]) == (
            1, host.trainer.pid, "trainer",
        )  # fmt: skip
        series = httpx.get(
            f"{server.url}/api/v1/hosts/{name}/metrics", params={"service": "trainer"},
            headers=read, timeout=5,
        ).json()["series"]  # fmt: skip
        values = {(s["name"], s["labels"].get("le")): s["value"] for s in series}
        assert values[("tokens_processed_total", None)] == 42
        assert values[("batch_size", None)] == 32
        assert values[("step_duration_seconds_bucket", "5.0")] == 1
        assert values[("step_duration_seconds_count", None)] == 2
        # the host's token reports for its own host only; a reader's for none
        other = httpx.post(
            f"{server.url}/api/v1/hosts/someone-else/reports",
            headers={"Authorization": f"Bearer {token.read_text().strip()}",
                     "X-Gpufleet-Client": "test"},
            json={"agent": "x", "reports": []}, timeout=5,
        )  # fmt: skip
        assert other.status_code == 403, other.text
        as_viewer = httpx.post(
            f"{server.url}/api/v1/hosts/{name}/reports",
            headers={**read, "X-Gpufleet-Client": "test"},
            json={"agent": "x", "reports": []}, timeout=5,
        )  # fmt: skip
        assert as_viewer.status_code == 403, as_viewer.text

        # the outage: reports wait on the agent's disk
        server.stop()
        time.sleep(OUTAGE_S)
        waited = host.buffered()
        assert waited >= OUTAGE_S / POLL_S * 0.8, f"only {waited} reports waited"
        server = ServerProcess(cluster, port=port)
        cluster.wait_until(lambda: host.buffered() == 0, 60, "the buffered reports to arrive")
        # the dashboard's Hosts panel and Services view, in headless Chromium
        page = f"{server.url}/#token={viewer}"
        dom = run_browser(["--dump-dom", "--virtual-time-budget=8000"], page, tmp_path)
        assert dom.returncode == 0, dom.stderr[-2000:]
        hosts_panel = re.search(r'<section[^>]*id="hosts".*?</section>', dom.stdout, re.S)
        services_panel = re.search(r'<section[^>]*id="services".*?</section>', dom.stdout, re.S)
        assert hosts_panel and services_panel, dom.stdout[:2000]
        assert "data-error" not in hosts_panel.group(0) + services_panel.group(0)
        assert f'data-host="{name}"' in hosts_panel.group(0)
        assert 'data-host-state="Ready"' in hosts_panel.group(0)
        assert "trainer (pytorch, GPU 1)" in hosts_panel.group(0)
        assert 'data-service="trainer"' in services_panel.group(0)
    finally:
        host.stop()
        server.stop()
    made, unsent = host.made(), host.waiting()
    status = json.loads(
        cluster.kubectl("get", "gpuhosts.gpufleet.io", name, "-o", "json").stdout
    )["status"]  # fmt: skip
    # every report taken once: numbers 1 to lastSequence each counted once (none lost in the
    # outage, none twice), and none left behind but what the agent's stop cut off (a batch
    # the server may have taken as the agent died is still on its disk)
    assert status["reports"] == status["lastSequence"]
    assert made - unsent <= status["lastSequence"] <= made
    assert status["reports"] >= waited
    # and the GPU time of each: 2 GPUs for POLL_S each report, the outage's included
    host_usage, trainer_usage = status["usage"]
    assert host_usage["gpuHours"] == pytest.approx(status["reports"] * 2 * POLL_S / 3600)
    assert trainer_usage["workload"] == "trainer"
    assert trainer_usage["gpuHours"] == pytest.approx(status["reports"] * POLL_S / 3600)
    # the CLI reads the same from the cluster; a host silent past its lostAfter is Lost
    listed = json.loads(gpufleet_cli(cluster, "hosts", "list", "-o", "json"))
    assert name in [h["name"] for h in listed]
    cluster.kubectl("patch", "gpuhosts.gpufleet.io", name, "--type=merge",
                    "-p", '{"spec": {"lostAfter": "1s"}}')  # fmt: skip
    time.sleep(1.5)
    got = json.loads(gpufleet_cli(cluster, "hosts", "get", name, "-o", "json"))
    assert got["state"] == "Lost" and "no report for" in got["message"]

    # the controller records the hosts' GPU time in its usage ledger (here every 2 s): all of
    # it, the outage's included
    def recorded() -> float:
        usage = subprocess.run(
            [sys.executable, "-m", "gpufleet", "usage", f"--ledger={controller.ledger}",
             "-o", "json"], capture_output=True, text=True, check=True,
        )  # fmt: skip
        rows = json.loads(usage.stdout)["hosts"]
        return float(sum(h["gpuHours"] for h in rows if h["host"] == name and "workload" not in h))

    cluster.wait_until(
        lambda: recorded() == pytest.approx(host_usage["gpuHours"], abs=1e-4), 60,
        "the controller to record the host's GPU-hours in its ledger",
    )  # fmt: skip


def test_an_unhealthy_host_is_told_quarantined_and_its_slurm_node_drained(
    cluster: ControlPlane, scenario: Any, host_token: tuple[str, Path], tmp_path: Path
) -> None:
    """GPU 1 of the host falls off the bus (Xid 79, scripted) and is reset 20 s later: its
    agent reports both, the server marks the GPUHost Unhealthy and Ready again, and the
    controller tells the routes that ask, quarantines the host (the nodes' guard rails) and
    releases it after its probation; the agent drains its real Slurm node, then resumes it."""
    absent = slurm_missing()
    if absent:
        skip_unless_ci(f"Slurm not installed ({', '.join(absent)}): apt-get install slurmctld "
                       "slurmd munge (make test does)")  # fmt: skip
    name, token = host_token
    receiver = Receiver()
    s = scenario(1)
    s.policy(
        notifications={"routes": [
            {"name": f"hosts-{s.id}", "type": "webhook", "url": receiver.url,
             "events": ["host-unhealthy"]},
        ]},
        # the session's cluster has few GPU nodes: one host of them must not trip the breaker
        health={"probation": "3s", "breakerPercent": 100},
    )  # fmt: skip
    s.apply()
    server = ServerProcess(cluster)
    timeline = "timeline:\n  - {at: 2s, gpu: 1, xid: 79}\n  - {at: 20s, reset: true}\n"
    with Slurm(tmp_path / "slurm", name) as slurm:
        run = functools.partial(subprocess.run, env=slurm.env)
        host = Host(name, server.url, token, tmp_path, timeline, slurm)
        try:
            cluster.wait_until(lambda: bool(receiver.received), 60, "the host-unhealthy message")
            (message,) = receiver.json()
            assert message["kind"] == "host-unhealthy" and message["fields"]["host"] == name
            assert "GPU 1 (GPU-fake-1) is unhealthy: Xid79" in message["text"]
            shown = json.loads(gpufleet_cli(cluster, "hosts", "get", name, "-o", "json"))
            assert shown["healthyGPUs"] == 1 or shown["state"] == "Ready"  # reset at 20 s
            # quarantined by the controller; drained by the agent
            cluster.wait_until(
                lambda: "DRAIN" in node_state(name, run)[0].split("+"), 30,
                "the agent to drain its Slurm node",
            )  # fmt: skip
            assert node_state(name, run)[1].startswith("gpufleet: ")
            # GPU 1 reset at 20 s: healthy for the 3 s probation, released, resumed
            cluster.wait_until(
                lambda: "DRAIN" not in node_state(name, run)[0].split("+"), 60,
                "the agent to resume its Slurm node once the host is released",
            )  # fmt: skip
            found = cluster.get("gpuhosts.gpufleet.io", name)
            assert QUARANTINED_AT_ANNOTATION not in (found["metadata"].get("annotations") or {})
            assert found["metadata"]["annotations"][QUARANTINE_HISTORY_ANNOTATION]
        finally:
            host.stop()
            server.stop()
            receiver.server.shutdown()
            breaker = cluster.kubectl("get", "configmap", HEALTH_BREAKER, "-n", "kube-system",
                                      check=False)  # fmt: skip
            cluster.kubectl("delete", "configmap", HEALTH_BREAKER, "-n", "kube-system",
                            check=False)  # fmt: skip
    assert breaker.returncode != 0, "the breaker tripped: the other tests would not quarantine"
    drained = [line for line in (tmp_path / "agent.log").read_text().splitlines()
               if "Slurm node" in line]  # fmt: skip
    assert [("drained" in d, "resumed" in d) for d in drained] == [(True, False), (False, True)]


def _exported(provider: MeterProvider) -> bool:
    return bool(provider.force_flush(timeout_millis=5_000))
