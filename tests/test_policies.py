"""The params of the tenancy and holding policies, their per-kind rules and the holding policy's
PriorityClasses (gpufleet/kube/policies.py, holding.py); the API server's evaluation of them is
tested in tests/cluster/test_tenancy.py and test_holding.py."""

from __future__ import annotations

from engine_helpers import gitops

from gpufleet.controllers.admission import priority_class_for
from gpufleet.kube import kinds
from gpufleet.kube.chart import admission_rules, check_rules
from gpufleet.kube.holding import (
    HELD_KINDS,
    HOLDING,
    cel,
    elastic_classes,
    holding_binding,
    holding_policy,
)
from gpufleet.kube.policies import PARAMS, suspend_path, tenancy_params, validating_policy
from gpufleet.kube.request import Request
from gpufleet.model.api import NAMED_PRIORITIES
from gpufleet.model.fleet import fleet_from_objects


def test_the_params_say_each_teams_namespaces_and_who_the_controller_is() -> None:
    objects = gitops(
        {"h100": {}, "a100": {}},
        {
            "nlp": {"namespaces": ["nlp", "shared"]},
            "research": {"namespaces": ["shared"]},
            "idle": {},
        },
        policy={
            "admission": {
                "excludedNamespaces": ["ci"],
                "maxGPUsPerWorkload": 64,
                "requireTeam": True,
            }
        },
    )
    loaded = fleet_from_objects(objects)
    assert not loaded.problems
    params = tenancy_params(
        loaded.fleet, "gpufleet", ["system:serviceaccount:gpufleet:c", "b"], "kai-scheduler"
    )
    assert params["metadata"]["name"] == PARAMS and params["metadata"]["namespace"] == "gpufleet"
    assert params["data"] == {
        "team.nlp": "nlp,shared",
        "team.research": "shared",
        "team.idle": "",  # a team that lists none: its label is honoured nowhere
        # a namespace two teams list belongs to the first by name, as request.team_of says
        "ns.nlp": "nlp",
        "ns.shared": "nlp",
        "queue.nlp": "nlp",
        "queue.research": "research",
        "queue.idle": "idle",
        "pools": "a100,h100",
        "maxGPUs": "64",
        "requireTeam": "true",
        "excluded": "ci",
        "scheduler": "kai-scheduler",
        "controllers": "b,system:serviceaccount:gpufleet:c",
    }


def test_every_suspendable_kind_is_checked_where_it_says_it_is_suspended() -> None:
    assert suspend_path(kinds.JOB) == ("spec", "suspend")
    pytorch = next(k for k in kinds.KINDS if k.kind == "PyTorchJob")
    assert suspend_path(pytorch) == ("spec", "runPolicy", "suspend")
    resume_rule = validating_policy()["spec"]["validations"][-1]["expression"]
    for kind in kinds.OBJECT_KINDS:
        named = f"request.resource.resource == '{kind.plural}'"
        # gated kinds have no suspend field: their pods' gate is checked instead
        assert (named in resume_rule) is (not kind.gated), kind.kind
    assert "oldObject.spec.runPolicy.suspend == true" in resume_rule


def test_the_holding_policy_gives_elastic_work_the_class_the_webhook_gives() -> None:
    classes = elastic_classes()
    assert set(classes) == {*NAMED_PRIORITIES, *map(str, range(100))}
    for label, class_name in classes.items():
        priority = NAMED_PRIORITIES.get(label, int(label) if label.isdigit() else -1)
        request = Request("t", "elastic", priority, 1, 1, None)
        assert priority_class_for(request) == class_name, label


def test_each_kind_is_held_by_the_api_server_or_by_the_webhook_not_both() -> None:
    def kinds_of(rules: list[dict[str, list[str]]]) -> set[str]:
        return {f"{r['apiGroups'][0]}/{r['resources'][0]}" for r in rules}

    held = kinds_of(check_rules())
    assert (
        held
        == {f"{k.group}/{k.plural}" for k in HELD_KINDS}
        == {"batch/jobs", "apps/deployments", "leaderworkerset.x-k8s.io/leaderworkersets", "/pods"}
    )
    assert not held & kinds_of(admission_rules())
    assert held | kinds_of(admission_rules()) == {f"{k.group}/{k.plural}" for k in kinds.KINDS}
    policies = [holding_policy(h) for h in HOLDING]
    assert (
        set().union(*(kinds_of(p["spec"]["matchConstraints"]["resourceRules"]) for p in policies))
        == held
    )
    # without its params it holds nothing rather than refuse every GPU Job of the cluster;
    # never in the cluster's own namespaces or the controller's
    binding = holding_binding("gpufleet", skip=("extra",))
    assert binding["spec"]["paramRef"]["parameterNotFoundAction"] == "Allow"
    (selector,) = binding["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"]
    assert selector["operator"] == "NotIn"
    assert {"kube-system", "gpufleet", "extra"} <= set(selector["values"])


def test_cel_literals_are_typed_where_the_patched_object_needs_it() -> None:
    assert cel({"a": "x", "b": "y"}) == "{'a': 'x', 'b': 'y'}"
    assert cel("it's") == "'it\\'s'"
    assert (
        cel({"key": "k", "values": ["v"]}, "Object.spec.t")
        == "Object.spec.t{key: 'k', values: ['v']}"
    )
    assert cel([{"n": 1}], "Object.l") == "[Object.l{n: 1}]"
