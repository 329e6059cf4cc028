"""GPUPool -> Karpenter v1 NodePool plus EC2NodeClass (aws) or GCENodeClass (gcp).

Each pool becomes one NodePool and one NodeClass of the same name. GPU nodes carry the
`nvidia.com/gpu` NoSchedule taint so only GPU workloads land there, the pool's labels so the
engine can pin admitted pods to the pool, and a `nvidia.com/gpu` limit of `maxGPUs`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpufleet.model.api import AWSNodeSettings, GCPNodeSettings, GPUPool
from gpufleet.model.fleet import Fleet
from gpufleet.render.common import (
    GPU_RESOURCE,
    GPU_TYPE_LABEL,
    POOL_LABEL,
    Manifest,
    managed_labels,
    manifest,
)

NODEPOOL_API = "karpenter.sh/v1"
EC2_NODECLASS_API = "karpenter.k8s.aws/v1"
GCE_NODECLASS_API = "karpenter.k8s.gcp/v1alpha1"

# GKE taints GPU nodes with value "present"; on AWS "true" is the convention of Karpenter's docs.
GPU_TAINT_VALUE = {"aws": "true", "gcp": "present"}


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
            "values": list(spec.instance_types),
        },
        {
            "key": "karpenter.sh/capacity-type",
            "operator": "In",
            "values": list(spec.capacity_types),
        },
    ]
    if spec.zones:
        reqs.append(
            {"key": "topology.kubernetes.io/zone", "operator": "In", "values": list(spec.zones)}
        )
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
