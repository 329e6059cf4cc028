"""Pulumi's mocks for the stack tests: every resource is recorded with its inputs; no cloud,
no Pulumi CLI."""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Any

import pulumi

ACCOUNT = "123456789012"
# the input that names each Azure resource the stacks declare
AZURE_NAMES = {
    "azure-native:resources:ResourceGroup": "resourceGroupName",
    "azure-native:network:VirtualNetwork": "virtualNetworkName",
    "azure-native:network:Subnet": "subnetName",
    "azure-native:containerservice:ManagedCluster": "resourceName",
    "azure-native:managedidentity:UserAssignedIdentity": "resourceName",
}


class Mocks(pulumi.runtime.Mocks):
    def __init__(self) -> None:
        self.resources: list[pulumi.runtime.MockResourceArgs] = []

    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str, dict[str, Any]]:
        self.resources.append(args)
        outputs = dict(args.inputs)
        if args.typ == "aws:eks/cluster:Cluster":
            outputs.update(endpoint="https://example.eks", certificateAuthority={"data": "Q0E="})
        if args.typ == "gcp:container/cluster:Cluster":
            outputs.update(endpoint="10.0.0.1", masterAuth={"clusterCaCertificate": "Q0E="})
        if args.typ == "gcp:serviceaccount/account:Account":
            outputs["email"] = f"{args.inputs['accountId']}@project.iam.gserviceaccount.com"
        if args.typ in AZURE_NAMES:  # Azure answers with the name the resource was given
            outputs["name"] = args.inputs.get(AZURE_NAMES[args.typ], args.name)
        if args.typ == "azure-native:containerservice:ManagedCluster":
            issuer = f"https://eastus.oic.prod-aks.azure.com/tenant/{args.name}/"
            outputs["oidcIssuerProfile"] = {**args.inputs["oidcIssuerProfile"], "issuerURL": issuer}
        if args.typ == "azure-native:managedidentity:UserAssignedIdentity":
            outputs.update(clientId=f"client-{args.name}", principalId=f"principal-{args.name}")
        outputs.setdefault("arn", f"arn:aws:mock::{ACCOUNT}:{args.name}")
        return f"{args.name}-id", outputs

    def call(
        self, args: pulumi.runtime.MockCallArgs
    ) -> tuple[dict[Any, Any], list[tuple[str, str]] | None]:
        if args.token == "aws:index/getCallerIdentity:getCallerIdentity":
            identity = {
                "accountId": ACCOUNT,
                "arn": f"arn:aws:iam::{ACCOUNT}:user/ci",
                "userId": "ci",
            }
            return identity, []
        if args.token == "azure-native:containerservice:listManagedClusterUserCredentials":
            config = base64.b64encode(b"apiVersion: v1\nkind: Config\n").decode()
            return {"kubeconfigs": [{"name": "clusterUser", "value": config}]}, []
        return {}, []


def run(
    project: str, build: Callable[[], dict[str, Any]]
) -> tuple[list[pulumi.runtime.MockResourceArgs], dict[str, Any]]:
    """Run `build` (which declares the stack) under fresh mocks; returns the resources and the
    resolved stack outputs."""
    mocks = Mocks()
    pulumi.runtime.set_mocks(mocks, project=project, stack="test", preview=False)
    resolved: dict[str, Any] = {}

    @pulumi.runtime.test  # type: ignore[untyped-decorator]
    def declare() -> pulumi.Output[Any]:
        return pulumi.Output.all(**build()).apply(resolved.update)

    declare()
    return mocks.resources, resolved


def of_type(resources: list[Any], typ: str) -> list[Any]:
    return [r for r in resources if r.typ == typ]
