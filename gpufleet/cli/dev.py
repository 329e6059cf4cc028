"""`gpufleet dev cluster`: a local control plane with simulated GPU nodes, for trying gpufleet."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from gpufleet.cli.output import console, err_console, fail, print_problems, problem_counts
from gpufleet.model import has_errors, validate_paths
from gpufleet.model.fleet import Fleet
from gpufleet.render import Target, render
from gpufleet.render.karpenter import InstanceTypesError, kwok_instance_types
from gpufleet.testing.cluster import (
    STATE_FILE,
    ClusterError,
    ControlPlane,
    build_script,
    default_bin_dir,
    default_work_dir,
    ensure_binaries,
)
from gpufleet.testing.fleet import LocalFleet
from gpufleet.testing.node import (
    add_real_nodes,
    default_images,
    missing_node_binaries,
    remove_real_nodes,
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
# the teams of `up --clusters`: the namespaces exist in every cluster; ml-platform reserves
# 8 GPUs in worker-1, research only borrows
DEV_TEAMS = {
    "ml-platform": {"namespaces": ["ml-platform"]},
    "research": {"namespaces": ["research"]},
}

WORK_DIR = typer.Option(
    None,
    "--work-dir",
    help="State folder (certificates, etcd data, kubeconfig, logs); "
    "default ~/.cache/gpufleet/dev-cluster.",
)


def _plane(work_dir: Path | None) -> tuple[Path, ControlPlane | None]:
    folder = work_dir or default_work_dir()
    if LocalFleet.attach(folder) is not None:
        raise fail(
            f"{folder} holds a fleet of clusters (gpufleet dev cluster up --clusters): stop it "
            "with gpufleet dev cluster down, or pass another --work-dir"
        )
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
    autoscale: bool = typer.Option(
        False,
        "--autoscale",
        help="Also run the real Karpenter (its kwok provider): it launches simulated nodes of "
        "the aws and gcp pools in --gitops for pods that wait for capacity, within each pool's "
        "maxGPUs, and removes them when empty.",
    ),
    gitops: Path | None = typer.Option(
        None,
        "--gitops",
        help="With --autoscale: the pools to autoscale (YAML files or a folder); default "
        "examples/gitops of the checkout.",
    ),
    real_nodes: int = typer.Option(
        0,
        "--real-nodes",
        min=0,
        help="Also start real nodes: containerd, runc, the CNI bridge and a kubelet each, on "
        "this machine (root, Linux; images from `make image`, no registry), so that pods such "
        "as the chart's really run. The cluster must have been started with them.",
    ),
    image: list[Path] = typer.Option(
        [],
        "--image",
        help="With --real-nodes: an OCI archive to import into each real node's containerd "
        "(repeat it); default build/image/pause.oci.tar and gpufleet.oci.tar of the checkout.",
    ),
    clusters: int = typer.Option(
        0,
        "--clusters",
        min=0,
        max=8,
        help="Start a fleet instead: a hub and this many worker clusters (worker-1 ...), each "
        "its own control plane with --nodes 8-GPU H100 nodes in its own pool and its own "
        "gpufleet controller, and gpufleet hub run on the hub (docs/multicluster.md).",
    ),
    work_dir: Path | None = WORK_DIR,
) -> None:
    """Start the control plane (or reuse the running one) and add fake GPU nodes.

    Run it again to add nodes of another type or pool to the running cluster. The first run
    builds the Kubernetes binaries from Go modules (needs Go 1.26; cached afterwards).

    With --autoscale, the pools' instance types (GPUs, capacity types, zones, prices) become
    Karpenter's instance types and their NodePools are applied as `gpufleet render --target
    karpenter-kwok` renders them; a running `gpufleet controller run` keeps them in step with
    the GPUPool objects. Run it again after changing a pool's instance types.

    With --real-nodes, pods run for real beside the simulated GPU nodes: each real node is a
    kubelet with its own containerd, reached by the API server and by kube-proxy's Service
    rules; a default StorageClass gives their volumes folders of this machine. Build the images
    first with `make image`; docs/harness.md says what this machine needs.

    Examples:
      gpufleet dev cluster up --nodes 4 --gpu-type H100 --pool us-west-h100
      gpufleet dev cluster up --nodes 0 --autoscale --gitops examples/gitops
      make image && gpufleet dev cluster up --nodes 2 --real-nodes 1
      helm install gpufleet charts/gpufleet -n gpufleet-system --create-namespace \\
        --set agent.runtimeClassName=
      gpufleet dev cluster up --clusters 3 --nodes 2   # a hub and three worker clusters
    """
    if clusters:
        if autoscale or real_nodes or image or pool or gitops:
            raise fail(
                "--clusters starts a fleet of simulated H100 nodes, one pool per cluster: it "
                "takes only --nodes (and --work-dir)"
            )
        _fleet_up(clusters, nodes, work_dir)
        return
    images = list(image) or default_images()
    for archive in images:
        if not archive.is_file():
            raise fail(f"--image {archive}: no such file (build the images with make image)")
    fleet = _autoscaled_fleet(gitops) if autoscale else None
    types = _instance_types(fleet) if fleet is not None else []  # refused before anything starts
    folder, plane = _plane(work_dir)
    try:
        if plane is None or not plane.running():
            if plane is not None:
                plane.stop()  # a half-dead earlier cluster: clean it up first
            bin_dir = default_bin_dir()
            ensure_binaries(bin_dir, also=missing_node_binaries if real_nodes else None)
            plane = ControlPlane(
                folder,
                bin_dir,
                log=lambda step: err_console.print(f"starting {step}"),
                real_nodes=real_nodes > 0,
            )
            plane.start()
        elif real_nodes and not plane.real_nodes:
            raise fail(
                "the running dev cluster was started without real nodes; stop it with "
                "gpufleet dev cluster down, then start it with --real-nodes"
            )
        if real_nodes:
            plane.log = lambda step: err_console.print(f"starting {step}")
            started = add_real_nodes(plane, real_nodes, images)
            err_console.print(
                f"added {len(started)} real node(s): {', '.join(n.name for n in started)}"
            )
        if nodes:
            names = plane.add_gpu_nodes(nodes, gpus_per_node, gpu_type, pool, zone)
            err_console.print(f"added {len(names)} {gpu_type} node(s): {', '.join(names)}")
        if fleet is not None:
            err_console.print(
                f"starting Karpenter (kwok provider) with {len(types)} instance type(s)"
            )
            plane.start_autoscaler(types)
            plane.apply(render(fleet, Target.KARPENTER_KWOK))
    except ClusterError as err:
        raise fail(str(err)) from None
    console.print(
        f"control plane: {plane.server}\nstate and logs: {folder}\n"
        f'use it with: eval "$(gpufleet dev cluster env)"'
    )
    if fleet is not None:
        pools = sorted(n for n, p in fleet.pools.items() if p.spec.provider != "static")
        console.print(
            f"autoscaling: Karpenter launches nodes of {', '.join(pools)} for pods that wait "
            "for them; try it with:\n"
            "  gpufleet crds | kubectl apply -f - && kubectl apply -f <your gitops folder>\n"
            "  gpufleet controller run   # admits work onto the pools' nodes-to-be\n"
            "  kubectl get nodeclaims,nodes -w"
        )


def _fleet_up(clusters: int, nodes: int, work_dir: Path | None) -> None:
    folder = work_dir or default_work_dir()
    fleet = LocalFleet.attach(folder)
    if fleet is not None and fleet.running():
        err_console.print(f"the fleet in {folder} runs already; adding nothing to it")
    else:
        if fleet is not None:
            fleet.stop()  # a half-dead earlier fleet: clean it up first
        plane = ControlPlane.attach(folder)
        if plane is not None and plane.running():
            raise fail(
                f"a single dev cluster runs in {folder}: stop it with gpufleet dev cluster "
                "down, or pass another --work-dir for the fleet"
            )
        bin_dir = default_bin_dir()
        try:
            ensure_binaries(bin_dir)
            fleet = LocalFleet(
                folder,
                [f"worker-{i}" for i in range(1, clusters + 1)],
                nodes=nodes,
                teams=DEV_TEAMS,
                reservations={("ml-platform", "worker-1"): 8},
                interval=1.0,
                bin_dir=bin_dir,
                log=lambda step: err_console.print(f"starting {step}"),
            )
            fleet.start()  # stops what it started when it fails
        except (ClusterError, TimeoutError) as err:
            raise fail(str(err)) from None
    workers = ", ".join(fleet.workers)
    console.print(
        f"hub: {fleet.hub.server} (gpufleet hub run)\n"
        f"workers: {workers}, {nodes} 8-GPU node(s) each, every one with its gpufleet "
        f"controller\nstate and logs: {folder} (one folder per control plane)\n"
        f'use the hub with: eval "$(gpufleet dev cluster env)"\n'
        "then: gpufleet clusters list; submit a Job to the hub with spec.managedBy: "
        "gpufleet.io/hub in namespace ml-platform or research (examples/multicluster)"
    )


def _autoscaled_fleet(gitops: Path | None) -> Fleet:
    """The pools --autoscale launches nodes for, validated like `gpufleet validate`."""
    if gitops is None:
        build = build_script()
        example = build.parents[2] / "examples" / "gitops" if build else None
        if example is None or not example.is_dir():
            raise fail("--autoscale needs the pools to autoscale: pass --gitops DIR")
        gitops = example
    fleet, problems = validate_paths([gitops])
    if has_errors(problems):
        print_problems(problems, err_console)
        raise fail(f"not starting the autoscaler: {gitops} has {problem_counts(problems)}")
    if not any(p.spec.provider != "static" for p in fleet.pools.values()):
        raise fail(
            f"{gitops} has no autoscaling pool: --autoscale launches nodes for pools of "
            "provider aws or gcp (static pools only use the nodes that exist)"
        )
    return fleet


def _instance_types(fleet: Fleet) -> list[dict[str, Any]]:
    try:
        return kwok_instance_types(fleet)
    except InstanceTypesError as err:
        raise fail(str(err)) from None


@cluster_app.command("env")
def env(work_dir: Path | None = WORK_DIR) -> None:
    """Print the shell line that points kubectl at the dev cluster.

    Example: eval "$(gpufleet dev cluster env)"; kubectl get nodes
    """
    folder = work_dir or default_work_dir()
    fleet = LocalFleet.attach(folder)
    if fleet is not None:  # kubectl talks to the hub; each worker's kubeconfig is said below
        typer.echo(f"export KUBECONFIG={fleet.hub.kubeconfig}")
        typer.echo(f"export PATH={fleet.hub.bin_dir}:$PATH")
        for name, worker in fleet.planes.items():
            typer.echo(f"# {name}: KUBECONFIG={worker.kubeconfig}")
        return
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
    folder = work_dir or default_work_dir()
    fleet = LocalFleet.attach(folder)
    if fleet is not None:
        fleet.log = err_console.print  # says which recorded processes it leaves alone, and why
        stopped = fleet.stop()
        err_console.print(
            f"stopped the fleet's {len(stopped)} process(es); logs are in {folder}/*/logs"
        )
        return
    folder, plane = _plane(work_dir)
    if plane is None:
        err_console.print(f"no dev cluster is running in {folder}")
        return
    if not plane.records:
        err_console.print(
            f"no process recorded in {folder / STATE_FILE} can be identified (a state file "
            "from an older gpufleet?)"
        )
    nodes = remove_real_nodes(plane)
    if nodes:
        err_console.print(f"removed real node(s) {', '.join(nodes)} and their containers")
    stopped = plane.stop()
    if stopped:
        err_console.print(f"stopped {', '.join(stopped)}; logs are in {plane.logs}")
    else:
        err_console.print(f"nothing to stop; removed the stale state in {folder}")
