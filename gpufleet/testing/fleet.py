"""A fleet of clusters on this machine: a hub and worker control planes, each worker with kwok
GPU nodes of its own pool and its own `gpufleet controller run --cluster-name`, and `gpufleet
hub run` on the hub. The hub test, `benchmarks/multicluster.py` and `gpufleet dev cluster up
--clusters N` start it the same way."""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gpufleet.model.keys import ADMISSION_GATE, HUB_MANAGER

from .cluster import ControlPlane, default_bin_dir, free_port

API = "gpufleet.io/v1alpha1"
HUB_NAMESPACE = "gpufleet-system"
FLEET_FILE = "fleet.json"  # which planes of a work folder make the fleet
GPUFLEET = [sys.executable, "-m", "gpufleet"]
CONTROLLER_PROCESS = "gpufleet-controller"
HUB_PROCESS = "gpufleet-hub"


def pool_of(cluster: str) -> str:
    return f"{cluster}-h100"


def fleet_objects(
    workers: Sequence[str],
    teams: dict[str, dict[str, Any]],
    reservations: dict[tuple[str, str], int],
    max_gpus: int,
    lost_after: str = "60s",
) -> list[dict[str, Any]]:
    """The GitOps objects of a local fleet: a Cluster and a static H100 pool per worker, the
    teams and the reservations ((team, cluster) -> GPUs in that cluster's pool)."""
    objects: list[dict[str, Any]] = []
    for name in workers:
        objects.append(
            {
                "apiVersion": API,
                "kind": "Cluster",
                "metadata": {"name": name},
                "spec": {
                    "region": f"local-{name}",
                    "kubeconfigSecretRef": {"name": f"{name}-kubeconfig", "key": "kubeconfig"},
                    "lostAfter": lost_after,
                },
            }
        )
        objects.append(
            {
                "apiVersion": API,
                "kind": "GPUPool",
                "metadata": {"name": pool_of(name)},
                "spec": {
                    "cluster": name,
                    "provider": "static",
                    "gpuType": "H100",
                    "gpusPerNode": 8,
                    "maxGPUs": max_gpus,
                    "nodeSelector": {"gpufleet.io/pool": pool_of(name)},
                },
            }
        )
    for name, spec in teams.items():
        objects.append(
            {"apiVersion": API, "kind": "Team", "metadata": {"name": name}, "spec": spec}
        )
    for (team, cluster), gpus in reservations.items():
        objects.append(
            {
                "apiVersion": API,
                "kind": "Reservation",
                "metadata": {"name": f"{team}-{cluster}"},
                "spec": {"team": team, "pool": pool_of(cluster), "gpus": gpus},
            }
        )
    return objects


@dataclass
class LocalFleet:
    work_dir: Path
    workers: Sequence[str] = ("east", "west")
    nodes: int = 2  # per worker
    teams: dict[str, dict[str, Any]] = field(default_factory=dict)
    reservations: dict[tuple[str, str], int] = field(default_factory=dict)
    lost_after: str = "60s"
    interval: float = 0.5  # the controllers' and the hub's resync
    hub_metrics_port: int = 0  # 0: the hub serves no /metrics
    bin_dir: Path = field(default_factory=default_bin_dir)
    log: Callable[[str], None] = lambda step: None
    hub: ControlPlane = field(init=False)
    planes: dict[str, ControlPlane] = field(init=False)

    def __post_init__(self) -> None:
        self.hub = ControlPlane(self.work_dir / "hub", self.bin_dir, log=self._log_of("hub"))
        self.planes = {
            name: ControlPlane(self.work_dir / name, self.bin_dir, log=self._log_of(name))
            for name in self.workers
        }

    def _log_of(self, plane: str) -> Callable[[str], None]:
        return lambda step: self.log(f"{plane}: {step}")

    @classmethod
    def attach(cls, work_dir: Path) -> LocalFleet | None:
        """The fleet an earlier `start()` recorded in `work_dir`, if any (its processes are
        those its control planes recorded: `stop()` ends them, or says why it leaves one)."""
        state = work_dir / FLEET_FILE
        if not state.exists():
            return None
        workers = json.loads(state.read_text())["workers"]
        fleet = cls(work_dir, workers)
        for name, plane in (("hub", fleet.hub), *fleet.planes.items()):
            attached = ControlPlane.attach(plane.work_dir)
            if attached is not None:
                attached.log = fleet._log_of(name)
                if name == "hub":
                    fleet.hub = attached
                else:
                    fleet.planes[name] = attached
        return fleet

    def running(self) -> bool:
        return all(plane.running() for plane in (self.hub, *self.planes.values()))

    @property
    def objects(self) -> list[dict[str, Any]]:
        return fleet_objects(
            self.workers, self.teams, self.reservations, self.nodes * 8, self.lost_after
        )

    def namespaces(self) -> list[str]:
        return sorted({ns for spec in self.teams.values() for ns in spec.get("namespaces", [])})

    def start(self) -> None:
        """Every control plane, then each worker's controller, then the hub: returns once the
        hub sees every worker Ready. What it started is stopped again when it fails."""
        try:
            self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self) -> None:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        (self.work_dir / FLEET_FILE).write_text(json.dumps({"workers": list(self.workers)}))
        for plane in (self.hub, *self.planes.values()):
            plane.start()
            for namespace in self.namespaces():
                plane.kubectl("create", "namespace", namespace)
        for name, plane in self.planes.items():
            plane.add_gpu_nodes(self.nodes, 8, pool=pool_of(name), prefix=f"{name}-gpu")
            self.start_controller(name)
        for name, plane in self.planes.items():
            applied = functools.partial(self._applied, plane)
            plane.wait_until(
                applied, 90, f"{name}'s controller to install its CRDs and take the fleet"
            )
            plane.wait_until(
                functools.partial(self._holds, plane), 90, f"{name}'s controller to hold Jobs"
            )
        self.hub.kubectl("create", "namespace", HUB_NAMESPACE)
        for name, plane in self.planes.items():
            self.hub.kubectl(
                "create", "secret", "generic", f"{name}-kubeconfig", "-n", HUB_NAMESPACE,
                f"--from-file=kubeconfig={plane.kubeconfig}",
            )  # fmt: skip
        self.start_hub()
        self.hub.wait_until(
            lambda: self._applied(self.hub), 90, "the hub to install its CRDs and take the fleet"
        )
        self.hub.wait_until(
            lambda: all(self._ready(n) for n in self.workers),
            90,
            "the hub to see every worker Ready, with its pool",
        )

    def _ready(self, name: str) -> bool:
        status = self.cluster(name)
        return status.get("state") == "Ready" and status.get("pools") == [pool_of(name)]

    def start_hub(self, process: str = HUB_PROCESS, metrics_port: int | None = None) -> None:
        """`gpufleet hub run` on the hub's control plane (`stop_hub` ends it); another
        `process` name runs one more hub (a standby while the first holds the lead)."""
        self.log(f"hub: gpufleet hub run ({process})")
        port = self.hub_metrics_port if metrics_port is None else metrics_port
        self.hub.start_process(
            process,
            [*GPUFLEET, "hub", "run", f"--kubeconfig={self.hub.kubeconfig}",
             f"--interval={self.interval}", f"--metrics-port={port}"],
            {}, ready=lambda: True,
        )  # fmt: skip

    def stop_hub(self, process: str = HUB_PROCESS) -> None:
        self.hub.stop_process(process)

    def start_controller(self, name: str) -> None:
        plane = self.planes[name]
        state = plane.work_dir / "controller"
        state.mkdir(exist_ok=True)
        self.log(f"{name}: gpufleet controller run --cluster-name={name}")
        plane.start_process(
            CONTROLLER_PROCESS,
            [*GPUFLEET, "controller", "run", f"--kubeconfig={plane.kubeconfig}",
             f"--cluster-name={name}", f"--webhook-port={free_port()}", f"--state-dir={state}",
             f"--interval={self.interval}", "--metrics-port=0", f"--ledger={state / 'ledger.db'}"],
            {}, ready=lambda: True,  # waited for below, once every worker's has started
        )  # fmt: skip

    def _applied(self, plane: ControlPlane) -> bool:
        """Apply the fleet's objects; False while the API server does not serve their kinds."""
        applied = plane.kubectl(
            "apply", "-f", "-", input=yaml.safe_dump_all(self.objects), check=False
        )
        return applied.returncode == 0

    def _holds(self, plane: ControlPlane) -> bool:
        """Whether the worker's API server holds a GPU Job of a team at its pods, as its
        controller's policies make it (a dry run)."""
        team, spec = next(iter(self.teams.items()))
        body = job_manifest("probe", spec["namespaces"][0], {"gpufleet.io/team": team}, 1, 1, "1s")
        return dry_run_held(plane, body) is True

    def cluster(self, name: str) -> dict[str, Any]:
        found = self.hub.kubectl("get", "clusters.gpufleet.io", name, "-o", "json", check=False)
        if found.returncode != 0:
            return {}
        status: dict[str, Any] = json.loads(found.stdout).get("status") or {}
        return status

    def processes(self) -> dict[str, int]:
        """The pid of each process of the fleet, by "plane/process"."""
        return {
            f"{plane_name}/{name}": record.pid
            for plane_name, plane in (("hub", self.hub), *self.planes.items())
            for name, record in plane.records.items()
        }

    def stop(self) -> list[str]:
        """Stop the hub first (it would see every worker lost), then each control plane with
        the controller it runs; the names of what was stopped."""
        stopped = [f"hub/{name}" for name in self.hub.stop()]
        for name, plane in self.planes.items():
            stopped += [f"{name}/{process}" for process in plane.stop()]
        state = self.work_dir / FLEET_FILE
        if state.exists():
            state.unlink()
        return stopped

    def __enter__(self) -> LocalFleet:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def job_manifest(
    name: str, namespace: str, labels: dict[str, str], gpus: int, pods: int, run_for: str
) -> dict[str, Any]:
    """A labelled batch/v1 Job of `pods` pods of `gpus` GPUs each that kwok runs for `run_for`."""
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "parallelism": pods,
            "completions": pods,
            "backoffLimit": 0,
            "template": {
                "metadata": {"annotations": {"gpufleet.io/run-for": run_for}},
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [
                        {
                            "name": "train",
                            "image": "example.com/train:1",
                            "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
                        }
                    ],
                },
            },
        },
    }


def dry_run_held(plane: ControlPlane, body: dict[str, Any]) -> bool | str:
    """Create `body` in a dry run: whether the API server holds it at its pods with gpufleet's
    admission gate, or, where it refuses it, why (kubectl's error)."""
    made = plane.kubectl(
        "create", "--dry-run=server", "-o", "json", "-f", "-",
        input=yaml.safe_dump(body), check=False,
    )  # fmt: skip
    if made.returncode != 0:
        return made.stderr
    gates = json.loads(made.stdout)["spec"]["template"]["spec"].get("schedulingGates")
    return {"name": ADMISSION_GATE} in (gates or [])


def hub_job(
    name: str, namespace: str, team: str, cls: str, gpus: int, run_for: str = "3600s", **labels: str
) -> dict[str, Any]:
    """A Job submitted to the hub: one pod of `gpus` GPUs that kwok runs for `run_for`."""
    body = job_manifest(
        name, namespace, {"gpufleet.io/team": team, "gpufleet.io/class": cls, **labels}, gpus, 1,
        run_for,
    )  # fmt: skip
    body["spec"]["managedBy"] = HUB_MANAGER
    return body
