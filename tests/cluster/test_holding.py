"""The holding policy in the real API server (gpufleet/kube/holding.py): a GPU Job (Deployment,
bare pod) is held for admission by the API server itself, so its create never waits on the
controller and succeeds while the controller is down; what the policy cannot vouch for is
checked by the webhook when one answers, and otherwise stays held with the reason recorded once
the controller is back."""

from __future__ import annotations

import json
from typing import Any

from gpufleet.kube.holding import CHECK_ANNOTATION
from gpufleet.model.keys import ADMISSION_GATE
from gpufleet.render.priorityclasses import RESERVED_CLASS, elastic_class_name, priority_value
from gpufleet.testing.cluster import ControlPlane

from .conftest import ControllerProcess, policy_params
from .test_kinds import bare_pod


def _pods(cluster: ControlPlane, namespace: str, job: str) -> list[dict[str, Any]]:
    listed = cluster.get("pods", "-n", namespace, "-l", f"batch.kubernetes.io/job-name={job}")
    return list(listed["items"])


def _events(cluster: ControlPlane, namespace: str, name: str) -> list[dict[str, Any]]:
    listed = cluster.get(
        "events", "-n", namespace, "--field-selector", f"involvedObject.name={name}"
    )
    return list(listed["items"])


def _deployment(namespace: str, team: str) -> dict[str, Any]:
    """An elastic Deployment of two pods with 4 GPUs each: a gang."""
    container = {
        "name": "serve",
        "image": "registry.k8s.io/pause:3.10",
        "resources": {"limits": {"nvidia.com/gpu": "4"}},
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": "serve",
            "namespace": namespace,
            "labels": {"gpufleet.io/team": team, "gpufleet.io/class": "elastic"},
        },
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "serve"}},
            "template": {
                "metadata": {"labels": {"app": "serve"}},
                "spec": {"containers": [container]},
            },
        },
    }


def _deployment_pods(cluster: ControlPlane, namespace: str) -> list[dict[str, Any]]:
    listed = cluster.get("pods", "-n", namespace, "-l", "gpufleet.io/workload=deployment-serve")
    return [p for p in listed["items"] if not p["metadata"].get("deletionTimestamp")]


def test_jobs_are_created_held_while_the_controller_is_down(
    cluster: ControlPlane, controller: ControllerProcess, scenario: Any
) -> None:
    s = scenario(3)
    nlp = s.team("nlp")
    s.reserve(nlp, 8)
    s.apply()
    cluster.wait_until(lambda: f"team.{nlp}" in policy_params(cluster), 30, "the params")
    controller.kill()  # as in a crash: its webhook stays registered and answers no one
    try:
        held = s.job("held", nlp, "reserved", 4, pods=2)
        assert held.returncode == 0, held.stderr
        # a Deployment too: created, and its ReplicaSet's pods made, held at the gate its
        # template carries (the pod webhook, down, sees no pod that is gated already)
        cluster.apply([_deployment(s.namespace, nlp)])
        deployment = cluster.get("deployment", "serve", "-n", s.namespace)
        assert deployment["metadata"]["annotations"]["gpufleet.io/managed"] == "true"
        assert CHECK_ANNOTATION not in deployment["metadata"]["annotations"]
        template = deployment["spec"]["template"]
        assert template["metadata"]["labels"]["gpufleet.io/workload"] == "deployment-serve"
        assert {"name": ADMISSION_GATE} in template["spec"]["schedulingGates"]
        assert template["spec"]["affinity"]["podAffinity"]  # a gang keeps to one zone
        cluster.wait_until(
            lambda: len(_deployment_pods(cluster, s.namespace)) == 2, 30, "the Deployment's pods"
        )
        for pod in _deployment_pods(cluster, s.namespace):
            assert {"name": ADMISSION_GATE} in pod["spec"]["schedulingGates"]
        # a bare pod of the team (a notebook): created, held at the gate, marked and given
        # its class with the priority the API server would have resolved from it
        cluster.apply([bare_pod("notebook", s.namespace, nlp, "elastic", 2)])
        notebook = cluster.get("pod", "notebook", "-n", s.namespace)
        assert notebook["spec"]["schedulingGates"] == [{"name": ADMISSION_GATE}]
        assert notebook["metadata"]["labels"]["gpufleet.io/workload"] == "pod-notebook"
        annotations = notebook["metadata"]["annotations"]
        assert annotations["gpufleet.io/managed"] == "true"
        assert annotations["example.com/owner"] == "ana"  # its own kept
        assert CHECK_ANNOTATION not in annotations
        elastic = elastic_class_name("normal")
        assert notebook["spec"]["priorityClassName"] == elastic
        assert notebook["spec"]["priority"] == priority_value(elastic)
        assert notebook["spec"]["preemptionPolicy"] == "Never"
        assert any(t.get("key") == "nvidia.com/gpu" for t in notebook["spec"]["tolerations"])
        # a team the fleet does not have: the policy cannot vouch for it and the webhook
        # that would refuse it is down, so it is created, held, marked to be checked
        unknown = s.job("unknown", "nobody", "elastic", 1)
        assert unknown.returncode == 0, unknown.stderr
        job = cluster.get("job", "held", "-n", s.namespace)
        assert not job["spec"].get("suspend")  # held at its pods, which are made at once
        assert {"name": ADMISSION_GATE} in job["spec"]["template"]["spec"]["schedulingGates"]
        cluster.wait_until(
            lambda: len(_pods(cluster, s.namespace, "held")) == 2, 30, "the Job's two pods"
        )
        for pod in _pods(cluster, s.namespace, "held"):
            assert {"name": ADMISSION_GATE} in pod["spec"]["schedulingGates"]
            assert not pod["spec"].get("nodeName")
        assert job["metadata"]["annotations"]["gpufleet.io/managed"] == "true"
        assert CHECK_ANNOTATION not in job["metadata"]["annotations"]
        template = job["spec"]["template"]["spec"]
        assert template["priorityClassName"] == RESERVED_CLASS
        assert any(t.get("key") == "nvidia.com/gpu" for t in template["tolerations"])
        assert template["affinity"]["podAffinity"]  # a gang keeps to one zone
        other = cluster.get("job", "unknown", "-n", s.namespace)
        assert {"name": ADMISSION_GATE} in other["spec"]["template"]["spec"]["schedulingGates"]
        assert other["metadata"]["annotations"][CHECK_ANNOTATION] == "true"
    finally:
        controller.start()
    s.wait_states({"held": "Running", "deployment-serve": "Running", "pod-notebook": "Running"}, 60)
    notebook = cluster.get("pod", "notebook", "-n", s.namespace)
    assert not notebook["spec"].get("schedulingGates")
    assert notebook["spec"]["nodeSelector"]["gpufleet.io/pool"] == s.pool
    for pod in _deployment_pods(cluster, s.namespace):
        assert pod["spec"]["nodeSelector"]["gpufleet.io/pool"] == s.pool
        assert not pod["spec"].get("schedulingGates")
    # the held Job that cannot be admitted says why, and stays held
    cluster.wait_until(
        lambda: any(e["reason"] == "Refused" for e in _events(cluster, s.namespace, "unknown")),
        30,
        "the Refused event",
    )
    (refused,) = [e for e in _events(cluster, s.namespace, "unknown") if e["reason"] == "Refused"]
    assert "team 'nobody' does not exist" in refused["message"]
    (pod,) = _pods(cluster, s.namespace, "unknown")
    assert {"name": ADMISSION_GATE} in pod["spec"]["schedulingGates"]
    # the admitted Job's pods were released where the engine placed them, the record on them
    for pod in _pods(cluster, s.namespace, "held"):
        assert ADMISSION_GATE not in str(pod["spec"].get("schedulingGates"))
        assert pod["spec"]["nodeSelector"]["gpufleet.io/pool"] == s.pool
        assert pod["metadata"]["annotations"]["gpufleet.io/admitted-pool"] == s.pool
    assert s.state("unknown") is None  # no GPUWorkload: it is not a request of this fleet


def test_what_the_policy_cannot_vouch_for_is_refused_by_the_webhook(
    cluster: ControlPlane, scenario: Any
) -> None:
    s = scenario(1)
    nlp = s.team("nlp")
    s.apply()
    cluster.wait_until(lambda: f"team.{nlp}" in policy_params(cluster), 30, "the params")
    # the policy runs first and marks it; the webhook refuses it with the reason
    refused = s.job("typo", nlp + "x", "elastic", 1)
    assert refused.returncode != 0
    assert f"team '{nlp}x' does not exist" in refused.stderr
    bad_class = s.job("bad-class", nlp, "gold", 1)
    assert bad_class.returncode != 0 and "is not a class" in bad_class.stderr
    # a bare pod as well: held by its own policy, refused by the webhook with the reason
    typo_pod = json.dumps(bare_pod("typo-pod", s.namespace, nlp + "x", "elastic", 1))
    refused_pod = cluster.kubectl("create", "-f", "-", input=typo_pod, check=False)
    assert refused_pod.returncode != 0
    assert f"team '{nlp}x' does not exist" in refused_pod.stderr
    # a valid one is held by the API server alone: not marked to be checked
    assert s.job("fine", nlp, "elastic", 1).returncode == 0
    job = cluster.get("job", "fine", "-n", s.namespace)
    assert CHECK_ANNOTATION not in job["metadata"]["annotations"]
    s.wait_states({"fine": "Running"}, 60)
