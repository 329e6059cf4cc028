"""GPUPool -> Karpenter v1 NodePool plus EC2NodeClass (aws), GCENodeClass (gcp) or AKSNodeClass
(azure), or, for the local dev cluster, a KWOKNodeClass and the instance-types file of
Karpenter's kwok provider.

Each pool becomes one NodePool and one NodeClass of the same name. GPU nodes carry the
`nvidia.com/gpu` NoSchedule taint so only GPU workloads land there, the pool's labels so the
engine can pin admitted pods to the pool, and a `nvidia.com/gpu` limit of `maxGPUs`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpufleet.model.api import AWSNodeSettings, AzureNodeSettings, GCPNodeSettings, GPUPool
from gpufleet.model.azure import azure_size, canonical_size
from gpufleet.model.fleet import Fleet
from gpufleet.model.keys import GPU_RESOURCE, GPU_TYPE_LABEL, POOL_LABEL, ZONE_LABEL
from gpufleet.render.common import Manifest, managed_labels, manifest

NODEPOOL_API = "karpenter.sh/v1"
EC2_NODECLASS_API = "karpenter.k8s.aws/v1"
GCE_NODECLASS_API = "karpenter.k8s.gcp/v1alpha1"
AKS_NODECLASS_API = "karpenter.azure.com/v1beta1"
KWOK_NODECLASS_API = "karpenter.kwok.sh/v1alpha1"
CAPACITY_TYPE_LABEL = "karpenter.sh/capacity-type"
# kwok nodes of a pool without zones land here, the zone `gpufleet dev cluster up` gives its nodes
DEFAULT_KWOK_ZONE = "zone-a"

# GKE taints GPU nodes with value "present"; on AWS and Azure "true" is the convention of
# Karpenter's docs.
GPU_TAINT_VALUE = {"aws": "true", "gcp": "present", "azure": "true"}


@dataclass(frozen=True)
class ClusterSettings:
    """Facts about the target cluster that pool specs do not carry."""

    name: str = "gpufleet"

    @property
    def discovery_tags(self) -> dict[str, str]:
        return {"karpenter.sh/discovery": self.name}


def _requirements(pool: GPUPool) -> list[dict[str, Any]]:
    spec = pool.spec
    reqs: list[dict[str, Any]] = [
        {
            "key": "node.kubernetes.io/instance-type",
            "operator": "In",
            # Azure's names are case-insensitive; its nodes' labels spell them one way
            "values": [
                canonical_size(t) if spec.provider == "azure" else t for t in spec.instance_types
            ],
        },
        {
            "key": CAPACITY_TYPE_LABEL,
            "operator": "In",
            "values": list(spec.capacity_types),
        },
    ]
    if spec.zones:
        reqs.append({"key": ZONE_LABEL, "operator": "In", "values": list(spec.zones)})
    return reqs


def nodepool(pool: GPUPool, node_class: tuple[str, str]) -> Manifest:
    spec = pool.spec
    group, kind = node_class
    pool_labels = {POOL_LABEL: pool.name, GPU_TYPE_LABEL: spec.gpu_type}
    body = {
        "limits": {GPU_RESOURCE: str(spec.max_gpus)},
        "disruption": {
            # GPU nodes are only removed when empty: consolidating a busy GPU node would
            # evict training pods that gpufleet did not decide to preempt.
            "consolidationPolicy": "WhenEmpty",
            "consolidateAfter": spec.consolidate_after,
            "budgets": [{"nodes": "10%"}],
        },
        "template": {
            "metadata": {"labels": pool_labels},
            "spec": {
                "nodeClassRef": {"group": group, "kind": kind, "name": pool.name},
                "expireAfter": spec.expire_after,
                "taints": [
                    {
                        "key": GPU_RESOURCE,
                        "value": GPU_TAINT_VALUE[spec.provider],
                        "effect": "NoSchedule",
                    }
                ],
                "requirements": _requirements(pool),
            },
        },
    }
    return manifest(
        NODEPOOL_API, "NodePool", pool.name, body, managed_labels(**{POOL_LABEL: pool.name})
    )


def ec2_nodeclass(pool: GPUPool, cluster: ClusterSettings) -> Manifest:
    aws = pool.spec.aws or AWSNodeSettings.model_validate({})  # the model's defaults
    body: dict[str, Any] = {
        "role": aws.node_role or f"KarpenterNodeRole-{cluster.name}",
        "amiSelectorTerms": [{"alias": aws.ami_alias}],
        "subnetSelectorTerms": [{"tags": cluster.discovery_tags}],
        "securityGroupSelectorTerms": [{"tags": cluster.discovery_tags}],
        # GPU images (CUDA, PyTorch) are large; the 20 GiB default fills up at the first pull.
        "blockDeviceMappings": [
            {
                "deviceName": "/dev/xvda",
                "ebs": {
                    "volumeSize": f"{aws.root_volume_gib}Gi",
                    "volumeType": "gp3",
                    "encrypted": True,
                    "deleteOnTermination": True,
                },
            }
        ],
        "tags": {POOL_LABEL: pool.name},
    }
    if aws.capacity_reservation_ids:
        body["capacityReservationSelectorTerms"] = [
            {"id": cr} for cr in aws.capacity_reservation_ids
        ]
    return manifest(
        EC2_NODECLASS_API,
        "EC2NodeClass",
        pool.name,
        body,
        managed_labels(**{POOL_LABEL: pool.name}),
    )


def gce_nodeclass(pool: GPUPool) -> Manifest:
    gcp = pool.spec.gcp or GCPNodeSettings.model_validate({})  # the model's defaults
    term: dict[str, str] = {"family": gcp.image_family}
    if gcp.image_family == "ContainerOptimizedOS":
        term["channel"] = "cluster"
    body: dict[str, Any] = {
        "imageSelectorTerms": [term],
        "disks": [{"category": "pd-balanced", "sizeGiB": gcp.boot_disk_gib, "boot": True}],
        # The NodePool sets the taint itself, so the provider must not add a second one.
        "autoGPUTaint": False,
        "gpuDriverVersion": "default",
        "labels": {POOL_LABEL: pool.name},
    }
    if gcp.service_account:
        body["serviceAccount"] = gcp.service_account
    return manifest(
        GCE_NODECLASS_API,
        "GCENodeClass",
        pool.name,
        body,
        managed_labels(**{POOL_LABEL: pool.name}),
    )


def aks_nodeclass(pool: GPUPool) -> Manifest:
    azure = pool.spec.azure or AzureNodeSettings.model_validate({})  # the model's defaults
    body: dict[str, Any] = {
        "imageFamily": azure.image_family,
        "osDiskSizeGB": azure.os_disk_size_gb,
        "tags": {POOL_LABEL: pool.name},
    }
    if azure.vnet_subnet_id:
        body["vnetSubnetID"] = azure.vnet_subnet_id
    return manifest(
        AKS_NODECLASS_API,
        "AKSNodeClass",
        pool.name,
        body,
        managed_labels(**{POOL_LABEL: pool.name}),
    )


def render_karpenter_azure(fleet: Fleet) -> list[Manifest]:
    out = []
    for pool in (fleet.pools[n] for n in sorted(fleet.pools)):
        if pool.spec.provider == "azure":
            out.append(nodepool(pool, ("karpenter.azure.com", "AKSNodeClass")))
            out.append(aks_nodeclass(pool))
    return out


def render_karpenter_aws(fleet: Fleet, cluster: ClusterSettings) -> list[Manifest]:
    out = []
    for pool in (fleet.pools[n] for n in sorted(fleet.pools)):
        if pool.spec.provider == "aws":
            out.append(nodepool(pool, ("karpenter.k8s.aws", "EC2NodeClass")))
            out.append(ec2_nodeclass(pool, cluster))
    return out


def render_karpenter_gcp(fleet: Fleet) -> list[Manifest]:
    out = []
    for pool in (fleet.pools[n] for n in sorted(fleet.pools)):
        if pool.spec.provider == "gcp":
            out.append(nodepool(pool, ("karpenter.k8s.gcp", "GCENodeClass")))
            out.append(gce_nodeclass(pool))
    return out


def kwok_nodeclass(pool: GPUPool) -> Manifest:
    """Karpenter's kwok provider launches simulated nodes; its NodeClass has nothing to set."""
    return manifest(
        KWOK_NODECLASS_API,
        "KWOKNodeClass",
        pool.name,
        {},
        managed_labels(**{POOL_LABEL: pool.name}),
    )


def render_karpenter_kwok(fleet: Fleet) -> list[Manifest]:
    """Every autoscaling pool (aws and gcp alike) as the NodePool its cloud would get, but
    launched by Karpenter's kwok provider: the local dev cluster runs the real Karpenter on the
    NodePools gpufleet renders, with the same requirements, taints, labels, limits and
    disruption settings."""
    out = []
    for pool in (fleet.pools[n] for n in sorted(fleet.pools)):
        if pool.spec.provider != "static":
            out.append(nodepool(pool, ("karpenter.kwok.sh", "KWOKNodeClass")))
            out.append(kwok_nodeclass(pool))
    return out


# What the kwok nodes of a known instance type offer besides GPUs (vCPUs, GiB of memory), from
# the providers' published specifications; other types get SHAPE_PER_GPU per GPU. Only pods'
# CPU and memory requests read these, so an approximation does no harm.
INSTANCE_SHAPES: dict[str, tuple[int, int]] = {
    "p5.48xlarge": (192, 2048),
    "p5e.48xlarge": (192, 2048),
    "p5en.48xlarge": (192, 2048),
    "p4d.24xlarge": (96, 1152),
    "p4de.24xlarge": (96, 1152),
    "g6e.12xlarge": (48, 384),
    "g6e.48xlarge": (192, 1536),
    "a3-highgpu-8g": (208, 1872),
    "a3-megagpu-8g": (208, 1872),
    "a2-ultragpu-8g": (96, 1360),
    "g2-standard-48": (48, 192),
}
SHAPE_PER_GPU = (12, 128)
# Prices when a pool gives none (USD per GPU-hour): Karpenter only compares them to pick the
# cheapest offering, so they just have to order on-demand above spot.
FALLBACK_PRICE = {"on-demand": 1.0, "spot": 0.4}


class InstanceTypesError(ValueError):
    """The pools cannot be turned into one consistent instance-types file."""


def kwok_instance_types(fleet: Fleet) -> list[dict[str, Any]]:
    """The instance-types file of Karpenter's kwok provider (`INSTANCE_TYPES_FILE_PATH`): every
    instance type of every autoscaling pool with its GPUs and one offering per capacity type and
    zone, priced from the pool's `pricePerGPUHour`. kwok has no capacity reservations, so a pool's
    `reserved` capacity type is left out (Karpenter falls back to its other capacity types).
    Raises InstanceTypesError when two pools give one instance type different GPU counts."""
    types: dict[str, dict[str, Any]] = {}
    owner: dict[str, str] = {}
    for pool in (fleet.pools[n] for n in sorted(fleet.pools)):
        spec = pool.spec
        if spec.provider == "static":
            continue
        prices = spec.price_per_gpu_hour
        for name in spec.instance_types:
            gpus = str(spec.gpus_per_node)
            if name in types and types[name]["resources"][GPU_RESOURCE] != gpus:
                raise InstanceTypesError(
                    f"instance type {name} has {types[name]['resources'][GPU_RESOURCE]} GPUs per "
                    f"node in pool {owner[name]} but {gpus} in pool {pool.name}: give both pools "
                    "the same gpusPerNode, or different instance types"
                )
            size = azure_size(name) if spec.provider == "azure" else None
            cpu, memory = (
                (size.vcpus, size.memory_gib)
                if size
                else INSTANCE_SHAPES.get(
                    name,
                    (SHAPE_PER_GPU[0] * spec.gpus_per_node, SHAPE_PER_GPU[1] * spec.gpus_per_node),
                )
            )
            entry = types.setdefault(
                name,
                {
                    "name": name,
                    "architecture": "amd64",
                    "operatingSystems": ["linux"],
                    "resources": {
                        "cpu": str(cpu),
                        "memory": f"{memory}Gi",
                        "ephemeral-storage": "1000Gi",
                        "pods": "110",
                        GPU_RESOURCE: gpus,
                    },
                    "offerings": [],
                },
            )
            owner.setdefault(name, pool.name)
            offered = {
                (o["Requirements"][0]["values"][0], o["Requirements"][1]["values"][0])
                for o in entry["offerings"]
            }
            for capacity_type in spec.capacity_types:
                if capacity_type == "reserved":
                    continue
                per_gpu = getattr(prices, capacity_type.replace("-", "_"), None) if prices else None
                if per_gpu is None:
                    per_gpu = FALLBACK_PRICE[capacity_type]
                for zone in spec.zones or [DEFAULT_KWOK_ZONE]:
                    if (capacity_type, zone) in offered:
                        continue  # the first pool (by name) prices a shared offering
                    entry["offerings"].append(
                        {
                            "Price": round(per_gpu * spec.gpus_per_node, 4),
                            "Available": True,
                            "Requirements": [
                                {
                                    "key": CAPACITY_TYPE_LABEL,
                                    "operator": "In",
                                    "values": [capacity_type],
                                },
                                {"key": ZONE_LABEL, "operator": "In", "values": [zone]},
                            ],
                        }
                    )
    for entry in types.values():
        if not entry["offerings"]:
            raise InstanceTypesError(
                f"instance type {entry['name']} (pool {owner[entry['name']]}) has no offering "
                "kwok can launch: its pool's capacityTypes are all 'reserved'; add on-demand or "
                "spot to try it locally"
            )
    return [types[name] for name in sorted(types)]
