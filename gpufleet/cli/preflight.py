"""`gpufleet preflight aws|gcp|azure`: can the cloud deliver the declared GPU pools?"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from gpufleet.cli.output import ProblemFormat, err_console, fail, print_problems, problem_counts
from gpufleet.cli.simulate import load_gitops
from gpufleet.iac import GCE_ACCELERATORS
from gpufleet.model import has_errors
from gpufleet.model.problems import Problem
from gpufleet.preflight.checks import aws_problems, azure_problems, gcp_problems

preflight_app = typer.Typer(
    help="Check quotas, availability and reservations for the GPU pools before deploying.",
    no_args_is_help=True,
)
GITOPS = typer.Option(..., "--gitops", "-g", help="GitOps files or folders with the GPUPools.")


def _report(problems: list[Problem], output: ProblemFormat, what: str) -> None:
    if output is ProblemFormat.JSON:
        import json

        print(json.dumps([p.to_dict() for p in problems], indent=2))
    else:
        print_problems(problems)
        err_console.print(f"{what}: {problem_counts(problems) if problems else 'all checks pass'}")
    if has_errors(problems):
        raise typer.Exit(1)


@preflight_app.command("aws")
def aws(
    gitops: list[Path] = GITOPS,
    region: str = typer.Option(..., "--region", help="The AWS region of the cluster."),
    output: ProblemFormat = typer.Option(ProblemFormat.TEXT, "-o", "--output"),
) -> None:
    """For every aws pool: its instance types exist and are offered in its zones, their GPU
    count matches gpusPerNode, the EC2 vCPU quotas (on-demand and spot, P and G families) cover
    every pool at maxGPUs, and its capacity reservations are active and of its types. Uses the
    default AWS credentials (read-only calls). Exit 1 on any error.

    Example: gpufleet preflight aws --gitops gitops/ --region us-west-2
    """
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError

    from gpufleet.preflight.aws import gather

    fleet = load_gitops(gitops)
    try:
        facts = gather(
            fleet,
            region,
            boto3.client("ec2", region_name=region),
            boto3.client("service-quotas", region_name=region),
        )
    except (BotoCoreError, ClientError) as err:
        raise fail(f"AWS refused the preflight calls: {err}") from None
    _report(aws_problems(fleet, facts), output, f"preflight aws ({region})")


@preflight_app.command("gcp")
def gcp(
    gitops: list[Path] = GITOPS,
    project: str = typer.Option(..., "--project", help="The GCP project."),
    region: str = typer.Option(..., "--region", help="The region of the cluster."),
    output: ProblemFormat = typer.Option(ProblemFormat.TEXT, "-o", "--output"),
) -> None:
    """For every gcp pool: its accelerator and machine types are offered in its zones and the
    region's GPU quotas (on-demand and preemptible) leave room for maxGPUs. Uses the default
    Google credentials (read-only calls). Exit 1 on any error.

    Example: gpufleet preflight gcp --gitops gitops/ --project ml-123 --region us-central1
    """
    from google.api_core.exceptions import GoogleAPIError
    from google.auth.exceptions import GoogleAuthError
    from google.cloud import compute_v1

    from gpufleet.preflight.gcp import gather

    fleet = load_gitops(gitops)
    try:
        facts = gather(
            project,
            region,
            compute_v1.RegionsClient(),
            compute_v1.AcceleratorTypesClient(),
            compute_v1.MachineTypesClient(),
        )
    except (GoogleAPIError, GoogleAuthError) as err:
        raise fail(f"GCP refused the preflight calls: {err}") from None
    _report(gcp_problems(fleet, facts, GCE_ACCELERATORS), output, f"preflight gcp ({region})")


@preflight_app.command("azure")
def azure(
    gitops: list[Path] = GITOPS,
    subscription: str = typer.Option(
        ..., "--subscription", envvar="AZURE_SUBSCRIPTION_ID", help="The Azure subscription ID."
    ),
    region: str = typer.Option(..., "--region", help="The region of the cluster (eastus)."),
    cluster: str | None = typer.Option(
        None,
        "--cluster",
        help="RESOURCE_GROUP/NAME of an AKS cluster to check for node auto-provisioning "
        "(Karpenter) and workload identity.",
    ),
    output: ProblemFormat = typer.Option(ProblemFormat.TEXT, "-o", "--output"),
) -> None:
    """For every azure pool: its VM sizes are offered to the subscription in the region and its
    zones (not restricted), the vCPU quotas cover every pool at maxGPUs (each size's family
    for on-demand, the regional Spot quota for spot, the regional total), and with --cluster
    the AKS cluster runs node auto-provisioning on Azure CNI overlay with Cilium, with workload
    identity. Uses the default Azure credentials (az login, a managed or workload identity;
    read-only calls). Exit 1 on any error.

    Example: gpufleet preflight azure --gitops gitops/ --subscription 0000-... --region eastus
    --cluster ml-rg/gpufleet
    """
    from azure.core.exceptions import AzureError
    from azure.identity import DefaultAzureCredential
    from azure.mgmt.compute import ComputeManagementClient
    from azure.mgmt.containerservice import ContainerServiceClient

    from gpufleet.preflight.azure import gather

    where = None
    if cluster is not None:
        group, slash, name = cluster.partition("/")
        if not (slash and group and name):
            raise fail(f"--cluster {cluster!r}: write RESOURCE_GROUP/NAME")
        where = (group, name)
    fleet = load_gitops(gitops)
    credential = DefaultAzureCredential()
    try:
        facts = gather(
            fleet,
            region,
            ComputeManagementClient(credential, subscription, **AZURE_CLIENT_OPTIONS),
            ContainerServiceClient(credential, subscription, **AZURE_CLIENT_OPTIONS),
            where,
        )
    except AzureError as err:
        raise fail(f"Azure refused the preflight calls: {str(err).splitlines()[0]}") from None
    _report(azure_problems(fleet, facts), output, f"preflight azure ({region})")


# the Azure clients' options (base_url, connection_verify): Azure's own by default; the tests
# point them at a local HTTPS server that answers as Azure's REST API does
AZURE_CLIENT_OPTIONS: dict[str, Any] = {}
