"""`gpufleet hosts ...`: GPU hosts outside Kubernetes (GPUHosts, kept by `gpufleet server` from
their standalone agents' reports), and the token a host's agent reports with."""

from __future__ import annotations

import os
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import typer
from rich import box
from rich.table import Table

from gpufleet.api import models, views
from gpufleet.cli.live import KUBECONFIG, ClusterReader, kube_client
from gpufleet.cli.output import OutputFormat, console, err_console, fail, print_structured
from gpufleet.model.api import GROUP, NAME_PATTERN, VERSION
from gpufleet.model.durations import parse_duration
from gpufleet.model.keys import QUARANTINED_AT_ANNOTATION, RELEASE_ANNOTATION

hosts_app = typer.Typer(
    help="GPU hosts outside Kubernetes (standalone agents): list, get, metrics, release, token.",
    no_args_is_help=True,
)
OUTPUT = typer.Option(OutputFormat.TABLE, "-o", "--output")


def _hosts(kubeconfig: Path | None) -> list[models.Host]:
    found = ClusterReader(kubeconfig).list("gpuhosts")
    return views.hosts(views.Objects(hosts=found), datetime.now(UTC))


def _dumped(host: models.Host) -> dict[str, Any]:
    return host.model_dump(mode="json", by_alias=True, exclude_none=True)


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.0f}%"


def _hours(host: models.Host) -> tuple[str, str]:
    total = next((u for u in host.usage if u.workload is None), None)
    if total is None:
        return "-", "-"
    return f"{total.gpu_hours:.1f}", f"{total.idle_gpu_hours:.1f}"


@hosts_app.command("list")
def list_hosts(kubeconfig: Path | None = KUBECONFIG, output: OutputFormat = OUTPUT) -> None:
    """The GPU hosts whose agents report to `gpufleet server`: state (Ready, Unhealthy, Lost),
    GPUs, how busy, GPU-hours and idle GPU-hours since they first reported.

    Example: gpufleet hosts list -o json
    """
    hosts = _hosts(kubeconfig)
    if print_structured([_dumped(h) for h in hosts], output):
        return
    table = Table(box=box.SIMPLE)
    for column in ("HOST", "STATE", "GPUS", "HEALTHY", "GPU BUSY", "CPU", "SERVICES",
                   "GPU-HOURS", "IDLE", "LAST SEEN"):  # fmt: skip
        table.add_column(column)
    for h in hosts:
        hours, idle = _hours(h)
        table.add_row(
            h.name, h.state, str(h.gpus), str(h.healthy_gpus), _percent(h.gpu_utilization),
            _percent(h.cpu_utilization), str(len(h.services)), hours, idle,
            h.last_seen.isoformat(timespec="seconds") if h.last_seen else "never",
        )  # fmt: skip
    console.print(table)
    if not hosts:
        err_console.print(
            "no GPU hosts: run `gpufleet agent standalone --server URL` on one "
            "(docs/agent-standalone.md)"
        )


@hosts_app.command("get")
def get_host(
    name: str = typer.Argument(..., help="The host, as its agent names it."),
    kubeconfig: Path | None = KUBECONFIG,
    output: OutputFormat = OUTPUT,
) -> None:
    """One GPU host: each GPU, the processes on them (user, command, framework, workload),
    the services that send it metrics, and GPU-hours by workload."""
    found = [h for h in _hosts(kubeconfig) if h.name == name]
    if not found:
        raise fail(f"no GPU host {name}: `gpufleet hosts list` shows those that reported")
    host = found[0]
    if print_structured(_dumped(host), output):
        return
    console.print(
        f"[bold]{host.name}[/bold]  {host.state}" + (f": {host.message}" if host.message else "")
    )
    console.print(
        f"reports {host.reports} (resent, not counted: {host.duplicates}); agent "
        f"{host.agent_version or '-'}; last seen {host.last_seen or 'never'}"
    )
    gpus = Table("GPU", "UUID", "HEALTHY", "BUSY", "MEMORY USED", "TEMP", box=box.SIMPLE)
    for d in host.devices:
        used = "-" if d.memory_used_bytes is None else f"{d.memory_used_bytes / 2**30:.1f} GiB"
        gpus.add_row(str(d.index), d.uuid, "yes" if d.healthy else "NO " + ",".join(d.problems),
                     _percent(d.utilization), used,
                     "-" if d.temperature_c is None else f"{d.temperature_c:g}C")  # fmt: skip
    console.print(gpus)
    if host.processes:
        procs = Table("GPU", "PID", "USER", "COMMAND", "FRAMEWORK", "WORKLOAD", "GPU MEMORY",
                      box=box.SIMPLE)  # fmt: skip
        for p in host.processes:
            memory = "-" if p.memory_bytes is None else f"{p.memory_bytes / 2**30:.1f} GiB"
            procs.add_row(str(p.gpu), str(p.pid), p.user, p.command, p.framework, p.workload,
                          memory)  # fmt: skip
        console.print(procs)
    if host.services:
        console.print(
            "services: " + ", ".join(f"{s.name} ({s.series} series)" for s in host.services)
        )
    usage = Table("WORKLOAD", "GPU-HOURS", "IDLE GPU-HOURS", box=box.SIMPLE)
    for u in host.usage:
        usage.add_row(u.workload or "(the host)", f"{u.gpu_hours:.2f}", f"{u.idle_gpu_hours:.2f}")
    console.print(usage)


@hosts_app.command("metrics")
def host_metrics(
    name: str = typer.Argument(..., help="The host."),
    service: str | None = typer.Option(None, "--service", help="Only this service_name's."),
    prefix: str | None = typer.Option(None, "--prefix", help="Only names starting so."),
    output: OutputFormat = OUTPUT,
) -> None:
    """The series of the host's newest report, as `gpufleet server` took it: the agent's GPU,
    process and host metrics and its programs' OTLP metrics. Asks the server of `gpufleet
    login` (or $GPUFLEET_SERVER and $GPUFLEET_TOKEN).

    Example: gpufleet hosts metrics gpu-vm-1 --service trainer
    """
    from gpufleet.client import ApiError, Client

    try:
        with Client.from_config() as client:
            found = client.host_metrics(name, service, prefix)
    except ApiError as err:
        raise fail(str(err)) from None
    if print_structured(found.model_dump(mode="json", by_alias=True), output):
        return
    table = Table("SERIES", "VALUE", box=box.SIMPLE)
    for s in found.series:
        labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
        table.add_row(f"{s.name}{{{labels}}}" if labels else s.name, f"{s.value:g}")
    console.print(table)
    err_console.print(f"{len(found.series)} series, taken on {name} at {found.time.isoformat()}")


@hosts_app.command("release")
def release(
    name: str = typer.Argument(..., help="The quarantined host."),
    by: str = typer.Option(os.environ.get("USER", "a person"), "--by", help="Who releases it."),
    kubeconfig: Path | None = KUBECONFIG,
) -> None:
    """Take a host out of quarantine by hand (also an escalated one): the health controller
    records who released it and when (annotation gpufleet.io/released-manually), and its
    agent resumes its Slurm node at its next report."""
    client = kube_client(kubeconfig)
    custom = client.CustomObjectsApi()
    stamp = f"{by} at {datetime.now(UTC).isoformat(timespec='seconds')}"
    try:
        found = custom.get_cluster_custom_object(GROUP, VERSION, "gpuhosts", name)
        if QUARANTINED_AT_ANNOTATION not in (found["metadata"].get("annotations") or {}):
            # a release request left on a healthy host would undo its next quarantine at once
            raise fail(f"host {name} is not quarantined: nothing to release")
        custom.patch_cluster_custom_object(
            GROUP, VERSION, "gpuhosts", name,
            {"metadata": {"annotations": {RELEASE_ANNOTATION: stamp}}},
        )  # fmt: skip
    except client.ApiException as err:
        raise fail(f"host {name}: {err.status} {err.reason}") from None
    err_console.print(f"release of host {name} requested; the health controller applies it")


@hosts_app.command("token")
def token(
    name: str = typer.Argument(..., help="The host, as its agent names it (--host-name)."),
    namespace: str = typer.Option(
        "gpufleet-system", "--namespace", "-n", help="Where the host's service account goes."
    ),
    duration: str = typer.Option("8760h", "--duration", help="How long the token is valid."),
    write: Path | None = typer.Option(
        None, "--write", help="Write it to this file (mode 0600) instead of printing it."
    ),
    kubeconfig: Path | None = KUBECONFIG,
) -> None:
    """A token with which a host's agent reports to `gpufleet server`: a service account
    `gpufleet-host-NAME` that may update the GPUHost NAME and nothing else (a ClusterRole
    with that resourceName), and a token of it. Run it again for a new token.

    Example:

      gpufleet hosts token gpu-vm-1 --write /etc/gpufleet/token   # on the host, via ssh
    """
    import re

    if not re.fullmatch(NAME_PATTERN, name):
        raise fail(f"host name {name!r}: use lower-case letters, digits, '-' and '.'")
    try:
        seconds = int(parse_duration(duration).total_seconds())
    except ValueError as err:
        raise fail(f"--duration: {err}") from None
    client = kube_client(kubeconfig)
    account = f"gpufleet-host-{name}"
    api = client.ApiClient()
    try:
        _ensure_access(client, api, name, account, namespace)
        answer = client.CoreV1Api(api).create_namespaced_service_account_token(
            account, namespace, {"spec": {"expirationSeconds": seconds}}
        )
    except client.ApiException as err:
        if err.status == 404:
            raise fail(f"namespace {namespace} does not exist: pass --namespace, the one "
                       "gpufleet runs in") from None  # fmt: skip
        raise fail(f"cannot make the token of host {name}: {err.status} {err.reason}") from None
    except Exception as err:  # the cluster did not answer
        raise fail(f"cannot make the token of host {name}: {err}") from None
    value = answer.status.token
    if write is None:
        typer.echo(value)
        return
    write.parent.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(write, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as out:
        out.write(value + "\n")
    err_console.print(f"wrote the token of host {name} to {write} (valid {duration})")


def _ensure_access(client: Any, api: Any, host: str, account: str, namespace: str) -> None:
    """The service account, and its right to update its own GPUHost only; made again the same
    when they exist."""
    core, rbac = client.CoreV1Api(api), client.RbacAuthorizationV1Api(api)
    labels = {"app.kubernetes.io/managed-by": "gpufleet", "gpufleet.io/host": host}
    role = {
        "metadata": {"name": account, "labels": labels},
        "rules": [
            {
                "apiGroups": [GROUP],
                "resources": ["gpuhosts"],
                "resourceNames": [host],
                "verbs": ["update"],
            }
        ],
    }
    binding = {
        "metadata": {"name": account, "labels": labels},
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": account,
        },
        "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}],
    }
    account_body = {"metadata": {"name": account, "labels": labels}}
    steps: list[tuple[Callable[[Any], Any], Callable[[Any], Any] | None, dict[str, Any]]] = [
        (lambda b: core.create_namespaced_service_account(namespace, b), None, account_body),
        (rbac.create_cluster_role, lambda b: rbac.replace_cluster_role(account, b), role),
        (
            rbac.create_cluster_role_binding,
            lambda b: rbac.replace_cluster_role_binding(account, b),
            binding,
        ),
    ]
    for create, replace, body in steps:
        try:
            create(body)
        except client.ApiException as err:
            if err.status != 409:
                raise
            if replace is not None:
                replace(body)
