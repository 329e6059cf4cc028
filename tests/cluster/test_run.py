"""`gpufleet run` onto the local control plane: the image pushed to a real registry, the
workload submitted with its digest, resources, env and class, admitted and running on kwok GPU
nodes; refusals (a team that does not exist, an unknown GPU type, a namespace not the team's)
before anything is pushed; --dry-run output the API server takes."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from gpufleet.client import Client, Forbidden
from gpufleet.testing.cluster import ControlPlane
from gpufleet.testing.registry import RegistryServer

from .conftest import ServerProcess

PROJECTS = Path(__file__).parents[1] / "data" / "run_projects"
API = "gpufleet.io/v1alpha1"


@pytest.fixture
def project(tmp_path: Path) -> Path:
    folder = tmp_path / "demo"
    shutil.copytree(PROJECTS / "pytorch", folder)
    return folder


def run(
    cluster: ControlPlane,
    registry: RegistryServer,
    env: dict[str, str],
    project: Path,
    *args: str,
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpufleet", "run", str(project),
         f"--kubeconfig={cluster.kubeconfig}", "--registry", f"{registry.host}/ml",
         "--base-image", f"{registry.host}/base/python:3.11", *args],
        capture_output=True, text=True, env=env,
    )  # fmt: skip


def tags(registry: RegistryServer, repository: str) -> list[str]:
    answer = httpx.get(f"http://{registry.host}/v2/{repository}/tags/list")
    return [] if answer.status_code == 404 else list(answer.json().get("tags") or [])


def test_run_submits_the_pushed_image(
    cluster: ControlPlane,
    scenario: Any,
    registry: RegistryServer,
    run_environment: dict[str, str],
    project: Path,
) -> None:
    world = scenario(1)
    team = world.team("ml")
    # a GPU type no other test's pool has: --gpu-type must find this pool alone
    pool = f"a10g-{world.id}"
    world.objects.append(
        {"apiVersion": API, "kind": "GPUPool", "metadata": {"name": pool},
         "spec": {"provider": "static", "gpuType": "A10G", "gpusPerNode": 8, "maxGPUs": 8,
                  "nodeSelector": {"gpufleet.io/pool": pool}}}
    )  # fmt: skip
    nodes = cluster.add_gpu_nodes(1, 8, "A10G", pool=pool, prefix=pool)
    world.nodes += nodes
    world.apply()
    env = {**run_environment, "WANDB_MODE": "offline"}
    (project / ".gpufleet.yaml").write_text("forward_env: [WANDB_MODE]\nenv: {EPOCHS: 3}\n")
    done = run(
        cluster, registry, env, project, "--team", team, "--gpus", "2", "--gpu-type", "a10g",
        "--name", "demo", "-o", "json",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    workload = result["workload"]
    # the team's namespace, as its Team lists it
    assert (workload["kind"], workload["namespace"]) == ("Job", world.namespace)
    assert workload["name"].startswith("demo-")
    job = json.loads(
        cluster.kubectl("get", "job", workload["name"], "-n", world.namespace, "-o", "json").stdout
    )
    labels = job["metadata"]["labels"]
    assert labels["gpufleet.io/team"] == team
    assert labels["gpufleet.io/class"] == "elastic"
    # the GPU type as the pools spell it; the engine chooses the pool
    assert job["metadata"]["annotations"]["gpufleet.io/gpu-types"] == "A10G"
    assert "gpufleet.io/pool" not in labels
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert container["image"] == result["image"]
    assert "@sha256:" in container["image"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert container["command"] == ["python3", "train.py"]
    assert {e["name"]: e["value"] for e in container["env"]} == {
        "EPOCHS": "3",
        "WANDB_MODE": "offline",
    }
    # admitted, run on the pool's node (kwok ends a pod with no run-for at once)
    world.wait_states({workload["name"]: "Completed"}, timeout=90)
    pods = json.loads(cluster.kubectl("get", "pods", "-n", world.namespace, "-o", "json").stdout)[
        "items"
    ]
    assert {p["spec"]["nodeName"] for p in pods} <= set(nodes)

    # unchanged: nothing built or pushed, a second workload of the same image
    again = run(cluster, registry, env, project, "--team", team, "--gpu-type", "A10G",
                "--name", "demo", "-o", "json")  # fmt: skip
    assert again.returncode == 0, again.stderr
    second = json.loads(again.stdout)
    assert second["built"] is False and second["image"] == result["image"]
    assert second["workload"]["name"] != workload["name"]


def test_refusals_push_and_submit_nothing(
    cluster: ControlPlane,
    scenario: Any,
    registry: RegistryServer,
    run_environment: dict[str, str],
    project: Path,
) -> None:
    world = scenario(1)
    team = world.team("ml")
    world.apply()

    def jobs() -> list[str]:  # where the runs below would have made one
        return [
            cluster.kubectl("get", "jobs", "-n", namespace, "-o", "name").stdout
            for namespace in (world.namespace, "default")
        ]

    before = jobs()

    done = run(cluster, registry, run_environment, project, "--team", "nobody", "--name", "r1")
    assert done.returncode == 1 and "team 'nobody' does not exist" in done.stderr
    done = run(cluster, registry, run_environment, project, "--team", team,
               "--gpu-type", "Z9000", "--name", "r2")  # fmt: skip
    assert done.returncode == 1 and "--gpu-type Z9000: no pool has that GPU type" in done.stderr
    # the API server's own admission: the team's label is refused outside its namespaces
    done = run(cluster, registry, run_environment, project, "--team", team,
               "--namespace", "default", "--name", "r3")  # fmt: skip
    assert done.returncode == 1 and "would refuse the Job" in done.stderr
    assert "nothing was pushed" in done.stderr and "Traceback" not in done.stderr
    assert [tags(registry, f"ml/{name}") for name in ("r1", "r2", "r3")] == [[], [], []]
    assert jobs() == before


@pytest.mark.parametrize(
    ("launcher", "nodes", "kind"),
    [("python", 1, "Job"), ("python", 2, "JobSet"), ("torchrun", 2, "TrainJob"),
     ("ray", 2, "RayJob")],
)  # fmt: skip
def test_dry_run_output_passes_a_server_side_dry_run(
    cluster: ControlPlane,
    scenario: Any,
    registry: RegistryServer,
    run_environment: dict[str, str],
    project: Path,
    launcher: str,
    nodes: int,
    kind: str,
) -> None:
    """Each kind's manifest, as --dry-run prints it, is taken by the API server: its CRD's
    schema and gpufleet's admission (the operators' CRDs installed; no operator needed)."""
    crds = {"JobSet": "jobset-crds", "TrainJob": "trainer-controller-manager-crds",
            "RayJob": "kuberay-operator-crds"}  # fmt: skip
    if kind in crds:
        cluster.install_crds([cluster.bin_dir / crds[kind]])
    world = scenario(1)
    team = world.team("ml")
    world.apply()
    (project / ".gpufleet.yaml").write_text(f"launcher: {launcher}\n")
    done = run(cluster, registry, run_environment, project, "--dry-run", "--team", team,
               "--namespace", world.namespace, "--nodes", str(nodes))  # fmt: skip
    assert done.returncode == 0, done.stderr
    manifest = yaml.safe_load(done.stdout)
    assert manifest["kind"] == kind
    checked = cluster.kubectl(
        "create", "--dry-run=server", "-o", "json", "-f", "-", input=done.stdout, check=False
    )
    assert checked.returncode == 0, checked.stderr
    assert json.loads(checked.stdout)["metadata"]["namespace"] == world.namespace


def test_the_sdk_runs_a_project_as_its_caller(
    cluster: ControlPlane,
    scenario: Any,
    registry: RegistryServer,
    run_environment: dict[str, str],
    project: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`Client.run`: built and pushed here, submitted through `gpufleet server` as the token's
    service account (RBAC: create Jobs and read GPU workloads in its namespace)."""
    world = scenario(1)
    team = world.team("ml")
    world.apply()
    for key in ("PIP_NO_INDEX", "PIP_FIND_LINKS", "XDG_CACHE_HOME", "GPUFLEET_CONFIG",
                "DOCKER_CONFIG"):  # fmt: skip
        monkeypatch.setenv(key, run_environment[key])
    runner = f"system:serviceaccount:{world.namespace}:runner"
    cluster.apply(
        [
            {"apiVersion": "v1", "kind": "ServiceAccount",
             "metadata": {"name": "runner", "namespace": world.namespace}},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
             "metadata": {"name": "runner", "namespace": world.namespace},
             "rules": [{"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["create"]},
                       {"apiGroups": ["gpufleet.io"], "resources": ["gpuworkloads"],
                        "verbs": ["get"]}]},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
             "metadata": {"name": "runner", "namespace": world.namespace},
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                         "name": "runner"},
             "subjects": [{"kind": "ServiceAccount", "name": "runner",
                           "namespace": world.namespace}]},
        ]
    )  # fmt: skip
    token = cluster.kubectl("create", "token", "runner", "-n", world.namespace).stdout.strip()
    server = ServerProcess(cluster)
    steps: list[str] = []
    try:
        with Client(server.url, token=token) as client:
            outcome = client.run(
                project, team=team, namespace=world.namespace, registry=f"{registry.host}/ml",
                base_image=f"{registry.host}/base/python:3.11", name="sdk", gpus=2,
                env={"EPOCHS": "2"}, progress=lambda step, *_: steps.append(step),
            )  # fmt: skip
            assert outcome.built and "@sha256:" in outcome.image and steps
            made = outcome.submitted
            assert made.created_by == runner and made.kind == "Job"
            job = cluster.get("job", made.name, "-n", world.namespace)
            (container,) = job["spec"]["template"]["spec"]["containers"]
            assert container["image"] == outcome.image
            assert {e["name"]: e["value"] for e in container["env"]} == {"EPOCHS": "2"}
            assert tags(registry, "ml/sdk")  # pushed
            done = client.wait_for_completion(world.namespace, made.workload, timeout=90)
            assert done.state == "Completed"
            # made as the runner: its dry run and its create, each audited as it
            mine = [
                e for e in cluster.audited()
                if e["objectRef"].get("namespace") == world.namespace
            ]  # fmt: skip
            assert [e["impersonatedUser"]["username"] for e in mine] == [runner, runner]
            # a namespace it may not create in: refused before anything is pushed
            with pytest.raises(Forbidden):
                client.run(project, team=team, namespace="default",
                           registry=f"{registry.host}/ml", name="sdk-denied")  # fmt: skip
            assert tags(registry, "ml/sdk-denied") == []
    finally:
        server.stop()
