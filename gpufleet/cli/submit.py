"""`gpufleet submit`: create a labelled workload (a batch/v1 Job, a JobSet, a TrainJob, a
Deployment or a bare pod) from flags, or label and create a manifest of any kind gpufleet
manages."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
import yaml

from gpufleet.api import views
from gpufleet.api.models import Template
from gpufleet.cli.live import KUBECONFIG, ClusterReader
from gpufleet.cli.output import OutputFormat, err_console, fail, print_data, print_yaml
from gpufleet.kube.kinds import kind_list, kind_of
from gpufleet.kube.manifests import (
    as_kind,
    for_hub,
    is_priority,
    job_manifest,
    label_manifest,
)
from gpufleet.model.api import GROUP, NAMED_PRIORITIES, VERSION
from gpufleet.model.gpu_types import split_list
from gpufleet.model.keys import (
    DISPATCHED_TO_ANNOTATION,
    GPU_TYPES_ANNOTATION,
    HUB_MESSAGE_ANNOTATION,
    HUB_STATE_ANNOTATION,
)
from gpufleet.model.suggest import did_you_mean

# the kinds `--kind` builds from flags (a RayJob needs its Ray image and entrypoint: --file)
BUILT = ("job", "jobset", "trainjob", "deployment", "pod")


def submit(
    name: str | None = typer.Argument(None, help="Job name (not needed with --file)."),
    team: str = typer.Option(..., "--team", "-t", help="The team the work belongs to."),
    workload_class: str | None = typer.Option(
        None,
        "--class",
        help="reserved (within the team's reservation, never "
        "preempted) or elastic (idle GPUs, may be preempted). [default: elastic]",
    ),
    priority: str | None = typer.Option(
        None,
        "--priority",
        help=f"{', '.join(NAMED_PRIORITIES)} or 0-99 (elastic work). [default: normal]",
    ),
    gpus: int | None = typer.Option(None, "--gpus", min=1, help="GPUs per pod. [default: 1]"),
    pods: int | None = typer.Option(
        None, "--pods", min=1, help="Pods that run together (a gang). [default: 1]"
    ),
    image: str | None = typer.Option(None, "--image", help="[default: busybox]"),
    pool: str | None = typer.Option(None, "--pool", help="Only this pool."),
    gpu_type: list[str] | None = typer.Option(
        None,
        "--gpu-type",
        help="The GPU types it accepts, the most preferred first: H100,A100 (or the flag "
        "repeated). Their pools are tried in this order; a pool of another type is never used "
        "nor preempted in.",
    ),
    template: str | None = typer.Option(
        None,
        "--template",
        help="A WorkloadTemplate to start from (gpufleet templates lists them): its kind, "
        "image, command, env, class, priority, GPUs, pods, pool, CPU and memory, where you "
        "give no flag of your own.",
    ),
    topology: str | None = typer.Option(
        None,
        "--topology",
        help="block or clique: a gang runs inside one network block (NVLink clique) or waits; "
        "by default one is preferred, not required.",
    ),
    namespace: str = typer.Option("default", "-n", "--namespace"),
    kind: str | None = typer.Option(
        None,
        "--kind",
        help="What to create: job (batch/v1), jobset (one replicated Job of the pods, needs "
        "JobSet), trainjob (the pods as nodes of --runtime, needs Kubeflow Trainer), "
        "deployment (the pods as replicas, for serving) or pod (one bare pod). [default: job]",
    ),
    runtime: str = typer.Option(
        "torch-distributed", "--runtime", help="The ClusterTrainingRuntime of a TrainJob."
    ),
    file: Path | None = typer.Option(
        None,
        "--file",
        "-f",
        help=f"A manifest to label and submit instead: a {kind_list()}.",
    ),
    run_for: str | None = typer.Option(
        None, "--run-for", help="Simulated run time on a dev cluster (kwok), e.g. 10m."
    ),
    cluster: str | None = typer.Option(
        None,
        "--cluster",
        help="Submit to the hub of a fleet (--kubeconfig is the hub's): auto sends the Job to "
        "the cluster that admits it soonest, a cluster's name pins it there (it waits, with "
        "the reason, while that cluster cannot take it). Jobs only (--kind job).",
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the workload, create nothing."),
    output: OutputFormat = typer.Option(
        OutputFormat.YAML, "-o", "--output", help="Format of --dry-run output."
    ),
    command: list[str] | None = typer.Argument(None, help="Command after --."),
    kubeconfig: Path | None = KUBECONFIG,
) -> None:
    """Submit GPU work as a labelled workload; gpufleet admits it when it may run.

    Example: gpufleet submit sweep-1 --team nlp --gpus 8 --pods 2 -- python train.py

    Example: gpufleet submit pretrain --kind trainjob --team llm --class reserved --gpus 8 --pods 4

    Example: gpufleet submit sweep-2 --team nlp --gpus 8 --cluster auto --kubeconfig hub.yaml

    Example: gpufleet submit eval-7 --team nlp --template eval-small -- python eval.py

    Example: gpufleet submit ft-3 --team nlp --gpus 8 --gpu-type H100,A100 -- python ft.py
    """
    chosen = _template(ClusterReader(kubeconfig), template, team) if template else None
    workload_class = workload_class or (chosen.workload_class if chosen else "elastic")
    priority = priority or (chosen.priority if chosen else "normal")
    gpus = gpus or (chosen.gpus if chosen else 1)
    pods = pods or (chosen.pods if chosen else 1)
    image = image or (chosen.image if chosen else "busybox")
    pool = pool or (chosen.pool if chosen else None)
    kind = kind or (chosen.kind if chosen else "job")
    command = command or (list(chosen.command) if chosen else [])
    if workload_class not in ("reserved", "elastic"):
        raise fail(f"--class {workload_class!r}: use reserved or elastic")
    if not is_priority(priority):
        raise fail(f"--priority {priority!r}: use {', '.join(NAMED_PRIORITIES)} or 0-99")
    if topology not in (None, "block", "clique"):
        raise fail(f"--topology {topology!r}: use block or clique")
    if kind not in BUILT:
        raise fail(
            f"--kind {kind!r}: use {', '.join(BUILT)} (a RayJob: write its manifest and pass "
            "it with --file)"
        )
    if file is not None:
        try:
            job = label_manifest(
                yaml.safe_load(file.read_text()), team, workload_class, priority, namespace
            )
        except (OSError, yaml.YAMLError, ValueError, AttributeError) as err:
            raise fail(f"{file}: {err}") from None
    elif name is None:
        raise fail("give the workload a NAME, or pass --file")
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
            command,
            pool,
            run_for,
        )
        if chosen is not None:
            _with_template_resources(job, chosen)
        try:
            job = as_kind(job, kind, runtime)
        except ValueError as err:
            raise fail(f"--kind {kind}: {err}") from None
    if topology:
        job["metadata"]["labels"]["gpufleet.io/topology"] = topology
    if gpu_type:
        annotations = job["metadata"].get("annotations") or {}
        job["metadata"]["annotations"] = {
            **annotations,
            GPU_TYPES_ANNOTATION: ",".join(split_list(gpu_type)),
        }
    if cluster is not None:
        try:
            job = for_hub(job, cluster)
        except ValueError as err:
            use = ": use --kind job" if "Jobs only" in str(err) else ""
            raise fail(f"--cluster {cluster}: {err}{use}") from None
    if dry_run:
        (print_data if output is OutputFormat.JSON else print_yaml)(job)
        return
    adapter = kind_of(job)
    assert adapter is not None  # built here, or checked by label_manifest
    reader = ClusterReader(kubeconfig)
    where = job["metadata"].get("namespace", namespace)
    if cluster is not None:
        _check_cluster(reader, cluster)
    create_workload(reader, job, where)
    if cluster is not None:
        err_console.print(
            f"submitted Job {where}/{job['metadata']['name']} to the hub, for "
            + ("the cluster that admits it soonest" if cluster == "auto" else f"cluster {cluster}")
            + f"; where it runs and its state: kubectl get job {job['metadata']['name']} -n "
            f"{where} -o yaml (annotations {DISPATCHED_TO_ANNOTATION}, {HUB_STATE_ANNOTATION}, "
            f"{HUB_MESSAGE_ANNOTATION})"
        )
        return
    workload = adapter.workload_name(job["metadata"]["name"])
    err_console.print(
        f"submitted {adapter.kind} {where}/{job['metadata']['name']}; follow it with: "
        f"gpufleet workloads explain {workload} -n {where}"
    )


def create_workload(
    reader: ClusterReader, obj: dict[str, Any], namespace: str, dry_run: bool = False
) -> Any:
    """Create a workload of a kind gpufleet manages in `namespace` (with `dry_run`, only have
    the API server check it: schema, admission, RBAC, quota); what the server answered, or
    one clear error when it refuses or does not answer."""
    adapter = kind_of(obj)
    assert adapter is not None  # built by the CLI, or checked by label_manifest
    extra = {"dry_run": "All"} if dry_run else {}
    try:
        if adapter.bare:  # a core pod, not reached through the custom-object path
            return reader.core.create_namespaced_pod(namespace, obj, **extra)
        return reader.custom.create_namespaced_custom_object(
            adapter.group, adapter.version, namespace, adapter.plural, obj, **extra
        )
    except reader.api_exception as err:
        if err.status == 404:
            raise fail(
                f"the cluster does not serve {adapter.kind}s (or namespace {namespace} does not "
                "exist): install its operator first, or pick another namespace"
            ) from None
        refused = "would refuse" if dry_run else "refused"
        raise fail(f"the cluster {refused} the {adapter.kind}: {refusal_reason(err)}") from None
    except Exception as err:  # refused connection, timed out: the cluster is not there
        raise fail(f"the cluster did not answer ({err}); check --kubeconfig") from None


def _check_cluster(reader: ClusterReader, cluster: str) -> None:
    """Refuse a submit to a cluster that is not one of the hub's (a typo would wait forever)."""
    try:
        listed = reader.custom.list_cluster_custom_object(
            GROUP, VERSION, "clusters", _request_timeout=30
        )
    except reader.api_exception as err:
        raise fail(
            f"--cluster: cannot list the Clusters of the hub ({refusal_reason(err)}); is "
            "--kubeconfig the hub's, with gpufleet hub run installed there?"
        ) from None
    items = listed.get("items") or []
    names = sorted(c["metadata"]["name"] for c in items)
    # every cluster of a fleet holds the Cluster objects (the same GitOps repository); only
    # the hub's have a status, which the hub writes
    if not any((c.get("status") or {}).get("state") for c in items):
        raise fail(
            "--cluster: this cluster is not the hub of a fleet (none of its Cluster objects "
            "has a status: gpufleet hub run writes them); pass the hub's --kubeconfig"
        )
    if cluster != "auto" and cluster not in names:
        raise fail(
            f"--cluster {cluster}: no such Cluster in the hub; use auto or {', '.join(names)}"
        )


def _template(reader: ClusterReader, name: str, team: str) -> Template:
    """The WorkloadTemplate of that name, for `team`; a clear error where there is none."""
    found = {
        t.name: t
        for t in views.templates(views.Objects(templates=reader.list("workloadtemplates")))
    }
    if name not in found:
        known = ", ".join(sorted(found)) or "none: declare WorkloadTemplates in git"
        raise fail(
            f"--template {name}: no such template{did_you_mean(name, list(found))}; "
            f"templates: {known}"
        )
    if found[name].team not in (None, team):
        raise fail(f"--template {name}: it is team {found[name].team}'s, not {team}'s")
    return found[name]


def _with_template_resources(job: dict[str, Any], chosen: Template) -> None:
    """The template's env, CPU and memory on the Job's container."""
    (container,) = job["spec"]["template"]["spec"]["containers"]
    if chosen.env:
        container["env"] = [{"name": k, "value": v} for k, v in chosen.env.items()]
    asked = {k: v for k, v in (("cpu", chosen.cpu), ("memory", chosen.memory)) if v}
    if asked:
        container["resources"]["requests"] = {**asked, **container["resources"]["limits"]}


def refusal_reason(err: Any) -> str:
    import json

    try:
        return str(json.loads(err.body)["message"])
    except (ValueError, KeyError, TypeError):
        return str(err.reason)
