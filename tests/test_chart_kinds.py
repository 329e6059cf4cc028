"""The chart's per-kind rules come from the workload-kind registry: the generated template is
current, the chart lists no kind by hand, and the generated rules name every object kind."""

from __future__ import annotations

from pathlib import Path

import yaml

from gpufleet.kube.chart import (
    CONTROLLER_VERBS,
    POLICY_TEMPLATE,
    TEMPLATE,
    admission_rules,
    check_rules,
    kinds_template,
    policy_template,
    role_rules,
)
from gpufleet.kube.holding import HELD_KINDS
from gpufleet.kube.kinds import KINDS, OBJECT_KINDS

REPO = Path(__file__).resolve().parent.parent
TEMPLATES = REPO / "charts" / "gpufleet" / "templates"


def test_the_generated_template_is_current() -> None:
    assert (REPO / TEMPLATE).read_text() == kinds_template(), (
        f"{TEMPLATE} is out of date with the kind registry: run `make chart-kinds`"
    )


def test_the_generated_policy_is_current() -> None:
    assert (REPO / POLICY_TEMPLATE).read_text() == policy_template(), (
        f"{POLICY_TEMPLATE} is out of date with gpufleet/kube/policies.py: run `make chart-kinds`"
    )
    labels = '{{ include "gpufleet.labels" . | fromYaml | toJson }}'
    assert policy_template().count(labels) == 1  # the params', Helm's to own
    documents = list(yaml.safe_load_all(policy_template().replace(labels, "{}")))
    policy, binding, *holding, params = documents
    holds, hold_bindings = holding[::2], holding[1::2]
    assert len(holds) == len(HELD_KINDS)
    for bound in (binding, *hold_bindings):
        assert bound["spec"]["paramRef"]["namespace"] == "{{ .Release.Namespace }}"
        assert bound["spec"]["paramRef"]["name"] == params["metadata"]["name"]
    rules = policy["spec"]["matchConstraints"]["resourceRules"]
    assert {r["resources"][0] for r in rules} == {k.plural for k in OBJECT_KINDS} | {"pods"}
    for hold, bound in zip(holds, hold_bindings, strict=True):
        assert hold["kind"] == "MutatingAdmissionPolicy"
        assert bound["spec"]["policyName"] == hold["metadata"]["name"]
    # shipped knowing no team (every team's Job is then held and checked by the webhook) and
    # the controller's ServiceAccount, which alone may lift what the policies hold
    assert params["data"]["controllers"] == (
        "system:serviceaccount:{{ .Release.Namespace }}:{{ .Release.Name }}-controller"
    )
    assert not any(key.startswith("team.") for key in params["data"])


def test_the_chart_lists_no_kind_by_hand() -> None:
    for name, include in (
        ("rbac.yaml", "gpufleet.kinds.controllerRules"),
        ("webhook.yaml", "gpufleet.kinds.admissionRules"),
        ("webhook.yaml", "gpufleet.kinds.checkRules"),
        ("server.yaml", "gpufleet.kinds.serverRules"),
    ):
        text = (TEMPLATES / name).read_text()
        assert f'include "{include}"' in text, name
        for kind in OBJECT_KINDS:
            assert f"[{kind.plural}]" not in text, f"{name} lists {kind.plural} by hand"


def test_each_definition_is_yaml_of_the_registrys_rules() -> None:
    text = kinds_template()
    for name, rules in (
        ("gpufleet.kinds.admissionRules", admission_rules()),
        ("gpufleet.kinds.checkRules", check_rules()),
        ("gpufleet.kinds.controllerRules", role_rules(CONTROLLER_VERBS)),
    ):
        body = text.split(f'{{{{- define "{name}" -}}}}\n', 1)[1].split("{{- end }}", 1)[0]
        assert yaml.safe_load(body) == rules
    # every kind reaches a webhook: Jobs, Deployments and bare pods only when their holding
    # policy could not vouch for them
    every = sorted(r["resources"] for r in check_rules() + admission_rules())
    assert every == sorted([k.plural] for k in KINDS)
