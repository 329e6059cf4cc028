"""The workload-kind adapters (gpufleet/kube/kinds): what each kind asks for, how it is marked at
creation, resumed pinned to the engine's nodes, preempted, and how it says it finished. Pure;
tests/cluster/test_kinds.py runs the same kinds with their real operators."""

from __future__ import annotations

from typing import Any

import pytest
from kube_helpers import requested
from test_controller_logic import _review, fleet

from gpufleet.controllers import actions, loop
from gpufleet.kube import kinds, observe, request
from gpufleet.kube.kinds.base import merge_patch
from gpufleet.model.states import WorkloadState

TEAM = {"gpufleet.io/team": "nlp", "gpufleet.io/class": "elastic"}


def pod_template(gpus: int) -> dict[str, Any]:
    limits = {"nvidia.com/gpu": str(gpus)} if gpus else {}
    return {"spec": {"containers": [{"name": "c", "resources": {"limits": limits}}]}}


def jobset(workers: int = 2, gpus: int = 4, launcher_gpus: int = 0) -> dict[str, Any]:
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": "js", "namespace": "nlp-ns", "uid": "u1", "labels": TEAM},
        "spec": {
            "replicatedJobs": [
                {
                    "name": "launcher",
                    "template": {"spec": {"template": pod_template(launcher_gpus)}},
                },
                {
                    "name": "workers",
                    "replicas": workers,
                    "template": {"spec": {"parallelism": 2, "template": pod_template(gpus)}},
                },
            ]
        },
    }


def trainjob(nodes: int | None = 2, gpus: int = 8) -> dict[str, Any]:
    trainer: dict[str, Any] = {"resourcesPerNode": {"limits": {"nvidia.com/gpu": gpus}}}
    if nodes is not None:
        trainer["numNodes"] = nodes
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": "tj", "namespace": "nlp-ns", "uid": "u2", "labels": TEAM},
        "spec": {
            "runtimeRef": {"name": "torch-distributed"},
            "trainer": trainer,
            "runtimePatches": [{"manager": "example.com/other", "time": "2026-01-01T00:00:00Z"}],
        },
    }


def rayjob(workers: int = 2, hosts: int = 1, gpus: int = 1, shutdown: bool = True) -> Any:
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": {"name": "rj", "namespace": "nlp-ns", "uid": "u3", "labels": TEAM},
        "spec": {
            "shutdownAfterJobFinishes": shutdown,
            "rayClusterSpec": {
                "headGroupSpec": {"template": pod_template(0)},
                "workerGroupSpecs": [
                    {
                        "groupName": "gpu",
                        "replicas": workers,
                        "numOfHosts": hosts,
                        "template": pod_template(gpus),
                    }
                ],
            },
        },
    }


def test_each_kind_asks_for_its_gpu_pods_as_one_gang() -> None:
    js = requested(jobset(), fleet())
    # 2 replicas x parallelism 2 of 4 GPUs; the launcher asks for none and is not placed
    assert (js.team, js.gpus, js.pods) == ("nlp", 4.0, 4)
    tj = requested(trainjob(), fleet())
    assert (tj.gpus, tj.pods) == (8.0, 2)
    assert requested(trainjob(nodes=None), fleet()).pods == 1  # the TrainJob's default
    rj = requested(rayjob(workers=2, hosts=2), fleet())
    assert (rj.gpus, rj.pods) == (1.0, 4)  # the head has no GPU


def test_what_gpufleet_cannot_place_is_refused_with_the_fix() -> None:
    with pytest.raises(request.RequestError, match=r"launcher: 2, workers: 4.*same number"):
        requested(jobset(launcher_gpus=2), fleet())
    with pytest.raises(request.RequestError, match="shutdownAfterJobFinishes: true"):
        requested(rayjob(shutdown=False), fleet())
    assert request.request_of(rayjob(gpus=0), fleet()) is None  # no GPUs: not gpufleet's


def test_the_parts_a_managed_kind_makes_are_left_to_it() -> None:
    """A TrainJob's JobSet and a JobSet's Jobs: their owner was admitted, they are not."""
    made = jobset()
    made["metadata"]["ownerReferences"] = [
        {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "controller": True}
    ]
    assert request.request_of(made, fleet()) is None

    def job(owner: str, owner_kind: str) -> dict[str, Any]:
        reference = {"apiVersion": owner, "kind": owner_kind, "controller": True}
        return {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {
                "name": "js-workers-0",
                "namespace": "nlp-ns",
                "labels": TEAM,
                "ownerReferences": [reference],
            },
            "spec": {"template": pod_template(4)},
        }

    assert request.request_of(job("jobset.x-k8s.io/v1alpha2", "JobSet"), fleet()) is None
    # a CronJob's Job is a Job like any
    assert request.request_of(job("batch/v1", "CronJob"), fleet()) is not None


def test_creation_suspends_and_marks_every_template_of_the_gang() -> None:
    body = jobset()
    patch = request.creation_patch(body, requested(body, fleet()), "pc", None, "q")
    assert patch["spec"]["suspend"] is True
    rebuilt = patch["spec"]["replicatedJobs"]  # a merge patch replaces lists whole
    assert [r["name"] for r in rebuilt] == ["launcher", "workers"]
    assert rebuilt[1]["replicas"] == 2 and rebuilt[1]["template"]["spec"]["parallelism"] == 2
    gangs = set()
    for replicated, original in zip(rebuilt, body["spec"]["replicatedJobs"], strict=True):
        template = replicated["template"]["spec"]["template"]
        assert template["spec"]["priorityClassName"] == "pc"
        # the user's containers are kept as written
        assert (
            template["spec"]["containers"]
            == original["template"]["spec"]["template"]["spec"]["containers"]
        )
        gangs.add(template["metadata"]["labels"]["gpufleet.io/gang"])
    assert len(gangs) == 1  # one gang: every pod in one zone

    tj = trainjob()
    patch = request.creation_patch(tj, requested(tj, fleet()), "pc", None, "q")
    entries = patch["spec"]["runtimePatches"]
    assert entries[0]["manager"] == "example.com/other"  # another manager's patch is kept
    ours = entries[1]
    assert ours["manager"] == "gpufleet.io/admission"
    (job,) = ours["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    pod = job["template"]["spec"]["template"]
    assert job["name"] == "node"
    # a runtime patch carries no PriorityClass: only what Trainer lets it set
    assert set(pod["spec"]) == {"tolerations", "affinity"}
    assert "gpufleet.io/gang" in pod["metadata"]["labels"]


def test_admission_pins_gpu_pods_where_the_kind_lets_it() -> None:
    # RayJob: the workers to the engine's nodes; the head, without GPUs, is left alone
    (patch,) = actions.admission_patches(rayjob(workers=1), "h100", ("n1",))
    cluster = patch["spec"]["rayClusterSpec"]
    assert patch["spec"]["suspend"] is False
    assert "headGroupSpec" not in cluster
    worker = cluster["workerGroupSpecs"][0]["template"]["spec"]
    assert worker["nodeSelector"] == {"gpufleet.io/pool": "h100"}
    assert observe.pinned_to({**rayjob(workers=1), **patch}) == ("n1",)
    # JobSet: its webhook refuses a new node affinity on a suspended JobSet: the pool only
    (patch,) = actions.admission_patches(jobset(), "h100", ("n1", "n2"))
    workers = patch["spec"]["replicatedJobs"][1]["template"]["spec"]["template"]["spec"]
    assert workers["nodeSelector"] == {"gpufleet.io/pool": "h100"}
    assert "affinity" not in workers
    launcher = patch["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert "nodeSelector" not in launcher
    # TrainJob: its runtime patch may change only while it stays suspended: two writes
    placed, resumed = actions.admission_patches(trainjob(), "h100", ("n1",))
    assert "suspend" not in placed["spec"]
    assert resumed == {"spec": {"suspend": False}}
    ours = placed["spec"]["runtimePatches"][-1]["trainingRuntimeSpec"]
    node = ours["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
    assert node["spec"]["nodeSelector"] == {"gpufleet.io/pool": "h100"}


@pytest.mark.parametrize(
    ("obj", "status", "expected"),
    [
        (
            jobset(),
            {"conditions": [{"type": "Completed", "status": "True", "message": "all done"}]},
            ("Completed", None, "the JobSet completed: all done"),
        ),
        (
            jobset(),
            {"conditions": [{"type": "Failed", "status": "True", "reason": "FailurePolicy"}]},
            ("Failed", "FailurePolicy", "the JobSet failed (FailurePolicy)"),
        ),
        (
            trainjob(),
            {"conditions": [{"type": "Complete", "status": "True"}]},
            ("Completed", None, "the TrainJob completed"),
        ),
        (
            rayjob(),
            {"jobDeploymentStatus": "Failed", "reason": "DeadlineExceeded", "message": "late"},
            ("Failed", "DeadlineExceeded", "the RayJob failed (DeadlineExceeded): late"),
        ),
    ],
)
def test_each_kind_says_how_it_finished(obj: Any, status: Any, expected: Any) -> None:
    outcome = kinds.adapter_of(obj).outcome({**obj, "status": status}, [])
    assert outcome is not None
    assert (outcome.state, outcome.reason, outcome.message) == expected
    assert observe.workload_state({**obj, "status": status}, {"spec": {}}, [])[0] == expected[0]


def test_a_gpuworkload_names_its_kind_and_cannot_clash_with_a_job_of_the_same_name() -> None:
    body = loop._workload_body(trainjob(), kinds.adapter_of(trainjob()), fleet())
    assert body is not None
    assert body["metadata"]["name"] == "trainjob-tj"
    assert body["spec"]["workloadRef"] == {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "name": "tj",
        "uid": "u2",
    }
    assert body["metadata"]["ownerReferences"][0]["kind"] == "TrainJob"
    assert kinds.JOB.workload_name("tj") == "tj"  # a Job's keeps its name, as before


def test_the_pods_of_a_rayjob_are_those_of_its_current_ray_cluster() -> None:
    ray = rayjob()
    kind = kinds.adapter_of(ray)
    assert kind.pods_named(ray) is None  # no cluster yet: no pods to count
    ray["status"] = {"rayClusterName": "rj-x7k2p"}
    assert (kind.pod_label, kind.pods_named(ray)) == ("ray.io/cluster", "rj-x7k2p")
    pods = [
        {
            "metadata": {
                "name": "h",
                "namespace": "nlp-ns",
                "labels": {"ray.io/cluster": "rj-x7k2p"},
            }
        },
        {"metadata": {"name": "o", "namespace": "nlp-ns", "labels": {"ray.io/cluster": "other"}}},
    ]
    grouped = loop.group_pods(pods)
    assert [p["metadata"]["name"] for p in grouped[("nlp-ns", "ray.io/cluster", "rj-x7k2p")]] == [
        "h"
    ]


@pytest.mark.parametrize(
    ("kind", "expected"),
    [("jobset", "JobSet"), ("trainjob", "TrainJob"), ("deployment", "Deployment")],
)
def test_submit_builds_each_kind_that_gpufleet_then_reads_as_the_same_gang(
    kind: str, expected: str
) -> None:
    import yaml
    from typer.testing import CliRunner

    from gpufleet.cli.main import app

    result = CliRunner().invoke(
        app,
        ["submit", "pretrain", "--kind", kind, "--team", "nlp", "-n", "nlp-ns", "--gpus", "8",
         "--pods", "2", "--dry-run", "--", "python", "train.py"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    body = yaml.safe_load(result.stdout)
    assert body["kind"] == expected
    asked = requested(body, fleet())
    assert (asked.team, asked.gpus, asked.pods) == ("nlp", 8.0, 2)


def test_submit_refuses_what_it_cannot_build_and_manifests_of_other_kinds(tmp_path: Any) -> None:
    from typer.testing import CliRunner

    from gpufleet.cli.main import app

    runner = CliRunner()
    result = runner.invoke(app, ["submit", "x", "--kind", "rayjob", "--team", "nlp"])
    assert result.exit_code != 0 and "write its manifest and pass it with --file" in result.output
    statefulset = tmp_path / "s.yaml"
    statefulset.write_text("apiVersion: apps/v1\nkind: StatefulSet\nmetadata: {name: s}\n")
    result = runner.invoke(app, ["submit", "--file", str(statefulset), "--team", "nlp"])
    assert result.exit_code != 0
    assert "not of a kind gpufleet manages: Job (batch/v1), JobSet" in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize(
    ("file", "pods", "gpus"),
    [
        ("job.yaml", 2, 8),
        ("jobset.yaml", 4, 8),
        ("trainjob.yaml", 4, 8),
        ("rayjob.yaml", 2, 8),
        ("pytorchjob.yaml", 4, 8),
        ("deployment.yaml", 2, 1),
        ("leaderworkerset.yaml", 8, 8),
        ("pod.yaml", 1, 1),
    ],
)
def test_the_documented_examples_are_the_gangs_they_say(file: str, pods: int, gpus: int) -> None:
    from pathlib import Path

    import yaml

    body = yaml.safe_load((Path(__file__).parents[1] / "examples" / "workloads" / file).read_text())
    kind = kinds.adapter_of(body)
    assert kind is not None and kind.problem(body) is None
    sets = request.gpu_pod_sets(body, kind)
    assert (sum(p.count for p in sets), {p.gpus for p in sets}) == (pods, {gpus})


def test_a_kind_whose_operator_is_missing_is_empty_not_a_failed_start() -> None:
    """The controller watches every kind; a CRD not installed (404) or a kind it may not read
    (403) leaves that kind empty and synced, so Jobs are managed meanwhile. A kind that must
    be there (pods, nodes) is never taken for absent."""
    import threading

    from kubernetes.client.exceptions import ApiException

    from gpufleet.kube import cache as cache_module

    calls: list[str] = []

    def not_served(**_: Any) -> Any:
        calls.append("list")
        raise ApiException(status=404, reason="Not Found")

    for optional, synced in ((True, True), (False, False)):
        cache = cache_module.ClusterCache([cache_module.Store("jobsets")])
        stop = threading.Event()
        informer = cache_module.Informer(cache, "jobsets", not_served, stop, optional=optional)
        thread = informer.start()
        cache.wait_for_sync(1.0)
        stop.set()
        thread.join(timeout=15)
        assert cache.synced() is synced
        assert cache.items("jobsets") == []
    assert calls


def deployment(replicas: int = 2) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "serve", "namespace": "nlp-ns", "uid": "u4", "labels": TEAM},
        "spec": {"replicas": replicas, "template": pod_template(4)},
    }


def gated_pod(name: str, held: bool = True, node: str | None = None, **spec: Any) -> Any:
    gates = [{"name": "other.example/gate"}] + ([{"name": "gpufleet.io/admission"}] * held)
    return {
        "metadata": {
            "name": name,
            "namespace": "nlp-ns",
            "labels": {"gpufleet.io/workload": "deployment-serve"},
            "ownerReferences": [{"kind": "ReplicaSet", "name": "serve-abc", "controller": True}],
        },
        "spec": {
            **pod_template(4)["spec"],
            "schedulingGates": gates,
            **({"nodeName": node} if node else {}),
            **spec,
        },
        "status": {"phase": "Running" if node else "Pending"},
    }


def test_a_deployment_is_marked_at_creation_and_its_pods_held_by_a_gate() -> None:
    body = deployment()
    asked = requested(body, fleet())
    assert (asked.gpus, asked.pods) == (4.0, 2)
    patch = request.creation_patch(body, asked, "pc", None, "q")
    assert "suspend" not in patch["spec"]  # it has none: its pods are held instead
    template = patch["spec"]["template"]
    assert template["metadata"]["labels"]["gpufleet.io/workload"] == "deployment-serve"
    assert template["spec"]["priorityClassName"] == "pc"
    from gpufleet.controllers import admission

    pod = gated_pod("p", held=False)
    assert admission.gate_patch(pod) == [
        {"op": "add", "path": "/spec/schedulingGates/-", "value": {"name": "gpufleet.io/admission"}}
    ]
    assert admission.gate_patch(gated_pod("p")) == []  # already held
    bare = {**pod, "metadata": {**pod["metadata"], "ownerReferences": []}}
    assert admission.gate_patch(bare) == []  # a pod without a controller is not held


def test_admission_releases_held_pods_onto_the_engines_nodes_and_preemption_deletes() -> None:
    from datetime import UTC, datetime

    from gpufleet.engine import Admission, Decisions, Preemption, PreemptionReason

    now = datetime(2026, 1, 1, tzinfo=UTC)
    workload = {
        "metadata": {"name": "deployment-serve", "namespace": "nlp-ns"},
        "spec": {"team": "nlp", "class": "elastic", "gpus": 4, "pods": 2},
        "status": {"state": "Pending"},
    }
    pods = (gated_pod("b"), gated_pod("a"))
    waiting = observe.Observed(deployment(), workload, WorkloadState.PENDING, (), pods)
    decisions = Decisions(admitted=(Admission("nlp-ns/deployment-serve", "h100", ("n1", "n2")),))
    (change,) = actions.changes_for(decisions, [waiting], now)
    assert change.patches == ()  # nothing to resume on the Deployment itself
    assert [w.name for w in change.pod_writes] == ["a", "b"]
    first = change.pod_writes[0]
    assert first.patch is not None
    assert first.patch[0] == {
        "op": "replace",
        "path": "/spec/schedulingGates",
        "value": [{"name": "other.example/gate"}],  # another's gate stays
    }
    assert first.patch[1]["value"] == {"gpufleet.io/pool": "h100"}
    assert observe.pinned_to({"spec": {"template": first.after}}) == ("n1",)
    assert not observe.held(first.after)
    # admitted: a pod made later (a replacement) is released onto the node left free
    admitted = {**workload, "status": {"state": "Running", "pool": "h100", "nodes": ["n1", "n2"]}}
    running = (gated_pod("a", held=False, node="n1"), gated_pod("c"))
    item = observe.Observed(deployment(), admitted, WorkloadState.STARTING, ("n1", "n2"), running)
    late = [c for c in actions.changes_for(Decisions(), [item], now) if c.pod_writes]
    (write,) = late[0].pod_writes
    assert write.name == "c" and observe.pinned_to({"spec": {"template": write.after}}) == ("n2",)
    # one released in an earlier cycle and not bound yet holds the node it is pinned to
    unbound = (first.after, gated_pod("c"))
    pending = observe.Observed(
        deployment(), admitted, WorkloadState.STARTING, ("n1", "n2"), unbound
    )
    (write,) = next(
        c for c in actions.changes_for(Decisions(), [pending], now) if c.pod_writes
    ).pod_writes
    assert write.name == "c" and observe.pinned_to({"spec": {"template": write.after}}) == ("n2",)
    both = (first.after, change.pod_writes[1].after, gated_pod("c"))  # a scale-up stays held
    full = observe.Observed(deployment(), admitted, WorkloadState.STARTING, ("n1", "n2"), both)
    assert not [c for c in actions.changes_for(Decisions(), [full], now) if c.pod_writes]
    # preempted: its released pods are deleted (its ReplicaSet makes them again, held)
    reason = PreemptionReason.RESERVATION_RECLAIMED
    decisions = Decisions(preempted=(Preemption("nlp-ns/deployment-serve", "x", reason, "m"),))
    (change,) = actions.changes_for(decisions, [item], now)
    assert [(w.name, w.patch) for w in change.pod_writes] == [("a", None)]
    assert change.evicts and change.status["state"] == "Preempted"


def test_a_gated_workload_waits_while_its_pods_are_held() -> None:
    recorded = {"spec": {"pods": 2}, "status": {"state": "Preempted"}}
    state = observe.workload_state(deployment(), recorded, [gated_pod("a"), gated_pod("b")])
    assert state == ("Preempted", ())
    admitted = {"spec": {"pods": 2}, "status": {"state": "Queued", "nodes": ["n1", "n2"]}}
    assert observe.workload_state(deployment(), admitted, [gated_pod("a")]) == (
        "Queued",
        ("n1", "n2"),
    )
    both = [gated_pod("a", held=False, node="n1"), gated_pod("b", held=False, node="n2")]
    assert observe.workload_state(deployment(), recorded, both)[0] == "Running"


def leaderworkerset(replicas: int, **templates: Any) -> dict[str, Any]:
    return {
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "metadata": {"name": "llm", "namespace": "nlp-ns", "uid": "u5", "labels": TEAM},
        "spec": {"replicas": replicas, "leaderWorkerTemplate": {"size": 4, **templates}},
    }


def test_a_leaderworkerset_is_one_gang_of_its_leaders_and_workers() -> None:
    body = leaderworkerset(2, workerTemplate=pod_template(4))
    one_group = leaderworkerset(1, workerTemplate=pod_template(4))  # within 16 GPUs a workload
    asked = requested(one_group, fleet())
    assert (asked.gpus, asked.pods) == (4.0, 4)
    kind = kinds.adapter_of(body)
    sets = kind.pod_sets(body)
    assert [(p.name, p.count, p.gpus) for p in sets] == [("leader", 2, 4.0), ("worker", 6, 4.0)]
    patch = request.creation_patch(body, asked, "pc", None, "q")
    lwt = patch["spec"]["leaderWorkerTemplate"]
    # no leader template of its own: the worker template, which leaders use too, is labelled
    assert set(lwt) == {"workerTemplate"}
    assert lwt["workerTemplate"]["metadata"]["labels"]["gpufleet.io/workload"] == "lws-llm"
    with_leader = leaderworkerset(2, leaderTemplate=pod_template(0), workerTemplate=pod_template(4))
    sets = request.gpu_pod_sets(with_leader, kind)  # a leader without GPUs is not placed
    assert [(p.name, p.count) for p in sets] == [("worker", 6)]
    lwt = request.creation_patch(with_leader, asked, "pc", None, "q")["spec"][
        "leaderWorkerTemplate"
    ]
    assert {k: v["metadata"]["labels"]["gpufleet.io/workload"] for k, v in lwt.items()} == {
        "leaderTemplate": "lws-llm",
        "workerTemplate": "lws-llm",
    }


def test_the_webhook_holds_a_gated_kinds_pods_and_refuses_what_cannot_be_managed() -> None:
    import asyncio
    import base64
    import json

    from gpufleet.controllers import admission

    def answer(obj: dict[str, Any]) -> dict[str, Any]:
        body = {"request": {"uid": "1", "kind": {"kind": obj["kind"]}, "object": obj}}
        loop = asyncio.new_event_loop()
        try:
            response: dict[str, Any] = loop.run_until_complete(admission.review(body))["response"]
            return response
        finally:
            loop.close()

    held = answer({**gated_pod("p", held=False), "kind": "Pod"})
    assert held["allowed"] and held["patchType"] == "JSONPatch"
    assert json.loads(base64.b64decode(held["patch"]))[0]["value"] == {
        "name": "gpufleet.io/admission"
    }
    refused = answer(rayjob(shutdown=False))
    assert refused["allowed"] is False and refused["status"]["code"] == 422
    assert "shutdownAfterJobFinishes: true" in refused["status"]["message"]


def bare_pod(**metadata: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "nb",
            "namespace": "nlp-ns",
            "uid": "u7",
            "labels": dict(TEAM),
            "annotations": {"example.com/owner": "ana"},
            **metadata,
        },
        "spec": {
            **pod_template(4)["spec"],
            "schedulingGates": [{"name": "other.example/gate"}],
        },
    }


def test_a_bare_pod_of_a_team_is_a_workload_of_one_pod_held_at_creation() -> None:
    body = bare_pod()
    asked = requested(body, fleet())
    assert (asked.team, asked.gpus, asked.pods) == ("nlp", 4.0, 1)
    patch = request.creation_patch(body, asked, "gpufleet-elastic-high", None, "q")
    assert patch["metadata"]["labels"] == {
        "gpufleet.io/team": "nlp",
        "gpufleet.io/class": "elastic",
        "gpufleet.io/workload": "pod-nb",  # its pods are found by it: itself
    }
    assert patch["metadata"]["annotations"] == {"gpufleet.io/managed": "true"}
    spec = patch["spec"]
    assert spec["schedulingGates"] == [
        {"name": "other.example/gate"},  # another's gate stays
        {"name": "gpufleet.io/admission"},
    ]
    # the API server resolved its class before the webhook named one: the value comes along
    assert (spec["priorityClassName"], spec["priority"], spec["preemptionPolicy"]) == (
        "gpufleet-elastic-high",
        75,
        "Never",
    )
    # named by generateName: no name to label it with yet, held all the same
    unnamed = bare_pod(name=None, generateName="nb-")
    patch = request.creation_patch(unnamed, asked, "gpufleet-elastic-high", None, "q")
    assert "gpufleet.io/workload" not in patch["metadata"]["labels"]
    assert patch["spec"]["schedulingGates"][-1] == {"name": "gpufleet.io/admission"}
    # a pod a controller owns is that controller's; a pod without the team label is no one's,
    # even in a namespace a team lists (a bare pod names its team)
    owned = bare_pod(ownerReferences=[{"kind": "ReplicaSet", "name": "r", "controller": True}])
    assert request.request_of(owned, fleet()) is None
    unlabelled = bare_pod(labels={})
    assert request.request_of(unlabelled, fleet()) is None
    # the cache keeps a bare pod whole (a workload), other pods trimmed
    from gpufleet.kube import cache

    assert cache.trim_pod(bare_pod())["metadata"]["annotations"] == {"example.com/owner": "ana"}
    # (a held one keeps its annotations: its release adds the admission's record to them)
    assert cache.trim_pod(owned)["metadata"]["annotations"] == {"example.com/owner": "ana"}
    released = merge_patch(owned, {"spec": {"schedulingGates": None}})
    assert "annotations" not in cache.trim_pod(released)["metadata"]


def test_a_bare_pod_says_how_it_ended_but_not_while_it_is_deleted() -> None:
    pod = kinds.POD
    assert pod.outcome({**bare_pod(), "status": {"phase": "Running"}}, []) is None
    done = pod.outcome({**bare_pod(), "status": {"phase": "Succeeded"}}, [])
    assert done is not None
    assert done.state == "Completed"
    terminated = {"state": {"terminated": {"exitCode": 137}}}
    failed = pod.outcome(
        {**bare_pod(), "status": {"phase": "Failed", "containerStatuses": [terminated]}}, []
    )
    assert failed is not None
    assert failed.state == "Failed" and "exit code 137" in failed.message
    # deleted (a preemption or its owner), its phase is no outcome of its own
    deleted = bare_pod(deletionTimestamp="2026-01-01T00:00:00Z")
    assert pod.outcome({**deleted, "status": {"phase": "Failed"}}, []) is None


def test_a_preempted_bare_pod_is_recorded_as_owed_before_it_is_deleted() -> None:
    from datetime import UTC, datetime

    from gpufleet.engine import Decisions, Preemption, PreemptionReason

    now = datetime(2026, 1, 1, tzinfo=UTC)
    workload: dict[str, Any] = {
        "metadata": {"name": "pod-nb", "namespace": "nlp-ns"},
        "spec": {"team": "nlp", "class": "elastic", "gpus": 4, "pods": 1},
        "status": {"state": "Running", "pool": "h100", "nodes": ["n1"]},
    }
    released = bare_pod(labels={**TEAM, "gpufleet.io/workload": "pod-nb"})
    released["spec"] = {**released["spec"], "schedulingGates": [], "nodeName": "n1"}
    item = observe.Observed(released, workload, WorkloadState.RUNNING, ("n1",), (released,))
    reason = PreemptionReason.RESERVATION_RECLAIMED
    decisions = Decisions(preempted=(Preemption("nlp-ns/pod-nb", "x", reason, "m"),))
    (change,) = actions.changes_for(decisions, [item], now)
    assert [(w.name, w.patch) for w in change.pod_writes] == [("nb", None)]
    assert change.status_first and change.evicts
    assert change.status["state"] == "Preempted"
    assert change.status["podDeletedAt"] == "2026-01-01T00:00:00Z"
    # a Deployment's pods are made again by its ReplicaSet: nothing is owed
    served = {**workload, "metadata": {**workload["metadata"], "name": "deployment-serve"}}
    running = (gated_pod("a", held=False, node="n1"),)
    gated = observe.Observed(deployment(), served, WorkloadState.RUNNING, ("n1",), running)
    decisions = Decisions(preempted=(Preemption("nlp-ns/deployment-serve", "x", reason, "m"),))
    (change,) = actions.changes_for(decisions, [gated], now)
    assert not change.status_first and "podDeletedAt" not in change.status


def test_a_bare_pods_gpuworkload_keeps_its_manifest_and_is_repaired_after_the_pod() -> None:
    body = bare_pod()
    body["spec"] = {**body["spec"], "nodeName": "n1", "priority": 50}
    workload = loop._workload_body(body, kinds.POD, fleet())
    assert workload is not None
    assert "ownerReferences" not in workload["metadata"]  # it outlives a preempted pod
    template = workload["spec"]["podTemplate"]
    assert template["metadata"]["annotations"] == {"example.com/owner": "ana"}
    assert "nodeName" not in template["spec"] and "priority" not in template["spec"]
    remade = kinds.POD.remade("default", "nb", template)
    assert remade["metadata"]["name"] == "nb" and remade["kind"] == "Pod"
    assert remade["spec"]["schedulingGates"] == [
        {"name": "other.example/gate"},
        {"name": "gpufleet.io/admission"},
    ]

    def repairs(status: dict[str, Any], pod: dict[str, Any] | None) -> list[tuple[str, str]]:
        found = loop.bare_pod_repairs([{**workload, "status": status}], lambda key: pod)
        return [(r.action, r.uid) for r in found]

    owed = {"state": "Preempted", "podDeletedAt": "2026-01-01T00:00:00Z"}
    again = bare_pod(uid="u8")
    assert repairs(owed, None) == [("remake", "")]  # the preemption deleted it: made again
    assert repairs(owed, again) == [("adopt", "u8")]  # made again: its new uid recorded
    assert repairs({"state": "Preempted"}, None) == [("delete", "")]  # its owner deleted it
    assert repairs({"state": "Running"}, again) == [("delete", "")]  # ... and made another
    assert repairs({"state": "Running"}, bare_pod()) == []  # its own pod: nothing to do
    job = loop._workload_body(
        {**jobset(), "metadata": {**jobset()["metadata"], "creationTimestamp": "t"}},
        kinds.adapter_of(jobset()),
        fleet(),
    )
    assert job is not None
    assert loop.bare_pod_repairs([job], lambda key: None) == []  # other kinds: the GC's work


def test_the_webhook_holds_a_bare_pod_and_refuses_one_of_an_unknown_team() -> None:
    import base64
    import json

    held = _review(bare_pod())
    ops = {op["path"]: op["value"] for op in json.loads(base64.b64decode(held["patch"]))}
    assert ops["/spec/schedulingGates"][-1] == {"name": "gpufleet.io/admission"}
    assert ops["/metadata/labels"]["gpufleet.io/workload"] == "pod-nb"
    assert ops["/spec/priority"] == 50
    refused = _review(bare_pod(labels={"gpufleet.io/team": "nobody"}))
    assert refused["allowed"] is False
    assert "team 'nobody' does not exist" in refused["status"]["message"]


def pytorchjob(workers: int = 2, gpus: int = 4) -> dict[str, Any]:
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": "pt", "namespace": "nlp-ns", "uid": "u5", "labels": TEAM},
        "spec": {
            "pytorchReplicaSpecs": {
                # written Worker first: gpufleet reads the Master first all the same
                "Worker": {"replicas": workers, "template": pod_template(gpus)},
                "Master": {"replicas": 1, "template": pod_template(gpus)},
            }
        },
    }


def test_a_pytorchjob_is_one_gang_suspended_by_its_run_policy_and_pinned_at_admission() -> None:
    body = pytorchjob()
    kind = kinds.adapter_of(body)
    assert kind.kind == "PyTorchJob" and kind.workload_name("pt") == "pytorchjob-pt"
    assert [(s.name, s.count) for s in kind.pod_sets(body)] == [("Master", 1), ("Worker", 2)]
    asked = requested(body, fleet())
    assert (asked.team, asked.gpus, asked.pods) == ("nlp", 4.0, 3)
    patch = request.creation_patch(body, asked, "pc", None, "q")
    assert patch["spec"]["runPolicy"] == {"suspend": True} and "suspend" not in patch["spec"]
    for role in ("Master", "Worker"):
        template = patch["spec"]["pytorchReplicaSpecs"][role]["template"]
        assert template["spec"]["priorityClassName"] == "pc"
        assert template["spec"]["containers"] == pod_template(4)["spec"]["containers"]
    created = merge_patch(body, patch)
    assert kind.suspended(created) and not kind.suspended(body)
    # the operator makes no pod of a suspended PyTorchJob: its pods are pinned to the nodes
    (resume,) = actions.admission_patches(created, "h100", ("n1", "n2", "n3"))
    assert resume["spec"]["runPolicy"] == {"suspend": False}
    resumed = merge_patch(created, resume)
    assert not kind.suspended(resumed)
    assert observe.pinned_to(resumed) == ("n1", "n2", "n3")
    worker = resumed["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
    assert worker["nodeSelector"] == {"gpufleet.io/pool": "h100"}
    assert merge_patch(resumed, kind.suspend_patch())["spec"]["runPolicy"]["suspend"] is True
    done = {"conditions": [{"type": "Succeeded", "status": "True", "message": "ok"}]}
    outcome = kind.outcome({**body, "status": done}, [])
    assert outcome is not None and outcome.state == "Completed"
    failed = {"conditions": [{"type": "Failed", "status": "True", "reason": "OOM"}]}
    outcome = kind.outcome({**body, "status": failed}, [])
    assert outcome is not None and (outcome.state, outcome.reason) == ("Failed", "OOM")


def test_every_example_workload_is_a_valid_request_of_the_example_fleet() -> None:
    """The examples a user copies are admitted by the example fleet: each names a team that
    lists its namespace (the tenancy rule), and each kind is one the registry reads."""
    from pathlib import Path

    import yaml

    from gpufleet.model.fleet import fleet_from_objects

    examples = Path(__file__).resolve().parent.parent / "examples"
    objects = [
        o
        for f in sorted((examples / "gitops").glob("*.yaml"))
        for o in yaml.safe_load_all(f.read_text())
        if o
    ]
    loaded = fleet_from_objects(objects)
    assert not loaded.problems, loaded.problems
    files = sorted((examples / "workloads").glob("*.yaml"))
    assert len(files) >= len(kinds.KINDS)
    for path in files:
        for obj in yaml.safe_load_all(path.read_text()):
            if obj:
                asked = requested(obj, loaded.fleet)
                assert (
                    obj["metadata"]["namespace"] in loaded.fleet.teams[asked.team].spec.namespaces
                ), path


def held_job(suspended: bool = False) -> dict[str, Any]:
    template = merge_patch(pod_template(4), {"spec": {"schedulingGates": [GATE]}})
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "train", "namespace": "nlp-ns", "uid": "u9", "labels": TEAM},
        "spec": {"parallelism": 2, "suspend": suspended, "template": template},
    }


def job_pod(name: str, held: bool = True, node: str | None = None) -> dict[str, Any]:
    pod: dict[str, Any] = gated_pod(name, held, node)
    pod["metadata"]["labels"] = {"batch.kubernetes.io/job-name": "train"}
    pod["metadata"]["finalizers"] = ["batch.kubernetes.io/job-tracking"]
    return pod


GATE = {"name": "gpufleet.io/admission"}


def test_a_job_is_held_at_its_pods_released_at_admission_and_loses_them_to_preemption() -> None:
    from datetime import UTC, datetime

    from gpufleet.engine import Admission, Decisions, Preemption, PreemptionReason

    job = kinds.adapter_of(held_job())
    assert job.holds_pods(held_job()) and not job.gated
    legacy = merge_patch(
        held_job(True), {"spec": {"template": {"spec": {"schedulingGates": None}}}}
    )
    assert not job.holds_pods(legacy)  # made suspended before Jobs were held at the gate
    workload = {
        "metadata": {"name": "train", "namespace": "nlp-ns"},
        "spec": {"team": "nlp", "class": "elastic", "gpus": 4, "pods": 2},
        "status": {"state": "Pending"},
    }
    pods = [job_pod("train-b"), job_pod("train-a")]
    # not suspended, its pods made and held: it waits
    assert observe.workload_state(held_job(), workload, pods) == ("Pending", ())
    now = datetime(2026, 1, 1, tzinfo=UTC)
    waiting = observe.Observed(held_job(), workload, WorkloadState.PENDING, (), tuple(pods))
    decisions = Decisions(admitted=(Admission("nlp-ns/train", "h100", ("n1", "n2")),))
    (change,) = actions.changes_for(decisions, [waiting], now)
    assert change.patches == ()  # nothing to resume: its pods are released
    assert [w.name for w in change.pod_writes] == ["train-a", "train-b"]
    first = change.pod_writes[0].after
    assert not observe.held(first) and observe.pinned_to({"spec": {"template": first}}) == ("n1",)
    # each released pod records the admission, so its GPUWorkload's record may wait for Running
    assert first["metadata"]["annotations"] == {
        "gpufleet.io/admitted-pool": "h100",
        "gpufleet.io/admitted-at": "2026-01-01T00:00:00Z",
        "gpufleet.io/admitted-nodes": "n1,n2",  # the whole admission's
    }
    assert change.status_may_wait > 0
    # a pod's own annotations stay: the record is added key by key where it has some
    annotated = job_pod("train-a")
    annotated["metadata"]["annotations"] = {"gpufleet.io/run-for": "600s"}
    (write,) = actions.release_writes(
        observe.Observed(held_job(), workload, WorkloadState.PENDING, (), (annotated,)),
        "h100",
        ("n1",),
        at=now,
    )
    assert write.patch is not None
    assert [op["path"] for op in write.patch if "annotations" in op["path"]] == [
        "/metadata/annotations/gpufleet.io~1admitted-pool",
        "/metadata/annotations/gpufleet.io~1admitted-at",
        "/metadata/annotations/gpufleet.io~1admitted-nodes",
    ]
    assert write.after["metadata"]["annotations"]["gpufleet.io/run-for"] == "600s"
    released = [w.after for w in change.pod_writes]
    state, nodes = observe.workload_state(held_job(), workload, released)
    assert state == "Starting"  # released, not bound yet
    item = observe.Observed(held_job(), workload, WorkloadState.STARTING, nodes, tuple(released))
    # a crash before the record was written: the pods' record is written with its status
    assert actions.lost_admission_record(item, {})["pool"] == "h100"
    # ... even where it released one pod of the gang and not the other: the one released says
    # where the whole gang goes, and the other is released there (as the cache keeps them)
    from gpufleet.kube import cache

    partly = (cache.trim_pod(released[0]), cache.trim_pod(job_pod("train-b")))
    state, nodes = observe.workload_state(held_job(), workload, list(partly))
    assert (state, nodes) == ("Starting", ("n1", "n2"))
    torn = observe.Observed(held_job(), workload, state, nodes, partly)
    (write,) = actions.late_pods(torn, {})
    assert write.name == "train-b"
    assert observe.pinned_to({"spec": {"template": write.after}}) == ("n2",)
    # preempted: not suspended; its pods are deleted once the Job controller's finalizer is
    # off (uncounted), after the record, and the Job controller makes new ones, held
    reason = PreemptionReason.RESERVATION_RECLAIMED
    decisions = Decisions(preempted=(Preemption("nlp-ns/train", "x", reason, "m"),))
    (change,) = actions.changes_for(decisions, [item], now)
    assert change.patches == () and change.status_first
    assert sorted(w.name for w in change.pod_writes) == ["train-a", "train-b"]
    assert all(w.unfinalize for w in change.pod_writes)
    # one an earlier release suspended to preempt it, admitted again: resumed, with the
    # record on the Job; the pods it makes arrive held
    preempted = {**workload, "status": {"state": "Preempted", "preemptions": 1}}
    again = observe.Observed(held_job(True), preempted, WorkloadState.PREEMPTED, (), ())
    decisions = Decisions(admitted=(Admission("nlp-ns/train", "h100", ("n1", "n2")),))
    (change,) = actions.changes_for(decisions, [again], now)
    (patch,) = change.patches
    assert patch["spec"] == {"suspend": False}
    assert patch["metadata"]["annotations"]["gpufleet.io/admitted-pool"] == "h100"
    record = {"pool": "h100", "nodes": ["n1", "n2"], "admittedAt": "2026-01-01T00:00:00Z"}
    admitted = {**workload, "status": {"state": "Queued", **record}}
    late = observe.Observed(
        held_job(), admitted, WorkloadState.QUEUED, ("n1", "n2"), (job_pod("train-c"),)
    )
    # a mate released in an earlier cycle and not bound yet, as the cache keeps it, still
    # holds its node: the late pod goes to the other (both on n1 left one unschedulable in CI)
    from gpufleet.kube import cache

    kept = cache.trim_pod(first)
    assert observe.pinned_to({"spec": {"template": kept}}) == ("n1",)
    mates = observe.Observed(
        held_job(), admitted, WorkloadState.STARTING, ("n1", "n2"), (kept, job_pod("train-c"))
    )
    (write,) = actions.late_pods(mates, {})
    assert observe.pinned_to({"spec": {"template": write.after}}) == ("n2",)
    (write,) = next(
        c for c in actions.changes_for(Decisions(), [late], now) if c.pod_writes
    ).pod_writes
    assert write.name == "train-c" and not observe.held(write.after)
    # it records the admission too: its GPUWorkload's record may still be held back
    assert write.after["metadata"]["annotations"]["gpufleet.io/admitted-at"] == record["admittedAt"]
