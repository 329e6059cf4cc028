"""`gpufleet crds`: the CustomResourceDefinitions of the gpufleet API."""

from __future__ import annotations

from pathlib import Path

import typer

from gpufleet.cli.output import err_console
from gpufleet.cli.render import write_objects
from gpufleet.render.common import to_yaml
from gpufleet.render.crds import render_crds


def crds(
    output: str = typer.Option(
        "-", "-o", "--output", help="'-' for stdout, or a folder to write one file per CRD."
    ),
) -> None:
    """Print the CRDs of the gpufleet API, generated from the models.

    Cluster, GPUPool, Team, Reservation, FleetPolicy, WorkloadTemplate, GPUWorkload and
    GPUHost (group gpufleet.io, version v1alpha1).

    Install them with: gpufleet crds | kubectl apply --server-side -f -
    """
    objects = render_crds()
    if output == "-":
        typer.echo(to_yaml(objects), nl=False)
        return
    written, _ = write_objects(objects, Path(output))
    err_console.print(f"wrote {written} CRDs to {output}")
