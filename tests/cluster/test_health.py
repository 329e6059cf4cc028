"""GPU health end to end on the real control plane: node agents with the scripted NVML
(`--nvml fake:FILE`) on kwok GPU nodes, the controller quarantining, requeueing and releasing.
Detection latencies are printed (run with -s to see them)."""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpufleet.testing.cluster import ControlPlane

from .conftest import ControllerProcess

REPO = Path(__file__).resolve().parents[2]
FAULTS = REPO / "examples" / "faults"
TAINT = "gpufleet.io/gpu-unhealthy"


class Agents:
    def __init__(self, cluster: ControlPlane, tmp: Path) -> None:
        self.cluster, self.tmp = cluster, tmp
        self.processes: list[subprocess.Popen[bytes]] = []
        self.healthy = tmp / "healthy.yaml"
        self.healthy.write_text("gpus: 8\nbaseline: {temperatureC: 45, eccDbeVolatile: 0}\n")

    def start(self, node: str, timeline: Path | None = None) -> float:
        log = (self.cluster.logs / f"agent-{node}.log").open("ab")
        self.processes.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "gpufleet",
                    "agent",
                    "run",
                    f"--node-name={node}",
                    f"--nvml=fake:{timeline or self.healthy}",
                    f"--kubeconfig={self.cluster.kubeconfig}",
                    "--poll-interval=1",
                    "--metrics-port=0",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        )
        return time.monotonic()

    def stop(self) -> None:
        for process in self.processes:
            process.terminate()
        for process in self.processes:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()


@pytest.fixture
def agents(cluster: ControlPlane, tmp_path: Path) -> Iterator[Agents]:
    made = Agents(cluster, tmp_path)
    yield made
    made.stop()


def tainted(cluster: ControlPlane, node: str) -> bool:
    taints = cluster.get("node", node).get("spec", {}).get("taints") or []
    return any(t["key"] == TAINT for t in taints)


def condition(cluster: ControlPlane, node: str) -> dict[str, Any]:
    conditions = cluster.get("node", node)["status"].get("conditions") or []
    return next((c for c in conditions if c["type"] == "GPUHealthy"), {})


def node_events(cluster: ControlPlane, node: str) -> str:
    return cluster.kubectl(
        "get", "events", "-n", "default", f"--field-selector=involvedObject.name={node}"
    ).stdout


def test_xid79_quarantines_the_node_and_requeues_its_work(
    scenario: Any, cluster: ControlPlane, agents: Agents
) -> None:
    s = scenario(3)
    team = s.team("research")
    s.reserve(team, 16)
    s.apply()
    assert s.job("train", team, "reserved", 8, run_for="600s").returncode == 0
    s.wait_states({"train": "Running"})
    (bad,) = cluster.get("gwl", "train", "-n", s.namespace)["status"]["nodes"]
    started = {n: agents.start(n, FAULTS / "xid79.yaml" if n == bad else None) for n in s.nodes}
    fault_at = started[bad] + 10  # the timeline's Xid 79 comes 10 s after the agent starts
    cluster.wait_until(lambda: tainted(cluster, bad), 45, f"{bad} to be quarantined")
    latency = time.monotonic() - fault_at
    print(f"\nXid 79 -> quarantine taint: {latency:.1f}s")
    assert latency <= 30
    found = condition(cluster, bad)
    assert (found["status"], found["reason"]) == ("False", "Xid79")
    assert "GPU 3" in found["message"]
    # the workload is requeued and runs again, on a healthy node
    cluster.wait_until(
        lambda: (
            (w := cluster.get("gwl", "train", "-n", s.namespace)["status"]).get("state")
            == "Running"
            and bad not in w.get("nodes", [bad])
            and w.get("preemptions") == 1
        ),
        60,
        "train to run again on a healthy node",
    )
    print(f"Xid 79 -> workload running elsewhere: {time.monotonic() - fault_at:.1f}s")
    events = node_events(cluster, bad)
    assert "Quarantined" in events and "Xid79" in events
    assert f"node {bad} is quarantined" in s.events("train")
    for node in set(s.nodes) - {bad}:
        assert not tainted(cluster, node)
        assert condition(cluster, node)["status"] == "True"


def test_faults_on_60_percent_of_a_pool_quarantine_at_most_20_percent(
    scenario: Any,
    cluster: ControlPlane,
    agents: Agents,
    controller: ControllerProcess,
    gpu_nodes: list[str],
) -> None:
    s = scenario(5)
    s.apply()
    faulty = s.nodes[:3]
    for node in s.nodes:
        agents.start(node, FAULTS / "dbe.yaml" if node in faulty else None)
    cluster.wait_until(
        lambda: all(condition(cluster, n).get("status") == "False" for n in faulty),
        45,
        "the agents to report the faults",
    )
    time.sleep(5)  # give the controller several cycles to (not) act on the rest
    quarantined = [n for n in s.nodes if tainted(cluster, n)]
    assert len(quarantined) == 1 and quarantined[0] in faulty
    blocked = set(faulty) - set(quarantined)
    for node in blocked:
        assert "QuarantineLimitReached" in node_events(cluster, node)
    with urllib.request.urlopen(f"http://127.0.0.1:{controller.metrics_port}/metrics") as r:
        text = r.read().decode()
    assert f'gpufleet_quarantine_blocked_nodes{{pool="{s.pool}"}} 2.0' in text
    assert f'gpufleet_quarantined_nodes{{pool="{s.pool}"}} 1.0' in text
    # a person releases the quarantined node: recorded on the node and in an Event
    (node,) = quarantined
    cli = [sys.executable, "-m", "gpufleet", "nodes", f"--kubeconfig={cluster.kubeconfig}"]
    healthy = next(n for n in s.nodes if n not in faulty)
    refused = subprocess.run(
        [*cli[:4], "release", healthy, "--by", "tester", cli[4]], capture_output=True, text=True
    )
    assert refused.returncode == 1 and "is not quarantined" in refused.stderr
    done = subprocess.run(
        [*cli[:4], "release", node, "--by", "tester", cli[4]], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    cluster.wait_until(
        lambda: (
            "tester"
            in cluster.get("node", node)["metadata"]["annotations"].get(
                "gpufleet.io/released-manually", ""
            )
        ),
        20,
        "the manual release to be recorded",
    )
    assert "ReleasedManually" in node_events(cluster, node)


def test_a_node_comes_back_after_the_fault_clears_and_probation(
    scenario: Any, cluster: ControlPlane, agents: Agents
) -> None:
    s = scenario(2)
    s.policy(health={"probation": "5s"})
    s.apply()
    node = s.nodes[0]
    started = agents.start(node, FAULTS / "recovery.yaml")  # Xid 79 at 5 s, reboot at 40 s
    agents.start(s.nodes[1])
    cluster.wait_until(lambda: tainted(cluster, node), 40, f"{node} to be quarantined")
    print(f"\nXid 79 -> quarantine taint: {time.monotonic() - started - 5:.1f}s")
    cluster.wait_until(lambda: condition(cluster, node).get("status") == "True", 60, "healthy")
    healthy_at = time.monotonic()
    assert tainted(cluster, node)  # still on probation
    cluster.wait_until(lambda: not tainted(cluster, node), 30, f"{node} to leave quarantine")
    waited = time.monotonic() - healthy_at
    print(f"healthy again -> released: {waited:.1f}s (probation 5s)")
    assert waited >= 3
    assert "Released" in node_events(cluster, node)
