"""The AWS Pulumi stack with Pulumi's mocks (no cloud, no CLI): the resource graph, IAM least
privilege, Helm values, NodePools identical to `gpufleet render`, and configuration errors."""

from __future__ import annotations

import json
import runpy
import sys
from typing import Any

import pulumi
import pytest
from conftest import EXAMPLE, REPO
from pulumi_mocks import Mocks, of_type, run
from typer.testing import CliRunner

from gpufleet.cli.main import app
from gpufleet.iac import ConfigError

sys.path.insert(0, str(REPO / "infra" / "aws"))
import aws_stack


def run_stack(**config: Any) -> tuple[list[pulumi.runtime.MockResourceArgs], dict[str, Any]]:
    cfg = aws_stack.StackConfig.from_values({"region": "us-west-2", **config})
    fleet = aws_stack.load_fleet_for(cfg)
    return run("gpufleet-aws", lambda: aws_stack.build(cfg, fleet))


@pytest.fixture(scope="module")
def stack() -> tuple[list[pulumi.runtime.MockResourceArgs], dict[str, Any]]:
    return run_stack()


def test_resource_graph(stack: tuple[list[Any], dict[str, Any]]) -> None:
    resources, outputs = stack
    (cluster,) = of_type(resources, "aws:eks/cluster:Cluster")
    assert cluster.inputs["version"] == "1.34" and cluster.inputs["name"] == "gpufleet"
    assert len(of_type(resources, "aws:ec2/subnet:Subnet")) == 4  # public + private in 2 zones
    (group,) = of_type(resources, "aws:eks/nodeGroup:NodeGroup")
    assert group.inputs["labels"] == {"gpufleet.io/system": "true"}
    releases = {
        r.inputs["name"]: r.inputs for r in of_type(resources, "kubernetes:helm.sh/v3:Release")
    }
    assert set(releases) == {"karpenter", "gpu-operator", "kai-scheduler", "argocd", "gpufleet"}
    assert releases["karpenter"]["chart"] == "oci://public.ecr.aws/karpenter/karpenter"
    assert releases["karpenter"]["values"]["settings"]["clusterName"] == "gpufleet"
    assert releases["gpufleet"]["chart"] == str(REPO / "charts" / "gpufleet")
    (app_,) = of_type(resources, "kubernetes:argoproj.io/v1alpha1:Application")
    assert app_.inputs["spec"]["syncPolicy"]["automated"] == {"prune": True, "selfHeal": True}
    assert len(of_type(resources, "aws:cloudwatch/eventRule:EventRule")) == 4
    assert outputs["gpuPools"] == ["us-east-a100", "us-west-h100"]


def test_dcgm_profiling_fields_are_enabled(stack: tuple[list[Any], dict[str, Any]]) -> None:
    resources, _ = stack
    (operator,) = [
        r for r in of_type(resources, "kubernetes:helm.sh/v3:Release") if r.name == "gpu-operator"
    ]
    exporter = operator.inputs["values"]["dcgmExporter"]
    assert exporter["enabled"] and exporter["config"]["create"]
    profiling = ("SM_ACTIVE", "PIPE_TENSOR_ACTIVE", "DRAM_ACTIVE")
    for field in [f"DCGM_FI_PROF_{f}" for f in profiling] + [
        "DCGM_FI_DEV_POWER_USAGE",
        "DCGM_FI_DEV_POWER_MGMT_LIMIT",
    ]:
        assert f"{field}," in exporter["config"]["data"]


def test_karpenter_iam_is_least_privilege(stack: tuple[list[Any], dict[str, Any]]) -> None:
    resources, _ = stack
    (policy,) = of_type(resources, "aws:iam/rolePolicy:RolePolicy")
    document = json.loads(policy.inputs["policy"])
    for statement in document["Statement"]:
        actions = (
            statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
        )
        assert not any(a == "*" or a.endswith(":*") for a in actions), statement["Sid"]
        if statement["Resource"] == "*":  # only reads, only in the cluster's region
            assert all(":Describe" in a or a == "pricing:GetProducts" for a in actions)
            assert statement["Condition"]["StringEquals"]["aws:RequestedRegion"] == "us-west-2"
    by_sid = {s["Sid"]: s for s in document["Statement"]}
    assert by_sid["PassNodeRoleOnly"]["Resource"].endswith("gpufleet-node")
    assert "TerminateInstances" in json.dumps(by_sid["ManageOwnInstances"])
    assert by_sid["ManageOwnInstances"]["Condition"]["StringEquals"] == {
        "aws:ResourceTag/kubernetes.io/cluster/gpufleet": "owned"
    }
    roles = {r.name: r.inputs for r in of_type(resources, "aws:iam/role:Role")}
    assert "pods.eks.amazonaws.com" in roles["gpufleet-karpenter"]["assumeRolePolicy"]
    assert roles["gpufleet-node"]["name"] == "KarpenterNodeRole-gpufleet"


def test_node_pools_are_byte_identical_to_gpufleet_render(
    stack: tuple[list[Any], dict[str, Any]],
) -> None:
    resources, _ = stack
    (group,) = of_type(resources, "kubernetes:yaml/v2:ConfigGroup")
    rendered = CliRunner().invoke(
        app, ["render", str(EXAMPLE), "--target", "karpenter-aws", "-o", "-"]
    )
    assert rendered.exit_code == 0, rendered.output
    assert group.inputs["yaml"] == rendered.stdout
    assert "kind: NodePool" in rendered.stdout and "kind: EC2NodeClass" in rendered.stdout


def test_existing_vpc_creates_no_network() -> None:
    resources, _ = run_stack(vpcId="vpc-123", subnetIds=["subnet-a", "subnet-b"])
    assert of_type(resources, "aws:ec2/vpc:Vpc") == []
    (cluster,) = of_type(resources, "aws:eks/cluster:Cluster")
    assert cluster.inputs["vpcConfig"]["subnetIds"] == ["subnet-a", "subnet-b"]


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({}, "gpufleet:region: Field required"),
        ({"region": "mars"}, "gpufleet:region: String should match pattern"),
        ({"region": "us-west-2", "clusterName": "Bad_Name"}, "gpufleet:clusterName"),
        ({"region": "us-west-2", "vpcId": "vpc-1"}, "set subnetIds to at least two"),
        ({"region": "us-west-2", "systemNodes": 0}, "gpufleet:systemNodes"),
        ({"region": "us-west-2", "colour": "blue"}, "gpufleet:colour: Extra inputs"),
    ],
)
def test_config_errors_name_the_key(values: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        aws_stack.StackConfig.from_values(values)


def test_invalid_gitops_folder_is_a_config_error(tmp_path: Any) -> None:
    (tmp_path / "pools.yaml").write_text(
        "apiVersion: gpufleet.io/v1alpha1\nkind: GPUPool\nmetadata: {name: p}\n"
        "spec: {provider: aws, gpuType: H100, gpusPerNode: 8, maxGPUs: -1}\n"
    )
    cfg = aws_stack.StackConfig.from_values({"region": "us-west-2", "gitopsPath": str(tmp_path)})
    with pytest.raises(ConfigError, match="run `gpufleet validate"):
        aws_stack.load_fleet_for(cfg)


@pytest.mark.parametrize(
    ("cloud", "key"), [("aws", "region"), ("gcp", "project"), ("azure", "subscriptionId")]
)
def test_each_stacks_program_ends_a_missing_key_with_its_name(cloud: str, key: str) -> None:
    """infra/<cloud>/__main__.py, as `pulumi up` runs it (under the mocks): its stack module and
    cluster_software.run_stack wired up, a missing key ends it with the key's name."""
    pulumi.runtime.set_mocks(Mocks(), project=f"gpufleet-{cloud}", stack="test", preview=False)
    pulumi.runtime.set_all_config({})
    with pytest.raises(SystemExit, match=f"^error: gpufleet:{key}: Field required"):
        runpy.run_path(str(REPO / "infra" / cloud / "__main__.py"), run_name="__main__")
