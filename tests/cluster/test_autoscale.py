"""Autoscaled GPU pools end to end: the real Karpenter (its kwok provider) launches simulated
nodes for the NodePools the gpufleet controller renders, for the work the controller admits.

One control plane for the module (Karpenter would act on the shared session cluster's pods too):
the tests run in order on one fleet, each building on the state the one before left.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import skip_unless_ci
from engine_helpers import gitops

from gpufleet.model.fleet import fleet_from_objects
from gpufleet.render.karpenter import kwok_instance_types
from gpufleet.testing.cluster import ControlPlane, default_bin_dir, missing_binaries
from gpufleet.testing.metrics import scraped

from .conftest import ControllerProcess, job_manifest

REPO = Path(__file__).resolve().parents[2]
WORK_DIR = REPO / "build" / "test-autoscale"
NS = "research"
AWS = {"amiAlias": "al2023@v20251112"}
POOLS = {
    # reserved work may scale it up to maxGPUs; elastic work may not
    "auto": {
        "provider": "aws",
        "gpuType": "H100",
        "maxGPUs": 32,
        "instanceTypes": ["p5.48xlarge"],
        "zones": ["zone-a", "zone-b"],  # a gang's nodes must come up in one of them
        "consolidateAfter": "5s",
        "nodeSelector": {},
        "aws": AWS,
    },
    # elastic work may scale it up, to 16 GPUs at most; an Azure pool (the NodePool of its
    # AKSNodeClass, with a KWOKNodeClass here), launched as its VM size
    "burst": {
        "provider": "azure",
        "gpuType": "A100",
        "maxGPUs": 16,
        "instanceTypes": ["Standard_ND96amsr_A100_v4"],
        "zones": ["eastus-1"],
        "consolidateAfter": "5s",
        "allowElasticScaleUp": True,
        "nodeSelector": {},
    },
    # its instance type is not among Karpenter's: nothing can be launched for it
    "nolaunch": {
        "provider": "gcp",
        "gpuType": "L4",
        "gpusPerNode": 4,
        "maxGPUs": 8,
        "instanceTypes": ["g2-standard-24"],
        "zones": ["zone-a"],
        "nodeSelector": {},
    },
}
UNOFFERED = "nolaunch"
TEAMS = {"research": {"namespaces": [NS]}, "labs": {"namespaces": [NS]}}


class Autoscaled:
    def __init__(
        self, plane: ControlPlane, objects: list[dict[str, Any]], controller: ControllerProcess
    ) -> None:
        self.plane = plane
        self.objects = objects
        self.controller = controller
        self.created: dict[str, float] = {}

    def job(self, name: str, team: str, cls: str, pool: str, gpus: int = 8, pods: int = 1) -> None:
        labels = {"gpufleet.io/team": team, "gpufleet.io/class": cls, "gpufleet.io/pool": pool}
        body = job_manifest(name, NS, labels, gpus, pods, "3600s")
        self.created[name] = time.monotonic()
        self.plane.kubectl("create", "-f", "-", input=yaml.safe_dump(body))

    def workload(self, name: str) -> dict[str, Any]:
        found = self.plane.kubectl("get", "gwl", name, "-n", NS, "-o", "json", check=False)
        return json.loads(found.stdout) if found.returncode == 0 else {}

    def state(self, name: str) -> tuple[str, str]:
        status = self.workload(name).get("status") or {}
        return status.get("state", ""), status.get("reason", "")

    def wait_state(self, name: str, state: str, timeout: float = 90) -> float:
        """Seconds from the Job's creation until its workload reached `state`."""
        self.plane.wait_until(
            lambda: self.state(name)[0] == state, timeout, f"{name} to be {state}"
        )
        return time.monotonic() - self.created[name]

    def pods(self, job: str) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self.plane.get(
            "pods", "-n", NS, "-l", f"batch.kubernetes.io/job-name={job}"
        )["items"]
        return [p for p in items if not p["metadata"].get("deletionTimestamp")]

    def claims(self, pool: str) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self.plane.get(
            "nodeclaims", "-l", f"karpenter.sh/nodepool={pool}"
        )["items"]
        return items

    def launches(self) -> list[str]:
        """What Karpenter said when it created NodeClaims and why (the pods it found), for a
        failure's message: a surplus claim shows which batch of pods asked for it."""
        log = self.plane.logs / "karpenter-kwok.log"
        said = log.read_text(errors="replace").splitlines() if log.is_file() else []
        return [
            line for line in said
            if "found provisionable pod" in line or "created nodeclaim" in line
        ]  # fmt: skip

    def story(self, job: str) -> dict[str, Any]:
        """What became of a Job's pods, for a failure's message: each pod (those being deleted
        too), its workload's record, the Events of the namespace, and what Karpenter and the
        controller logged of disruptions, evictions and the Job."""
        pods = self.plane.get("pods", "-n", NS, "-l", f"batch.kubernetes.io/job-name={job}")[
            "items"
        ]
        events = self.plane.get("events", "-n", NS)["items"]

        def said(log: str, *words: str) -> list[str]:
            path = self.plane.logs / log
            lines = path.read_text(errors="replace").splitlines() if path.is_file() else []
            return [line[:300] for line in lines if any(w in line.lower() for w in words)][-30:]

        return {
            "pods": [
                (
                    p["metadata"]["name"],
                    p["spec"].get("nodeName"),
                    (p.get("status") or {}).get("phase"),
                    p["metadata"].get("deletionTimestamp"),
                )
                for p in pods
            ],
            "workload": self.workload(job).get("status"),
            "events": [
                (e["involvedObject"].get("name"), e.get("reason"), (e.get("message") or "")[:200])
                for e in events
            ],
            "karpenter": said("karpenter-kwok.log", "disrupt", "drift", "evict", "delet", "termin"),
            "controller": said("gpufleet-controller.log", job, "warning", "error"),
        }

    def settled(self) -> None:
        """Wait until a wrong scale-up would have begun, instead of a number of seconds: three
        whole controller cycles (each would release what it admits), then every released pod
        of the namespace bound (Karpenter launches nodes only for released pods that the
        scheduler could not place; once none waits unbound it has nothing to launch for)."""
        self.controller.wait_cycles(3)

        def released_all_bound() -> bool:
            pods = self.plane.get("pods", "-n", NS)["items"]
            released = [
                p
                for p in pods
                if not p["spec"].get("schedulingGates")
                and not p["metadata"].get("deletionTimestamp")
            ]
            return all(p["spec"].get("nodeName") for p in released)

        self.plane.wait_until(released_all_bound, 60, "every released pod to be bound")

    def karpenter_reconciles(self, controller: str) -> int:
        """How many times Karpenter's `controller` has reconciled (its /metrics)."""
        port = self.plane.ports["karpenter-metrics"]
        series = f'controller_runtime_reconcile_time_seconds_count{{controller="{controller}"}}'
        return int(scraped(f"http://127.0.0.1:{port}/metrics", series) or 0)

    def karpenter_saw(self, nodepool: str) -> None:
        """Wait until Karpenter would have disrupted nodes for a change of `nodepool`: it has
        observed the NodePool's generation, then its disruption loop (which replaces drifted
        nodes) has passed twice, the first of them possibly begun before; and the
        controller's own cycles."""

        def observed() -> bool:
            pool = self.plane.get("nodepool", nodepool)
            conditions = (pool.get("status") or {}).get("conditions") or []
            ready = [c for c in conditions if c["type"] == "Ready"]
            return (
                bool(ready) and ready[0].get("observedGeneration") == pool["metadata"]["generation"]
            )

        self.plane.wait_until(observed, 60, f"Karpenter to observe NodePool {nodepool}")
        passes = self.karpenter_reconciles("disruption")
        self.plane.wait_until(
            lambda: self.karpenter_reconciles("disruption") >= passes + 2,
            120,
            "two passes of Karpenter's disruption loop",
        )
        self.controller.wait_cycles(3)

    def gated(self, job: str) -> bool:
        """Whether every pod of the Job still waits at a scheduling gate (Karpenter ignores
        such pods: it launches nothing for them)."""
        pods = self.pods(job)
        return bool(pods) and all(p["spec"].get("schedulingGates") for p in pods)

    def nodes(self, pool: str) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self.plane.get("nodes", "-l", f"gpufleet.io/pool={pool}")[
            "items"
        ]
        return items

    def pool_status(self, pool: str) -> dict[str, Any]:
        status: dict[str, Any] = self.plane.get("gpupool", pool).get("status") or {}
        return status


@pytest.fixture(scope="module")
def autoscaled(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Autoscaled]:
    bin_dir = default_bin_dir()
    missing = missing_binaries(bin_dir)
    if missing:
        skip_unless_ci(
            f"binaries missing in {bin_dir} ({', '.join(missing)}): run hack/k8s/build.sh"
        )
    if WORK_DIR.exists():
        shutil.rmtree(WORK_DIR)
    objects = gitops(
        {name: {"gpusPerNode": 8, **spec} for name, spec in POOLS.items()},
        TEAMS,
        {("research", "auto"): 16, ("research", UNOFFERED): 4},
    )
    offered = [o for o in objects if o["metadata"]["name"] != UNOFFERED]
    loaded = fleet_from_objects(offered, "test")
    assert not loaded.problems, loaded.problems
    plane = ControlPlane(WORK_DIR, bin_dir)
    plane.start()
    controller = ControllerProcess(plane, tmp_path_factory.mktemp("autoscale-controller"))
    try:
        plane.start_autoscaler(kwok_instance_types(loaded.fleet))
        controller.start()  # it installs gpufleet's CRDs and renders the NodePools
        plane.kubectl("create", "namespace", NS)
        plane.apply(objects)
        plane.wait_until(
            lambda: (
                {"auto", "burst"}
                <= {p["metadata"]["name"] for p in plane.get("nodepools")["items"]}
            ),
            60,
            "the controller to render the pools' NodePools",
        )
        yield Autoscaled(plane, objects, controller)
    finally:
        controller.stop()
        plane.stop()


def test_the_controller_renders_nodepools_for_karpenters_kwok_provider(
    autoscaled: Autoscaled,
) -> None:
    pool = autoscaled.plane.get("nodepool", "auto")
    template = pool["spec"]["template"]
    assert template["spec"]["nodeClassRef"] == {
        "group": "karpenter.kwok.sh",
        "kind": "KWOKNodeClass",
        "name": "auto",
    }
    assert pool["spec"]["limits"] == {"nvidia.com/gpu": "32"}
    assert template["metadata"]["labels"]["gpufleet.io/pool"] == "auto"
    assert (
        autoscaled.plane.get("kwoknodeclass", "auto")["metadata"]["labels"][
            "app.kubernetes.io/managed-by"
        ]
        == "gpufleet"
    )
    assert autoscaled.nodes("auto") == [] and autoscaled.nodes("burst") == []
    assert autoscaled.plane.get("nodepool", UNOFFERED)["spec"]["limits"] == {"nvidia.com/gpu": "8"}


def test_a_reserved_gang_gets_exactly_the_nodes_it_needs(autoscaled: Autoscaled) -> None:
    autoscaled.job("gang", "research", "reserved", "auto", gpus=8, pods=2)
    seconds = autoscaled.wait_state("gang", "Running", 120)
    claims = autoscaled.claims("auto")
    # ceil(16 GPUs / 8 per node), no more (this once failed with 3: the message says which
    # pods Karpenter found in each batch, and the gang's pods when they were made)
    made = [
        (p["metadata"]["name"], p["metadata"]["creationTimestamp"]) for p in autoscaled.pods("gang")
    ]
    assert len(claims) == 2, (autoscaled.launches(), made)
    assert {c["metadata"]["labels"]["node.kubernetes.io/instance-type"] for c in claims} == {
        "p5.48xlarge"
    }
    # in one zone of the two, the one the admission pinned the gang to
    (zone,) = {c["metadata"]["labels"]["topology.kubernetes.io/zone"] for c in claims}
    pods = autoscaled.pods("gang")
    for pod in pods:  # each pinned to it as it was released
        (node_term,) = pod["spec"]["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"
        ]["nodeSelectorTerms"]
        assert node_term["matchExpressions"] == [
            {"key": "topology.kubernetes.io/zone", "operator": "In", "values": [zone]}
        ]
    # and the pod affinity that holds a replacement pod in its mates' zone
    template = autoscaled.plane.get("job", "gang", "-n", NS)["spec"]["template"]
    (term,) = template["spec"]["affinity"]["podAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]
    assert term["topologyKey"] == "topology.kubernetes.io/zone"
    # (this once found one pod of the two, a moment after both ran: the message says what became
    # of the other)
    story = autoscaled.story("gang")
    assert len(pods) == 2 and all(p["status"]["phase"] == "Running" for p in pods), story
    assert {p["spec"]["nodeName"] for p in pods} == {
        n["metadata"]["name"] for n in autoscaled.nodes("auto")
    }, story
    autoscaled.plane.wait_until(
        lambda: autoscaled.pool_status("auto").get("totalGPUs") == 16,
        30,
        "the pool's status to count the new nodes",
    )
    print(f"\nreserved 16-GPU gang: created to Running with scale-up in {seconds:.1f}s")


def test_elastic_work_grows_a_pool_only_where_allowed_and_within_maxgpus(
    autoscaled: Autoscaled,
) -> None:
    # `auto` does not let elastic work scale it up: its nodes are busy, so this waits
    autoscaled.job("no-scale", "labs", "elastic", "auto")
    # `burst` does, up to 16 GPUs: two of three 8-GPU jobs run
    for name in ("burst-1", "burst-2", "burst-3"):
        autoscaled.job(name, "labs", "elastic", "burst")
    autoscaled.wait_state("burst-1", "Running", 120)
    autoscaled.wait_state("burst-2", "Running", 120)
    autoscaled.settled()
    assert autoscaled.state("burst-3") == ("Pending", "PoolFull")
    assert autoscaled.state("no-scale") == ("Pending", "PoolFull")
    assert autoscaled.gated("burst-3") and autoscaled.gated("no-scale")
    burst = autoscaled.claims("burst")
    assert len(burst) == 2
    assert {c["metadata"]["labels"]["node.kubernetes.io/instance-type"] for c in burst} == {
        "Standard_ND96amsr_A100_v4"
    }
    assert len(autoscaled.claims("auto")) == 2
    for name in ("no-scale", "burst-3"):
        assert all(p["status"]["phase"] != "Running" for p in autoscaled.pods(name))


def test_an_interrupted_node_is_replaced_and_its_work_resumes(autoscaled: Autoscaled) -> None:
    """Deleting a NodeClaim is what Karpenter does on a spot interruption: the node is drained
    and goes away; the gang's pod there must come back on a replacement node, the Job must not
    count it as a failure, and the elastic work waiting must not take the replacement."""
    pods = autoscaled.pods("gang")
    victim_node = pods[0]["spec"]["nodeName"]
    (claim,) = [c for c in autoscaled.claims("auto") if c["status"].get("nodeName") == victim_node]
    started = time.monotonic()
    autoscaled.plane.kubectl("delete", "nodeclaim", claim["metadata"]["name"], "--wait=false")

    def resumed() -> bool:
        now = autoscaled.pods("gang")
        return (
            len(now) == 2
            and all(p["status"].get("phase") == "Running" for p in now)
            and victim_node not in {p["spec"].get("nodeName") for p in now}
        )

    autoscaled.plane.wait_until(resumed, 120, "the gang to run again without the lost node")
    seconds = time.monotonic() - started
    assert autoscaled.state("gang")[0] == "Running"
    job = autoscaled.plane.get("job", "gang", "-n", NS)
    assert not job["status"].get("failed")
    autoscaled.plane.wait_until(
        lambda: victim_node not in {n["metadata"]["name"] for n in autoscaled.nodes("auto")},
        120,
        "Karpenter to remove the drained node",
    )
    assert len(autoscaled.claims("auto")) == 2  # one replacement, no more
    # the replacement node was launched for the gang's pod, not for the elastic work waiting
    assert autoscaled.state("no-scale") == ("Pending", "PoolFull")
    print(f"\nnode lost to Running again on a replacement: {seconds:.1f}s")


def test_a_gitops_change_of_a_pool_updates_its_nodepool_without_disruption(
    autoscaled: Autoscaled,
) -> None:
    before = {p["metadata"]["name"]: p["spec"]["nodeName"] for p in autoscaled.pods("gang")}
    pool = next(o for o in autoscaled.objects if o["metadata"]["name"] == "auto")
    pool["spec"]["maxGPUs"] = 40
    pool["spec"]["instanceTypes"] = ["p5.48xlarge", "p5e.48xlarge"]
    autoscaled.plane.apply([pool])
    autoscaled.plane.wait_until(
        lambda: (
            autoscaled.plane.get("nodepool", "auto")["spec"]["limits"] == {"nvidia.com/gpu": "40"}
        ),
        60,
        "the NodePool to follow the pool's maxGPUs",
    )
    requirements = autoscaled.plane.get("nodepool", "auto")["spec"]["template"]["spec"][
        "requirements"
    ]
    types = next(r for r in requirements if r["key"] == "node.kubernetes.io/instance-type")
    assert types["values"] == ["p5.48xlarge", "p5e.48xlarge"]
    autoscaled.karpenter_saw("auto")
    drifted = [
        c["metadata"]["name"]
        for c in autoscaled.claims("auto")
        for condition in (c.get("status") or {}).get("conditions") or []
        if condition["type"] == "Drifted" and condition["status"] == "True"
    ]
    assert drifted == []
    after = {p["metadata"]["name"]: p["spec"]["nodeName"] for p in autoscaled.pods("gang")}
    assert after == before
    assert autoscaled.state("gang")[0] == "Running"


def test_work_whose_nodes_cannot_be_launched_says_why(autoscaled: Autoscaled) -> None:
    """Karpenter has no offering of the pool's instance type: the reserved work admitted onto
    the pool's nodes-to-be says what Karpenter said, instead of waiting without a word."""
    autoscaled.job("unlaunchable", "research", "reserved", UNOFFERED, gpus=4)
    autoscaled.plane.wait_until(
        lambda: autoscaled.state("unlaunchable")[1] == "NodesNotLaunched",
        90,
        "the workload to say why its node is not launched",
    )
    status = autoscaled.workload("unlaunchable")["status"]
    assert status["state"] in ("Queued", "Starting")
    assert status["message"].startswith(f"Karpenter launches no node of pool {UNOFFERED} for it: ")
    # its instance type offered nowhere, Karpenter leaves the NodePool out and says so of others
    assert f"does not consider NodePool {UNOFFERED}" in status["message"]
    assert autoscaled.nodes(UNOFFERED) == []
    events = autoscaled.plane.kubectl(
        "get", "events", "-n", NS, "--field-selector=involvedObject.name=unlaunchable"
    ).stdout
    assert "NodesNotLaunched" in events
    seconds = time.monotonic() - autoscaled.created["unlaunchable"]
    print(f"\nwithin {seconds:.0f}s of its creation: {status['message']}")


def test_empty_nodes_are_removed_and_the_pool_status_follows(autoscaled: Autoscaled) -> None:
    autoscaled.plane.kubectl("delete", "jobs", "--all", "-n", NS, "--wait=false")
    started = time.monotonic()
    autoscaled.plane.wait_until(
        lambda: not autoscaled.nodes("auto") and not autoscaled.nodes("burst"),
        240,
        "Karpenter to remove the empty nodes",
    )
    seconds = time.monotonic() - started
    autoscaled.plane.wait_until(
        lambda: (
            autoscaled.pool_status("auto").get("totalGPUs", 0) == 0
            and autoscaled.pool_status("burst").get("totalGPUs", 0) == 0
        ),
        30,
        "the pools' status to follow",
    )
    print(f"\n4 empty nodes removed in {seconds:.1f}s (consolidateAfter 5s)")
