"""The tenancy policy's params and its per-kind rules (gpufleet/kube/policies.py); the API
server's evaluation of it is tested in tests/cluster/test_tenancy.py."""

from __future__ import annotations

from engine_helpers import gitops

from gpufleet.kube import kinds
from gpufleet.kube.policies import PARAMS, suspend_path, tenancy_params, validating_policy
from gpufleet.model.fleet import fleet_from_objects


def test_the_params_say_each_teams_namespaces_and_who_the_controller_is() -> None:
    objects = gitops(
        {"h100": {}},
        {"nlp": {"namespaces": ["nlp", "nlp-dev"]}, "research": {}},
        policy={"admission": {"excludedNamespaces": ["ci"]}},
    )
    loaded = fleet_from_objects(objects)
    assert not loaded.problems
    params = tenancy_params(loaded.fleet, "gpufleet", ["system:serviceaccount:gpufleet:c", "b"])
    assert params["metadata"]["name"] == PARAMS and params["metadata"]["namespace"] == "gpufleet"
    assert params["data"] == {
        "team.nlp": "nlp,nlp-dev",
        "team.research": "",  # a team that lists none: its label is honoured nowhere
        "excluded": "ci",
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
