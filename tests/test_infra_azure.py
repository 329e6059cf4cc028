"""The Azure Pulumi stack with Pulumi's mocks: AKS with node auto-provisioning on the network
it needs, the GPU pools as the exact `gpufleet render --target karpenter-azure` YAML, the
controller's workload identity (federated to its service account, Reader on the resource group
only), the shared cluster software, and configuration errors."""

from __future__ import annotations

import sys
from typing import Any

import pytest
from conftest import REPO
from pulumi_mocks import of_type, run
from typer.testing import CliRunner

from gpufleet.cli.main import app
from gpufleet.iac import ConfigError

sys.path.insert(0, str(REPO / "infra" / "azure"))
import azure_stack

SUBSCRIPTION = "00000000-1111-2222-3333-444444444444"
BASE = {"subscriptionId": SUBSCRIPTION, "location": "eastus"}


def run_stack(**config: Any) -> tuple[list[Any], dict[str, Any]]:
    cfg = azure_stack.StackConfig.from_values({**BASE, **config})
    fleet = azure_stack.load_fleet_for(cfg)
    return run("gpufleet-azure", lambda: azure_stack.build(cfg, fleet))


def test_aks_with_node_auto_provisioning_and_the_rendered_pools() -> None:
    resources, outputs = run_stack()
    (cluster,) = of_type(resources, "azure-native:containerservice:ManagedCluster")
    spec = cluster.inputs
    assert spec["nodeProvisioningProfile"] == {"mode": "Auto"}
    assert spec["networkProfile"]["networkPlugin"] == "azure"
    assert spec["networkProfile"]["networkPluginMode"] == "overlay"
    assert spec["networkProfile"]["networkDataplane"] == "cilium"
    assert spec["oidcIssuerProfile"] == {"enabled": True}
    assert spec["securityProfile"] == {"workloadIdentity": {"enabled": True}}
    (system,) = spec["agentPoolProfiles"]
    assert system["mode"] == "System" and system["nodeLabels"] == {"gpufleet.io/system": "true"}
    (subnet,) = of_type(resources, "azure-native:network:Subnet")
    assert system["vnetSubnetID"] == f"{subnet.name}-id"
    (group,) = of_type(resources, "kubernetes:yaml/v2:ConfigGroup")
    rendered = CliRunner().invoke(
        app, ["render", str(REPO / "examples" / "azure"), "--target", "karpenter-azure", "-o", "-"]
    )
    assert rendered.exit_code == 0, rendered.output
    assert group.inputs["yaml"] == rendered.stdout and "kind: AKSNodeClass" in rendered.stdout
    assert outputs["gpuPools"] == ["eastus-a100-spot", "eastus-h100"]
    releases = {
        r.inputs["name"]: r.inputs for r in of_type(resources, "kubernetes:helm.sh/v3:Release")
    }
    assert set(releases) == {"gpu-operator", "kai-scheduler", "argocd", "gpufleet"}
    assert releases["gpu-operator"]["values"]["driver"] == {"enabled": True}  # AKS brings none
    controller = releases["gpufleet"]["values"]["controller"]
    assert controller["schedulerName"] == "kai-scheduler"
    assert controller["podLabels"] == {"azure.workload.identity/use": "true"}
    annotations = controller["serviceAccount"]["annotations"]
    assert annotations == {"azure.workload.identity/client-id": "client-gpufleet-controller"}
    assert outputs["controllerClientID"] == "client-gpufleet-controller"


def test_the_controllers_identity_is_federated_and_reads_only() -> None:
    resources, outputs = run_stack()
    (federated,) = of_type(resources, "azure-native:managedidentity:FederatedIdentityCredential")
    assert (
        federated.inputs["subject"] == "system:serviceaccount:gpufleet-system:gpufleet-controller"
    )
    assert federated.inputs["issuer"] == outputs["oidcIssuer"]
    assert federated.inputs["audiences"] == ["api://AzureADTokenExchange"]
    (role,) = of_type(resources, "azure-native:authorization:RoleAssignment")
    assert role.inputs["roleDefinitionId"].endswith(f"/roleDefinitions/{azure_stack.READER_ROLE}")
    assert role.inputs["scope"] == f"/subscriptions/{SUBSCRIPTION}/resourceGroups/gpufleet-rg"
    assert role.inputs["principalId"] == "principal-gpufleet-controller"


def test_an_existing_resource_group_and_subnet_are_used_as_given() -> None:
    subnet = (f"/subscriptions/{SUBSCRIPTION}/resourceGroups/net/providers/Microsoft.Network/"
              "virtualNetworks/hub/subnets/gpu")  # fmt: skip
    resources, _ = run_stack(resourceGroup="ml", vnetSubnetID=subnet)
    assert of_type(resources, "azure-native:resources:ResourceGroup") == []
    assert of_type(resources, "azure-native:network:VirtualNetwork") == []
    (cluster,) = of_type(resources, "azure-native:containerservice:ManagedCluster")
    assert cluster.inputs["resourceGroupName"] == "ml"
    assert cluster.inputs["agentPoolProfiles"][0]["vnetSubnetID"] == subnet


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"location": "eastus"}, "gpufleet:subscriptionId: Field required"),
        ({**BASE, "subscriptionId": "my-sub"}, "gpufleet:subscriptionId"),
        ({**BASE, "vnetSubnetID": "subnet-1"}, "gpufleet:vnetSubnetID"),
        ({**BASE, "region": "eastus"}, "gpufleet:region: Extra inputs"),
    ],
)
def test_config_errors_name_the_key(values: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        azure_stack.StackConfig.from_values(values)
