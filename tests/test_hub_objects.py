"""The hub's pure part (gpufleet/kube/hub.py): the copy a worker gets of a hub Job, the status
mirrored back, and a worker's snapshot from its nodes and GPUWorkloads."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from engine_helpers import gitops
from typer.testing import CliRunner

from gpufleet.api import views
from gpufleet.cli.main import app
from gpufleet.kube.hub import (
    copies_by_hub_job,
    copy_for_worker,
    hub_workload,
    is_hub_job,
    mirrored_status,
    pinned_cluster,
    stale_in,
    worker_snapshot,
)
from gpufleet.kube.request import RequestError
from gpufleet.model.fleet import Fleet, fleet_from_objects
from gpufleet.model.states import WorkloadState

NOW = datetime(2026, 12, 1, tzinfo=UTC)
GPUS_4 = {"limits": {"nvidia.com/gpu": "4"}}


def fleet() -> Fleet:
    objects = gitops(
        {"east-h100": {"cluster": "east"}, "west-h100": {"cluster": "west"}},
        {"nlp": {"namespaces": ["nlp"]}},
        {("nlp", "west-h100"): 16},
    )
    for name in ("east", "west"):
        objects.append(
            {
                "apiVersion": "gpufleet.io/v1alpha1",
                "kind": "Cluster",
                "metadata": {"name": name},
                "spec": {"kubeconfigSecretRef": {"name": name, "key": "kubeconfig"}},
            }
        )
    loaded = fleet_from_objects(objects)
    assert loaded.problems == []
    return loaded.fleet


def hub_job(**labels: str) -> dict[str, Any]:
    """A hub Job as the hub's API server returns it (selector and template labels set)."""
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": "train",
            "namespace": "nlp",
            "uid": "u-1",
            "creationTimestamp": "2026-12-01T00:00:00Z",
            "labels": {"gpufleet.io/team": "nlp", "gpufleet.io/class": "reserved", **labels},
            "annotations": {
                "gpufleet.io/dispatched-to": "west",
                "gpufleet.io/stale-in": "east",
                "owner": "ana",
            },
        },
        "spec": {
            "managedBy": "gpufleet.io/hub",
            "parallelism": 2,
            "completions": 2,
            "selector": {"matchLabels": {"batch.kubernetes.io/controller-uid": "u-1"}},
            "template": {
                "metadata": {
                    "labels": {
                        "batch.kubernetes.io/controller-uid": "u-1",
                        "batch.kubernetes.io/job-name": "train",
                        "controller-uid": "u-1",
                        "job-name": "train",
                        "app": "train",
                    }
                },
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "t", "image": "x", "resources": GPUS_4}],
                },
            },
        },
    }


def test_a_copy_is_the_job_without_what_the_hub_set() -> None:
    job = hub_job()
    job["spec"]["ttlSecondsAfterFinished"] = 0
    made = copy_for_worker(job)
    assert "managedBy" not in made["spec"] and "selector" not in made["spec"]
    # it outlives its end: the hub mirrors how it ended (the hub Job keeps its TTL)
    assert "ttlSecondsAfterFinished" not in made["spec"]
    assert job["spec"]["ttlSecondsAfterFinished"] == 0
    assert made["spec"]["template"]["metadata"]["labels"] == {"app": "train"}
    assert made["metadata"]["labels"]["gpufleet.io/hub-job"] == "u-1"
    assert made["metadata"]["labels"]["gpufleet.io/team"] == "nlp"
    assert made["metadata"]["annotations"] == {"owner": "ana"}
    assert job["spec"]["managedBy"] == "gpufleet.io/hub"  # the hub Job itself is untouched
    # what the user asks of gpufleet goes along; gpufleet's other marks stay at the hub
    asked = {"gpufleet.io/gpu-types": "H100,A100", "gpufleet.io/external-id": "run-42"}
    marks = {
        "gpufleet.io/managed": "true",
        "gpufleet.io/submitter": "ana",
        "gpufleet.io/state": "Running",
    }
    job["metadata"]["annotations"].update({**asked, **marks})
    assert copy_for_worker(job)["metadata"]["annotations"] == {"owner": "ana", **asked}
    unlabelled = {**made, "metadata": {**made["metadata"], "labels": {}}}
    assert copies_by_hub_job([made, unlabelled]) == {"u-1": made}


def test_what_the_hub_reads_of_its_jobs() -> None:
    job = hub_job()
    assert is_hub_job(job) and not is_hub_job({"spec": {}})
    assert stale_in(job) == ["east"]
    assert pinned_cluster(job) is None
    assert pinned_cluster(hub_job(**{"gpufleet.io/cluster": "auto"})) is None
    assert pinned_cluster(hub_job(**{"gpufleet.io/cluster": "west"})) == "west"
    workload = hub_workload(job, fleet(), NOW)
    assert workload is not None
    assert (workload.name, workload.pods, workload.gpus) == ("nlp/train", 2, 4)
    assert workload.reserved and workload.state is WorkloadState.PENDING
    with pytest.raises(RequestError, match="team 'nope' does not exist"):
        hub_workload(hub_job(**{"gpufleet.io/team": "nope"}), fleet(), NOW)


def test_the_status_mirrored_is_the_copys_and_nothing_when_it_matches() -> None:
    job = hub_job()
    copy = {"status": {"active": 2, "ready": 2, "startTime": "2026-12-01T00:00:05Z"}}
    patch = mirrored_status(job, copy)
    assert patch is not None
    assert patch["active"] == 2 and patch["startTime"] == "2026-12-01T00:00:05Z"
    assert mirrored_status({**job, "status": copy["status"]}, copy) is None
    # a copy made again in another cluster started later: the hub Job keeps its first start
    again = {"status": {**copy["status"], "startTime": "2026-12-01T01:00:00Z", "active": 1}}
    assert mirrored_status({**job, "status": copy["status"]}, again) == {"active": 1}


def node(name: str, pool: str, gpus: int = 8) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"gpufleet.io/pool": pool}},
        "status": {
            "allocatable": {"nvidia.com/gpu": str(gpus), "cpu": "1"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def gwl(name: str, state: str, nodes: list[str], cls: str = "elastic") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "nlp"},
        "spec": {
            "team": "nlp",
            "class": cls,
            "gpus": 8,
            "pods": len(nodes) or 1,
            "workloadRef": {"apiVersion": "batch/v1", "kind": "Job", "name": name},
        },
        "status": {"state": state, "nodes": nodes, "submittedAt": "2026-12-01T00:00:00Z"},
    }


def test_a_workers_snapshot_is_its_pools_nodes_and_unfinished_work() -> None:
    west = fleet().for_cluster("west")
    snapshot = worker_snapshot(
        west,
        [node("w-1", "west-h100"), node("w-2", "west-h100"), node("e-1", "east-h100")],
        [
            gwl("running", "Running", ["w-1"]),
            gwl("waiting", "Pending", []),
            gwl("done", "Completed", ["w-2"]),
            gwl("elsewhere", "Running", ["gone-node"]),
        ],
        NOW,
    )
    assert set(snapshot.pools) == {"west-h100"}
    assert snapshot.reservations == {("nlp", "west-h100"): 16}
    assert [n.name for n in snapshot.nodes] == ["w-1", "w-2"]
    assert all(n.cpu_free is None for n in snapshot.nodes)  # GPUs only: pods are not watched
    assert [(w.name, w.state, w.nodes) for w in snapshot.workloads] == [
        ("nlp/running", WorkloadState.RUNNING, ("w-1",)),
        ("nlp/waiting", WorkloadState.PENDING, ()),
    ]
    sent = hub_workload(hub_job(), west, NOW)
    assert sent is not None
    with_sent = worker_snapshot(west, [node("w-1", "west-h100")], [], NOW, [sent])
    assert [w.name for w in with_sent.workloads] == ["nlp/train"]


def test_the_clusters_view_adds_up_what_the_hub_wrote() -> None:
    ready = {"state": "Ready", "nodes": 2, "gpus": 16, "allocatedGPUs": 8, "workloads": 1}
    objects = views.Objects(
        clusters=[
            {"metadata": {"name": "west"}, "spec": {"region": "us-west-2"}, "status": ready},
            {"metadata": {"name": "east", "labels": {"env": "prod"}}, "spec": {}},
        ]
    )
    summary = views.clusters(objects)
    assert [(c.name, c.state) for c in summary.items] == [("east", "Unknown"), ("west", "Ready")]
    assert summary.items[1].region == "us-west-2" and summary.items[0].labels == {"env": "prod"}
    assert (summary.totals.clusters, summary.totals.ready, summary.totals.gpus) == (2, 1, 16)


def test_clusters_list_without_a_hub_says_what_to_do(tmp_path: Path) -> None:
    missing = tmp_path / "none.kubeconfig"
    result = CliRunner().invoke(app, ["clusters", "list", "--kubeconfig", str(missing)])
    assert result.exit_code != 0
    assert "cannot load the kubeconfig" in result.output and "Traceback" not in result.output
