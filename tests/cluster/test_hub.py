"""A fleet of clusters end to end: a hub and two worker clusters, each its own control plane
with kwok GPU nodes and its own gpufleet controller; `gpufleet hub run` sends the Jobs
submitted to the hub to the workers, and moves a lost worker's work to the other.

The tests run in order on one fleet, each building on the state the one before left.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from conftest import skip_unless_ci
from test_report_browser import run_browser

from gpufleet.model.keys import (
    CLUSTER_LABEL,
    DISPATCHED_TO_ANNOTATION,
    HUB_JOB_LABEL,
    HUB_MESSAGE_ANNOTATION,
    HUB_STATE_ANNOTATION,
)
from gpufleet.testing.cluster import default_bin_dir, missing_binaries
from gpufleet.testing.fleet import LocalFleet, hub_job, pool_of

from .conftest import ServerProcess

REPO = Path(__file__).resolve().parents[2]
WORK_DIR = REPO / "build" / "test-hub"
WORKERS = ("east", "west")
LOST_AFTER_S = 10
TEAMS = {"nlp": {"namespaces": ["nlp"]}, "vision": {"namespaces": ["vision"]}}


class Fleet:
    def __init__(self, local: LocalFleet) -> None:
        self.local = local
        self.hub = local.hub
        self.workers = local.planes

    def submit(self, name: str, team: str, cls: str = "elastic", **labels: str) -> None:
        body = hub_job(name, team, team, cls, 8, **labels)
        self.hub.kubectl("create", "-f", "-", input=yaml.safe_dump(body))

    def hub_job(self, name: str, team: str) -> dict[str, Any]:
        found: dict[str, Any] = self.hub.get("job", name, "-n", team)
        return found

    def where(self, name: str, team: str) -> str | None:
        """The cluster the hub sent the Job to; None while it waits (or when it is gone)."""
        found = self.hub.kubectl("get", "job", name, "-n", team, "-o", "json", check=False)
        if found.returncode != 0:
            return None
        annotations = json.loads(found.stdout)["metadata"].get("annotations") or {}
        return annotations.get(DISPATCHED_TO_ANNOTATION)

    def copies(self, name: str, team: str) -> dict[str, dict[str, Any]]:
        """The live (not being deleted) copies of a hub Job, by cluster."""
        uid = self.hub_job(name, team)["metadata"]["uid"]
        found = {}
        for cluster, plane in self.workers.items():
            if not plane.running():
                continue
            for job in plane.get("jobs", "-n", team, "-l", f"{HUB_JOB_LABEL}={uid}")["items"]:
                if not job["metadata"].get("deletionTimestamp"):
                    found[cluster] = job
        return found

    def running_in(self, name: str, team: str) -> list[str]:
        """The clusters where a pod of the hub Job's copy runs."""
        clusters = []
        for cluster, job in self.copies(name, team).items():
            selector = f"batch.kubernetes.io/controller-uid={job['metadata']['uid']}"
            pods = self.workers[cluster].get("pods", "-n", team, "-l", selector)["items"]
            if any(
                p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
                for p in pods
            ):
                clusters.append(cluster)
        return clusters

    def state(self, name: str, team: str) -> str | None:
        annotations = self.hub_job(name, team)["metadata"].get("annotations") or {}
        return annotations.get(HUB_STATE_ANNOTATION)

    def cluster(self, name: str) -> dict[str, Any]:
        return self.local.cluster(name)

    def wait_running(self, name: str, team: str, timeout: float = 90) -> str:
        self.hub.wait_until(
            lambda: len(self.running_in(name, team)) == 1 and self.state(name, team) == "Running",
            timeout,
            f"hub Job {team}/{name} to run in one cluster",
        )
        (cluster,) = self.running_in(name, team)
        return cluster


@pytest.fixture(scope="module")
def fleet() -> Iterator[Fleet]:
    bin_dir = default_bin_dir()
    missing = missing_binaries(bin_dir)
    if missing:
        skip_unless_ci(
            f"binaries missing in {bin_dir} ({', '.join(missing)}): run hack/k8s/build.sh"
        )
    if WORK_DIR.exists():
        shutil.rmtree(WORK_DIR)
    local = LocalFleet(
        WORK_DIR,
        WORKERS,
        nodes=2,
        teams=TEAMS,
        reservations={("nlp", "west"): 16},
        lost_after=f"{LOST_AFTER_S}s",
        bin_dir=bin_dir,
    )
    with local:
        yield Fleet(local)


def test_the_hub_sees_every_cluster(fleet: Fleet) -> None:
    for name in WORKERS:
        status = fleet.cluster(name)
        assert status["state"] == "Ready"
        assert status["nodes"] == 2 and status["gpus"] == 16
        assert status["pools"] == [pool_of(name)]
        assert status["kubernetesVersion"].startswith("v1.")
    listed = subprocess.run(
        [sys.executable, "-m", "gpufleet", "clusters", "list", "-o", "json",
         f"--kubeconfig={fleet.hub.kubeconfig}"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    data = json.loads(listed.stdout)
    assert [c["name"] for c in data["items"]] == list(WORKERS)
    assert data["totals"]["gpus"] == 32 and data["totals"]["ready"] == 2


def test_the_clusters_page_shows_every_cluster_in_chromium(fleet: Fleet, tmp_path: Path) -> None:
    """The hub's `gpufleet server`: /api/v1/clusters and the dashboard's Clusters panel, in
    headless Chromium, with the numbers the hub wrote."""
    server = ServerProcess(fleet.hub, "--insecure-local")
    try:
        answer = httpx.get(f"{server.url}/api/v1/clusters", timeout=10).json()
        assert [c["name"] for c in answer["items"]] == list(WORKERS)
        assert answer["totals"] == {
            "clusters": 2, "ready": 2, "nodes": 4, "gpus": 32, "allocatedGPUs": 0, "workloads": 0,
        }  # fmt: skip
        dom = run_browser(["--dump-dom", "--virtual-time-budget=8000"], server.url, tmp_path)
        assert dom.returncode == 0, dom.stderr[-2000:]
        html = dom.stdout
        for name in WORKERS:
            row = re.search(rf'<tr data-cluster="{name}">(.*?)</tr>', html, re.DOTALL)
            assert row is not None, html[:2000]
            assert 'data-state="Ready"' in row.group(1) and f"local-{name}" in row.group(1)
        assert 'data-cluster-totals="2"' in html and "2 of 2 ready" in html
        assert re.search(r'id="cluster-gpus">32<', html), html[:2000]
        assert 'id="clusters" data-panel="clusters" data-rendered="true"' in html
    finally:
        server.stop()


def test_a_burst_is_spread_over_both_clusters(fleet: Fleet) -> None:
    for index in range(4):
        fleet.submit(f"sweep-{index}", "vision")
    places = [fleet.wait_running(f"sweep-{index}", "vision") for index in range(4)]
    assert sorted(places) == ["east", "east", "west", "west"]
    for index, cluster in enumerate(places):
        assert fleet.where(f"sweep-{index}", "vision") == cluster
        status = fleet.hub_job(f"sweep-{index}", "vision").get("status") or {}
        assert status.get("active") == 1, status  # the copy's status, mirrored
    # the hub's own Job controller leaves hub Jobs alone: no pod in the hub
    assert fleet.hub.get("pods", "-n", "vision")["items"] == []


def test_reserved_work_goes_to_its_reservation_and_reclaims_it(fleet: Fleet) -> None:
    """nlp's reservation is in west, which vision's elastic work fills: nlp's reserved Job
    goes there (east has no reservation of nlp's) and takes the GPUs back."""
    fleet.submit("train", "nlp", "reserved")
    assert fleet.wait_running("train", "nlp", 120) == "west"
    states = {f"sweep-{i}": fleet.state(f"sweep-{i}", "vision") for i in range(4)}
    assert list(states.values()).count("Running") == 3, states


def test_work_pinned_to_an_unknown_cluster_waits_saying_why(fleet: Fleet) -> None:
    fleet.submit("pinned", "vision", **{CLUSTER_LABEL: "south"})
    fleet.hub.wait_until(
        lambda: (
            (fleet.hub_job("pinned", "vision")["metadata"].get("annotations") or {}).get(
                HUB_MESSAGE_ANNOTATION
            )
            == "its cluster south is not a cluster of the fleet"
        ),
        30,
        "the hub to say why the pinned Job waits",
    )
    assert fleet.where("pinned", "vision") is None
    fleet.hub.kubectl("delete", "job", "pinned", "-n", "vision")


def test_a_cancelled_hub_job_is_removed_from_its_cluster(fleet: Fleet) -> None:
    on_west = [f"sweep-{i}" for i in range(4) if fleet.where(f"sweep-{i}", "vision") == "west"]
    assert len(on_west) == 2
    uids = [fleet.hub_job(name, "vision")["metadata"]["uid"] for name in on_west]
    fleet.hub.kubectl("delete", "job", *on_west, "-n", "vision")
    west = fleet.workers["west"]
    fleet.hub.wait_until(
        lambda: all(
            not west.get("jobs", "-n", "vision", "-l", f"{HUB_JOB_LABEL}={uid}")["items"]
            for uid in uids
        ),
        60,
        "the copies of the cancelled hub Jobs to be removed from west",
    )


def test_a_lost_clusters_work_runs_elsewhere_and_never_twice(fleet: Fleet) -> None:
    on_east = [f"sweep-{i}" for i in range(4) if fleet.where(f"sweep-{i}", "vision") == "east"]
    assert len(on_east) == 2
    east = fleet.workers["east"]
    stopped = time.monotonic()
    east.stop_apiserver()
    fleet.hub.wait_until(
        lambda: fleet.cluster("east").get("state") == "Lost", 60, "the hub to declare east lost"
    )
    lost_at = time.monotonic()
    assert lost_at - stopped >= LOST_AFTER_S - 1  # not before lostAfter without a heartbeat

    # west has room for one of the two (nlp's reserved Job holds the other half): it runs there
    # within 60 s of the loss
    def moved_west() -> list[str]:
        return [n for n in on_east if fleet.running_in(n, "vision") == ["west"]]

    fleet.hub.wait_until(lambda: bool(moved_west()), 60, "one of east's Jobs to run in west")
    moved = moved_west()
    assert len(moved) == 1 and fleet.where(moved[0], "vision") == "west"
    fleet.hub.wait_until(  # the hub Job shows its new copy's status
        lambda: (fleet.hub_job(moved[0], "vision").get("status") or {}).get("active") == 1,
        30,
        "the moved Job's status to be mirrored",
    )
    (left,) = [n for n in on_east if n != moved[0]]
    message = (fleet.hub_job(left, "vision")["metadata"].get("annotations") or {}).get(
        HUB_MESSAGE_ANNOTATION, ""
    )
    assert "east is lost" in message or "west PoolFull" in message, message
    # east returns: its stale copies go before it takes work, then the one left runs there
    east.start_apiserver()
    fleet.hub.wait_until(
        lambda: fleet.cluster("east").get("state") == "Ready", 90, "east to be Ready again"
    )
    assert fleet.wait_running(left, "vision", 90) == "east"
    for name in on_east:
        assert len(fleet.running_in(name, "vision")) == 1, (name, fleet.copies(name, "vision"))
        assert len(fleet.copies(name, "vision")) == 1
    assert fleet.running_in(moved[0], "vision") == ["west"]


def test_a_cluster_the_hub_cannot_reach_says_why(fleet: Fleet) -> None:
    south = {
        "apiVersion": "gpufleet.io/v1alpha1",
        "kind": "Cluster",
        "metadata": {"name": "south"},
        "spec": {"kubeconfigSecretRef": {"name": "south-kubeconfig", "key": "kubeconfig"}},
    }
    fleet.hub.apply([south])
    try:
        fleet.hub.wait_until(
            lambda: (
                fleet.cluster("south").get("message")
                == "its kubeconfig: Secret gpufleet-system/south-kubeconfig not found"
            ),
            30,
            "the hub to say why it cannot reach south",
        )
        assert fleet.cluster("south")["state"] == "Unknown"
        assert all(fleet.cluster(n)["state"] == "Ready" for n in WORKERS)
    finally:
        fleet.hub.kubectl("delete", "clusters.gpufleet.io", "south")


def test_the_multicluster_benchmark_smoke() -> None:
    """benchmarks/multicluster.py at a small size, on its own control planes: every figure is
    there, and losing a worker lost nothing and ran nothing twice."""
    if missing_binaries(default_bin_dir()):
        skip_unless_ci("binaries missing: run hack/k8s/build.sh")
    script = Path(__file__).resolve().parents[2] / "benchmarks" / "multicluster.py"
    result = subprocess.run(
        [sys.executable, str(script), "--workers", "2", "--jobs", "24", "--nodes", "3",
         "--kill-worker", "--lost-after", "10"],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    figures = json.loads(result.stdout)
    assert figures["lost"] == 0 and figures["running_twice"] == 0, figures
    assert sum(figures["per_cluster"].values()) == 24
    assert all(count > 0 for count in figures["per_cluster"].values()), figures  # spread
    assert figures["lost_declared_seconds"] >= 9, figures
    for key in ("dispatch_per_second", "all_running_seconds", "requeued_after_loss_seconds"):
        assert figures[key] > 0, figures
    assert figures["single_cluster_all_running_seconds"] > 0
