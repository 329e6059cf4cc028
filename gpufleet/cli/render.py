"""`gpufleet render`: the Kubernetes objects a GitOps repository turns into."""

from __future__ import annotations

from pathlib import Path

import typer
import yaml

from gpufleet.cli.output import err_console, fail, print_problems, problem_counts
from gpufleet.model import has_errors, validate_paths
from gpufleet.model.keys import MANAGED_BY, MANAGED_BY_LABEL
from gpufleet.render import ClusterSettings, Manifest, Target, file_name, render, to_yaml


def render_command(
    paths: list[Path] = typer.Argument(..., help="YAML files or folders.", show_default=False),
    target: Target = typer.Option(
        ...,
        "--target",
        "-t",
        help="karpenter-aws: NodePool+EC2NodeClass per aws pool; karpenter-gcp: "
        "NodePool+GCENodeClass per gcp pool; karpenter-azure: NodePool+AKSNodeClass per azure "
        "pool; karpenter-kwok: NodePool+KWOKNodeClass per "
        "cloud pool, for Karpenter's kwok provider in `gpufleet dev cluster up "
        "--autoscale`; kai: KAI Queues for the team tree; priorityclasses: reserved/elastic "
        "PriorityClasses; all: everything a cloud cluster gets (all but karpenter-kwok).",
    ),
    output: str = typer.Option(
        "-",
        "-o",
        "--output",
        help="'-' for a YAML stream on stdout, or a folder to write one file per object "
        "(files of objects gpufleet no longer renders are removed).",
    ),
    cluster_name: str = typer.Option(
        "gpufleet",
        "--cluster-name",
        help="Cluster name used in Karpenter discovery tags and the default node role; in a "
        "fleet of clusters, also which Cluster's pools to render.",
    ),
) -> None:
    """Render pools, teams and policy into Karpenter, KAI and PriorityClass objects.

    The input is validated first; nothing is rendered while it has errors.
    Output is deterministic, so it can be committed and diffed.

    Example: gpufleet render gitops/ --target all -o rendered/
    Example (a fleet of clusters): gpufleet render gitops/ -t all --cluster-name east -o east/
    """
    fleet, problems = validate_paths(paths)
    if has_errors(problems):
        print_problems(problems, err_console)
        raise fail(f"not rendering: {problem_counts(problems)}; fix the errors above")
    if fleet.clusters and cluster_name not in fleet.clusters:
        raise fail(
            f"the fleet declares the clusters {', '.join(sorted(fleet.clusters))}: pass "
            "--cluster-name with the one to render for (each cluster gets its own pools)"
        )
    objects = render(fleet.for_cluster(cluster_name), target, ClusterSettings(name=cluster_name))
    if output == "-":
        typer.echo(to_yaml(objects), nl=False)
        return
    written, removed = write_objects(objects, Path(output))
    err_console.print(
        f"wrote {written} object{'s' * (written != 1)} to {output}"
        + (f", removed {removed} stale" if removed else "")
    )


def write_objects(objects: list[Manifest], folder: Path) -> tuple[int, int]:
    """Write one file per object; delete files of gpufleet-managed objects no longer rendered."""
    if folder.exists() and not folder.is_dir():
        raise fail(f"{folder} exists and is not a folder; pass a folder or '-'")
    folder.mkdir(parents=True, exist_ok=True)
    wanted = {file_name(obj): obj for obj in objects}
    removed = 0
    for existing in sorted(folder.glob("*.yaml")):
        if existing.name not in wanted and _is_managed(existing):
            existing.unlink()
            removed += 1
    for name, obj in wanted.items():
        (folder / name).write_text(to_yaml([obj]), encoding="utf-8")
    return len(wanted), removed


def _is_managed(path: Path) -> bool:
    try:
        docs = list(yaml.safe_load_all(path.read_text(encoding="utf-8")))
    except (OSError, yaml.YAMLError):
        return False
    return (
        len(docs) == 1
        and isinstance(docs[0], dict)
        and (docs[0].get("metadata", {}).get("labels", {}).get(MANAGED_BY_LABEL) == MANAGED_BY)
    )
