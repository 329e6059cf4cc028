"""One real control plane per test session (etcd, kube-apiserver, kube-controller-manager,
kube-scheduler, kwok), a namespace per test. Logs stay in build/test-cluster/logs."""

from __future__ import annotations

import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpufleet.testing.cluster import ControlPlane, default_bin_dir, missing_binaries

REPO = Path(__file__).resolve().parents[2]
WORK_DIR = REPO / "build" / "test-cluster"


@pytest.fixture(scope="session")
def cluster() -> Iterator[ControlPlane]:
    bin_dir = default_bin_dir()
    missing = missing_binaries(bin_dir)
    if missing:
        pytest.skip(
            f"control-plane binaries missing in {bin_dir} ({', '.join(missing)}): "
            "run hack/k8s/build.sh (needs Go 1.26); `make test` does this"
        )
    if WORK_DIR.exists():
        shutil.rmtree(WORK_DIR)
    started = time.monotonic()
    plane = ControlPlane(WORK_DIR, bin_dir)
    plane.start()
    print(f"\ncontrol plane ready in {time.monotonic() - started:.1f}s; logs in {plane.logs}")
    try:
        yield plane
    finally:
        plane.stop()


@pytest.fixture(scope="session")
def gpu_nodes(cluster: ControlPlane) -> list[str]:
    """Two fake 8-GPU H100 nodes shared by the tests of the session."""
    return cluster.add_gpu_nodes(2, gpus_per_node=8, gpu_type="H100", pool="test-h100")


@pytest.fixture
def namespace(cluster: ControlPlane) -> Iterator[str]:
    name = f"t-{uuid.uuid4().hex[:8]}"
    cluster.kubectl("create", "namespace", name)
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)
