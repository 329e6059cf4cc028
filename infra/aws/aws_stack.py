"""The AWS stack: VPC, EKS, a system node group, Karpenter (IAM, interruption queue, Helm), the
NVIDIA GPU Operator (DCGM profiling metrics on), KAI Scheduler, Argo CD pointed at the GitOps
repository, and the gpufleet chart. GPU NodePools and EC2NodeClasses are rendered from the
GPUPool specs by `gpufleet.render` — the same objects `gpufleet render --target karpenter-aws`
prints — and applied as that exact YAML.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as k8s
from pydantic import Field, model_validator

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # infra/
import cluster_software

from gpufleet.iac import config_values, fleet_from
from gpufleet.model.fleet import Fleet
from gpufleet.render import ClusterSettings, Target, render
from gpufleet.render.common import to_yaml


class StackConfig(cluster_software.StackSettings):
    """`pulumi config set gpufleet:<key> <value>`; every key has a default but region."""

    region: str = Field(pattern=r"^[a-z]{2}(-[a-z]+)+-\d$")
    kubernetes_version: str = Field("1.34", alias="kubernetesVersion", pattern=r"^1\.\d+$")
    vpc_id: str | None = Field(None, alias="vpcId")
    subnet_ids: list[str] = Field(default_factory=list, alias="subnetIds")
    availability_zones: list[str] = Field(default_factory=list, alias="availabilityZones")
    system_instance_type: str = Field("m7i.xlarge", alias="systemInstanceType")
    system_nodes: int = Field(2, alias="systemNodes", ge=1, le=10)
    karpenter_version: str = Field("1.14.1", alias="karpenterVersion")

    @model_validator(mode="after")
    def _network(self) -> StackConfig:
        if self.vpc_id and len(self.subnet_ids) < 2:
            raise ValueError("with vpcId, set subnetIds to at least two private subnets of it")
        if not self.vpc_id and self.subnet_ids:
            raise ValueError("subnetIds needs vpcId (the VPC the subnets belong to)")
        return self

    @property
    def zones(self) -> list[str]:
        return self.availability_zones or [f"{self.region}a", f"{self.region}b"]

    @classmethod
    def from_pulumi(cls, config: pulumi.Config) -> StackConfig:
        region = pulumi.Config("aws").get("region")
        return cls.from_values(config_values(cls, config.get, {"region": region}))


def load_fleet_for(config: StackConfig, base: Path | None = None) -> Fleet:
    return fleet_from((base or Path(__file__).resolve().parent) / config.gitops_path)


def gpu_node_objects_yaml(fleet: Fleet, cluster_name: str) -> str:
    """The NodePools and EC2NodeClasses, exactly as `gpufleet render --target karpenter-aws`."""
    return to_yaml(render(fleet, Target.KARPENTER_AWS, ClusterSettings(cluster_name)))


def _assume(service: str) -> str:
    return json.dumps(
        {
            "Version": "2012-10-17",
            "Statement": [
                {
                    "Effect": "Allow",
                    "Principal": {"Service": service},
                    "Action": ["sts:AssumeRole", "sts:TagSession"]
                    if service == "pods.eks.amazonaws.com"
                    else "sts:AssumeRole",
                }
            ],
        }
    )


def karpenter_policy(
    cluster: str, region: str, account: str, node_role_arn: str, queue_arn: str
) -> dict[str, Any]:
    """What the Karpenter controller may do: launch and tag instances for this cluster's pools,
    read what it needs, and nothing on resources of other clusters."""
    tagged = {"StringEquals": {f"aws:RequestTag/kubernetes.io/cluster/{cluster}": "owned"}}
    owned = {"StringEquals": {f"aws:ResourceTag/kubernetes.io/cluster/{cluster}": "owned"}}
    arn = f"arn:aws:ec2:{region}"
    launched = [
        f"{arn}:*:fleet/*",
        f"{arn}:*:instance/*",
        f"{arn}:*:volume/*",
        f"{arn}:*:network-interface/*",
        f"{arn}:*:launch-template/*",
        f"{arn}:*:spot-instances-request/*",
    ]
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Sid": "LaunchForThisCluster",
                "Effect": "Allow",
                "Action": ["ec2:RunInstances", "ec2:CreateFleet", "ec2:CreateLaunchTemplate"],
                "Resource": launched,
                "Condition": tagged,
            },
            {
                "Sid": "UseSharedLaunchInputs",
                "Effect": "Allow",
                "Action": ["ec2:RunInstances", "ec2:CreateFleet"],
                "Resource": [
                    f"{arn}::image/*",
                    f"{arn}::snapshot/*",
                    f"{arn}:*:security-group/*",
                    f"{arn}:*:subnet/*",
                    f"{arn}:*:capacity-reservation/*",
                    f"{arn}:*:launch-template/*",
                ],
            },
            {
                "Sid": "TagOnCreate",
                "Effect": "Allow",
                "Action": "ec2:CreateTags",
                "Resource": launched,
                "Condition": {
                    **tagged,
                    "StringEqualsIfExists": {
                        "ec2:CreateAction": ["RunInstances", "CreateFleet", "CreateLaunchTemplate"]
                    },
                },
            },
            {
                "Sid": "ManageOwnInstances",
                "Effect": "Allow",
                "Action": ["ec2:TerminateInstances", "ec2:DeleteLaunchTemplate", "ec2:CreateTags"],
                "Resource": [f"{arn}:*:instance/*", f"{arn}:*:launch-template/*"],
                "Condition": owned,
            },
            {
                "Sid": "Read",
                "Effect": "Allow",
                "Action": [
                    "ec2:DescribeAvailabilityZones",
                    "ec2:DescribeCapacityReservations",
                    "ec2:DescribeImages",
                    "ec2:DescribeInstances",
                    "ec2:DescribeInstanceTypeOfferings",
                    "ec2:DescribeInstanceTypes",
                    "ec2:DescribeLaunchTemplates",
                    "ec2:DescribeSecurityGroups",
                    "ec2:DescribeSpotPriceHistory",
                    "ec2:DescribeSubnets",
                    "pricing:GetProducts",
                ],
                "Resource": "*",  # describe calls cannot be scoped to resources
                "Condition": {"StringEquals": {"aws:RequestedRegion": region}},
            },
            {
                "Sid": "SSMImageParameters",
                "Effect": "Allow",
                "Action": "ssm:GetParameter",
                "Resource": f"arn:aws:ssm:{region}::parameter/aws/service/*",
            },
            {
                "Sid": "PassNodeRoleOnly",
                "Effect": "Allow",
                "Action": "iam:PassRole",
                "Resource": node_role_arn,
                "Condition": {"StringEquals": {"iam:PassedToService": "ec2.amazonaws.com"}},
            },
            {
                "Sid": "CreateInstanceProfiles",
                "Effect": "Allow",
                "Action": ["iam:CreateInstanceProfile", "iam:TagInstanceProfile"],
                "Resource": f"arn:aws:iam::{account}:instance-profile/*",
                "Condition": {
                    "StringEquals": {f"aws:RequestTag/kubernetes.io/cluster/{cluster}": "owned"}
                },
            },
            {
                "Sid": "ManageOwnInstanceProfiles",
                "Effect": "Allow",
                "Action": [
                    "iam:AddRoleToInstanceProfile",
                    "iam:RemoveRoleFromInstanceProfile",
                    "iam:DeleteInstanceProfile",
                    "iam:GetInstanceProfile",
                ],
                "Resource": f"arn:aws:iam::{account}:instance-profile/*",
                "Condition": {
                    "StringEquals": {f"aws:ResourceTag/kubernetes.io/cluster/{cluster}": "owned"}
                },
            },
            {
                "Sid": "InterruptionQueue",
                "Effect": "Allow",
                "Action": ["sqs:DeleteMessage", "sqs:GetQueueUrl", "sqs:ReceiveMessage"],
                "Resource": queue_arn,
            },
            {
                "Sid": "Cluster",
                "Effect": "Allow",
                "Action": "eks:DescribeCluster",
                "Resource": f"arn:aws:eks:{region}:{account}:cluster/{cluster}",
            },
        ],
    }


NODE_POLICIES = (
    "AmazonEKSWorkerNodePolicy",
    "AmazonEKS_CNI_Policy",
    "AmazonEC2ContainerRegistryReadOnly",
    "AmazonSSMManagedInstanceCore",
)


def build(config: StackConfig, fleet: Fleet) -> dict[str, Any]:
    """Declare every resource; returns the stack outputs."""
    name = config.cluster_name
    tags = {"gpufleet.io/cluster": name, f"kubernetes.io/cluster/{name}": "owned"}
    account = aws.get_caller_identity().account_id
    subnets = _network(config, tags)

    cluster_role = aws.iam.Role(f"{name}-cluster", assume_role_policy=_assume("eks.amazonaws.com"))
    aws.iam.RolePolicyAttachment(
        f"{name}-cluster-policy",
        role=cluster_role.name,
        policy_arn="arn:aws:iam::aws:policy/AmazonEKSClusterPolicy",
    )
    cluster = aws.eks.Cluster(
        name,
        name=name,
        version=config.kubernetes_version,
        role_arn=cluster_role.arn,
        vpc_config={"subnet_ids": subnets},
        access_config={"authentication_mode": "API"},
        tags=tags,
    )
    # one node role for the system nodes and the GPU nodes Karpenter launches: the renderer's
    # EC2NodeClasses name it KarpenterNodeRole-<cluster>
    node_role = aws.iam.Role(
        f"{name}-node",
        name=f"KarpenterNodeRole-{name}",
        assume_role_policy=_assume("ec2.amazonaws.com"),
    )
    for policy in NODE_POLICIES:
        aws.iam.RolePolicyAttachment(
            f"{name}-node-{policy}",
            role=node_role.name,
            policy_arn=f"arn:aws:iam::aws:policy/{policy}",
        )
    aws.eks.AccessEntry(
        f"{name}-nodes", cluster_name=cluster.name, principal_arn=node_role.arn, type="EC2_LINUX"
    )
    aws.eks.NodeGroup(
        f"{name}-system",
        cluster_name=cluster.name,
        node_role_arn=node_role.arn,
        subnet_ids=subnets,
        instance_types=[config.system_instance_type],
        scaling_config={
            "desired_size": config.system_nodes,
            "min_size": config.system_nodes,
            "max_size": config.system_nodes + 1,
        },
        labels={"gpufleet.io/system": "true"},
        tags=tags,
    )
    aws.eks.Addon(
        f"{name}-pod-identity", cluster_name=cluster.name, addon_name="eks-pod-identity-agent"
    )

    queue, karpenter_role = _karpenter_iam(config, account, cluster, node_role)
    provider = k8s.Provider(f"{name}-k8s", kubeconfig=_kubeconfig(cluster, config.region))
    karpenter = k8s.helm.v3.Release(
        "karpenter",
        name="karpenter",
        chart="oci://public.ecr.aws/karpenter/karpenter",
        version=config.karpenter_version,
        namespace="kube-system",
        values={
            "settings": {"clusterName": name, "interruptionQueue": queue.name},
            "serviceAccount": {"name": "karpenter"},
            "nodeSelector": {"gpufleet.io/system": "true"},
        },
        opts=pulumi.ResourceOptions(provider=provider, depends_on=[karpenter_role]),
    )
    # EKS accelerated AMIs bring the driver
    cluster_software.install(config, provider, False)
    k8s.yaml.v2.ConfigGroup(
        "gpu-node-pools",
        yaml=gpu_node_objects_yaml(fleet, name),
        opts=pulumi.ResourceOptions(provider=provider, depends_on=[karpenter]),
    )
    return {
        "clusterName": cluster.name,
        "clusterEndpoint": cluster.endpoint,
        "interruptionQueue": queue.name,
        "nodeRole": node_role.name,
        "gpuPools": sorted(p for p in fleet.pools if fleet.pools[p].spec.provider == "aws"),
    }


def _network(config: StackConfig, tags: dict[str, str]) -> Any:
    if config.vpc_id:
        return config.subnet_ids
    vpc = aws.ec2.Vpc(
        f"{config.cluster_name}-vpc",
        cidr_block="10.0.0.0/16",
        enable_dns_hostnames=True,
        enable_dns_support=True,
        tags=tags,
    )
    gateway = aws.ec2.InternetGateway(f"{config.cluster_name}-igw", vpc_id=vpc.id, tags=tags)
    public_routes = aws.ec2.RouteTable(
        f"{config.cluster_name}-public",
        vpc_id=vpc.id,
        routes=[{"cidr_block": "0.0.0.0/0", "gateway_id": gateway.id}],
        tags=tags,
    )
    private = []
    nat = None
    for i, zone in enumerate(config.zones):
        public = aws.ec2.Subnet(
            f"{config.cluster_name}-public-{zone}",
            vpc_id=vpc.id,
            availability_zone=zone,
            cidr_block=f"10.0.{i}.0/24",
            map_public_ip_on_launch=True,
            tags={**tags, "kubernetes.io/role/elb": "1"},
        )
        aws.ec2.RouteTableAssociation(
            f"{config.cluster_name}-public-{zone}",
            subnet_id=public.id,
            route_table_id=public_routes.id,
        )
        if nat is None:
            address = aws.ec2.Eip(f"{config.cluster_name}-nat", domain="vpc", tags=tags)
            nat = aws.ec2.NatGateway(
                f"{config.cluster_name}-nat",
                subnet_id=public.id,
                allocation_id=address.id,
                tags=tags,
            )
        subnet = aws.ec2.Subnet(
            f"{config.cluster_name}-private-{zone}",
            vpc_id=vpc.id,
            availability_zone=zone,
            cidr_block=f"10.0.{64 + 16 * i}.0/20",
            tags={
                **tags,
                "kubernetes.io/role/internal-elb": "1",
                "karpenter.sh/discovery": config.cluster_name,  # where Karpenter launches nodes
            },
        )
        routes = aws.ec2.RouteTable(
            f"{config.cluster_name}-private-{zone}",
            vpc_id=vpc.id,
            routes=[{"cidr_block": "0.0.0.0/0", "nat_gateway_id": nat.id}],
            tags=tags,
        )
        aws.ec2.RouteTableAssociation(
            f"{config.cluster_name}-private-{zone}", subnet_id=subnet.id, route_table_id=routes.id
        )
        private.append(subnet.id)
    return private


def _karpenter_iam(
    config: StackConfig, account: str, cluster: aws.eks.Cluster, node_role: aws.iam.Role
) -> tuple[aws.sqs.Queue, aws.iam.Role]:
    name = config.cluster_name
    queue = aws.sqs.Queue(
        f"{name}-interruptions",
        name=name,
        message_retention_seconds=300,
        sqs_managed_sse_enabled=True,
    )
    aws.sqs.QueuePolicy(
        f"{name}-interruptions",
        queue_url=queue.id,
        policy=queue.arn.apply(
            lambda arn: json.dumps(
                {
                    "Version": "2012-10-17",
                    "Statement": [
                        {
                            "Effect": "Allow",
                            "Principal": {"Service": ["events.amazonaws.com", "sqs.amazonaws.com"]},
                            "Action": "sqs:SendMessage",
                            "Resource": arn,
                        }
                    ],
                }
            )
        ),
    )
    ec2 = "aws.ec2"
    for rule, source, detail in (
        ("spot-interruption", ec2, "EC2 Spot Instance Interruption Warning"),
        ("rebalance", ec2, "EC2 Instance Rebalance Recommendation"),
        ("state-change", ec2, "EC2 Instance State-change Notification"),
        ("health", "aws.health", "AWS Health Event"),
    ):
        pattern = {"source": [source], "detail-type": [detail]}
        event = aws.cloudwatch.EventRule(f"{name}-{rule}", event_pattern=json.dumps(pattern))
        aws.cloudwatch.EventTarget(f"{name}-{rule}", rule=event.name, arn=queue.arn)
    role = aws.iam.Role(f"{name}-karpenter", assume_role_policy=_assume("pods.eks.amazonaws.com"))
    aws.iam.RolePolicy(
        f"{name}-karpenter",
        role=role.id,
        policy=pulumi.Output.all(node_role.arn, queue.arn).apply(
            lambda args: json.dumps(
                karpenter_policy(name, config.region, account, args[0], args[1])
            )
        ),
    )
    aws.eks.PodIdentityAssociation(
        f"{name}-karpenter",
        cluster_name=cluster.name,
        namespace="kube-system",
        service_account="karpenter",
        role_arn=role.arn,
    )
    return queue, role


def _kubeconfig(cluster: aws.eks.Cluster, region: str) -> pulumi.Output[str]:
    return pulumi.Output.all(cluster.name, cluster.endpoint, cluster.certificate_authority).apply(
        lambda args: json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {
                        "name": args[0],
                        "cluster": {
                            "server": args[1],
                            "certificate-authority-data": (args[2] or {}).get("data", ""),
                        },
                    }
                ],
                "users": [
                    {
                        "name": "aws",
                        "user": {
                            "exec": {
                                "apiVersion": "client.authentication.k8s.io/v1beta1",
                                "command": "aws",
                                "args": [
                                    "eks",
                                    "get-token",
                                    "--cluster-name",
                                    args[0],
                                    "--region",
                                    region,
                                ],
                            }
                        },
                    }
                ],
                "contexts": [{"name": args[0], "context": {"cluster": args[0], "user": "aws"}}],
                "current-context": args[0],
            }
        )
    )
