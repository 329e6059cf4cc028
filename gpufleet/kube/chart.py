"""The chart's rules for each workload kind, made from the kind registry (`kinds.KINDS`), so that
a new kind is one line there and nothing in the chart is listed by hand.

`charts/gpufleet/templates/_kinds.tpl` holds them as named templates that `rbac.yaml`,
`webhook.yaml` and `server.yaml` include; `make chart-kinds` writes it and a test fails when it
differs from what the registry makes. The dev controller registers its webhooks with the same
`admission_rules()`.
"""

from __future__ import annotations

import json
from typing import Any

from gpufleet.model.fleet import Fleet

from .holding import HELD_KINDS, api_server_policies
from .kinds import OBJECT_KINDS
from .kinds.base import WorkloadKind
from .policies import tenancy_params

TEMPLATE = "charts/gpufleet/templates/_kinds.tpl"
POLICY_TEMPLATE = "charts/gpufleet/templates/admission-policy.yaml"
NAMESPACE = "{{ .Release.Namespace }}"
# the controller admits, suspends and resumes each kind's objects
CONTROLLER_VERBS = ("get", "list", "watch", "patch")
# the server cancels a workload by deleting its object, for callers who may delete its
# GPUWorkload (it reads workloads through their GPUWorkloads)
SERVER_VERBS = ("delete",)


def _creation_rule(kind: WorkloadKind) -> dict[str, Any]:
    return {
        "apiGroups": [kind.group],
        "apiVersions": [kind.version],
        "resources": [kind.plural],
        "operations": ["CREATE"],
        "scope": "Namespaced",
    }


def admission_rules() -> list[dict[str, Any]]:
    """The admission webhook's rules: the creation of an object of each kind the API server
    does not hold itself (holding.py holds Jobs)."""
    return [_creation_rule(k) for k in OBJECT_KINDS if k not in HELD_KINDS]


def check_rules() -> list[dict[str, Any]]:
    """The rules of the webhook that checks what the holding policy could not vouch for."""
    return [_creation_rule(k) for k in HELD_KINDS]


def role_rules(verbs: tuple[str, ...]) -> list[dict[str, Any]]:
    """ClusterRole rules granting `verbs` on the objects of each kind."""
    return [
        {"apiGroups": [k.group], "resources": [k.plural], "verbs": list(verbs)}
        for k in OBJECT_KINDS
    ]


def _flow(rule: dict[str, Any]) -> str:
    """One rule as a YAML flow mapping on one line (JSON is YAML)."""
    return json.dumps(rule, separators=(", ", ": "))


def _define(name: str, comment: str, rules: list[dict[str, Any]]) -> str:
    lines = "\n".join(f"- {_flow(rule)}" for rule in rules)
    return f'{{{{/* {comment} */}}}}\n{{{{- define "{name}" -}}}}\n{lines}\n{{{{- end }}}}\n'


def kinds_template() -> str:
    """The text of `_kinds.tpl`."""
    header = (
        "{{/* Generated from the workload-kind registry (gpufleet/kube/kinds/__init__.py) by\n"
        "     `make chart-kinds`; do not edit: a test fails when this differs. */}}\n"
    )
    return (
        "\n".join(
            (
                header,
                _define(
                    "gpufleet.kinds.admissionRules",
                    "the admission webhook: creating any kind the API server does not hold",
                    admission_rules(),
                ),
                _define(
                    "gpufleet.kinds.checkRules",
                    "the check webhook: the creation of the kinds the API server holds",
                    check_rules(),
                ),
                _define(
                    "gpufleet.kinds.controllerRules",
                    "the controller: read, admit, suspend and resume every kind's objects",
                    role_rules(CONTROLLER_VERBS),
                ),
                _define(
                    "gpufleet.kinds.serverRules",
                    "the server: cancel (delete) every kind's objects",
                    role_rules(SERVER_VERBS),
                ),
            )
        ).rstrip()
        + "\n"
    )


def policy_template() -> str:
    """The text of `admission-policy.yaml`: the tenancy policy, the holding policy, their
    bindings and their params in the release namespace, shipped empty of teams so that work is
    held from the install on (the controller writes the fleet into it)."""
    header = (
        "# Generated from gpufleet/kube/policies.py and holding.py by `make chart-kinds`; do not\n"
        "# edit: a test fails when this differs. The API server enforces them whether or not the\n"
        "# controller is up; they never refuse a valid create.\n"
    )
    release = "{{ .Release.Name }}"
    controller = f"system:serviceaccount:{NAMESPACE}:{release}-controller"
    params = tenancy_params(Fleet(), NAMESPACE, [controller])
    params["metadata"]["labels"] = "LABELS"
    objects = [*api_server_policies(NAMESPACE, f"{release}-"), params]
    documents = [json.dumps(obj, indent=2) for obj in objects]
    text = header + "\n---\n".join(documents) + "\n"
    # the chart's labels on the params, so that Helm owns the ConfigMap it installs
    return text.replace('"LABELS"', '{{ include "gpufleet.labels" . | fromYaml | toJson }}')
