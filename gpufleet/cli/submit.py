"""`gpufleet submit`: create a labelled batch/v1 Job from flags or from a Job manifest."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
import yaml

from gpufleet.cli.live import KUBECONFIG, ClusterReader
from gpufleet.cli.output import OutputFormat, err_console, fail, print_data, print_yaml
from gpufleet.model.api import NAMED_PRIORITIES


def job_manifest(
    name: str,
    namespace: str,
    team: str,
    workload_class: str,
    priority: str,
    gpus: int,
    pods: int,
    image: str,
    command: list[str],
    pool: str | None,
    run_for: str | None,
) -> dict[str, Any]:
    """A Job whose `pods` pods (a gang when more than one) each ask for `gpus` GPUs."""
    labels = {
        "gpufleet.io/team": team,
        "gpufleet.io/class": workload_class,
        "gpufleet.io/priority": priority,
    }
    if pool:
        labels["gpufleet.io/pool"] = pool
    container: dict[str, Any] = {
        "name": "main",
        "image": image,
        "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
    }
    if command:
        container["command"] = command
    template: dict[str, Any] = {"spec": {"restartPolicy": "Never", "containers": [container]}}
    if run_for:
        template["metadata"] = {"annotations": {"gpufleet.io/run-for": run_for}}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {"parallelism": pods, "completions": pods, "backoffLimit": 0, "template": template},
    }


def label_manifest(
    job: dict[str, Any], team: str, workload_class: str, priority: str, namespace: str | None
) -> dict[str, Any]:
    """A user's Job manifest with gpufleet's labels added (its own labels are kept)."""
    if job.get("kind") != "Job" or not str(job.get("apiVersion", "")).startswith("batch/"):
        raise ValueError("the manifest is not a batch/v1 Job")
    metadata = job.setdefault("metadata", {})
    labels = metadata.setdefault("labels", {}) or {}
    labels.setdefault("gpufleet.io/team", team)
    labels.setdefault("gpufleet.io/class", workload_class)
    labels.setdefault("gpufleet.io/priority", priority)
    metadata["labels"] = labels
    if namespace:
        metadata["namespace"] = namespace
    return job


def submit(
    name: str | None = typer.Argument(None, help="Job name (not needed with --file)."),
    team: str = typer.Option(..., "--team", "-t", help="The team the work belongs to."),
    workload_class: str = typer.Option(
        "elastic",
        "--class",
        help="reserved (within the team's reservation, never "
        "preempted) or elastic (idle GPUs, may be preempted).",
    ),
    priority: str = typer.Option(
        "normal", "--priority", help=f"{', '.join(NAMED_PRIORITIES)} or 0-99 (elastic work)."
    ),
    gpus: int = typer.Option(1, "--gpus", min=1, help="GPUs per pod."),
    pods: int = typer.Option(1, "--pods", min=1, help="Pods that run together (a gang)."),
    image: str = typer.Option("busybox", "--image"),
    pool: str | None = typer.Option(None, "--pool", help="Only this pool."),
    topology: str | None = typer.Option(
        None,
        "--topology",
        help="block or clique: a gang runs inside one network block (NVLink clique) or waits; "
        "by default one is preferred, not required.",
    ),
    namespace: str = typer.Option("default", "-n", "--namespace"),
    file: Path | None = typer.Option(
        None, "--file", "-f", help="A Job manifest to label and submit instead."
    ),
    run_for: str | None = typer.Option(
        None, "--run-for", help="Simulated run time on a dev cluster (kwok), e.g. 10m."
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the Job, create nothing."),
    output: OutputFormat = typer.Option(
        OutputFormat.YAML, "-o", "--output", help="Format of --dry-run output."
    ),
    command: list[str] | None = typer.Argument(None, help="Command after --."),
    kubeconfig: Path | None = KUBECONFIG,
) -> None:
    """Submit GPU work as a labelled batch/v1 Job; gpufleet admits it when it may run.

    Example: gpufleet submit sweep-1 --team nlp --gpus 8 --pods 2 -- python train.py
    """
    if workload_class not in ("reserved", "elastic"):
        raise fail(f"--class {workload_class!r}: use reserved or elastic")
    if priority not in NAMED_PRIORITIES and not (priority.isdigit() and int(priority) <= 99):
        raise fail(f"--priority {priority!r}: use {', '.join(NAMED_PRIORITIES)} or 0-99")
    if topology not in (None, "block", "clique"):
        raise fail(f"--topology {topology!r}: use block or clique")
    if file is not None:
        try:
            job = label_manifest(
                yaml.safe_load(file.read_text()), team, workload_class, priority, namespace
            )
        except (OSError, yaml.YAMLError, ValueError, AttributeError) as err:
            raise fail(f"{file}: {err}") from None
    elif name is None:
        raise fail("give the Job a NAME, or pass --file")
    else:
        job = job_manifest(
            name,
            namespace,
            team,
            workload_class,
            priority,
            gpus,
            pods,
            image,
            command or [],
            pool,
            run_for,
        )
    if topology:
        job["metadata"]["labels"]["gpufleet.io/topology"] = topology
    if dry_run:
        (print_data if output is OutputFormat.JSON else print_yaml)(job)
        return
    reader = ClusterReader(kubeconfig)
    try:
        reader.batch.create_namespaced_job(
            job["metadata"].get("namespace", namespace),
            job,
        )
    except reader.api_exception as err:
        raise fail(f"the cluster refused the Job: {_reason(err)}") from None
    err_console.print(
        f"submitted {job['metadata'].get('namespace', namespace)}/"
        f"{job['metadata']['name']}; follow it with: gpufleet workloads explain "
        f"{job['metadata']['name']} -n {job['metadata'].get('namespace', namespace)}"
    )


def _reason(err: Any) -> str:
    import json

    try:
        return str(json.loads(err.body)["message"])
    except (ValueError, KeyError, TypeError):
        return str(err.reason)
