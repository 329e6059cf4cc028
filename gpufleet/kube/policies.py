"""The ValidatingAdmissionPolicy that guards tenancy inside the API server, and the ConfigMap it
reads as its params. Pure: the shells apply what these functions make.

What it enforces (DESIGN §5), on the objects of every workload kind and on pods:
- a team label names a Team that lists the object's namespace (else any tenant could run
  reserved work on another team's reservation and bill it to them);
- a managed workload's team and class change only by the gpufleet controller;
- only the controller lifts gpufleet's scheduling gate off a pod or a Job's pod template;
- only the controller resumes a managed workload it holds suspended.

CEL in the API server rather than a check in our webhook: it runs in-process, costs no round
trip and holds whether or not the controller is up. The policy needs only what CEL can see: the
object, its old version, the requesting user, and the params ConfigMap, which the controller
writes from the fleet (`tenancy_params`) with the user names it acts as. Until that ConfigMap
exists the binding allows everything (`parameterNotFoundAction: Allow`): a cluster where the
controller never ran is not locked.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from gpufleet.model.fleet import Fleet
from gpufleet.model.keys import (
    ADMISSION_GATE,
    CLASS_LABEL,
    MANAGED_ANNOTATION,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    TEAM_LABEL,
    WORKLOAD_LABEL,
)
from gpufleet.render.kai import queue_name_for_team

from .kinds import OBJECT_KINDS
from .kinds.base import WorkloadKind

POLICY = "tenancy.gpufleet.io"  # the chart's is <release>-tenancy.gpufleet.io
PARAMS = "gpufleet-tenancy"  # the ConfigMap, in the controller's namespace
API = "admissionregistration.k8s.io/v1"
OPERATIONS = ["CREATE", "UPDATE"]


def tenancy_params(
    fleet: Fleet, namespace: str, controllers: Iterable[str], scheduler: str = ""
) -> dict[str, Any]:
    """The params of the tenancy and holding policies (holding.py): `team.<team>` the
    namespaces a team lists, `ns.<namespace>` the team a namespace's workloads belong to
    without a team label, `queue.<team>` its KAI queue, `pools` the pools, `maxGPUs` and
    `requireTeam` the FleetPolicy's admission limits, `excluded` the namespaces gpufleet leaves
    alone, `scheduler` the scheduler admitted pods go to, `controllers` the user names the
    controller acts as (lists comma-separated)."""
    data = {f"team.{name}": ",".join(team.spec.namespaces) for name, team in fleet.teams.items()}
    for name in sorted(fleet.teams, reverse=True):  # the first team by name, as team_of
        data.update({f"ns.{ns}": name for ns in fleet.teams[name].spec.namespaces})
    data.update({f"queue.{name}": queue_name_for_team(fleet, name) for name in fleet.teams})
    admission = fleet.policy.admission
    data["pools"] = ",".join(sorted(fleet.pools))
    limit = admission.max_gpus_per_workload
    data["maxGPUs"] = "" if limit is None else str(int(limit))
    data["requireTeam"] = "true" if admission.require_team else "false"
    data["excluded"] = ",".join(admission.excluded_namespaces)
    data["scheduler"] = scheduler
    data["controllers"] = ",".join(sorted(set(controllers)))
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": PARAMS,
            "namespace": namespace,
            "labels": {MANAGED_BY_LABEL: MANAGED_BY},
        },
        "data": data,
    }


def _label(obj: str, key: str) -> str:
    return (
        f"{obj} != null && has({obj}.metadata.labels) && '{key}' in {obj}.metadata.labels"
        f" ? {obj}.metadata.labels['{key}'] : ''"
    )


def _field_true(obj: str, path: tuple[str, ...]) -> str:
    """CEL: `obj.<path>` is present and true."""
    steps = [".".join((obj, *path[: i + 1])) for i in range(len(path))]
    return " && ".join([f"{obj} != null", *(f"has({s})" for s in steps), f"{steps[-1]} == true"])


def suspend_path(kind: WorkloadKind) -> tuple[str, ...]:
    """Where a kind's objects say they are suspended (from its `suspend_patch`)."""
    path: list[str] = []
    node: Any = kind.suspend_patch()
    while isinstance(node, dict):
        ((key, node),) = node.items()
        path.append(key)
    return tuple(path)


def _suspended(obj: str) -> str:
    """CEL: `obj` is a suspended object of a kind gpufleet suspends (gated kinds have none)."""
    expression = "false"
    for kind in reversed([k for k in OBJECT_KINDS if not k.gated]):
        test = (
            f"request.resource.group == '{kind.group}'"
            f" && request.resource.resource == '{kind.plural}'"
        )
        expression = f"({test}) ? ({_field_true(obj, suspend_path(kind))}) : ({expression})"
    return expression


def _gated(obj: str) -> str:
    """CEL: gpufleet's gate holds `obj`, a pod, or the pods of `obj`, a Job (kinds/job.py)."""

    def holds(spec: str) -> str:
        return (
            f"has({spec}.schedulingGates)"
            f" && {spec}.schedulingGates.exists(g, g.name == '{ADMISSION_GATE}')"
        )

    return (
        f"{obj} != null && (request.resource.resource == 'pods' ? {holds(f'{obj}.spec')} : "
        f"request.resource.group == 'batch' && request.resource.resource == 'jobs'"
        f" && {holds(f'{obj}.spec.template.spec')})"
    )


UNCHANGED = "request.operation == 'UPDATE' && variables.team == variables.oldTeam"


def validating_policy(name: str = POLICY) -> dict[str, Any]:
    rules = [
        {
            "apiGroups": [k.group],
            "apiVersions": [k.version],
            "resources": [k.plural],
            "operations": OPERATIONS,
        }
        for k in OBJECT_KINDS
    ]
    rules.append(
        {"apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"], "operations": OPERATIONS}
    )
    # a held pod stays matched when its labels are taken off first
    labelled = " || ".join(
        [
            f"({o} != null && has({o}.metadata.labels) && '{key}' in {o}.metadata.labels)"
            for o in ("object", "oldObject")
            for key in (TEAM_LABEL, WORKLOAD_LABEL)
        ]
        + [f"({_gated('oldObject')})"]
    )
    team_namespaces = "params.data['team.' + variables.team]"
    return {
        "apiVersion": API,
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name, "labels": {MANAGED_BY_LABEL: MANAGED_BY}},
        "spec": {
            "failurePolicy": "Fail",
            "paramKind": {"apiVersion": "v1", "kind": "ConfigMap"},
            "matchConstraints": {"resourceRules": rules},
            # only objects that say they are gpufleet's: the rest never evaluate a line
            "matchConditions": [{"name": "labelled", "expression": labelled}],
            "variables": [
                {"name": "team", "expression": _label("object", TEAM_LABEL)},
                {"name": "oldTeam", "expression": _label("oldObject", TEAM_LABEL)},
                {"name": "cls", "expression": _label("object", CLASS_LABEL)},
                {"name": "oldCls", "expression": _label("oldObject", CLASS_LABEL)},
                {
                    "name": "controller",
                    "expression": "has(params.data) && 'controllers' in params.data"
                    " && request.userInfo.username in params.data['controllers'].split(',')",
                },
                {
                    "name": "managed",
                    "expression": "oldObject != null && has(oldObject.metadata.annotations)"
                    f" && '{MANAGED_ANNOTATION}' in oldObject.metadata.annotations",
                },
                {
                    "name": "excluded",
                    "expression": "has(params.data) && 'excluded' in params.data"
                    " && request.namespace in params.data['excluded'].split(',')",
                },
            ],
            "validations": [
                {
                    # a team the params do not know yet (created a moment ago) is the
                    # webhook's to check, which waits for the fleet's caches
                    "expression": f"variables.team == '' || variables.excluded || ({UNCHANGED})"
                    " || !(has(params.data) && ('team.' + variables.team) in params.data)"
                    f" || request.namespace in {team_namespaces}.split(',')",
                    # the words of request.team_namespace_message
                    "messageExpression": "'team ' + variables.team + ' runs in namespace(s) ' + "
                    f"({team_namespaces} == '' ? '(none listed)' : {team_namespaces}) + '; ' + "
                    "request.namespace + ' is not one of them: set "
                    f"{TEAM_LABEL} to a team of ' + request.namespace + ', or add ' + "
                    "request.namespace + ' to the Team\\'s spec.namespaces by pull request'",
                    "reason": "Forbidden",
                },
                {
                    # the mark too, or taking it off first would let the owner resume it
                    "expression": "!variables.managed || variables.controller || "
                    "(variables.team == variables.oldTeam && variables.cls == variables.oldCls"
                    " && has(object.metadata.annotations)"
                    f" && '{MANAGED_ANNOTATION}' in object.metadata.annotations)",
                    "message": "the team, class and gpufleet.io/managed mark of a workload "
                    "gpufleet manages are set when it is created and only the gpufleet "
                    "controller changes them: delete it and create it again with the labels you "
                    "want",
                    "reason": "Forbidden",
                },
                {
                    "expression": f"variables.controller || !({_gated('oldObject')})"
                    f" || ({_gated('object')})",
                    "message": f"only the gpufleet controller lifts the {ADMISSION_GATE} "
                    "scheduling gate: the pods are released when their workload is admitted "
                    "(kubectl get gwl says where it waits and why)",
                    "reason": "Forbidden",
                },
                {
                    "expression": f"variables.controller || !variables.managed"
                    f" || !({_suspended('oldObject')}) || ({_suspended('object')})",
                    "message": "this workload is held for admission: only the gpufleet "
                    "controller resumes it, when it is admitted (kubectl get gwl says where it "
                    "waits and why)",
                    "reason": "Forbidden",
                },
            ],
        },
    }


def policy_binding(params_namespace: str, name: str = POLICY) -> dict[str, Any]:
    return {
        "apiVersion": API,
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name, "labels": {MANAGED_BY_LABEL: MANAGED_BY}},
        "spec": {
            "policyName": name,
            "validationActions": ["Deny"],
            "paramRef": {
                "name": PARAMS,
                "namespace": params_namespace,
                "parameterNotFoundAction": "Allow",
            },
        },
    }


def admission_policies(params_namespace: str, name: str = POLICY) -> list[dict[str, Any]]:
    """The policy and its binding (the params ConfigMap is the controller's to write)."""
    return [validating_policy(name), policy_binding(params_namespace, name)]
