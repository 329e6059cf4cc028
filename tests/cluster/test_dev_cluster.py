"""`gpufleet dev cluster up | env | down` for people: a second, separate control plane, or a
fleet of them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from gpufleet.testing.cluster import ControlPlane, default_bin_dir
from gpufleet.testing.fleet import LocalFleet


def gpufleet(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpufleet", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )


def test_dev_cluster_up_env_down(cluster: ControlPlane, tmp_path: Path) -> None:
    # `cluster` only ensures the binaries exist; this test runs its own control plane
    work = tmp_path / "dev"
    up = gpufleet("dev", "cluster", "up", "--nodes", "4", "--work-dir", str(work))
    assert up.returncode == 0, up.stderr
    assert str(work) in up.stdout
    try:
        env = gpufleet("dev", "cluster", "env", "--work-dir", str(work))
        assert env.returncode == 0
        kubeconfig = env.stdout.splitlines()[0].removeprefix("export KUBECONFIG=")
        assert Path(kubeconfig).exists()
        kubectl = [str(default_bin_dir() / "kubectl"), f"--kubeconfig={kubeconfig}"]
        listed = subprocess.run(
            [*kubectl, "get", "nodes"], capture_output=True, text=True, check=True
        ).stdout
        assert len([line for line in listed.splitlines()[1:] if " Ready " in line]) == 4
        nodes = json.loads(
            subprocess.run(
                [*kubectl, "get", "nodes", "-o", "json"], capture_output=True, text=True, check=True
            ).stdout
        )
        for node in nodes["items"]:
            assert node["status"]["allocatable"]["nvidia.com/gpu"] == "8"
            labels = node["metadata"]["labels"]
            assert labels["nvidia.com/gpu.present"] == "true"
            assert labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
            assert labels["topology.kubernetes.io/zone"] == "zone-a"
            assert node["spec"]["taints"] == [
                {"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}
            ]
        # running `up` again adds nodes of another type and pool to the same cluster
        more = gpufleet(
            "dev",
            "cluster",
            "up",
            "--nodes",
            "1",
            "--gpu-type",
            "A100",
            "--gpus-per-node",
            "4",
            "--pool",
            "us-east-a100",
            "--work-dir",
            str(work),
        )
        assert more.returncode == 0, more.stderr
        nodes = json.loads(
            subprocess.run(
                [*kubectl, "get", "nodes", "-o", "json"], capture_output=True, text=True, check=True
            ).stdout
        )
        a100 = [
            n
            for n in nodes["items"]
            if n["metadata"]["labels"].get("gpufleet.io/pool") == "us-east-a100"
        ]
        assert len(a100) == 1
        assert a100[0]["status"]["allocatable"]["nvidia.com/gpu"] == "4"
        processes = json.loads((work / "cluster.json").read_text())["processes"]
        pids = {name: record["pid"] for name, record in processes.items()}
        assert set(pids) == {
            "etcd",
            "kube-apiserver",
            "kube-controller-manager",
            "kube-scheduler",
            "kwok",
        }
    finally:
        down = gpufleet("dev", "cluster", "down", "--work-dir", str(work))
    assert down.returncode == 0
    for name, pid in pids.items():
        assert not _running(pid), f"{name} (pid {pid}) still runs after down"
    assert ControlPlane.attach(work) is None
    assert (work / "logs" / "kube-apiserver.log").exists()


def test_dev_cluster_up_autoscale_runs_karpenter(cluster: ControlPlane, tmp_path: Path) -> None:
    work = tmp_path / "dev"
    example = Path(__file__).resolve().parents[2] / "examples" / "gitops"
    up = gpufleet(
        "dev", "cluster", "up", "--nodes", "0", "--autoscale", "--gitops", str(example),
        "--work-dir", str(work),
    )  # fmt: skip
    try:
        assert up.returncode == 0, up.stderr
        assert "starting Karpenter (kwok provider) with 4 instance type(s)" in up.stderr
        assert "Karpenter launches nodes of europe-l4, us-east-a100, us-west-h100" in up.stdout
        assert "gpufleet controller run" in up.stdout  # how to go on
        plane = ControlPlane.attach(work)
        assert plane is not None and "karpenter-kwok" in plane.records
        pools = json.loads(plane.kubectl("get", "nodepools", "-o", "json").stdout)["items"]
        assert {p["metadata"]["name"]: p["spec"]["template"]["spec"]["nodeClassRef"]["kind"]
                for p in pools} == dict.fromkeys(
            ("europe-l4", "us-east-a100", "us-west-h100"), "KWOKNodeClass"
        )  # fmt: skip
        types = json.loads((work / "instance-types.json").read_text())
        assert {t["name"] for t in types} == {
            "g2-standard-48", "p4d.24xlarge", "p4de.24xlarge", "p5.48xlarge",
        }  # fmt: skip
        pid = plane.records["karpenter-kwok"].pid
    finally:
        down = gpufleet("dev", "cluster", "down", "--work-dir", str(work))
    assert down.returncode == 0
    assert "karpenter-kwok" in down.stderr
    assert not _running(pid)


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split(")", 1)[1].split()[0] != "Z"


def test_dev_cluster_up_clusters_starts_a_fleet(cluster: ControlPlane, tmp_path: Path) -> None:
    """`up --clusters 2`: a hub and two workers, each its own control plane with its
    controller; `env` points at the hub, `down` stops every process of the fleet."""
    work = tmp_path / "fleet"
    pids: dict[str, int] = {}
    up = gpufleet(
        "dev", "cluster", "up", "--clusters", "2", "--nodes", "1", "--work-dir", str(work)
    )
    try:
        assert up.returncode == 0, up.stderr
        assert "workers: worker-1, worker-2, 1 8-GPU node(s) each" in up.stdout
        fleet = LocalFleet.attach(work)
        assert fleet is not None and fleet.running()
        pids = fleet.processes()
        assert {"hub/gpufleet-hub", "worker-1/gpufleet-controller",
                "worker-2/gpufleet-controller", "worker-2/kube-apiserver"} <= set(pids)  # fmt: skip
        env = gpufleet("dev", "cluster", "env", "--work-dir", str(work)).stdout.splitlines()
        assert env[0] == f"export KUBECONFIG={fleet.hub.kubeconfig}"
        assert f"# worker-2: KUBECONFIG={fleet.planes['worker-2'].kubeconfig}" in env
        listed = gpufleet(
            "clusters", "list", "-o", "json", "--kubeconfig", str(fleet.hub.kubeconfig)
        )
        assert listed.returncode == 0, listed.stderr
        clusters = json.loads(listed.stdout)
        assert [(c["name"], c["state"], c["gpus"]) for c in clusters["items"]] == [
            ("worker-1", "Ready", 8),
            ("worker-2", "Ready", 8),
        ]
        again = gpufleet("dev", "cluster", "up", "--clusters", "2", "--work-dir", str(work))
        assert again.returncode == 0 and "runs already" in again.stderr
        single = gpufleet("dev", "cluster", "up", "--work-dir", str(work))
        assert single.returncode != 0
        assert "holds a fleet of clusters" in single.stderr and "Traceback" not in single.stderr
    finally:
        down = gpufleet("dev", "cluster", "down", "--work-dir", str(work))
    assert down.returncode == 0, down.stderr
    for name, pid in pids.items():
        assert not _running(pid), f"{name} (pid {pid}) still runs after down"
    assert LocalFleet.attach(work) is None
    assert (work / "hub" / "logs" / "gpufleet-hub.log").exists()
