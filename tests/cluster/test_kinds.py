"""Workload kinds beyond batch/v1 Jobs, with their real operators running beside the control
plane (JobSet v0.11.1, Kubeflow Trainer v2.2.0, KubeRay v1.6.0, LeaderWorkerSet v0.8.0, Kubeflow
Training Operator v1.7.0, built by hack/k8s/build.sh) and Deployments:
admission within a reservation, preemption across kinds and resumption, and gangs that wait
whole. The figures each test prints (admission and reclaim seconds) are the closing note's."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import yaml
from conftest import skip_unless_ci

from gpufleet.testing.cluster import ClusterError, ControlPlane
from gpufleet.testing.operators import Operators, missing_operators

from .conftest import ControllerProcess, gpufleet_cli, job_manifest, policy_params

pytestmark = pytest.mark.cluster

IMAGE = "example.com/train:1"  # kwok runs no container: any image will do
# kwok ends a Job's pods after this (1 s without it): the workloads here run until deleted
RUN_FOR = {"gpufleet.io/run-for": "600s"}
TORCH_RUNTIME = "torch-distributed"


@pytest.fixture(scope="module")
def operators(cluster: ControlPlane, controller: Any) -> Iterator[Operators]:
    missing = missing_operators(cluster.bin_dir)
    if missing:
        skip_unless_ci(
            f"operators missing in {cluster.bin_dir} ({', '.join(missing)}): run "
            "hack/k8s/build.sh (needs Go 1.26); `make test` does this"
        )
    started = Operators(cluster)
    try:
        started.start(
            "jobset", "trainer-controller-manager", "kuberay-operator", "lws", "training-operator"
        )
        runtime = cluster.bin_dir / "trainer-controller-manager-crds" / "torch_distributed.yaml"
        cluster.apply(list(yaml.safe_load_all(runtime.read_text())))
        # the session's controller started before these kinds existed: it looks for them again
        # every 30 s; the figures the tests print are those of a controller that knows them
        log = cluster.logs / "gpufleet-controller.log"
        cluster.wait_until(
            lambda: all(
                f"{kind} are served now" in log.read_text(errors="replace")
                for kind in ("jobsets", "trainjobs", "rayjobs", "leaderworkersets", "pytorchjobs")
            ),
            60,
            "the controller to watch JobSets, TrainJobs, RayJobs, LeaderWorkerSets, PyTorchJobs",
        )
        yield started
    finally:
        started.stop()


def labels(team: str, cls: str) -> dict[str, str]:
    return {"gpufleet.io/team": team, "gpufleet.io/class": cls}


def container(name: str, gpus: int) -> dict[str, Any]:
    limits = {"nvidia.com/gpu": str(gpus)} if gpus else {}
    return {"name": name, "image": IMAGE, "resources": {"limits": limits}}


def jobset(name: str, namespace: str, team: str, cls: str, replicas: int, gpus: int) -> Any:
    """A JobSet of `replicas` one-pod Jobs of `gpus` GPUs each (and a launcher without GPUs)."""

    def job(replicated: str, count: int, runs: dict[str, Any]) -> dict[str, Any]:
        pod = {"restartPolicy": "Never", "containers": [runs]}
        template = {"metadata": {"annotations": RUN_FOR}, "spec": pod}
        return {"name": replicated, "replicas": count, "template": {"spec": {"template": template}}}

    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": name, "namespace": namespace, "labels": labels(team, cls)},
        "spec": {
            "replicatedJobs": [
                job("launcher", 1, container("launch", 0)),
                job("workers", replicas, container("train", gpus)),
            ]
        },
    }


def trainjob(name: str, namespace: str, team: str, cls: str, nodes: int, gpus: int) -> Any:
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": name, "namespace": namespace, "labels": labels(team, cls)},
        "spec": {
            "runtimeRef": {"name": TORCH_RUNTIME},
            # a runtime patch of another manager, which gpufleet's own must leave in place
            "runtimePatches": [
                {
                    "manager": "example.com/tests",
                    "trainingRuntimeSpec": {
                        "template": {
                            "spec": {
                                "replicatedJobs": [
                                    {
                                        "name": "node",
                                        "template": {
                                            "spec": {
                                                "template": {"metadata": {"annotations": RUN_FOR}}
                                            }
                                        },
                                    }
                                ]
                            }
                        }
                    },
                }
            ],
            "trainer": {
                "image": IMAGE,
                "numNodes": nodes,
                "resourcesPerNode": {"limits": {"nvidia.com/gpu": str(gpus)}},
            },
        },
    }


def rayjob(name: str, namespace: str, team: str, cls: str, workers: int, gpus: int) -> Any:
    """A RayJob whose head has no GPU and whose `workers` workers have `gpus` each."""
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": {"name": name, "namespace": namespace, "labels": labels(team, cls)},
        "spec": {
            "entrypoint": "python -c 'print(1)'",
            "shutdownAfterJobFinishes": True,
            "rayClusterSpec": {
                "headGroupSpec": {
                    "rayStartParams": {},
                    "template": {"spec": {"containers": [container("ray-head", 0)]}},
                },
                "workerGroupSpecs": [
                    {
                        "groupName": "gpu",
                        "replicas": workers,
                        "minReplicas": workers,
                        "maxReplicas": workers,
                        "rayStartParams": {},
                        "template": {"spec": {"containers": [container("ray-worker", gpus)]}},
                    }
                ],
            },
        },
    }


def pytorchjob(name: str, namespace: str, team: str, cls: str, workers: int, gpus: int) -> Any:
    """A PyTorchJob of a Master and `workers` Workers, each with `gpus` GPUs."""

    def replica(count: int) -> dict[str, Any]:
        template = {"metadata": {"annotations": RUN_FOR}, "spec": {"containers": [
            container("pytorch", gpus)]}}  # fmt: skip
        return {"replicas": count, "restartPolicy": "Never", "template": template}

    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": name, "namespace": namespace, "labels": labels(team, cls)},
        "spec": {"pytorchReplicaSpecs": {"Master": replica(1), "Worker": replica(workers)}},
    }


def create(cluster: ControlPlane, body: dict[str, Any]) -> None:
    cluster.kubectl("create", "-f", "-", input=yaml.safe_dump(body))


def gpu_pods(cluster: ControlPlane, namespace: str, label: str, name: str) -> list[Any]:
    """The pods of a workload that ask for GPUs, not being deleted."""
    pods = cluster.get("pods", "-n", namespace, "-l", f"{label}={name}")["items"]
    return [
        p
        for p in pods
        if not p["metadata"].get("deletionTimestamp")
        and any(
            (c.get("resources") or {}).get("limits", {}).get("nvidia.com/gpu")
            for c in p["spec"]["containers"]
        )
    ]


def timed(s: Any, expected: dict[str, str], timeout: float = 90) -> float:
    """Seconds until the GPUWorkloads reach `expected`; on a timeout, what they and the pods
    of the namespace looked like (states, reasons, gates, nodes) and its warnings."""
    started = time.monotonic()
    try:
        s.wait_states(expected, timeout)
    except ClusterError as err:
        cluster = s.cluster
        workloads = [
            (w["metadata"]["name"], w.get("status"))
            for w in cluster.get("gwl", "-n", s.namespace)["items"]
        ]
        pods = [
            (p["metadata"]["name"], p["status"].get("phase"), p["spec"].get("nodeName"), held)
            for p in cluster.get("pods", "-n", s.namespace)["items"]
            for held in [is_held(p)]
        ]
        warnings = cluster.kubectl(
            "get", "events", "-n", s.namespace, "--field-selector=type=Warning", check=False
        ).stdout
        raise AssertionError(
            f"{err}; workloads: {workloads}; pods (phase, node, held): {pods}; "
            f"warnings: {warnings[-2000:]}"
        ) from None
    return time.monotonic() - started


def ray_cluster(cluster: ControlPlane, namespace: str, name: str) -> str:
    return str(cluster.get("rayjob", name, "-n", namespace)["status"]["rayClusterName"])


def suspended(cluster: ControlPlane, resource: str, namespace: str, name: str) -> bool:
    return bool(cluster.get(resource, name, "-n", namespace)["spec"].get("suspend"))


def test_a_jobset_is_admitted_within_its_reservation_and_pinned_to_the_pool(
    scenario: Callable[[int], Any], operators: Operators, cluster: ControlPlane
) -> None:
    s = scenario(2)
    team = s.team("vision")
    s.reserve(team, 16)
    s.apply()
    create(cluster, jobset("train", s.namespace, team, "reserved", 2, 8))
    # the first workload of a kind may wait for the controller to find the kind's CRD
    seconds = timed(s, {"jobset-train": "Running"}, timeout=120)
    print(f"\nJobSet admission to Running: {seconds:.1f}s")
    workload = cluster.get("gwl", "jobset-train", "-n", s.namespace)
    assert workload["spec"]["workloadRef"]["kind"] == "JobSet"
    assert (workload["spec"]["gpus"], workload["spec"]["pods"]) == (8, 2)  # the launcher: none
    pods = gpu_pods(cluster, s.namespace, "jobset.sigs.k8s.io/jobset-name", "train")
    assert len(pods) == 2
    assert {p["spec"]["nodeName"] for p in pods} == set(s.nodes)
    for pod in pods:
        assert pod["spec"]["nodeSelector"]["gpufleet.io/pool"] == s.pool
        assert pod["spec"]["priorityClassName"] == "gpufleet-reserved"
    listed = cluster.kubectl("get", "jobs", "-n", s.namespace, "-o", "name").stdout.split()
    # the JobSet's own Jobs are its parts: no GPUWorkload of their own
    assert len(listed) == 3
    names = cluster.kubectl("get", "gwl", "-n", s.namespace, "-o", "name").stdout.split()
    assert names == ["gpuworkload.gpufleet.io/jobset-train"]


def test_a_reserved_trainjob_reclaims_gpus_from_an_elastic_jobset_which_resumes_after(
    scenario: Callable[[int], Any], operators: Operators, cluster: ControlPlane
) -> None:
    s = scenario(2)
    owner, borrower = s.team("llm"), s.team("sweeps")
    s.reserve(owner, 16)
    s.apply()
    create(cluster, jobset("sweep", s.namespace, borrower, "elastic", 2, 8))
    s.wait_states({"jobset-sweep": "Running"}, 120)
    create(cluster, trainjob("pretrain", s.namespace, owner, "reserved", 2, 8))
    reclaim = timed(s, {"trainjob-pretrain": "Running", "jobset-sweep": "Preempted"})
    print(f"\nTrainJob reclaiming 16 GPUs from a JobSet, to Running: {reclaim:.1f}s")
    assert suspended(cluster, "jobset", s.namespace, "sweep")
    assert gpu_pods(cluster, s.namespace, "jobset.sigs.k8s.io/jobset-name", "sweep") == []
    pods = gpu_pods(cluster, s.namespace, "jobset.sigs.k8s.io/jobset-name", "pretrain")
    assert len(pods) == 2 and {p["spec"]["nodeName"] for p in pods} == set(s.nodes)
    assert all(p["spec"]["nodeSelector"]["gpufleet.io/pool"] == s.pool for p in pods)
    sweep = cluster.get("gwl", "jobset-sweep", "-n", s.namespace)["status"]
    assert sweep["preemptions"] == 1
    assert sweep["preemptedBy"] == f"{s.namespace}/trainjob-pretrain"
    events = s.events("sweep")
    assert "Preempted" in events and "trainjob-pretrain" in events
    # the owner's work ends: the borrowed capacity returns and the JobSet resumes
    cluster.kubectl("delete", "trainjob", "pretrain", "-n", s.namespace)
    resume = timed(s, {"jobset-sweep": "Running"}, timeout=120)
    print(f"JobSet resumed after the TrainJob went: {resume:.1f}s")
    assert not suspended(cluster, "jobset", s.namespace, "sweep")


def test_a_rayjob_is_admitted_preempted_by_a_reserved_job_and_resumed(
    scenario: Callable[[int], Any], operators: Operators, cluster: ControlPlane
) -> None:
    s = scenario(1)
    owner, borrower = s.team("serving"), s.team("tuning")
    s.reserve(owner, 8)
    s.apply()
    create(cluster, rayjob("tune", s.namespace, borrower, "elastic", 1, 8))
    seconds = timed(s, {"rayjob-tune": "Running"}, timeout=120)
    print(f"\nRayJob admission to Running: {seconds:.1f}s")
    label, cluster_name = "ray.io/cluster", ray_cluster(cluster, s.namespace, "tune")
    (worker,) = gpu_pods(cluster, s.namespace, label, cluster_name)
    assert worker["spec"]["nodeName"] == s.nodes[0]
    assert s.job("urgent", owner, "reserved", 8).returncode == 0
    reclaim = timed(s, {"urgent": "Running", "rayjob-tune": "Preempted"})
    print(f"Job reclaiming 8 GPUs from a RayJob, to Running: {reclaim:.1f}s")
    assert suspended(cluster, "rayjob", s.namespace, "tune")
    cluster.wait_until(
        lambda: not gpu_pods(cluster, s.namespace, label, cluster_name), 60, "no worker"
    )
    cluster.kubectl("delete", "job", "urgent", "-n", s.namespace)
    timed(s, {"rayjob-tune": "Running"}, timeout=120)


def test_a_pytorchjob_is_admitted_pinned_preempted_by_a_reserved_job_and_resumed(
    scenario: Callable[[int], Any], operators: Operators, cluster: ControlPlane
) -> None:
    """The Training Operator's PyTorchJob (suspended through runPolicy.suspend): a gang of a
    Master and a Worker on the engine's nodes, preempted whole for the owner's reserved Job,
    resumed when it is gone."""
    s = scenario(2)
    owner, borrower = s.team("research"), s.team("finetune")
    s.reserve(owner, 16)
    s.apply()
    label = "training.kubeflow.org/job-name"
    create(cluster, pytorchjob("tune", s.namespace, borrower, "elastic", 1, 8))
    seconds = timed(s, {"pytorchjob-tune": "Running"}, timeout=120)
    print(f"\nPyTorchJob admission to Running: {seconds:.1f}s")
    workload = cluster.get("gwl", "pytorchjob-tune", "-n", s.namespace)
    assert workload["spec"]["workloadRef"]["kind"] == "PyTorchJob"
    assert (workload["spec"]["gpus"], workload["spec"]["pods"]) == (8, 2)
    pods = gpu_pods(cluster, s.namespace, label, "tune")
    assert len(pods) == 2 and {p["spec"]["nodeName"] for p in pods} == set(s.nodes)
    for pod in pods:
        assert pod["spec"]["nodeSelector"]["gpufleet.io/pool"] == s.pool
        assert pod["spec"]["priorityClassName"].startswith("gpufleet-elastic")
    body = cluster.get("pytorchjob", "tune", "-n", s.namespace)
    assert body["spec"]["runPolicy"]["suspend"] is False
    # the owner takes its reservation back with a plain Job of 2 pods: the gang goes whole
    assert s.job("urgent", owner, "reserved", 8, pods=2).returncode == 0
    reclaim = timed(s, {"urgent": "Running", "pytorchjob-tune": "Preempted"})
    print(f"Job reclaiming 16 GPUs from a PyTorchJob, to Running: {reclaim:.1f}s")
    body = cluster.get("pytorchjob", "tune", "-n", s.namespace)
    assert body["spec"]["runPolicy"]["suspend"] is True
    cluster.wait_until(
        lambda: not gpu_pods(cluster, s.namespace, label, "tune"), 60, "the gang's pods gone"
    )
    status = cluster.get("gwl", "pytorchjob-tune", "-n", s.namespace)["status"]
    assert status["preemptions"] == 1 and status["preemptedBy"] == f"{s.namespace}/urgent"
    cluster.kubectl("delete", "job", "urgent", "-n", s.namespace)
    resume = timed(s, {"pytorchjob-tune": "Running"}, timeout=120)
    print(f"PyTorchJob resumed after the Job went: {resume:.1f}s")
    assert len(gpu_pods(cluster, s.namespace, label, "tune")) == 2


def test_a_gang_that_does_not_fit_waits_whole(
    scenario: Callable[[int], Any],
    operators: Operators,
    cluster: ControlPlane,
    controller: ControllerProcess,
) -> None:
    s = scenario(2)
    team = s.team("research")
    s.apply()
    create(cluster, jobset("wide", s.namespace, team, "elastic", 3, 8))  # 24 GPUs on 16
    create(cluster, trainjob("deep", s.namespace, team, "elastic", 3, 8))

    def reason(name: str) -> str | None:
        # the GPUWorkload is made a moment after its object: not found yet is no reason
        found = cluster.kubectl("get", "gwl", name, "-n", s.namespace, "-o", "json", check=False)
        if found.returncode != 0:
            return None
        reason: str | None = (json.loads(found.stdout).get("status") or {}).get("reason")
        return reason

    cluster.wait_until(
        lambda: all(reason(n) for n in ("jobset-wide", "trainjob-deep")),
        120,
        "a reason for both",
    )
    controller.wait_cycles(5)  # no pod may appear meanwhile
    for name in ("jobset-wide", "trainjob-deep"):
        status = cluster.get("gwl", name, "-n", s.namespace)["status"]
        assert status["state"] == "Pending", status
    assert suspended(cluster, "jobset", s.namespace, "wide")
    assert suspended(cluster, "trainjob", s.namespace, "deep")
    pods = cluster.get("pods", "-n", s.namespace)["items"]
    assert pods == []  # not one pod of either gang


def test_a_rayjob_that_cannot_be_suspended_is_refused_with_the_fix(
    scenario: Callable[[int], Any], operators: Operators, cluster: ControlPlane
) -> None:
    s = scenario(1)
    team = s.team("labs")
    s.apply()
    body = rayjob("keep", s.namespace, team, "elastic", 1, 8)
    body["spec"]["shutdownAfterJobFinishes"] = False
    created = cluster.kubectl("create", "-f", "-", input=yaml.safe_dump(body), check=False)
    assert created.returncode != 0
    assert "shutdownAfterJobFinishes: true" in created.stderr


def deployment(name: str, namespace: str, team: str, cls: str, replicas: int, gpus: int) -> Any:
    selector = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace, "labels": labels(team, cls)},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": selector},
            "template": {
                "metadata": {"labels": selector},
                "spec": {"containers": [container("serve", gpus)]},
            },
        },
    }


def pods_of(cluster: ControlPlane, namespace: str, workload: str) -> list[Any]:
    pods = cluster.get("pods", "-n", namespace, "-l", f"gpufleet.io/workload={workload}")
    return [p for p in pods["items"] if not p["metadata"].get("deletionTimestamp")]


def is_held(pod: Any) -> bool:
    gates = pod["spec"].get("schedulingGates") or []
    return any(g["name"] == "gpufleet.io/admission" for g in gates)


def test_a_deployment_is_held_by_a_gate_admitted_preempted_and_resumed(
    scenario: Callable[[int], Any],
    operators: Operators,
    cluster: ControlPlane,
    controller: ControllerProcess,
) -> None:
    """A Deployment has no suspend field: its pods are created held by gpufleet's scheduling
    gate and released where the engine places them; preempted, they are deleted, and the ones
    its ReplicaSet makes again wait, held, until it is admitted again."""
    s = scenario(2)
    owner, borrower = s.team("research"), s.team("inference")
    s.reserve(owner, 16)
    s.apply()
    create(cluster, deployment("serve", s.namespace, borrower, "elastic", 2, 8))
    seconds = timed(s, {"deployment-serve": "Running"}, timeout=120)
    print(f"\nDeployment admission to Running: {seconds:.1f}s")
    pods = pods_of(cluster, s.namespace, "deployment-serve")
    assert len(pods) == 2 and not any(is_held(p) for p in pods)
    assert {p["spec"]["nodeName"] for p in pods} == set(s.nodes)
    assert all(p["spec"]["nodeSelector"]["gpufleet.io/pool"] == s.pool for p in pods)
    # the owner claims its reservation with a JobSet: the Deployment's pods are deleted and
    # the ones made again stay held
    create(cluster, jobset("train", s.namespace, owner, "reserved", 2, 8))
    reclaim = timed(s, {"jobset-train": "Running", "deployment-serve": "Preempted"})
    print(f"JobSet reclaiming 16 GPUs from a Deployment, to Running: {reclaim:.1f}s")
    cluster.wait_until(
        lambda: len(pods_of(cluster, s.namespace, "deployment-serve")) == 2, 60, "new pods"
    )
    controller.wait_cycles(3)
    again = pods_of(cluster, s.namespace, "deployment-serve")
    assert all(is_held(p) and not p["spec"].get("nodeName") for p in again), (
        [(p["metadata"]["name"], p["spec"].get("nodeName")) for p in again],
        s.events("serve"),
        cluster.get("gwl", "-n", s.namespace)["items"],
        cluster.kubectl("get", "pods", "-n", s.namespace, "-o", "wide").stdout,
    )
    assert not {p["metadata"]["uid"] for p in again} & {p["metadata"]["uid"] for p in pods}
    cluster.kubectl("delete", "jobset", "train", "-n", s.namespace)
    resume = timed(s, {"deployment-serve": "Running"}, timeout=120)
    print(f"Deployment resumed after the JobSet went: {resume:.1f}s")
    assert not any(is_held(p) for p in pods_of(cluster, s.namespace, "deployment-serve"))


def leaderworkerset(name: str, namespace: str, team: str, cls: str, size: int, gpus: int) -> Any:
    """One group of a leader and size-1 workers, each with `gpus` GPUs."""
    template = {"spec": {"containers": [container("serve", gpus)]}}
    return {
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "metadata": {"name": name, "namespace": namespace, "labels": labels(team, cls)},
        "spec": {
            "replicas": 1,
            "leaderWorkerTemplate": {"size": size, "workerTemplate": template},
        },
    }


def test_a_leaderworkerset_is_held_admitted_whole_preempted_and_resumed(
    scenario: Callable[[int], Any], operators: Operators, cluster: ControlPlane
) -> None:
    """A LeaderWorkerSet's leader and workers are one gang, held by the gate like a
    Deployment's pods: released together, deleted on preemption, made again held by LWS."""
    s = scenario(2)
    owner, borrower = s.team("platform"), s.team("serving")
    s.reserve(owner, 16)
    s.apply()
    create(cluster, leaderworkerset("llm", s.namespace, borrower, "elastic", 2, 8))
    seconds = timed(s, {"lws-llm": "Running"}, timeout=120)
    print(f"\nLeaderWorkerSet admission to Running: {seconds:.1f}s")
    pods = pods_of(cluster, s.namespace, "lws-llm")
    assert len(pods) == 2 and not any(is_held(p) for p in pods)
    assert {p["spec"]["nodeName"] for p in pods} == set(s.nodes)
    roles = {p["metadata"]["labels"].get("leaderworkerset.sigs.k8s.io/worker-index") for p in pods}
    assert roles == {"0", "1"}  # LWS's own webhook labelled its leader and its worker
    assert s.job("urgent", owner, "reserved", 8, pods=2).returncode == 0
    reclaim = timed(s, {"urgent": "Running", "lws-llm": "Preempted"})
    print(f"Job reclaiming 16 GPUs from a LeaderWorkerSet, to Running: {reclaim:.1f}s")
    cluster.kubectl("delete", "job", "urgent", "-n", s.namespace)
    resume = timed(s, {"lws-llm": "Running"}, timeout=120)
    print(f"LeaderWorkerSet resumed after the Job went: {resume:.1f}s")
    again = pods_of(cluster, s.namespace, "lws-llm")
    assert len(again) == 2 and not any(is_held(p) for p in again)
    assert not {p["metadata"]["uid"] for p in again} & {p["metadata"]["uid"] for p in pods}


def test_a_leaderworkerset_is_created_held_while_the_controller_is_down(
    scenario: Callable[[int], Any],
    operators: Operators,
    cluster: ControlPlane,
    controller: ControllerProcess,
) -> None:
    """The API server holds a LeaderWorkerSet itself (holding.py), as it holds a Deployment:
    with the controller killed its create succeeds, both its templates (a leader's of its own,
    without metadata, and the workers') get the gate and the label its pods are found by, and
    its pods are made held; once the controller is back it is admitted whole."""
    s = scenario(1)
    team = s.team("inference")
    s.apply()
    cluster.wait_until(lambda: f"team.{team}" in policy_params(cluster), 30, "the params")
    body = leaderworkerset("held", s.namespace, team, "elastic", 2, 4)
    body["spec"]["leaderWorkerTemplate"]["leaderTemplate"] = {
        "spec": {"containers": [container("lead", 4)]}
    }
    controller.kill()  # as in a crash: its webhooks stay registered and answer no one
    try:
        create(cluster, body)
        made = cluster.get("leaderworkerset", "held", "-n", s.namespace)
        assert made["metadata"]["annotations"]["gpufleet.io/managed"] == "true"
        assert "gpufleet.io/check" not in made["metadata"]["annotations"]
        for name in ("leaderTemplate", "workerTemplate"):
            template = made["spec"]["leaderWorkerTemplate"][name]
            assert {"name": "gpufleet.io/admission"} in template["spec"]["schedulingGates"]
            assert template["metadata"]["labels"]["gpufleet.io/workload"] == "lws-held"
            assert template["spec"]["priorityClassName"] == "gpufleet-elastic-normal"
            assert template["spec"]["affinity"]["podAffinity"]  # a gang keeps to one zone
        cluster.wait_until(
            lambda: len(pods_of(cluster, s.namespace, "lws-held")) == 2, 60, "its two pods"
        )
        assert all(is_held(p) for p in pods_of(cluster, s.namespace, "lws-held"))
    finally:
        controller.start()
    timed(s, {"lws-held": "Running"}, timeout=120)
    pods = pods_of(cluster, s.namespace, "lws-held")
    assert len(pods) == 2 and not any(is_held(p) for p in pods)


@pytest.mark.parametrize("kind", ["rayjob", "deployment", "leaderworkerset"])
def test_reserved_work_of_each_kind_is_admitted_within_its_reservation(
    kind: str, scenario: Callable[[int], Any], operators: Operators, cluster: ControlPlane
) -> None:
    """16 GPUs of reserved work on a 16-GPU reservation: admitted at once, its GPU pods with
    the reserved PriorityClass; 8 more of the same team's reserved work waits whole."""
    s = scenario(3)
    team = s.team("owners")
    s.reserve(team, 16)
    s.apply()
    make = {"rayjob": rayjob, "deployment": deployment, "leaderworkerset": leaderworkerset}[kind]
    prefix = {"rayjob": "rayjob", "deployment": "deployment", "leaderworkerset": "lws"}[kind]
    create(cluster, make("fits", s.namespace, team, "reserved", 2, 8))
    s.wait_states({f"{prefix}-fits": "Running"}, 120)
    name = ray_cluster(cluster, s.namespace, "fits") if kind == "rayjob" else f"{prefix}-fits"
    label = "ray.io/cluster" if kind == "rayjob" else "gpufleet.io/workload"
    pods = gpu_pods(cluster, s.namespace, label, name)
    assert len(pods) == 2
    assert all(p["spec"]["priorityClassName"] == "gpufleet-reserved" for p in pods)
    # beyond the reservation, reserved work of the team waits, though a node is free
    create(cluster, make("beyond", s.namespace, team, "reserved", 1, 8))

    def reason() -> str:  # "" until the controller has made its GPUWorkload and decided
        found = cluster.kubectl(
            "get", "gwl", f"{prefix}-beyond", "-n", s.namespace, "-o",
            "jsonpath={.status.reason}", check=False,
        )  # fmt: skip
        return found.stdout

    cluster.wait_until(lambda: bool(reason()), 60, "a reason to wait")
    status = cluster.get("gwl", f"{prefix}-beyond", "-n", s.namespace)["status"]
    assert status["state"] == "Pending", status
    if kind != "rayjob":  # held, not one pod bound
        held = pods_of(cluster, s.namespace, f"{prefix}-beyond")
        assert all(is_held(p) and not p["spec"].get("nodeName") for p in held)


def bare_pod(name: str, namespace: str, team: str, cls: str, gpus: int) -> Any:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {**labels(team, cls), "app": "notebook"},
            "annotations": {"example.com/owner": "ana"},
        },
        "spec": {"containers": [container("notebook", gpus)]},
    }


def test_a_bare_pod_is_held_admitted_preempted_made_again_held_and_resumed(
    scenario: Callable[[int], Any], cluster: ControlPlane, controller: ControllerProcess
) -> None:
    """A bare pod of a team is a workload of its own: created held by the gate, released where
    the engine places it; preempted, gpufleet deletes it and makes it again under its name, held,
    with its labels, annotations and containers; admitted again when capacity returns. Deleted
    by its owner, its GPUWorkload goes with it and nothing makes it again."""
    s = scenario(1)
    owner, borrower = s.team("research"), s.team("notebooks")
    s.reserve(owner, 8)
    s.apply()
    create(cluster, bare_pod("nb", s.namespace, borrower, "elastic", 8))
    seconds = timed(s, {"pod-nb": "Running"}, timeout=60)
    print(f"\nbare pod admission to Running: {seconds:.1f}s")
    (first,) = pods_of(cluster, s.namespace, "pod-nb")
    assert not is_held(first) and first["spec"]["nodeName"] == s.nodes[0]
    assert first["spec"]["priorityClassName"] == "gpufleet-elastic-normal"
    # the class's value and policy, though the API server resolved the class before the
    # webhook named it
    assert first["spec"]["priority"] == 50 and first["spec"]["preemptionPolicy"] == "Never"
    workload = cluster.get("gwl", "pod-nb", "-n", s.namespace)
    assert workload["spec"]["workloadRef"]["kind"] == "Pod"
    assert "ownerReferences" not in workload["metadata"]  # it outlives a preempted pod
    assert s.job("urgent", owner, "reserved", 8).returncode == 0
    reclaim = timed(s, {"urgent": "Running", "pod-nb": "Preempted"})
    print(f"Job reclaiming 8 GPUs from a bare pod, to Running: {reclaim:.1f}s")

    def made_again() -> list[Any]:
        pods = pods_of(cluster, s.namespace, "pod-nb")
        return [p for p in pods if p["metadata"]["uid"] != first["metadata"]["uid"]]

    cluster.wait_until(lambda: bool(made_again()), 60, "the bare pod made again")
    (again,) = made_again()
    assert is_held(again) and not again["spec"].get("nodeName")
    assert again["metadata"]["annotations"]["example.com/owner"] == "ana"
    assert again["metadata"]["labels"]["app"] == "notebook"
    assert again["spec"]["containers"][0]["name"] == "notebook"
    cluster.wait_until(
        lambda: (
            cluster.get("gwl", "pod-nb", "-n", s.namespace)["spec"]["workloadRef"]["uid"]
            == again["metadata"]["uid"]
        ),
        30,
        "the GPUWorkload to record the pod made again",
    )
    status = cluster.get("gwl", "pod-nb", "-n", s.namespace)["status"]
    assert status["state"] == "Preempted" and not status.get("podDeletedAt"), status
    cluster.kubectl("delete", "job", "urgent", "-n", s.namespace)
    resume = timed(s, {"pod-nb": "Running"}, timeout=60)
    print(f"bare pod resumed after the Job went: {resume:.1f}s")
    (running,) = pods_of(cluster, s.namespace, "pod-nb")
    assert running["metadata"]["uid"] == again["metadata"]["uid"] and not is_held(running)
    # its owner cancels it (the pod is deleted): the GPUWorkload goes, and nothing makes the
    # pod again
    listed = gpufleet_cli(cluster, "workloads", "list", "-n", s.namespace)
    assert "pod-nb" in listed and "Pod" in listed
    gpufleet_cli(cluster, "workloads", "cancel", "pod-nb", "-n", s.namespace)
    cluster.wait_until(
        lambda: (
            cluster.kubectl("get", "gwl", "pod-nb", "-n", s.namespace, check=False).returncode != 0
        ),
        30,
        "the GPUWorkload of the deleted pod to go",
    )
    controller.wait_cycles(3)
    assert pods_of(cluster, s.namespace, "pod-nb") == []


def test_a_pod_that_a_controller_owns_is_left_to_it(
    scenario: Callable[[int], Any], cluster: ControlPlane
) -> None:
    """A Job's pods carry the team label when its template does: they are the Job's, not bare
    pods (no GPUWorkload of their own, no gate)."""
    s = scenario(1)
    team = s.team("research")
    s.reserve(team, 8)
    s.apply()
    body = job_manifest("labelled", s.namespace, labels(team, "reserved"), 8, 1, "600s")
    body["spec"]["template"]["metadata"]["labels"] = labels(team, "reserved")
    create(cluster, body)
    s.wait_states({"labelled": "Running"}, 60)
    names = {w["metadata"]["name"] for w in cluster.get("gwl", "-n", s.namespace)["items"]}
    assert names == {"labelled"}


def test_a_reserved_bare_pod_named_by_generate_name_is_admitted_within_its_reservation(
    scenario: Callable[[int], Any], cluster: ControlPlane
) -> None:
    """A bare pod made with generateName has no name when the webhook sees it: it is held all
    the same and managed under the name it got. Reserved, it runs within its team's
    reservation with the reserved class's priority; beyond it, it waits held."""
    s = scenario(2)
    team = s.team("research")
    s.reserve(team, 8)
    s.apply()

    def create_unnamed() -> str:
        body = bare_pod("unused", s.namespace, team, "reserved", 8)
        del body["metadata"]["name"]
        body["metadata"]["generateName"] = "nb-"
        made = cluster.kubectl("create", "-f", "-", "-o", "name", input=yaml.safe_dump(body))
        return str(made.stdout.strip().removeprefix("pod/"))

    name = create_unnamed()
    s.wait_states({f"pod-{name}": "Running"}, 60)
    pod = cluster.get("pod", name, "-n", s.namespace)
    assert not is_held(pod) and pod["spec"]["nodeName"] in s.nodes
    assert (pod["spec"]["priorityClassName"], pod["spec"]["priority"]) == ("gpufleet-reserved", 100)
    beyond = create_unnamed()

    def waits_with_a_reason() -> bool:
        found = cluster.kubectl(
            "get", "gwl", f"pod-{beyond}", "-n", s.namespace, "-o",
            "jsonpath={.status.state}/{.status.reason}", check=False,
        )  # fmt: skip
        return found.stdout.startswith("Pending/") and found.stdout != "Pending/"

    cluster.wait_until(waits_with_a_reason, 60, "the pod beyond the reservation to wait")
    waiting = cluster.get("pod", beyond, "-n", s.namespace)
    assert is_held(waiting) and not waiting["spec"].get("nodeName")  # though a node is free
