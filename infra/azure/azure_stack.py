"""The Azure stack: a resource group and virtual network (or an existing subnet), AKS with
node auto-provisioning (Karpenter, run by AKS) on Azure CNI overlay with Cilium, the OIDC
issuer and workload identity, a system node pool; the GPU pools as the exact NodePools and
AKSNodeClasses of `gpufleet render --target karpenter-azure`; the controller's own Azure
identity, federated to its service account; then, as on the other clouds, the NVIDIA GPU
Operator, KAI Scheduler, Argo CD pointed at the GitOps repository and the gpufleet chart.

Why node auto-provisioning rather than the self-hosted Karpenter provider for Azure: AKS runs,
upgrades and holds the identity of the Karpenter it manages (no controller, Helm release or
role assignments of ours to keep), and it reads the same NodePool and AKSNodeClass objects,
so the rendered pools are the same either way. Self-hosting is for pinning Karpenter's
version or running it where NAP is not offered (docs/install-azure.md).
"""

from __future__ import annotations

import base64
import sys
from pathlib import Path
from typing import Any

import pulumi
import pulumi_azure_native as azure
import pulumi_kubernetes as k8s
from pydantic import Field

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # infra/
import cluster_software

from gpufleet.iac import config_values, fleet_from
from gpufleet.model.azure import AZURE_SUBNET_ID
from gpufleet.model.fleet import Fleet
from gpufleet.render import Target, render
from gpufleet.render.common import to_yaml

CONTROLLER_SA = "system:serviceaccount:gpufleet-system:gpufleet-controller"
# Azure's built-in Reader role: the controller may read the subscription's VM sizes, quotas and
# the cluster's resources (what `gpufleet preflight azure` reads); it changes nothing
READER_ROLE = "acdd72a7-3385-48ef-bd42-f606fba81ae7"


class StackConfig(cluster_software.StackSettings):
    """`pulumi config set gpufleet:<key> <value>`; subscriptionId and location are required."""

    subscription_id: str = Field(
        alias="subscriptionId",
        pattern=r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$",
    )
    location: str = Field(pattern=r"^[a-z][a-z0-9]+$")
    cluster_name: str = Field("gpufleet", alias="clusterName", pattern=r"^[a-z][a-z0-9-]{0,62}$")
    resource_group: str | None = Field(
        None, alias="resourceGroup", description="An existing resource group; default: a new one."
    )
    vnet_subnet_id: str | None = Field(
        None,
        alias="vnetSubnetID",
        pattern=AZURE_SUBNET_ID,
        description="An existing subnet for the nodes; default: a new virtual network.",
    )
    kubernetes_version: str | None = Field(None, alias="kubernetesVersion")
    system_vm_size: str = Field("Standard_D4s_v5", alias="systemVmSize")
    system_nodes: int = Field(2, alias="systemNodes", ge=1, le=10)
    zones: list[str] = Field(default_factory=lambda: ["1", "2", "3"])
    gitops_path: str = Field("../../examples/azure", alias="gitopsPath")

    @classmethod
    def from_pulumi(cls, config: pulumi.Config) -> StackConfig:
        native = pulumi.Config("azure-native")
        fixed = {"subscriptionId": native.get("subscriptionId"), "location": native.get("location")}
        return cls.from_values(
            config_values(cls, config.get, {k: v for k, v in fixed.items() if v})
        )


def load_fleet_for(config: StackConfig, base: Path | None = None) -> Fleet:
    return fleet_from((base or Path(__file__).resolve().parent) / config.gitops_path)


def gpu_node_objects_yaml(fleet: Fleet) -> str:
    """The NodePools and AKSNodeClasses, exactly as `gpufleet render --target karpenter-azure`."""
    return to_yaml(render(fleet, Target.KARPENTER_AZURE))


def build(config: StackConfig, fleet: Fleet) -> dict[str, Any]:
    name = config.cluster_name
    group_name: pulumi.Input[str]
    if config.resource_group:
        group_name = config.resource_group
    else:
        group_name = azure.resources.ResourceGroup(
            name, resource_group_name=f"{name}-rg", location=config.location
        ).name
    subnet_id = config.vnet_subnet_id or _network(config, group_name)
    settings: dict[str, Any] = dict(
        resource_name_=name,
        resource_group_name=group_name,
        location=config.location,
        dns_prefix=name,
        kubernetes_version=config.kubernetes_version,
        identity={"type": "SystemAssigned"},
        agent_pool_profiles=[
            {
                "name": "system",
                "mode": "System",
                "count": config.system_nodes,
                "vm_size": config.system_vm_size,
                "os_type": "Linux",
                "vnet_subnet_id": subnet_id,
                "availability_zones": config.zones,
                "node_labels": {"gpufleet.io/system": "true"},
            }
        ],
        # node auto-provisioning runs only on Azure CNI overlay with Cilium
        network_profile={
            "network_plugin": "azure",
            "network_plugin_mode": "overlay",
            "network_dataplane": "cilium",
            "pod_cidr": "10.244.0.0/16",
        },
        node_provisioning_profile={"mode": "Auto"},
        oidc_issuer_profile={"enabled": True},
        security_profile={"workload_identity": {"enabled": True}},
    )
    cluster = azure.containerservice.ManagedCluster(name, **settings)
    identity = _controller_identity(config, group_name, cluster)
    provider = k8s.Provider(f"{name}-k8s", kubeconfig=_kubeconfig(group_name, cluster))
    pools = sorted(p for p in fleet.pools if fleet.pools[p].spec.provider == "azure")
    if pools:
        k8s.yaml.v2.ConfigGroup(
            "gpu-node-pools",
            yaml=gpu_node_objects_yaml(fleet),
            opts=pulumi.ResourceOptions(provider=provider),
        )
    # the AKS node images bring no GPU driver: the GPU Operator installs it
    cluster_software.install(
        config,
        provider,
        True,
        controller={
            "serviceAccount": {
                "annotations": {"azure.workload.identity/client-id": identity.client_id}
            },
            "podLabels": {"azure.workload.identity/use": "true"},
        },
    )
    return {
        "clusterName": cluster.name,
        "oidcIssuer": cluster.oidc_issuer_profile.apply(lambda p: p.issuer_url if p else None),
        "controllerClientID": identity.client_id,
        "gpuPools": pools,
    }


def _network(config: StackConfig, group: pulumi.Input[str]) -> pulumi.Output[str]:
    name = config.cluster_name
    vnet = azure.network.VirtualNetwork(
        name,
        virtual_network_name=f"{name}-vnet",
        resource_group_name=group,
        location=config.location,
        address_space={"address_prefixes": ["10.10.0.0/16"]},
    )
    subnet = azure.network.Subnet(
        f"{name}-nodes",
        subnet_name="nodes",
        resource_group_name=group,
        virtual_network_name=vnet.name,
        address_prefix="10.10.0.0/20",  # nodes only: pods get overlay addresses
    )
    return subnet.id


def _controller_identity(config: StackConfig, group: pulumi.Input[str], cluster: Any) -> Any:
    """A user-assigned identity for the gpufleet controller, federated to its service account
    through the cluster's OIDC issuer, with Reader on the resource group only."""
    name = config.cluster_name
    identity = azure.managedidentity.UserAssignedIdentity(
        f"{name}-controller",
        resource_name_=f"{name}-controller",
        resource_group_name=group,
        location=config.location,
    )
    azure.managedidentity.FederatedIdentityCredential(
        f"{name}-controller",
        federated_identity_credential_resource_name="gpufleet-controller",
        resource_group_name=group,
        resource_name_=identity.name,
        issuer=cluster.oidc_issuer_profile.apply(lambda p: p.issuer_url if p else ""),
        subject=CONTROLLER_SA,
        audiences=["api://AzureADTokenExchange"],
    )
    scope = pulumi.Output.concat(
        "/subscriptions/", config.subscription_id, "/resourceGroups/", group
    )
    azure.authorization.RoleAssignment(
        f"{name}-controller-reader",
        principal_id=identity.principal_id,
        principal_type="ServicePrincipal",
        role_definition_id=f"/subscriptions/{config.subscription_id}/providers/"
        f"Microsoft.Authorization/roleDefinitions/{READER_ROLE}",
        scope=scope,
    )
    return identity


def _kubeconfig(group: pulumi.Input[str], cluster: Any) -> pulumi.Output[str]:
    """The cluster's user kubeconfig (Entra ID login through kubelogin, as AKS gives it)."""
    credentials = azure.containerservice.list_managed_cluster_user_credentials_output(
        resource_group_name=group, resource_name=cluster.name
    )
    return credentials.kubeconfigs.apply(lambda found: base64.b64decode(found[0].value).decode())
