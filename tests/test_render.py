"""Renderers: schema-valid against the real third-party CRDs, pinned by golden files."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml
from conftest import module_crds
from crdschema import CRDSchemas
from typer.testing import CliRunner

from gpufleet.cli.main import app
from gpufleet.model import load_fleet
from gpufleet.model.bursting import burst_ceiling
from gpufleet.render import ClusterSettings, Target, render, to_yaml
from gpufleet.render.karpenter import InstanceTypesError, kwok_instance_types
from gpufleet.testing.cluster import KARPENTER_CRDS

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "gitops"
GOLDEN = Path(__file__).parent / "golden"


@pytest.fixture(scope="module")
def fleet():  # type: ignore[no-untyped-def]
    loaded = load_fleet([EXAMPLE])
    assert loaded.problems == []
    return loaded.fleet


@pytest.mark.parametrize(
    "target",
    # the bundled example has no azure pool: examples/azure's golden file is test_azure.py's
    [t for t in Target if t not in (Target.ALL, Target.KARPENTER_AZURE)],
    ids=lambda t: t.value,
)
def test_golden(fleet, target: Target) -> None:  # type: ignore[no-untyped-def]
    text = to_yaml(render(fleet, target))
    golden = GOLDEN / f"render-{target.value}.yaml"
    if os.environ.get("UPDATE_GOLDEN"):
        golden.write_text(text)
    assert text == golden.read_text(), (
        f"rendered {target.value} differs from {golden}; if intended, rerun with UPDATE_GOLDEN=1"
    )


def test_all_is_the_union_of_the_targets(fleet) -> None:  # type: ignore[no-untyped-def]
    cloud = [t for t in Target if t not in (Target.ALL, Target.KARPENTER_KWOK)]
    parts = [obj for t in cloud for obj in render(fleet, t)]
    everything = render(fleet, Target.ALL)
    assert sorted(map(repr, everything)) == sorted(map(repr, parts))
    names = [(o["kind"], o["metadata"]["name"]) for o in everything]
    assert len(names) == len(set(names))


def test_aws_objects_match_karpenters_crds(fleet, karpenter_aws_crds: Path) -> None:  # type: ignore[no-untyped-def]
    """Against the CRDs of Karpenter's AWS provider module (hack/k8s/build.sh fetches them)."""
    schemas = CRDSchemas(sorted(karpenter_aws_crds.glob("*.yaml")))
    objects = render(fleet, Target.KARPENTER_AWS)
    assert {o["kind"] for o in objects if schemas.knows(o)} == {"NodePool", "EC2NodeClass"}
    assert [e for o in objects for e in schemas.errors(o)] == []


def test_rendered_objects_match_the_real_crd_schemas(fleet, shared_crds: Path) -> None:  # type: ignore[no-untyped-def]
    schemas = CRDSchemas(sorted(shared_crds.rglob("*.yaml")))
    objects = render(fleet, Target.ALL)
    checked = [o for o in objects if schemas.knows(o)]
    kinds = {o["kind"] for o in checked}
    assert kinds == {"NodePool", "EC2NodeClass", "GCENodeClass", "Queue"}
    errors = [e for o in checked for e in schemas.errors(o)]
    assert errors == []


def test_kwok_target_matches_karpenters_own_crds(fleet) -> None:  # type: ignore[no-untyped-def]
    """The dev cluster's NodePools and KWOKNodeClasses, against the CRDs hack/k8s/build.sh
    takes from Karpenter's Go module; each NodePool is its cloud NodePool but for the
    NodeClass it names."""
    crds = module_crds(KARPENTER_CRDS)
    schemas = CRDSchemas(sorted(crds.glob("*.yaml")))
    objects = render(fleet, Target.KARPENTER_KWOK)
    assert {o["kind"] for o in objects if schemas.knows(o)} == {"NodePool", "KWOKNodeClass"}
    assert [e for o in objects for e in schemas.errors(o)] == []
    cloud = {
        o["metadata"]["name"]: o
        for t in (Target.KARPENTER_AWS, Target.KARPENTER_GCP)
        for o in render(fleet, t)
        if o["kind"] == "NodePool"
    }
    for pool in (o for o in objects if o["kind"] == "NodePool"):
        name = pool["metadata"]["name"]
        assert pool["spec"]["template"]["spec"]["nodeClassRef"] == {
            "group": "karpenter.kwok.sh",
            "kind": "KWOKNodeClass",
            "name": name,
        }
        pool["spec"]["template"]["spec"]["nodeClassRef"] = cloud[name]["spec"]["template"]["spec"][
            "nodeClassRef"
        ]
        assert pool == cloud[name]


def test_kwok_instance_types_come_from_the_pools(fleet) -> None:  # type: ignore[no-untyped-def]
    types = {t["name"]: t for t in kwok_instance_types(fleet)}
    assert set(types) == {"p5.48xlarge", "p4d.24xlarge", "p4de.24xlarge", "g2-standard-48"}
    p5 = types["p5.48xlarge"]
    assert p5["resources"]["nvidia.com/gpu"] == "8"
    offers = {
        (o["Requirements"][0]["values"][0], o["Requirements"][1]["values"][0]): o["Price"]
        for o in p5["offerings"]
    }
    # kwok has no capacity reservations: the pool's `reserved` is left to on-demand
    assert offers == {("on-demand", "us-west-2a"): 55.04, ("on-demand", "us-west-2b"): 55.04}
    l4 = {
        o["Requirements"][0]["values"][0]: o["Price"] for o in types["g2-standard-48"]["offerings"]
    }
    assert l4 == {"on-demand": 2.84, "spot": 1.12}  # 4 GPUs at 0.71 and 0.28 per GPU-hour


def test_kwok_instance_types_refuse_contradicting_pools(write) -> None:  # type: ignore[no-untyped-def]
    pools = yaml.safe_load_all((EXAMPLE / "pools.yaml").read_text())
    docs = list(pools)
    docs[2]["spec"]["instanceTypes"] = ["p5.48xlarge"]  # the L4 pool says 4 GPUs per node
    folder = write({"pools.yaml": yaml.safe_dump_all(docs)})
    loaded = load_fleet([folder])
    with pytest.raises(InstanceTypesError, match=r"p5\.48xlarge has 4 GPUs per node in pool"):
        kwok_instance_types(loaded.fleet)
    docs[2]["spec"]["instanceTypes"] = ["g2-standard-48"]
    docs[2]["spec"]["capacityTypes"] = ["reserved"]
    folder = write({"pools.yaml": yaml.safe_dump_all(docs)})
    with pytest.raises(InstanceTypesError, match="no offering kwok can launch"):
        kwok_instance_types(load_fleet([folder]).fleet)


def test_schema_check_catches_a_broken_object(fleet, karpenter_aws_crds: Path) -> None:  # type: ignore[no-untyped-def]
    schemas = CRDSchemas(sorted(karpenter_aws_crds.glob("*.yaml")))
    nodepool = next(o for o in render(fleet, Target.KARPENTER_AWS) if o["kind"] == "NodePool")
    nodepool["spec"]["disruption"]["consolidationPolicy"] = "Sometimes"
    nodepool["spec"]["template"]["spec"]["requirementz"] = []
    errors = schemas.errors(nodepool)
    assert any("'Sometimes' is not one of" in e for e in errors), errors
    assert any("requirementz" in e for e in errors), errors


def test_nodepool_carries_pool_limits_taint_and_requirements(fleet) -> None:  # type: ignore[no-untyped-def]
    objs = {(o["kind"], o["metadata"]["name"]): o for o in render(fleet, Target.KARPENTER_AWS)}
    pool = objs[("NodePool", "us-west-h100")]["spec"]
    assert pool["limits"] == {"nvidia.com/gpu": "256"}
    template = pool["template"]["spec"]
    assert {"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"} in template["taints"]
    reqs = {r["key"]: r["values"] for r in template["requirements"]}
    assert reqs["node.kubernetes.io/instance-type"] == ["p5.48xlarge"]
    assert reqs["karpenter.sh/capacity-type"] == ["reserved", "on-demand"]
    assert reqs["topology.kubernetes.io/zone"] == ["us-west-2a", "us-west-2b"]
    assert pool["template"]["metadata"]["labels"]["gpufleet.io/pool"] == "us-west-h100"
    nodeclass = objs[("EC2NodeClass", "us-west-h100")]["spec"]
    assert nodeclass["capacityReservationSelectorTerms"] == [{"id": "cr-0a1b2c3d4e5f60718"}]
    assert nodeclass["amiSelectorTerms"] == [{"alias": "al2023@v20251112"}]
    # only aws pools in the aws target
    assert {name for _, name in objs} == {"us-west-h100", "us-east-a100"}


def test_cluster_name_reaches_discovery_tags_and_role(fleet) -> None:  # type: ignore[no-untyped-def]
    objs = render(fleet, Target.KARPENTER_AWS, ClusterSettings(name="prod-eks"))
    nodeclass = next(o for o in objs if o["kind"] == "EC2NodeClass")["spec"]
    assert nodeclass["role"] == "KarpenterNodeRole-prod-eks"
    assert nodeclass["subnetSelectorTerms"] == [{"tags": {"karpenter.sh/discovery": "prod-eks"}}]


def test_kai_queues_follow_the_team_tree(fleet) -> None:  # type: ignore[no-untyped-def]
    queues = {q["metadata"]["name"]: q["spec"] for q in render(fleet, Target.KAI)}
    assert set(queues) == {"research", "nlp", "vision", "production", "inference", "training"}
    assert queues["nlp"]["parentQueue"] == "research"
    assert "parentQueue" not in queues["research"]
    gpu = queues["nlp"]["resources"]["gpu"]
    # nlp reserves 32 H100 + 16 A100 = 48 and may burst 50 % -> 72; weight = burstingPriority
    assert gpu == {"quota": 48, "limit": 72, "overQuotaWeight": 3}
    assert queues["research"]["resources"]["gpu"]["quota"] == 88  # nlp 48 + vision 40
    assert queues["inference"]["resources"]["gpu"]["limit"] == 48  # burstLimit "0"
    assert queues["training"]["resources"]["gpu"]["limit"] == -1  # unlimited
    assert queues["nlp"]["resources"]["cpu"] == {"quota": -1, "limit": -1, "overQuotaWeight": 1}


def test_parent_team_with_own_reservation_gets_a_leaf_queue(write) -> None:  # type: ignore[no-untyped-def]
    folder = write(
        {
            "f.yaml": (EXAMPLE / "pools.yaml").read_text()
            + """---
apiVersion: gpufleet.io/v1alpha1
kind: Team
metadata: {name: research}
---
apiVersion: gpufleet.io/v1alpha1
kind: Team
metadata: {name: nlp}
spec: {parent: research}
---
apiVersion: gpufleet.io/v1alpha1
kind: Reservation
metadata: {name: research-own}
spec: {team: research, pool: us-west-h100, gpus: 8}
"""
        }
    )
    queues = {
        q["metadata"]["name"]: q["spec"] for q in render(load_fleet([folder]).fleet, Target.KAI)
    }
    assert queues["research-own"]["parentQueue"] == "research"
    assert queues["research-own"]["resources"]["gpu"]["quota"] == 8
    assert queues["research"]["resources"]["gpu"]["quota"] == 8


@pytest.mark.parametrize(
    ("limit", "reserved", "expected"),
    [
        (None, 32, -1),
        ("0", 32, 32),
        ("50%", 32, 48),
        ("16", 32, 48),
        ("12.5%", 8, 9),
        ("50%", 0, 0),
    ],
)
def test_burst_ceiling(limit: str | None, reserved: int, expected: float) -> None:
    from gpufleet.model.api import Team

    team = Team.model_validate({"metadata": {"name": "t"}, "spec": {"burstLimit": limit}})
    assert burst_ceiling(team, reserved) == expected


def test_priority_classes_straddle_kais_threshold(fleet) -> None:  # type: ignore[no-untyped-def]
    classes = {o["metadata"]["name"]: o for o in render(fleet, Target.PRIORITY_CLASSES)}
    assert classes["gpufleet-reserved"]["value"] >= 100
    elastic = [c for n, c in classes.items() if n != "gpufleet-reserved"]
    assert {c["value"] for c in elastic} == {90, 75, 50, 25, 10}
    assert all(c["preemptionPolicy"] == "Never" for c in classes.values())


def test_cli_render_to_folder_prunes_stale_files(tmp_path: Path) -> None:
    runner = CliRunner()
    out = tmp_path / "rendered"
    out.mkdir()
    (out / "nodepool-removed-pool.yaml").write_text(
        "apiVersion: karpenter.sh/v1\nkind: NodePool\nmetadata:\n  name: removed-pool\n"
        "  labels: {app.kubernetes.io/managed-by: gpufleet}\n"
    )
    (out / "mine.yaml").write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: mine}\n")
    result = runner.invoke(app, ["render", str(EXAMPLE), "--target", "all", "-o", str(out)])
    assert result.exit_code == 0, result.output
    files = sorted(p.name for p in out.iterdir())
    assert "nodepool-removed-pool.yaml" not in files
    assert "mine.yaml" in files  # not ours: never touched
    assert "nodepool-us-west-h100.yaml" in files
    assert "queue-nlp.yaml" in files
    obj = yaml.safe_load((out / "nodepool-us-west-h100.yaml").read_text())
    assert obj["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "gpufleet"


def test_cli_render_refuses_invalid_input() -> None:
    result = CliRunner().invoke(app, ["render", "tests/data/invalid", "--target", "all"])
    assert result.exit_code == 1
    assert "not rendering" in result.output
    assert "Traceback" not in result.output
    assert result.stdout == ""


def test_render_is_deterministic(fleet) -> None:  # type: ignore[no-untyped-def]
    again = load_fleet([EXAMPLE]).fleet
    assert to_yaml(render(fleet, Target.ALL)) == to_yaml(render(again, Target.ALL))


def test_a_fleet_of_clusters_renders_one_clusters_pools_at_a_time() -> None:
    fleet_dir = REPO / "examples" / "multicluster"
    runner = CliRunner()
    eu = runner.invoke(
        app, ["render", str(fleet_dir), "-t", "karpenter-aws", "--cluster-name", "eu"]
    )
    assert eu.exit_code == 0, eu.output
    names = {(o["kind"], o["metadata"]["name"]) for o in yaml.safe_load_all(eu.stdout)}
    assert names == {("NodePool", "eu-h100"), ("EC2NodeClass", "eu-h100")}
    unnamed = runner.invoke(app, ["render", str(fleet_dir), "-t", "karpenter-aws"])
    assert unnamed.exit_code != 0
    assert "the fleet declares the clusters eu, us-west" in unnamed.output
    assert "Traceback" not in unnamed.output
