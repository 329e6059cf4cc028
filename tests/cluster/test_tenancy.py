"""The tenancy policy in the real API server (gpufleet/kube/policies.py): a team label is honoured
only in the team's namespaces, and only the controller lifts the gate, resumes held work or
changes a managed workload's team or class. Another user is played by impersonation (in
system:masters, so that RBAC lets it through and only the policy can refuse)."""

from __future__ import annotations

import subprocess
from typing import Any

import yaml

from gpufleet.kube.policies import POLICY
from gpufleet.kube.request import team_namespace_message
from gpufleet.testing.cluster import ControlPlane

from .conftest import job_manifest, policy_params

AS_TENANT = ("--as=alice", "--as-group=system:masters")
POLICY_SAYS = f"ValidatingAdmissionPolicy '{POLICY}'"


def _create(cluster: ControlPlane, body: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    return cluster.kubectl("create", "-f", "-", input=yaml.safe_dump(body), check=False)


def _pod_of(cluster: ControlPlane, namespace: str, job: str) -> dict[str, Any]:
    def one() -> dict[str, Any] | None:
        listed = cluster.get("pods", "-n", namespace, "-l", f"batch.kubernetes.io/job-name={job}")
        return listed["items"][0] if listed["items"] else None

    cluster.wait_until(lambda: one() is not None, 30, f"a pod of Job {job}")
    pod = one()
    assert pod is not None
    return pod


def _tenant_patch(
    cluster: ControlPlane, kind: str, name: str, namespace: str, patch: str
) -> subprocess.CompletedProcess[str]:
    """A tenant's patch: a JSON patch where `patch` is a list, else a merge patch."""
    kind_of = "json" if patch.lstrip().startswith("[") else "merge"
    return _as_tenant(
        cluster, "patch", kind, name, "-n", namespace, f"--type={kind_of}", "-p", patch
    )


def _as_tenant(cluster: ControlPlane, *args: str) -> subprocess.CompletedProcess[str]:
    """kubectl as another user than the controller."""
    return cluster.kubectl(*args, *AS_TENANT, check=False)


def test_a_team_label_is_honoured_only_in_the_teams_namespaces(
    cluster: ControlPlane, scenario: Any
) -> None:
    s = scenario(1)
    own, also = s.team("own"), s.team("also")  # both list s.namespace
    other = scenario(1)
    theirs = other.team("theirs")
    s.apply()
    other.apply()
    cluster.wait_until(
        lambda: other.namespace in policy_params(cluster).get(f"team.{theirs}", ""),
        30,
        "the policy's params",
    )
    expected = team_namespace_message(theirs, other.namespace, s.namespace)
    # a GPU Job claiming another team's reservation: refused, saying where that team runs
    claimed = s.job("claims-theirs", theirs, "reserved", 8)
    assert claimed.returncode != 0
    assert expected in claimed.stderr
    # a Job without GPUs, which gpufleet's webhook leaves alone: the API server refuses it
    cpu = job_manifest("cpu-theirs", s.namespace, {"gpufleet.io/team": theirs}, 0, 1, "60s")
    refused = _create(cluster, cpu)
    assert refused.returncode != 0
    assert POLICY_SAYS in refused.stderr and expected in refused.stderr
    # the team's own namespace is fine
    assert s.job("mine", own, "elastic", 8).returncode == 0
    s.wait_states({"mine": "Running"})
    # a managed workload's team or class changes only by the controller
    for label in (f"gpufleet.io/team={also}", "gpufleet.io/class=reserved"):
        changed = _as_tenant(
            cluster, "label", "job", "mine", "-n", s.namespace, label, "--overwrite"
        )
        assert changed.returncode != 0, label
        assert POLICY_SAYS in changed.stderr
        assert "only the gpufleet controller changes them" in changed.stderr
    # nor may the mark that says gpufleet manages it be taken off (then resuming it would be
    # free), nor a held pod's labels first and then its gate
    unmarked = _as_tenant(
        cluster, "annotate", "job", "mine", "-n", s.namespace, "gpufleet.io/managed-"
    )
    assert unmarked.returncode != 0 and POLICY_SAYS in unmarked.stderr
    # other labels stay the owner's to change
    other_label = _as_tenant(cluster, "label", "job", "mine", "-n", s.namespace, "purpose=test")
    assert other_label.returncode == 0, other_label.stderr


def test_only_the_controller_resumes_held_work_or_lifts_the_gate(
    cluster: ControlPlane, scenario: Any
) -> None:
    s = scenario(1)
    team = s.team("owner")
    s.reserve(team, 8)
    s.apply()
    assert s.job("running", team, "reserved", 8).returncode == 0
    s.wait_states({"running": "Running"})
    # the pool is full: this one waits, its pod made and held at gpufleet's scheduling gate
    assert s.job("held", team, "elastic", 8).returncode == 0
    s.wait_states({"held": "Pending"})
    job_pod = _pod_of(cluster, s.namespace, "held")
    assert {"name": "gpufleet.io/admission"} in job_pod["spec"]["schedulingGates"]
    lifted = _tenant_patch(
        cluster, "pod", job_pod["metadata"]["name"], s.namespace,
        '[{"op": "remove", "path": "/spec/schedulingGates"}]',
    )  # fmt: skip
    assert lifted.returncode != 0
    assert POLICY_SAYS in lifted.stderr and "lifts the gpufleet.io/admission" in lifted.stderr
    # the owner may suspend it (its template may then change), but not take the gate out of
    # its template, nor resume it
    suspended = _tenant_patch(cluster, "job", "held", s.namespace, '{"spec": {"suspend": true}}')
    assert suspended.returncode == 0, suspended.stderr
    # the API server lets a Job's template change only while it is suspended and not started:
    # once the Job controller has seen the suspension (it clears startTime); sooner, its own
    # validation refuses the patch before the policy is asked
    cluster.wait_until(
        lambda: (
            "startTime" not in (cluster.get("job", "held", "-n", s.namespace).get("status") or {})
        ),
        30,
        "the Job controller to see the suspension",
    )
    ungated = _tenant_patch(
        cluster, "job", "held", s.namespace,
        '[{"op": "remove", "path": "/spec/template/spec/schedulingGates"}]',
    )  # fmt: skip
    assert ungated.returncode != 0
    assert POLICY_SAYS in ungated.stderr and "lifts the gpufleet.io/admission" in ungated.stderr
    resumed = _tenant_patch(cluster, "job", "held", s.namespace, '{"spec": {"suspend": false}}')
    assert resumed.returncode != 0
    assert POLICY_SAYS in resumed.stderr and "held for admission" in resumed.stderr
    job = cluster.get("job", "held", "-n", s.namespace)
    assert {"name": "gpufleet.io/admission"} in job["spec"]["template"]["spec"]["schedulingGates"]
    # a bare pod of the team waits at gpufleet's scheduling gate
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "gated",
            "namespace": s.namespace,
            "labels": {"gpufleet.io/team": team, "gpufleet.io/pool": s.pool},
        },
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "8"}}}
            ],
        },
    }
    made = _create(cluster, pod)
    assert made.returncode == 0, made.stderr
    gates = cluster.get("pod", "gated", "-n", s.namespace)["spec"]["schedulingGates"]
    assert {"name": "gpufleet.io/admission"} in gates
    unlabelled = _as_tenant(
        cluster, "label", "pod", "gated", "-n", s.namespace, "gpufleet.io/team-"
    )
    assert unlabelled.returncode != 0 and POLICY_SAYS in unlabelled.stderr
    lifted = _tenant_patch(
        cluster, "pod", "gated", s.namespace, '[{"op": "remove", "path": "/spec/schedulingGates"}]'
    )
    assert lifted.returncode != 0
    assert POLICY_SAYS in lifted.stderr and "lifts the gpufleet.io/admission" in lifted.stderr
    assert cluster.get("pod", "gated", "-n", s.namespace)["spec"]["schedulingGates"] == gates
    # the controller itself resumes the held Job once the GPUs are free
    cluster.kubectl("delete", "pod", "gated", "-n", s.namespace, "--wait=false")
    cluster.kubectl("delete", "job", "running", "-n", s.namespace, "--wait=false")
    s.wait_states({"held": "Running"}, 90)
