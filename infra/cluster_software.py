"""What every stack installs into its cluster once it exists: the NVIDIA GPU Operator (DCGM
profiling fields on), KAI Scheduler, Argo CD with an Application syncing the GitOps folder, and
the gpufleet chart."""

from __future__ import annotations

from types import ModuleType
from typing import Any, Self

import pulumi
import pulumi_kubernetes as k8s
from pydantic import BaseModel, ConfigDict, Field

from gpufleet.iac import CHART, ConfigError, gpu_operator_values, parse_config


class StackSettings(BaseModel):
    """The keys every stack takes (`pulumi config set gpufleet:<key> <value>`): the cluster's
    name, the GitOps folder and repository it syncs, and the versions of the software installed
    into it. Each cloud's StackConfig adds its own keys (and may narrow these)."""

    model_config = ConfigDict(populate_by_name=True, extra="forbid")

    cluster_name: str = Field("gpufleet", alias="clusterName", pattern=r"^[a-z][a-z0-9-]{0,38}$")
    gitops_path: str = Field("../../examples/gitops", alias="gitopsPath")
    gitops_repo_url: str = Field(
        "https://github.com/example-org/gpu-fleet.git", alias="gitopsRepoUrl"
    )
    gitops_revision: str = Field("main", alias="gitopsRevision")
    gpu_operator_version: str = Field("v26.7.0", alias="gpuOperatorVersion")
    kai_version: str = Field("v0.17.0", alias="kaiVersion")
    argocd_version: str | None = Field(None, alias="argocdVersion")  # None: the chart's latest

    @classmethod
    def from_values(cls, values: dict[str, Any]) -> Self:
        return parse_config(cls, values)


def install(
    config: StackSettings,
    provider: k8s.Provider,
    gpu_driver: bool,
    controller: dict[str, Any] | None = None,
) -> None:
    """`gpu_driver`: whether the GPU Operator installs the driver (EKS AMIs and GKE's driver
    installer bring their own; AKS's node images do not). `controller`: more of the chart's
    `controller` values (its cloud identity)."""
    on_cluster = pulumi.ResourceOptions(provider=provider)

    def release(
        name: str,
        chart: str,
        namespace: str,
        version: str | None = None,
        repo: str | None = None,
        values: dict[str, Any] | None = None,
    ) -> k8s.helm.v3.Release:
        return k8s.helm.v3.Release(
            name,
            name=name,
            chart=chart,
            namespace=namespace,
            create_namespace=True,
            version=version,
            repository_opts={"repo": repo} if repo else None,
            values=values,
            opts=on_cluster,
        )

    release(
        "gpu-operator",
        "gpu-operator",
        "gpu-operator",
        repo="https://helm.ngc.nvidia.com/nvidia",
        version=config.gpu_operator_version,
        values=gpu_operator_values(driver=gpu_driver),
    )
    release(
        "kai-scheduler",
        "oci://ghcr.io/kai-scheduler/kai-scheduler/kai-scheduler",
        "kai-scheduler",
        version=config.kai_version,
    )
    argocd = release(
        "argocd",
        "argo-cd",
        "argocd",
        repo="https://argoproj.github.io/argo-helm",
        version=config.argocd_version,
    )
    gpufleet = release(
        "gpufleet",
        str(CHART),
        "gpufleet-system",
        values={
            "controller": {
                "clusterName": config.cluster_name,
                "schedulerName": "kai-scheduler",
                **(controller or {}),
            }
        },
    )
    k8s.apiextensions.CustomResource(
        "gitops",
        api_version="argoproj.io/v1alpha1",
        kind="Application",
        metadata={"name": "gpufleet-desired-state", "namespace": "argocd"},
        spec={
            "project": "default",
            "source": {
                "repoURL": config.gitops_repo_url,
                "targetRevision": config.gitops_revision,
                "path": "gitops",
                "directory": {"recurse": True},
            },
            "destination": {"server": "https://kubernetes.default.svc"},
            "syncPolicy": {"automated": {"prune": True, "selfHeal": True}},
        },
        opts=pulumi.ResourceOptions(provider=provider, depends_on=[argocd, gpufleet]),
    )


def run_stack(stack: ModuleType) -> None:
    """A stack's `pulumi up` program (its __main__.py): its StackConfig read from the stack's
    configuration, `build` run for the fleet `load_fleet_for` reads, the outputs exported; a
    wrong key ends it with the key's message, not a traceback."""
    try:
        config = stack.StackConfig.from_pulumi(pulumi.Config("gpufleet"))
        outputs = stack.build(config, stack.load_fleet_for(config))
    except ConfigError as err:
        raise SystemExit(f"error: {err}") from None
    for name, value in outputs.items():
        pulumi.export(name, value)
