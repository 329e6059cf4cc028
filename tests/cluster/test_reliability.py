"""The loop under failure, on the real control plane: the API server restarted in the middle of
a reclaim, and the controller SIGKILLed during a burst of creates. In both, nothing may be lost
and nothing admitted twice."""

from __future__ import annotations

import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from gpufleet.kube.observe import held
from gpufleet.testing.cluster import ControlPlane

from .conftest import ControllerProcess


def _live_pods(cluster: ControlPlane, namespace: str) -> list[dict[str, Any]]:
    """Pods that hold or may take GPUs: not finished, not being deleted, not held (a
    preempted Job's new pods wait at the gate)."""
    return [
        p
        for p in cluster.get("pods", "-n", namespace)["items"]
        if p["status"].get("phase") in ("Pending", "Running")
        and not p["metadata"].get("deletionTimestamp")
        and not held(p)
    ]


def _states(cluster: ControlPlane, namespace: str) -> Counter[str]:
    """GPUWorkloads per "state (reason)"."""
    workloads = cluster.get("gwl", "-n", namespace)["items"]
    return Counter(
        " ".join(
            filter(
                None, [(w.get("status") or {}).get("state"), (w.get("status") or {}).get("reason")]
            )
        )
        or "-"
        for w in workloads
    )


def _job_controller_events(cluster: ControlPlane, namespace: str) -> Counter[tuple[str, str]]:
    """(Job, reason) -> how often the Job controller reported it (aggregated counts summed)."""
    counts: Counter[tuple[str, str]] = Counter()
    for event in cluster.get("events", "-n", namespace)["items"]:
        if event["involvedObject"].get("kind") == "Job":
            key = (event["involvedObject"]["name"], event["reason"])
            counts[key] += int(event.get("count") or 1)
    return counts


def _assert_admitted_once(cluster: ControlPlane, namespace: str, names: list[str]) -> None:
    """Every Job in `names` runs exactly its one pod, was never suspended after its admission
    (the Job controller deleted none of its pods) and has one GPUWorkload; no node holds more
    than its 8 GPUs."""
    live = _live_pods(cluster, namespace)
    per_node: Counter[str] = Counter()
    per_job: Counter[str] = Counter()
    for pod in live:
        gpus = int(pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"])
        per_node[pod["spec"].get("nodeName", "unbound")] += gpus
        per_job[pod["metadata"]["labels"].get("job-name", "")] += 1
    assert all(v <= 8 for k, v in per_node.items() if k != "unbound"), per_node
    assert {n: per_job[n] for n in names} == dict.fromkeys(names, 1)
    events = _job_controller_events(cluster, namespace)
    assert not [n for n in names if events[(n, "SuccessfulDelete")]], "a Job lost its pod"
    assert all(events[(n, "Resumed")] <= 1 for n in names)
    workloads = cluster.get("gwl", "-n", namespace)["items"]
    held = Counter(w["metadata"]["name"] for w in workloads)
    assert all(held[n] == 1 for n in names)
    assert not [
        w for w in workloads if w["metadata"]["name"] in names and w["status"].get("preemptions")
    ]


def test_api_server_restart_in_the_middle_of_a_reclaim(
    cluster: ControlPlane, controller: ControllerProcess, scenario: Any
) -> None:
    s = scenario(2)
    owner, batch = s.team("owner"), s.team("batch")
    s.reserve(owner, 8)
    s.apply()
    elastic = [f"elastic-{i}" for i in range(16)]
    for name in elastic:
        s.job(name, batch, "elastic", 1)
    s.wait_states(dict.fromkeys(elastic, "Running"), 90)
    reserved = [f"reserved-{i}" for i in range(8)]
    for name in reserved:
        s.job(name, owner, "reserved", 1)
    # restart as soon as the reclaim has begun: evictions and admissions in flight
    cluster.wait_until(
        lambda: any(s.state(n) == "Preempted" for n in elastic), 60, "the first preemption"
    )
    cluster.restart_apiserver(down_for=2)
    s.wait_states(dict.fromkeys(reserved, "Running"), 120)
    states = Counter(s.state(n) for n in elastic)
    assert states == {"Running": 8, "Preempted": 8}, states
    _assert_admitted_once(cluster, s.namespace, reserved)
    running = [n for n in elastic if s.state(n) == "Running"]
    assert len(_live_pods(cluster, s.namespace)) == len(reserved) + len(running)
    # the victims' pods were deleted uncounted: no Job counts a failed pod
    jobs = cluster.get("jobs", "-n", s.namespace)["items"]
    assert not [j["metadata"]["name"] for j in jobs if (j.get("status") or {}).get("failed")]


def test_controller_killed_during_a_burst_of_creates(
    cluster: ControlPlane, controller: ControllerProcess, scenario: Any
) -> None:
    """500 Jobs from 8 threads; the controller is SIGKILLed after about 150 and started again.
    No create is refused: the API server holds Jobs itself (holding.py), whether or not the
    controller answers. Every Job ends admitted exactly once."""
    jobs = 500
    s = scenario(-(-jobs // 8))  # a GPU for every Job
    batch = s.team("batch")
    s.apply()
    batch_api = client.BatchV1Api(config.new_client_from_config(str(cluster.kubeconfig)))
    created: list[str] = []
    refused: list[str] = []
    names = [f"burst-{i}" for i in range(jobs)]

    def create(name: str) -> None:
        body = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": name, "labels": {"gpufleet.io/team": batch}},
            "spec": {
                "backoffLimit": 0,
                "template": {
                    # kwok ends a pod after this long (without it, at once)
                    "metadata": {"annotations": {"gpufleet.io/run-for": "600s"}},
                    "spec": {
                        "restartPolicy": "Never",
                        "containers": [
                            {
                                "name": "c",
                                "image": "x",
                                "resources": {"limits": {"nvidia.com/gpu": "1"}},
                            }
                        ],
                    },
                },
            },
        }
        try:
            batch_api.create_namespaced_job(s.namespace, body, _preload_content=False)
        except ApiException as err:
            refused.append(f"{name}: {err.status} {err.body}")
        else:
            created.append(name)

    with ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(create, n) for n in names]
        while len(created) + len(refused) < 150:
            time.sleep(0.05)
        controller.kill()
        controller.start()
        for future in futures:
            future.result()
    assert not refused, refused[:5]
    assert sorted(created) == sorted(names)
    deadline = time.monotonic() + 300
    while (states := _states(cluster, s.namespace)) != {"Running": jobs}:
        assert time.monotonic() < deadline, f"not all {jobs} Jobs Running after 300 s: {states}"
        time.sleep(1)
    _assert_admitted_once(cluster, s.namespace, names)
    jobs_listed = cluster.get("jobs", "-n", s.namespace)["items"]
    assert all(j["spec"].get("suspend") is False for j in jobs_listed)
