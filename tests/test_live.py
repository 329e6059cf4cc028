"""The live CLI's summaries and explanations (pure parts; the cluster tests run the commands)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from gpufleet.api import models, views

NOW = datetime(2026, 1, 1, 12, tzinfo=UTC)


def workload(name: str, state: str, **status: Any) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "nlp", "name": name},
        "spec": {"team": "nlp", "class": "elastic", "priority": 50, "gpus": 8, "pods": 2},
        "status": {"state": state, **status},
    }


def test_fleet_summary_counts_gpus_queue_and_teams() -> None:
    pools = [
        {
            "metadata": {"name": "h100"},
            "spec": {"gpuType": "H100"},
            "status": {"totalGPUs": 32, "healthyGPUs": 32, "allocatedGPUs": 24, "idleGPUs": 8},
        }
    ]
    summary = views.status(
        views.Objects(
            pools=pools,
            workloads=[
                workload("a", "Running"),
                workload("b", "Pending"),
                workload("c", "Preempted"),
            ],
        )
    ).model_dump(by_alias=True)
    assert summary["pools"][0]["utilisationPercent"] == 75.0
    assert summary["totals"]["idleGPUs"] == 8
    assert summary["queueDepth"] == {"nlp": 2}
    assert summary["topTeams"] == [{"team": "nlp", "usedGPUs": 16.0}]


def test_explain_waiting_and_running() -> None:
    waiting = views.explain(
        views.workload(
            workload(
                "b",
                "Pending",
                reason="PoolFull",
                message="needs 16 GPUs in pool h100; 8 are free",
                position=2,
                eta="2026-01-01T14:00:00Z",
            )
        )
    )
    assert "nlp/b (Job, elastic, team nlp, priority 50, 2 pod(s) x 8 GPU) is Pending" in waiting
    assert "waiting: PoolFull" in waiting
    assert "needs 16 GPUs in pool h100; 8 are free" in waiting
    assert "2nd in team nlp's queue" in waiting
    assert "around 2026-01-01T14:00:00Z" in waiting
    running = views.explain(
        views.workload(
            workload("a", "Running", pool="h100", nodes=["h100-1", "h100-2"], preemptions=1)
        )
    )
    assert "is Running in pool h100 on h100-1, h100-2" in running
    assert "preempted 1 time(s) before" in running


def test_submit_builds_a_labelled_gang_job() -> None:
    from gpufleet.kube.manifests import job_manifest, label_manifest

    job = job_manifest(
        "sweep",
        "nlp",
        "nlp",
        "elastic",
        "high",
        8,
        2,
        "img:1",
        ["python", "t.py"],
        "us-west-h100",
        "10m",
    )
    assert job["metadata"]["labels"] == {
        "gpufleet.io/team": "nlp",
        "gpufleet.io/class": "elastic",
        "gpufleet.io/priority": "high",
        "gpufleet.io/pool": "us-west-h100",
    }
    assert job["spec"]["parallelism"] == job["spec"]["completions"] == 2
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"] == {"nvidia.com/gpu": "8"}
    assert container["command"] == ["python", "t.py"]
    mine = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "x", "labels": {"gpufleet.io/team": "vision", "app": "a"}},
    }
    labelled = label_manifest(mine, "nlp", "reserved", "normal", "ns")
    assert labelled["metadata"]["labels"]["gpufleet.io/team"] == "vision"  # the user's wins
    assert labelled["metadata"]["labels"]["gpufleet.io/class"] == "reserved"
    assert labelled["metadata"]["namespace"] == "ns"


def test_observe_mode_groups_gpu_nodes_by_product() -> None:

    from gpufleet.kube import observe

    def node(name: str, product: str, gpus: int, ready: bool = True) -> dict[str, Any]:
        return {
            "metadata": {"name": name, "labels": {"nvidia.com/gpu.product": product}},
            "spec": {},
            "status": {
                "allocatable": {"nvidia.com/gpu": str(gpus)},
                "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
            },
        }

    def pod(on: str, gpus: int, phase: str = "Running") -> dict[str, Any]:
        return {
            "metadata": {"name": "p", "namespace": "x"},
            "status": {"phase": phase},
            "spec": {
                "nodeName": on,
                "containers": [{"resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}],
            },
        }

    nodes = [
        node("a", "NVIDIA-H100", 8),
        node("b", "NVIDIA-H100", 8, ready=False),
        node("c", "NVIDIA-L4", 4),
        {"metadata": {"name": "cpu"}, "status": {}},
    ]
    pools = observe.discovered_pools(nodes, [pod("a", 3), pod("c", 4), pod("a", 8, "Succeeded")])
    assert pools == [
        {
            "pool": "observed-nvidia-h100",
            "gpuType": "NVIDIA-H100",
            "totalGPUs": 16,
            "healthyGPUs": 8,
            "allocatedGPUs": 3,
            "idleGPUs": 5,
        },
        {
            "pool": "observed-nvidia-l4",
            "gpuType": "NVIDIA-L4",
            "totalGPUs": 4,
            "healthyGPUs": 4,
            "allocatedGPUs": 4,
            "idleGPUs": 0,
        },
    ]


def test_stats_count_by_state_team_and_class_with_gpu_hours() -> None:
    rows = views.workloads(
        [
            workload("a", "Running", startedAt="2026-01-01T10:00:00Z"),  # 16 GPUs for 2 h
            workload("b", "Pending"),
            workload(
                "c",
                "Completed",
                startedAt="2026-01-01T09:00:00Z",
                finishedAt="2026-01-01T09:30:00Z",
            ),
        ]
    )
    found = views.stats(rows, NOW)
    assert found.total == 3 and found.gpu_hours == 16 * 2 + 16 * 0.5
    assert [(c.key, c.workloads, c.gpus) for c in found.by_state] == [
        ("Completed", 1, 16.0), ("Pending", 1, 16.0), ("Running", 1, 16.0),
    ]  # fmt: skip
    assert [(c.key, c.workloads) for c in found.by_team] == [("nlp", 3)]
    assert found.waiting_gpus == 16


def test_health_counts_nodes_and_lists_those_to_look_at() -> None:
    def node(name: str, ready: bool, healthy: str, quarantined: bool = False) -> models.Node:
        return models.Node(node=name, pool="p", gpus=8, allocated_gpus=0, ready=ready,
                           gpu_healthy=healthy, quarantined=quarantined)  # fmt: skip

    nodes = [node("a", True, "True"), node("b", True, "False"), node("c", False, "Unknown"),
             node("d", True, "True", quarantined=True)]  # fmt: skip
    found = views.health(nodes)
    assert (found.nodes, found.ready, found.gpu_healthy, found.gpu_unhealthy) == (4, 3, 2, 1)
    assert (found.unknown, found.quarantined, found.gpus, found.unhealthy_gpus) == (1, 1, 32, 24)
    assert [n.node for n in found.problems] == ["b", "c", "d"]
