"""`gpufleet dev cluster`: a local control plane with simulated GPU nodes, for trying gpufleet."""

from __future__ import annotations

from pathlib import Path

import typer

from gpufleet.cli.output import console, err_console, fail
from gpufleet.testing.cluster import (
    STATE_FILE,
    ClusterError,
    ControlPlane,
    default_bin_dir,
    default_work_dir,
    ensure_binaries,
)

dev_app = typer.Typer(
    help="Tools for developing and trying gpufleet locally.", no_args_is_help=True
)
cluster_app = typer.Typer(
    help="A local Kubernetes control plane (etcd, kube-apiserver, kube-controller-manager, "
    "kube-scheduler) with simulated GPU nodes (kwok). No Docker and no cloud account needed.",
    no_args_is_help=True,
)
dev_app.add_typer(cluster_app, name="cluster")

WORK_DIR = typer.Option(
    None,
    "--work-dir",
    help="State folder (certificates, etcd data, kubeconfig, logs); "
    "default ~/.cache/gpufleet/dev-cluster.",
)


def _plane(work_dir: Path | None) -> tuple[Path, ControlPlane | None]:
    folder = work_dir or default_work_dir()
    plane = ControlPlane.attach(folder)
    if plane is not None:  # says which recorded processes it leaves alone, and why
        plane.log = lambda message: err_console.print(message)
    return folder, plane


@cluster_app.command("up")
def up(
    nodes: int = typer.Option(2, "--nodes", "-n", min=0, help="Fake GPU nodes to add."),
    gpus_per_node: int = typer.Option(8, "--gpus-per-node", min=1, max=64),
    gpu_type: str = typer.Option("H100", "--gpu-type", help="H100, A100, L4, ..."),
    pool: str | None = typer.Option(None, "--pool", help="Label the nodes gpufleet.io/pool=NAME."),
    zone: str = typer.Option("zone-a", "--zone", help="topology.kubernetes.io/zone of the nodes."),
    work_dir: Path | None = WORK_DIR,
) -> None:
    """Start the control plane (or reuse the running one) and add fake GPU nodes.

    Run it again to add nodes of another type or pool to the running cluster. The first run
    builds the Kubernetes binaries from Go modules (needs Go 1.26; cached afterwards).

    Example: gpufleet dev cluster up --nodes 4 --gpu-type H100 --pool us-west-h100
    """
    folder, plane = _plane(work_dir)
    try:
        if plane is None or not plane.running():
            if plane is not None:
                plane.stop()  # a half-dead earlier cluster: clean it up first
            bin_dir = default_bin_dir()
            ensure_binaries(bin_dir)
            plane = ControlPlane(
                folder, bin_dir, log=lambda step: err_console.print(f"starting {step}")
            )
            plane.start()
        if nodes:
            names = plane.add_gpu_nodes(nodes, gpus_per_node, gpu_type, pool, zone)
            err_console.print(f"added {len(names)} {gpu_type} node(s): {', '.join(names)}")
    except ClusterError as err:
        raise fail(str(err)) from None
    console.print(
        f"control plane: {plane.server}\nstate and logs: {folder}\n"
        f'use it with: eval "$(gpufleet dev cluster env)"'
    )


@cluster_app.command("env")
def env(work_dir: Path | None = WORK_DIR) -> None:
    """Print the shell line that points kubectl at the dev cluster.

    Example: eval "$(gpufleet dev cluster env)"; kubectl get nodes
    """
    folder, plane = _plane(work_dir)
    if plane is None:
        raise fail(f"no dev cluster in {folder}; start one with: gpufleet dev cluster up")
    typer.echo(f"export KUBECONFIG={plane.kubeconfig}")
    typer.echo(f"export PATH={plane.bin_dir}:$PATH")


@cluster_app.command("down")
def down(work_dir: Path | None = WORK_DIR) -> None:
    """Stop every process of the dev cluster. Logs stay in the state folder.

    A process is signalled only while it is still the one the cluster started (same pid, start
    time, executable and boot): after a reboot, or with a stale state folder, the recorded pids
    may belong to something else, which is reported and left alone.

    Example: gpufleet dev cluster down
    """
    folder, plane = _plane(work_dir)
    if plane is None:
        err_console.print(f"no dev cluster is running in {folder}")
        return
    if not plane.records:
        err_console.print(
            f"no process recorded in {folder / STATE_FILE} can be identified (a state file "
            "from an older gpufleet?)"
        )
    stopped = plane.stop()
    if stopped:
        err_console.print(f"stopped {', '.join(stopped)}; logs are in {plane.logs}")
    else:
        err_console.print(f"nothing to stop; removed the stale state in {folder}")
