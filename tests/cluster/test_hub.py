"""A fleet of clusters end to end: a hub and two worker clusters, each its own control plane
with kwok GPU nodes and its own gpufleet controller; `gpufleet hub run` sends the Jobs
submitted to the hub to the workers, and moves a lost worker's work to the other.

The tests run in order on one fleet, each building on the state the one before left.
"""

from __future__ import annotations

import functools
import json
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from conftest import skip_unless_ci
from test_report_browser import run_browser

from gpufleet.client import Client, Invalid
from gpufleet.ledger.store import open_ledger
from gpufleet.model.keys import (
    CLUSTER_LABEL,
    DISPATCHED_TO_ANNOTATION,
    HUB_JOB_LABEL,
    HUB_MESSAGE_ANNOTATION,
    HUB_STATE_ANNOTATION,
)
from gpufleet.testing.cluster import ControlPlane, default_bin_dir, free_port, missing_binaries
from gpufleet.testing.fleet import HUB_NAMESPACE, LocalFleet, hub_job, job_manifest, pool_of

from .conftest import ServerProcess, prometheus_scraping
from .test_chart import rendered
from .test_metrics import value

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


def gpufleet(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpufleet", *args], capture_output=True, text=True, check=False
    )


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
        hub_metrics_port=free_port(),
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
            row = re.search(rf'<tr data-cluster="{name}"[^>]*>(.*?)</tr>', html, re.DOTALL)
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


def test_the_hubs_metrics_are_scraped_by_prometheus(fleet: Fleet, tmp_path: Path) -> None:
    port = fleet.local.hub_metrics_port
    with prometheus_scraping([f"127.0.0.1:{port}"], tmp_path) as prometheus:
        fleet.hub.wait_until(
            lambda: value(prometheus, "sum(gpufleet_hub_dispatched_total)") == 4,
            60,
            "Prometheus to scrape the hub's 4 dispatches",
        )
        for name in WORKERS:
            ready = f'gpufleet_cluster_state{{cluster="{name}",state="Ready"}}'
            assert value(prometheus, ready) == 1
            assert value(prometheus, f'gpufleet_hub_dispatched_total{{cluster="{name}"}}') == 2
        assert value(prometheus, "gpufleet_hub_waiting_workloads") == 0
        assert value(prometheus, "gpufleet_hub_leading") == 1  # the only hub leads
        assert (value(prometheus, "gpufleet_hub_cycle_seconds_count") or 0) > 0


def test_reserved_work_goes_to_its_reservation_and_reclaims_it(fleet: Fleet) -> None:
    """nlp's reservation is in west, which vision's elastic work fills: nlp's reserved Job
    goes there (east has no reservation of nlp's) and takes the GPUs back."""
    fleet.submit("train", "nlp", "reserved")
    assert fleet.wait_running("train", "nlp", 120) == "west"
    states = {f"sweep-{i}": fleet.state(f"sweep-{i}", "vision") for i in range(4)}
    assert list(states.values()).count("Running") == 3, states
    # west's controller writes its ledger rows as west's (clusters may share one ledger)
    ledger = open_ledger(str(fleet.workers["west"].work_dir / "controller" / "ledger.db"))
    try:
        fleet.hub.wait_until(
            lambda: any(
                s.workload == "nlp/train" and s.cluster == "west"
                for s in ledger.segments(datetime.now(UTC) - timedelta(hours=1), datetime.now(UTC))
            ),
            30,
            "west's ledger to record nlp/train as west's",
        )
        assert {s.cluster for s in ledger.segments(datetime(2026, 1, 1, tzinfo=UTC),
                                                   datetime.now(UTC))} == {"west"}  # fmt: skip
    finally:
        ledger.close()


def test_the_hubs_server_shows_every_clusters_work_and_filters_by_cluster(
    fleet: Fleet, tmp_path: Path
) -> None:
    """`gpufleet server --fleet` on the hub: every worker's workloads, nodes and pools with
    their cluster, `?cluster=` on each view, and the dashboard's cluster filter in Chromium."""
    server = ServerProcess(fleet.hub, "--insecure-local", "--fleet")
    api = f"{server.url}/api/v1"

    def read(path: str) -> Any:
        answer = httpx.get(f"{api}/{path}", timeout=10)
        assert answer.status_code == 200, answer.text
        return answer.json()

    try:
        fleet.hub.wait_until(  # each worker is watched once its Secret is read
            lambda: (
                {w["cluster"] for w in read("workloads?namespace=vision")["items"]}
                == {"east", "west"}
            ),
            60,
            "the hub's server to show both workers' workloads",
        )
        shown = {(w["namespace"], w["name"]): w["cluster"] for w in read("workloads")["items"]}
        for index in range(4):
            assert shown[("vision", f"sweep-{index}")] == fleet.where(f"sweep-{index}", "vision")
        assert shown[("nlp", "train")] == "west"
        west = read("workloads?cluster=west")["items"]
        assert {w["cluster"] for w in west} == {"west"} and ("nlp", "train") in {
            (w["namespace"], w["name"]) for w in west
        }
        nodes = read("nodes?cluster=east")
        assert [(n["node"].startswith("east-gpu"), n["cluster"]) for n in nodes] == [
            (True, "east")
        ] * 2
        assert len(read("nodes")) == 4
        capacity = read("capacity?cluster=west")
        assert [(p["pool"], p["cluster"]) for p in capacity["pools"]] == [(pool_of("west"), "west")]
        assert capacity["totals"]["totalGPUs"] == 16
        assert read("capacity")["totals"]["totalGPUs"] == 32
        explained = read("workloads/nlp/train/explain?cluster=west")
        assert "is Running in pool west-h100" in explained["text"], explained
        assert httpx.get(f"{api}/workloads/nlp/train?cluster=east", timeout=10).status_code == 404
        # a workload of one name in both clusters (made in each, not through the hub)
        for plane in fleet.workers.values():
            body = job_manifest("dup", "vision", {"gpufleet.io/team": "vision"}, 1, 1, "1h")
            plane.kubectl("create", "-f", "-", input=yaml.safe_dump(body))
        fleet.hub.wait_until(
            lambda: (
                sorted(
                    w["cluster"]
                    for w in read("workloads?namespace=vision")["items"]
                    if w["name"] == "dup"
                )
                == ["east", "west"]
            ),
            60,
            "both clusters' vision/dup to be shown",
        )
        both = httpx.get(f"{api}/workloads/vision/dup", timeout=10)
        assert both.status_code == 409 and "several clusters (east, west)" in both.text
        assert read("workloads/vision/dup?cluster=east")["cluster"] == "east"
        cancel = httpx.post(
            f"{api}/workloads/nlp/train/cancel", headers={"X-Gpufleet-Client": "test"}, timeout=10
        )
        assert cancel.status_code == 405  # read-only: the workload is the worker's
        dom = run_browser(
            ["--dump-dom", "--virtual-time-budget=8000"], f"{server.url}/?cluster=west", tmp_path
        )
        assert dom.returncode == 0, dom.stderr[-2000:]
        html = dom.stdout
        assert 'id="cluster-shown">west<' in html, html[:3000]
        cells = re.findall(r'data-workload-cluster="([a-z0-9-]*)"', html)
        assert cells and set(cells) == {"west"}, cells
        assert (
            f'data-pool="{pool_of("west")}"' in html
            and f'data-pool="{pool_of("east")}"' not in html
        )
    finally:
        server.stop()
    # the CLI reads the workers through the hub the same way: --cluster NAME|all
    hub = f"--kubeconfig={fleet.hub.kubeconfig}"
    listed = gpufleet("workloads", "list", "-A", "--cluster", "all", "-o", "json", hub)
    assert listed.returncode == 0, listed.stderr
    rows = [(w["namespace"], w["name"], w["cluster"]) for w in json.loads(listed.stdout)]
    assert {(ns, name): c for ns, name, c in rows if name != "dup"} == shown
    assert sorted(c for _, name, c in rows if name == "dup") == ["east", "west"]
    status = gpufleet("status", "--cluster", "west", "-o", "json", hub)
    assert status.returncode == 0, status.stderr
    assert [p["pool"] for p in json.loads(status.stdout)["pools"]] == [pool_of("west")]
    explained = gpufleet("workloads", "explain", "train", "-n", "nlp", "--cluster", "west", hub)
    assert "is Running in pool west-h100" in explained.stdout, explained.stderr
    unknown = gpufleet("workloads", "list", "-A", "--cluster", "south", hub)
    assert unknown.returncode == 1 and "use all or east, west" in unknown.stderr
    for plane in fleet.workers.values():
        plane.kubectl("delete", "job", "dup", "-n", "vision")


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
    assert len(moved) == 1
    fleet.hub.wait_until(  # the hub Job shows where its new copy runs, and its status
        lambda: (
            fleet.where(moved[0], "vision") == "west"
            and (fleet.hub_job(moved[0], "vision").get("status") or {}).get("active") == 1
        ),
        30,
        "the moved Job's new cluster and status to be mirrored",
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
    # nlp's reserved Job ran on through all of it: never preempted, in no cluster
    (train,) = fleet.workers["west"].get("gpuworkloads", "-n", "nlp")["items"]
    assert train["status"]["state"] == "Running"
    assert train["status"].get("preemptions", 0) == 0
    assert fleet.running_in("train", "nlp") == ["west"]


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


def test_submit_to_the_hub_auto_or_pinned(fleet: Fleet) -> None:
    """`gpufleet submit --cluster`: auto goes where there is room (east: west is full), a
    pinned Job waits for its cluster saying why, a cluster the hub has not is refused."""
    hub = f"--kubeconfig={fleet.hub.kubeconfig}"
    common = ("--team", "vision", "-n", "vision", "--gpus", "8", "--run-for", "1h", hub)
    auto = gpufleet("submit", "cli-auto", *common, "--cluster", "auto")
    assert auto.returncode == 0, auto.stderr
    assert "to the hub, for the cluster that admits it soonest" in auto.stderr
    assert fleet.wait_running("cli-auto", "vision") == "east"
    assert fleet.hub_job("cli-auto", "vision")["spec"]["managedBy"] == "gpufleet.io/hub"
    pinned = gpufleet("submit", "cli-west", *common, "--cluster", "west")
    assert pinned.returncode == 0, pinned.stderr
    fleet.hub.wait_until(
        lambda: "west" in (
            (fleet.hub_job("cli-west", "vision")["metadata"].get("annotations") or {}).get(
                HUB_MESSAGE_ANNOTATION
            ) or ""
        ),
        30,
        "the hub to say why the Job pinned to west waits",
    )  # fmt: skip
    assert fleet.where("cli-west", "vision") is None
    unknown = gpufleet("submit", "cli-south", *common, "--cluster", "south")
    assert unknown.returncode == 1
    assert "no such Cluster in the hub; use auto or east, west" in unknown.stderr
    deployment = gpufleet("submit", "cli-d", *common, "--cluster", "auto", "--kind", "deployment")
    assert deployment.returncode == 1 and "the hub sends batch/v1 Jobs only" in deployment.stderr
    not_hub = gpufleet(
        "submit", "cli-x", *common[:-1], f"--kubeconfig={fleet.workers['east'].kubeconfig}",
        "--cluster", "auto",
    )  # fmt: skip
    assert not_hub.returncode == 1 and "not the hub of a fleet" in not_hub.stderr, not_hub.stderr
    for name in ("cli-auto", "cli-west"):
        fleet.hub.kubectl("delete", "job", name, "-n", "vision")


def test_the_sdk_submits_through_the_hubs_server(fleet: Fleet) -> None:
    """`POST /api/v1/workloads` with `cluster` on the hub's server (`--fleet`): the Job is made
    in the hub as the hub takes it and runs in a worker; the server's refusals name the fix;
    it cancels nothing in its clusters."""
    server = ServerProcess(fleet.hub, "--insecure-local", "--fleet")
    short: dict[str, Any] = {
        "team": "vision", "gpus": 8, "image": "example.com/train:1", "run_for": "1h"
    }  # fmt: skip
    try:
        with Client(server.url) as client:
            made = client.submit_job("vision", name="sdk-auto", cluster="auto", **short)
            assert made.kind == "Job" and made.name == "sdk-auto"
            assert made.manifest["metadata"]["labels"][CLUSTER_LABEL] == "auto"
            assert fleet.wait_running("sdk-auto", "vision") in WORKERS
            assert fleet.hub_job("sdk-auto", "vision")["spec"]["managedBy"] == "gpufleet.io/hub"
            # its workload, in the worker it runs in, through the same server
            fleet.hub.wait_until(
                lambda: any(
                    w.name == "sdk-auto" for w in client.iter_workloads(namespace="vision")
                ),
                60,
                "the hub's server to show the workload",
            )
            wrongs: tuple[tuple[dict[str, Any], str], ...] = (
                ({}, "cluster: needed on the hub's server"),
                ({"cluster": "sout"}, "no such Cluster in the hub"),
            )
            for wrong, said in wrongs:
                with pytest.raises(Invalid) as refused:
                    client.submit_job("vision", name="sdk-wrong", **short, **wrong)
                assert said in refused.value.message, refused.value.message
            assert fleet.hub.kubectl("get", "job", "sdk-wrong", "-n", "vision",
                                     check=False).returncode != 0  # fmt: skip
        cancel = httpx.post(
            f"{server.url}/api/v1/workloads/vision/sdk-auto/cancel",
            headers={"X-Gpufleet-Client": "test"},
            timeout=10,
        )
        assert cancel.status_code == 405 and "changes nothing in its clusters" in cancel.text
        assert fleet.state("sdk-auto", "vision") == "Running"
    finally:
        server.stop()
        fleet.hub.kubectl("delete", "job", "sdk-auto", "-n", "vision", check=False)


def test_a_copy_deleted_in_its_worker_is_made_again(fleet: Fleet) -> None:
    """Deleting a copy in its worker does not lose the hub Job: it is sent again (nlp's
    reservation is in west, so there)."""
    (old,) = fleet.copies("train", "nlp").values()
    fleet.workers["west"].kubectl("delete", "job", "train", "-n", "nlp", "--wait=false")
    fleet.hub.wait_until(
        lambda: any(
            c["metadata"]["uid"] != old["metadata"]["uid"]
            for c in fleet.copies("train", "nlp").values()
        ),
        60,
        "the hub to make nlp/train's copy again",
    )
    assert fleet.wait_running("train", "nlp", 90) == "west"


def test_the_charts_hub_rights_are_enough_to_run_it(fleet: Fleet, tmp_path: Path) -> None:
    """The chart's hub mode (hub.enabled): its ServiceAccount and roles, applied to the hub,
    are all `gpufleet hub run --no-install` needs. Run as that account in place of the
    fleet's hub, it keeps the Clusters Ready (their status) and sends a Job and mirrors it."""
    objects = rendered("--set", "hub.enabled=true", "--show-only", "templates/hub.yaml")
    (deployment,) = [o for o in objects if o["kind"] == "Deployment"]
    assert deployment["spec"]["replicas"] == 2  # one leads, one stands by
    assert [o["kind"] for o in objects].count("PodDisruptionBudget") == 1
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[:3] == ["hub", "run", "--no-install"]
    assert f"--lease-namespace={HUB_NAMESPACE}" in args
    fleet.hub.apply([o for o in objects if o["kind"] != "Deployment"])
    account = deployment["spec"]["template"]["spec"]["serviceAccountName"]
    token = fleet.hub.kubectl("create", "token", account, "-n", HUB_NAMESPACE).stdout.strip()
    kubeconfig = tmp_path / "hub-account.kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "hub", "cluster": {
                    "server": fleet.hub.server,
                    "certificate-authority": str(fleet.hub.pki.ca_cert)}}],
                "users": [{"name": account, "user": {"token": token}}],
                "contexts": [{"name": "hub", "context": {"cluster": "hub", "user": account}}],
                "current-context": "hub",
            }
        )
    )  # fmt: skip
    before = {name: fleet.cluster(name)["lastHeartbeat"] for name in WORKERS}
    fleet.local.stop_hub()
    log = tmp_path / "hub.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "gpufleet", *args,  # the chart's, its lease's namespace too
             f"--kubeconfig={kubeconfig}", "--interval=0.5", "--metrics-port=0"],
            stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        # submitted as the hub starts: in its first LIST, whose items come without their kind
        fleet.submit("as-chart", "vision")
        assert fleet.wait_running("as-chart", "vision", 90) == "east"  # where there is room
        fleet.hub.wait_until(
            lambda: all(
                fleet.cluster(n)["state"] == "Ready" and fleet.cluster(n)["lastHeartbeat"] > t
                for n, t in before.items()
            ),
            30,
            "the Clusters' status to be written as the chart's account",
        )
        assert process.poll() is None, log.read_text()[-3000:]
        said = log.read_text()
        assert "Forbidden" not in said and "403" not in said, said[-3000:]
    finally:
        process.terminate()
        process.wait(timeout=20)
        fleet.hub.kubectl("delete", "job", "as-chart", "-n", "vision")
        fleet.local.start_hub()


def lease_holder(hub: ControlPlane) -> str | None:
    """Who holds the hubs' Lease (`hostname-pid`), None before any hub took it."""
    lease = hub.kubectl("get", "lease", "gpufleet-hub", "-n", "kube-system", "-o", "json",
                        check=False)  # fmt: skip
    if lease.returncode != 0:
        return None
    holder: str | None = json.loads(lease.stdout)["spec"].get("holderIdentity")
    return holder


def test_a_standby_hub_takes_over_when_the_leader_dies(fleet: Fleet) -> None:
    """Two hubs: the holder of the Lease sends work, the other stands by. The leader is
    SIGKILLed in the middle of a burst (its Lease is not given up): the standby takes the lead
    once the Lease expires, and every Job of the burst runs, each in exactly one cluster."""
    fleet.hub.kubectl("delete", "jobs", "--all", "-n", "vision")  # room for the burst
    fleet.hub.wait_until(
        lambda: all(not p.get("jobs", "-n", "vision")["items"] for p in fleet.workers.values()),
        60,
        "the copies of vision's hub Jobs to be removed",
    )
    hub = fleet.hub
    leader = hub.records["gpufleet-hub"].pid
    holder = functools.partial(lease_holder, hub)
    assert holder() == f"{socket.gethostname()}-{leader}"
    fleet.local.start_hub("gpufleet-hub-standby", metrics_port=0)
    standby = hub.records["gpufleet-hub-standby"].pid
    names = [f"ha-{index}" for index in range(6)]
    try:
        for name in names[:3]:
            hub.kubectl(
                "create",
                "-f",
                "-",
                input=yaml.safe_dump(hub_job(name, "vision", "vision", "elastic", 1)),
            )
        hub.wait_until(lambda: any(fleet.copies(n, "vision") for n in names[:3]), 30,
                       "the leader to send the first Jobs")  # fmt: skip
        assert holder() == f"{socket.gethostname()}-{leader}"  # the standby waited
        hub.records["gpufleet-hub"].signal_group(signal.SIGKILL)
        killed = time.monotonic()
        for name in names[3:]:
            hub.kubectl(
                "create",
                "-f",
                "-",
                input=yaml.safe_dump(hub_job(name, "vision", "vision", "elastic", 1)),
            )
        for name in names:
            fleet.wait_running(name, "vision", 120)
        assert holder() == f"{socket.gethostname()}-{standby}"
        assert time.monotonic() - killed >= 20  # not before the dead leader's Lease expired
        for name in names:
            assert len(fleet.copies(name, "vision")) == 1, (name, fleet.copies(name, "vision"))
            assert len(fleet.running_in(name, "vision")) == 1
    finally:
        fleet.local.stop_hub("gpufleet-hub-standby")
        fleet.local.stop_hub()
        hub.kubectl("delete", "jobs", "--all", "-n", "vision")
        fleet.local.start_hub()


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
    assert figures["backlog_dispatch_per_second"] > 0 and figures["backlog_all_running_seconds"] > 0
    assert figures["hub_writes_per_job"] >= 1  # the create, at least
