"""The chart installed with its default values onto a real node: a control plane of its own with
one kubelet (containerd, runc) beside kwok GPU nodes, the project's image built by `make image`
and imported into the node's containerd. Its pods run for real, under their ServiceAccounts;
then the controller is deleted and scaled away while a tenant creates Jobs, the release is
upgraded and uninstalled (gpufleet.testing.chart; benchmarks/install.py times the same path)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from conftest import REPO, skip_unless_ci

from gpufleet.testing.chart import CUDA_OOM, POOL, Install, install_scenario
from gpufleet.testing.cluster import default_bin_dir, missing_binaries
from gpufleet.testing.node import (
    check_host,
    cluster_with_real_node,
    leftovers,
    missing_node_binaries,
)

WORK_DIR = REPO / "build" / "test-install"
IMAGES = [REPO / "build" / "image" / "pause.oci.tar", REPO / "build" / "image" / "gpufleet.oci.tar"]
GPU_NODES = 2
TENANT_JOBS = 6


@pytest.fixture(scope="module")
def scenario() -> Iterator[dict[str, Any]]:
    problems = check_host()
    missing = missing_binaries(default_bin_dir()) + missing_node_binaries(default_bin_dir())
    if missing:
        problems.append(f"missing in {default_bin_dir()}: {', '.join(missing)} (hack/k8s/build.sh)")
    absent = [str(p) for p in IMAGES if not p.is_file()]
    if absent:
        problems.append(f"images not built: {', '.join(absent)} (make image)")
    if problems:
        skip_unless_ci("this machine cannot run a real node: " + "; ".join(problems))
    with cluster_with_real_node(WORK_DIR, IMAGES, GPU_NODES, POOL) as (plane, node, _):
        install = Install(plane, node, gpus=8 * GPU_NODES)
        result = install_scenario(install, TENANT_JOBS)
        yield result
    # the node is gone from the machine: no container, mount, cgroup, bridge or rule of it
    assert leftovers(node) == []


def test_the_charts_pods_run_on_the_real_node_under_their_service_accounts(
    scenario: dict[str, Any],
) -> None:
    pods = {p["component"]: p for p in scenario["pods"] if p["node"] == "real-1"}
    assert {"controller", "server", "agent"} <= set(pods), scenario["pods"]
    for component, pod in pods.items():
        assert pod["serviceAccount"] == f"gpufleet-{component}" and pod["ready"], pod
        assert pod["ip"].startswith("10.244.1."), pod  # the node's bridge, not kwok's fake IPs
    containers = scenario["containers"]
    assert len(containers) >= 3
    for container in containers:
        # the ID the kubelet reports is a container containerd knows, from the project's image
        assert container["containerID"].startswith("containerd://"), container
        assert container["containerdImage"] == "ghcr.io/gpufleet/gpufleet:0.1.0", container
    healthy = scenario["gpu_healthy"]
    assert healthy["status"] == "True" and healthy["reason"] == "AllChecksPassed", healthy


def test_the_controller_may_read_pod_logs_from_the_kubelet(scenario: dict[str, Any]) -> None:
    """Diagnosis reads a failed pod's last log lines: under the chart, with the controller's
    own service account, from a real kubelet (no log fixtures)."""
    read = scenario["controller_reads_logs"]
    assert read["error"] == "", read
    assert any("gpufleet server: dashboard at" in line for line in read["lines"]), read


def test_a_failed_gpu_pod_on_the_real_node_is_diagnosed_from_its_log(
    scenario: dict[str, Any],
) -> None:
    """A GPU Job's container fails on the real node (the kubelet runs it, its log is real);
    the chart's controller reads that log with its own rights and names the cause."""
    found = scenario["gpu_failure"]
    assert found["pods"] == [{"node": "real-1", "phase": "Failed"}], found
    assert found["state"] == "Failed", found
    diagnosis = found["diagnosis"]
    assert diagnosis["pattern"] == "cuda-out-of-memory", diagnosis
    assert 1 in diagnosis["evidence"]["exitCodes"], diagnosis
    assert diagnosis["evidence"]["lastLogLines"] == [CUDA_OOM], diagnosis
    # and a user reads the same line with `gpufleet workloads logs`
    shown = found["logs_shown"]
    assert shown["exit"] == 0 and shown["stdout"] == CUDA_OOM + "\n", shown


def test_the_gap_is_visible_through_the_servers_service(scenario: dict[str, Any]) -> None:
    status = scenario["status"]
    # observe mode: nothing declared yet, the GPU nodes counted as observed pools
    assert status["observeMode"] is True
    assert status["totals"]["totalGPUs"] == 8 * GPU_NODES
    assert status["totals"]["idleGPUs"] == 8 * GPU_NODES
    assert scenario["dashboard_served"]
    assert scenario["all_pods_ready_seconds"] <= scenario["gap_visible_seconds"]


def test_tenants_create_work_while_the_controller_is_gone(scenario: dict[str, Any]) -> None:
    for phase in ("creates_while_controller_restarts", "creates_while_controller_down"):
        creates = scenario[phase]
        assert creates["succeeded"] == creates["attempted"] == TENANT_JOBS, creates
    # with no controller at all, every Job is created and held by the API server's policy
    assert scenario["creates_while_controller_down"]["heldPods"] == TENANT_JOBS
    # and each is admitted once when a controller is back: one pod and one GPUWorkload each
    after = scenario["tenant_after_restart"]
    assert after["jobs"] == after["pods"] == after["runningPods"] == 2 * TENANT_JOBS, after
    assert after["gpuWorkloads"] == 2 * TENANT_JOBS and after["heldPods"] == 0, after


def test_an_upgrade_loses_no_work_and_an_uninstall_leaves_nothing(
    scenario: dict[str, Any],
) -> None:
    before, after = scenario["tenant_before_upgrade"], scenario["tenant_after_upgrade"]
    assert before["runningPodUIDs"] == after["runningPodUIDs"] and before["runningPods"] > 0
    assert scenario["workloads_lost_in_upgrade"] == 0
    assert scenario["left_behind"] == []
