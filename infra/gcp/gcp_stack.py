"""The GCP stack: a VPC-native network, GKE Standard with Workload Identity and a system node
pool, karpenter-provider-gcp (service account, IAM, Helm) for the GPU pools, the NVIDIA GPU
Operator with GKE's driver installer and the DCGM profiling fields on, KAI Scheduler, Argo CD
pointed at the GitOps repository, and the gpufleet chart.

GPU pools: with `karpenterChartRepo` set, the NodePools and GCENodeClasses rendered by
`gpufleet render --target karpenter-gcp` are applied as that exact YAML. karpenter-provider-gcp
is pre-1.0 and serves only the built-in GPU families (a2, a3, g2, a4); without it, each gcp
GPUPool becomes a GKE node pool with autoscaling up to its maxGPUs instead.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pulumi
import pulumi_gcp as gcp
import pulumi_kubernetes as k8s
from pydantic import Field

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # infra/
import cluster_software

from gpufleet.iac import GCE_ACCELERATORS, config_values, fleet_from
from gpufleet.model.fleet import Fleet
from gpufleet.render import Target, render
from gpufleet.render.common import to_yaml

# Karpenter on GKE launches and deletes instances and reads the cluster; nothing project-wide
# beyond that (roles as documented by karpenter-provider-gcp's installation guide)
KARPENTER_ROLES = (
    "roles/compute.instanceAdmin.v1",
    "roles/container.clusterViewer",
    "roles/iam.serviceAccountUser",
)
NODE_ROLES = (
    "roles/logging.logWriter",
    "roles/monitoring.metricWriter",
    "roles/artifactregistry.reader",
)


class StackConfig(cluster_software.StackSettings):
    """`pulumi config set gpufleet:<key> <value>`; project and region are required."""

    project: str = Field(pattern=r"^[a-z][a-z0-9-]{4,28}[a-z0-9]$")
    region: str = Field(pattern=r"^[a-z]+-[a-z]+\d$")
    release_channel: str = Field(
        "REGULAR", alias="releaseChannel", pattern=r"^(RAPID|REGULAR|STABLE)$"
    )
    system_machine_type: str = Field("e2-standard-4", alias="systemMachineType")
    system_nodes: int = Field(1, alias="systemNodes", ge=1, le=10)  # per zone
    karpenter_chart_repo: str | None = Field(None, alias="karpenterChartRepo")
    karpenter_version: str = Field("0.5.0", alias="karpenterVersion")

    @classmethod
    def from_pulumi(cls, config: pulumi.Config) -> StackConfig:
        gcp_config = pulumi.Config("gcp")
        fixed = {"project": gcp_config.get("project"), "region": gcp_config.get("region")}
        return cls.from_values(config_values(cls, config.get, fixed))


def load_fleet_for(config: StackConfig, base: Path | None = None) -> Fleet:
    return fleet_from((base or Path(__file__).resolve().parent) / config.gitops_path)


def gpu_node_objects_yaml(fleet: Fleet) -> str:
    """The NodePools and GCENodeClasses, exactly as `gpufleet render --target karpenter-gcp`."""
    return to_yaml(render(fleet, Target.KARPENTER_GCP))


def build(config: StackConfig, fleet: Fleet) -> dict[str, Any]:
    name = config.cluster_name
    network = gcp.compute.Network(name, auto_create_subnetworks=False)
    subnet = gcp.compute.Subnetwork(
        name,
        network=network.id,
        region=config.region,
        ip_cidr_range="10.10.0.0/20",
        private_ip_google_access=True,
        secondary_ip_ranges=[
            {"range_name": "pods", "ip_cidr_range": "10.64.0.0/14"},
            {"range_name": "services", "ip_cidr_range": "10.68.0.0/20"},
        ],
    )
    cluster = gcp.container.Cluster(
        name,
        name=name,
        location=config.region,
        network=network.id,
        subnetwork=subnet.id,
        remove_default_node_pool=True,
        initial_node_count=1,
        deletion_protection=True,
        release_channel={"channel": config.release_channel},
        ip_allocation_policy={
            "cluster_secondary_range_name": "pods",
            "services_secondary_range_name": "services",
        },
        workload_identity_config={"workload_pool": f"{config.project}.svc.id.goog"},
    )
    nodes = _service_account(f"{name}-nodes", config.project, NODE_ROLES)
    gcp.container.NodePool(
        f"{name}-system",
        cluster=cluster.id,
        node_count=config.system_nodes,
        node_config={
            "machine_type": config.system_machine_type,
            "service_account": nodes.email,
            "oauth_scopes": ["https://www.googleapis.com/auth/cloud-platform"],
            "labels": {"gpufleet.io/system": "true"},
            "workload_metadata_config": {"mode": "GKE_METADATA"},
        },
    )
    provider = k8s.Provider(f"{name}-k8s", kubeconfig=_kubeconfig(cluster))
    gpu_pools = _gpu_pools(config, fleet, cluster, nodes, provider)
    # GKE's driver installer brings the driver
    cluster_software.install(config, provider, False)
    return {"clusterName": cluster.name, "clusterEndpoint": cluster.endpoint, "gpuPools": gpu_pools}


def _gpu_pools(
    config: StackConfig,
    fleet: Fleet,
    cluster: gcp.container.Cluster,
    nodes: gcp.serviceaccount.Account,
    provider: k8s.Provider,
) -> list[str]:
    pools = sorted(p for p in fleet.pools if fleet.pools[p].spec.provider == "gcp")
    if config.karpenter_chart_repo:
        name = config.cluster_name
        karpenter = _service_account(f"{name}-karpenter", config.project, KARPENTER_ROLES)
        gcp.serviceaccount.IAMMember(
            f"{name}-karpenter-workload-identity",
            service_account_id=karpenter.name,
            role="roles/iam.workloadIdentityUser",
            member=f"serviceAccount:{config.project}.svc.id.goog[karpenter-system/karpenter]",
        )
        on_cluster = pulumi.ResourceOptions(provider=provider)
        crds = k8s.helm.v3.Release(
            "karpenter-crd",
            name="karpenter-crd",
            chart="karpenter-crd",
            repository_opts={"repo": config.karpenter_chart_repo},
            version=config.karpenter_version,
            namespace="karpenter-system",
            create_namespace=True,
            opts=on_cluster,
        )
        release = k8s.helm.v3.Release(
            "karpenter",
            name="karpenter",
            chart="karpenter",
            repository_opts={"repo": config.karpenter_chart_repo},
            version=config.karpenter_version,
            namespace="karpenter-system",
            values={
                "controller": {
                    "settings": {
                        "projectID": config.project,
                        "region": config.region,
                        "clusterName": name,
                    }
                },
                "serviceAccount": {
                    "annotations": {"iam.gke.io/gcp-service-account": karpenter.email},
                },
                "nodeSelector": {"gpufleet.io/system": "true"},
            },
            opts=pulumi.ResourceOptions(provider=provider, depends_on=[crds]),
        )
        k8s.yaml.v2.ConfigGroup(
            "gpu-node-pools",
            yaml=gpu_node_objects_yaml(fleet),
            opts=pulumi.ResourceOptions(provider=provider, depends_on=[release]),
        )
        return pools
    for pool in pools:
        spec = fleet.pools[pool].spec
        machine = spec.instance_types[0] if spec.instance_types else "g2-standard-8"
        gcp.container.NodePool(
            f"{config.cluster_name}-{pool}",
            cluster=cluster.id,
            node_locations=spec.zones or None,
            autoscaling={
                "min_node_count": 0,
                "max_node_count": spec.max_gpus // spec.gpus_per_node,
            },
            node_config={
                "machine_type": machine,
                "service_account": nodes.email,
                "oauth_scopes": ["https://www.googleapis.com/auth/cloud-platform"],
                "spot": "spot" in spec.capacity_types and "on-demand" not in spec.capacity_types,
                "guest_accelerators": [
                    {
                        "type": GCE_ACCELERATORS.get(spec.gpu_type, spec.gpu_type.lower()),
                        "count": spec.gpus_per_node,
                        "gpu_driver_installation_config": {"gpu_driver_version": "DEFAULT"},
                    }
                ],
                "labels": {"gpufleet.io/pool": pool, "gpufleet.io/gpu-type": spec.gpu_type},
                "taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NO_SCHEDULE"}],
            },
        )
    return pools


def _service_account(name: str, project: str, roles: tuple[str, ...]) -> gcp.serviceaccount.Account:
    """A service account with exactly these project roles."""
    account = gcp.serviceaccount.Account(name, account_id=name[:30])
    for role in roles:
        gcp.projects.IAMMember(
            f"{name}-{role.split('/')[1]}",
            project=project,
            role=role,
            member=account.email.apply(lambda e: f"serviceAccount:{e}"),
        )
    return account


def _kubeconfig(cluster: gcp.container.Cluster) -> pulumi.Output[str]:
    return pulumi.Output.all(cluster.name, cluster.endpoint, cluster.master_auth).apply(
        lambda args: (
            "apiVersion: v1\nkind: Config\n"
            f"clusters:\n- name: {args[0]}\n  cluster:\n    server: https://{args[1]}\n"
            f"    certificate-authority-data: {(args[2] or {}).get('cluster_ca_certificate', '')}\n"
            f"users:\n- name: gke\n  user:\n    exec:\n"
            "      apiVersion: client.authentication.k8s.io/v1beta1\n"
            "      command: gke-gcloud-auth-plugin\n      provideClusterInfo: true\n"
            f"contexts:\n- name: {args[0]}\n  context: {{cluster: {args[0]}, user: gke}}\n"
            f"current-context: {args[0]}\n"
        )
    )
