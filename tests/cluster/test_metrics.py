"""The controller's metrics, scraped by a real Prometheus and read through its query API."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from gpufleet.client import Client, Conflict
from gpufleet.testing.cluster import ControlPlane, free_port

from .conftest import ControllerProcess, ServerProcess, gpufleet_cli, prometheus_scraping
from .test_health import Agents


@pytest.fixture
def prometheus(controller: ControllerProcess, tmp_path: Path) -> Iterator[str]:
    with prometheus_scraping([f"127.0.0.1:{controller.metrics_port}"], tmp_path) as url:
        yield url


def query(base: str, expression: str) -> list[dict[str, Any]]:
    url = f"{base}/api/v1/query?{urllib.parse.urlencode({'query': expression})}"
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            data = json.loads(response.read())
    except OSError:
        return []
    result: list[dict[str, Any]] = data["data"]["result"]
    return result


def value(base: str, expression: str) -> float | None:
    result = query(base, expression)
    return float(result[0]["value"][1]) if result else None


def _errors_now(controller: ControllerProcess) -> float:
    """The controller's failed cycles so far, from its own /metrics (earlier tests of the
    session, e.g. an API server restart, may have failed some)."""
    url = f"http://127.0.0.1:{controller.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "gpufleet_reconcile_errors_total":
                return float(sample.value)
    raise AssertionError("gpufleet_reconcile_errors_total is not exported")


def test_metrics_scraped_by_prometheus(
    cluster: ControlPlane, scenario: Any, prometheus: str, controller: ControllerProcess
) -> None:
    errors_before = _errors_now(controller)
    s = scenario(1)
    nlp = s.team("nlp")
    s.reserve(nlp, 4)
    s.apply()
    s.job("running", nlp, "elastic", 8)
    s.wait_states({"running": "Running"})
    s.job("waiting", nlp, "elastic", 8)
    cluster.wait_until(
        lambda: value(prometheus, 'up{job="gpufleet"}') == 1,
        60,
        "Prometheus to scrape the controller",
    )
    pool = f'pool="{s.pool}"'
    cluster.wait_until(
        lambda: (
            value(prometheus, f'gpufleet_pool_gpus{{{pool},state="allocated"}}') == 8
            and value(prometheus, f'gpufleet_queue_depth{{team="{nlp}",class="elastic"}}') == 1
        ),
        60,
        "the metrics to show the allocation and the queue",
    )
    assert value(prometheus, f'gpufleet_pool_gpus{{{pool},state="idle"}}') == 0
    assert value(prometheus, f'gpufleet_pool_gpus{{{pool},state="total",gpu_type="H100"}}') == 8
    assert value(prometheus, f'gpufleet_team_gpus{{team="{nlp}",kind="borrowed"}}') == 4
    assert value(prometheus, f'gpufleet_team_gpus{{team="{nlp}",kind="reserved"}}') == 4
    assert (value(prometheus, f'gpufleet_admissions_total{{{pool},team="{nlp}"}}') or 0) >= 1
    assert (value(prometheus, "gpufleet_cluster_efficiency") or 0) > 0
    assert (value(prometheus, "gpufleet_cycle_seconds_count") or 0) > 0

    # the fleet over the window, as gpufleet metrics reads it from Prometheus (its subqueries
    # look every 15 s: wait for one that saw the queue)
    def fleet() -> dict[str, Any]:
        shown = json.loads(subprocess.run(
            [sys.executable, "-m", "gpufleet", "metrics", f"--prometheus={prometheus}",
             "--since", "10m", "-o", "json"], capture_output=True, text=True, check=True,
        ).stdout)  # fmt: skip
        ours = {t["team"]: t for t in shown["teams"]}.get(nlp, {})
        return shown if ours.get("peakQueueDepth") == 1 else {}

    cluster.wait_until(lambda: bool(fleet()), 45, "gpufleet metrics to see the queue")
    shown = fleet()
    (ours,) = [p for p in shown["pools"] if p["pool"] == s.pool]
    assert ours["meanTotalGPUs"] == 8 and 0 < ours["meanAllocatedGPUs"] <= 8
    assert ours["allocation"] == round(ours["meanAllocatedGPUs"] / 8, 4)
    assert 0 <= ours["idleGPUHours"] < 8 * 10 / 60
    (team,) = [t for t in shown["teams"] if t["team"] == nlp]
    assert team["preemptions"] == 0  # (its admission came before the first scrape)
    # no cycle failed while this test ran (Prometheus sees what the controller exports)
    assert (
        value(prometheus, "gpufleet_reconcile_errors_total")
        == errors_before
        == (_errors_now(controller))
    )


def test_a_workloads_gpu_metrics_are_its_nodes_agents_in_prometheus(
    cluster: ControlPlane, scenario: Any, tmp_path: Path
) -> None:
    """Two Jobs run, one on a whole node and one on half of another; each node's agent (the
    scripted NVML) reports its own utilisation and memory, a real Prometheus scrapes them, and
    the server's /metrics of each workload is its nodes' figures over its run: exact for the
    one with the whole node, said to be shared for the other."""
    s = scenario(2)
    nlp = s.team("nlp")
    s.reserve(nlp, 8)
    s.apply()
    s.job("whole", nlp, "reserved", 8)
    s.job("half", nlp, "elastic", 4)
    s.job("later", nlp, "elastic", 8)  # no room: it waits, and has no metrics
    s.wait_states({"whole": "Running", "half": "Running"})

    def node_of(name: str) -> str:
        (node,) = cluster.get("gwl", name, "-n", s.namespace)["status"]["nodes"]
        return str(node)

    busy = {node_of("whole"): 75, node_of("half"): 25}
    agents = Agents(cluster, tmp_path)
    ports = []
    for node, percent in busy.items():
        timeline = tmp_path / f"{node}.yaml"
        timeline.write_text(yaml.safe_dump({"gpus": 8, "baseline": {
            "temperatureC": 40, "utilizationPct": percent,
            "memoryUsedBytes": percent * 10**9, "memoryTotalBytes": 80 * 10**9,
        }}))  # fmt: skip
        ports.append(free_port())
        agents.start(node, timeline, ports[-1])
    server = None
    try:
        with prometheus_scraping([f"127.0.0.1:{p}" for p in ports], tmp_path) as url:
            server = ServerProcess(cluster, "--insecure-local", f"--prometheus={url}")
            with Client(server.url) as fleet:

                def seen(name: str) -> bool:
                    return len(fleet.workload_metrics(s.namespace, name).utilization) >= 3

                cluster.wait_until(
                    lambda: seen("whole") and seen("half"), 90, "Prometheus to have 3 points"
                )
                whole = fleet.workload_metrics(s.namespace, "whole")
                assert whole.exact and whole.note is None and whole.nodes == [node_of("whole")]
                assert {p.value for p in whole.utilization} == {0.75}
                assert whole.mean_utilization == 0.75
                assert whole.peak_memory_used_bytes == 8 * 75 * 10**9
                assert whole.memory_total_bytes == 8 * 80 * 10**9
                assert whole.start == fleet.workload(s.namespace, "whole").started_at
                half = fleet.workload_metrics(s.namespace, "half")
                assert not half.exact and "shared their nodes" in (half.note or "")
                assert {p.value for p in half.utilization} == {0.25}
                with pytest.raises(Conflict) as waiting:
                    fleet.workload_metrics(s.namespace, "later")
                assert "has not run yet" in waiting.value.message
                shown = json.loads(gpufleet_cli(
                    cluster, "workloads", "metrics", "whole", "-n", s.namespace,
                    f"--prometheus={url}", "-o", "json",
                ))  # fmt: skip
                assert shown["meanUtilization"] == 0.75 and shown["exact"] is True
    finally:
        if server is not None:
            server.stop()
        agents.stop()
