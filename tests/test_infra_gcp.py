"""The GCP Pulumi stack with Pulumi's mocks: the resource graph, IAM, Helm values, GPU pools
either as the exact `gpufleet render --target karpenter-gcp` YAML or as GKE node pools, and
configuration errors."""

from __future__ import annotations

import sys
from typing import Any

import pytest
from conftest import EXAMPLE, REPO
from pulumi_mocks import of_type, run
from typer.testing import CliRunner

from gpufleet.cli.main import app
from gpufleet.iac import ConfigError

sys.path.insert(0, str(REPO / "infra" / "gcp"))
import gcp_stack

BASE = {"project": "ml-platform-123", "region": "us-central1"}


def run_stack(**config: Any) -> tuple[list[Any], dict[str, Any]]:
    cfg = gcp_stack.StackConfig.from_values({**BASE, **config})
    fleet = gcp_stack.load_fleet_for(cfg)
    return run("gpufleet-gcp", lambda: gcp_stack.build(cfg, fleet))


def test_with_karpenter_the_node_pools_are_gpufleet_render_output() -> None:
    resources, outputs = run_stack(karpenterChartRepo="https://charts.example.com/karpenter-gcp")
    (cluster,) = of_type(resources, "gcp:container/cluster:Cluster")
    assert cluster.inputs["workloadIdentityConfig"] == {
        "workloadPool": "ml-platform-123.svc.id.goog"
    }
    assert cluster.inputs["removeDefaultNodePool"] is True
    (group,) = of_type(resources, "kubernetes:yaml/v2:ConfigGroup")
    rendered = CliRunner().invoke(
        app, ["render", str(EXAMPLE), "--target", "karpenter-gcp", "-o", "-"]
    )
    assert rendered.exit_code == 0, rendered.output
    assert group.inputs["yaml"] == rendered.stdout
    assert "kind: GCENodeClass" in rendered.stdout
    releases = {
        r.inputs["name"]: r.inputs for r in of_type(resources, "kubernetes:helm.sh/v3:Release")
    }
    assert set(releases) == {
        "karpenter-crd",
        "karpenter",
        "gpu-operator",
        "kai-scheduler",
        "argocd",
        "gpufleet",
    }
    exporter = releases["gpu-operator"]["values"]["dcgmExporter"]
    assert "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE," in exporter["config"]["data"]
    assert releases["gpu-operator"]["values"]["driver"] == {"enabled": False}
    roles = {r.inputs["role"] for r in of_type(resources, "gcp:projects/iAMMember:IAMMember")}
    assert "roles/compute.instanceAdmin.v1" in roles
    assert not any(r in roles for r in ("roles/owner", "roles/editor", "roles/compute.admin"))
    (binding,) = of_type(resources, "gcp:serviceaccount/iAMMember:IAMMember")
    assert binding.inputs["member"].endswith("[karpenter-system/karpenter]")
    assert outputs["gpuPools"] == ["europe-l4"]


def test_without_karpenter_each_gpu_pool_is_a_gke_node_pool() -> None:
    resources, _ = run_stack()
    assert of_type(resources, "kubernetes:yaml/v2:ConfigGroup") == []
    pools = {r.name: r.inputs for r in of_type(resources, "gcp:container/nodePool:NodePool")}
    assert set(pools) == {"gpufleet-system", "gpufleet-europe-l4"}
    l4 = pools["gpufleet-europe-l4"]
    (accelerator,) = l4["nodeConfig"]["guestAccelerators"]
    assert accelerator["type"] == "nvidia-l4" and accelerator["count"] >= 1
    assert l4["autoscaling"]["maxNodeCount"] * accelerator["count"] <= 64
    assert l4["nodeConfig"]["labels"]["gpufleet.io/pool"] == "europe-l4"
    assert {"key": "nvidia.com/gpu", "value": "present", "effect": "NO_SCHEDULE"} in l4[
        "nodeConfig"
    ]["taints"]


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"region": "us-central1"}, "gpufleet:project: Field required"),
        ({**BASE, "releaseChannel": "NIGHTLY"}, "gpufleet:releaseChannel"),
        ({**BASE, "zone": "a"}, "gpufleet:zone: Extra inputs"),
    ],
)
def test_config_errors_name_the_key(values: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        gcp_stack.StackConfig.from_values(values)
