from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import pytest

if TYPE_CHECKING:
    from gpufleet.testing.registry import RegistryServer

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "gitops"


def shared_dir() -> Path | None:
    """The workspace's shared folder (third-party CRDs, traces), beside the repository."""
    configured = os.environ.get("GPUFLEET_SHARED_DIR")
    if configured:
        return Path(configured) if Path(configured).is_dir() else None
    # the workspace keeps it beside the checkout; a CI clone may sit one level deeper
    for parent in REPO.parents:
        if (parent / "shared" / "crds").is_dir():
            return parent / "shared"
    return None


def skip_unless_ci(reason: str) -> NoReturn:
    """Skip a test whose external piece is missing, except under CI (`CI` set), where the
    piece is part of the build and its absence is an error that must not hide the test."""
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI is set: a missing piece fails the run instead of skipping)")
    pytest.skip(reason)


def module_crds(folder: str) -> Path:
    """CRDs that hack/k8s/build.sh copies from a project's Go module into the binary cache
    (karpenter-aws-crds, karpenter-kwok-crds), so no copy of them lives in the workspace."""
    from gpufleet.testing.cluster import default_bin_dir

    path = default_bin_dir() / folder
    if not path.is_dir():
        skip_unless_ci(f"{folder} not found in {path.parent}: run hack/k8s/build.sh")
    return path


@pytest.fixture
def karpenter_aws_crds() -> Path:
    """NodePool, NodeClaim and EC2NodeClass of Karpenter's AWS provider v1.14.1."""
    return module_crds("karpenter-aws-crds")


@pytest.fixture
def shared_crds() -> Path:
    """The CRDs no module on the Go proxy ships (KAI Scheduler, Karpenter's GCP provider), and
    Karpenter's, from the workspace's shared folder."""
    base = shared_dir()
    if base is None or not (base / "crds").is_dir():
        skip_unless_ci(
            "third-party CRDs not found: set GPUFLEET_SHARED_DIR to the folder that "
            "holds crds/karpenter-aws, crds/karpenter-gcp and crds/kai"
        )
    return base / "crds"


@pytest.fixture(scope="session")
def postgres() -> Iterator[str]:
    """The URL of a throwaway PostgreSQL server (Debian's), for the ledger's tests."""
    from gpufleet.testing.postgres import PostgresServer, server_bin

    bin_dir = server_bin()
    if bin_dir is None:
        skip_unless_ci("PostgreSQL server not found: apt-get install postgresql (make test does)")
    server = PostgresServer(bin_dir).start()
    try:
        yield server.url
    finally:
        server.cleanup()


@pytest.fixture(scope="session")
def registry() -> Iterator[RegistryServer]:
    """A real registry (Debian's docker-registry) holding, as base/python:3.11, the small
    base image make image builds (Debian and its python3)."""
    from gpufleet.image.registry import Registry
    from gpufleet.testing.registry import (
        BASE_ARCHIVE,
        RegistryServer,
        push_layout,
        registry_binary,
    )

    binary = registry_binary()
    if binary is None:
        skip_unless_ci("docker-registry not found: apt-get install docker-registry (make test)")
    if not BASE_ARCHIVE.is_file():
        skip_unless_ci(f"{BASE_ARCHIVE} not found: build it with make image")
    with RegistryServer(binary) as server:
        client = Registry(server.host, server.host, None)
        push_layout(BASE_ARCHIVE, client, "base/python", "3.11")
        client.close()
        yield server


@pytest.fixture(scope="session")
def run_environment(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """For gpufleet run: pip finds the stand-in wheels only; no user config or Docker login;
    caches of the session's own."""
    from gpufleet.testing.wheels import make_wheels

    root = tmp_path_factory.mktemp("run-env")
    (root / "docker").mkdir()
    (root / "docker" / "config.json").write_text("{}")  # no logins (buildah wants the file)
    return {
        **os.environ,
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": str(make_wheels(root / "wheels")),
        "XDG_CACHE_HOME": str(root / "cache"),
        "GPUFLEET_CONFIG": str(root / "config.yaml"),
        "DOCKER_CONFIG": str(root / "docker"),
    }


@pytest.fixture
def write(tmp_path: Path):  # type: ignore[no-untyped-def]
    """Write `files` (name -> text) under a fresh folder and return the folder."""

    def _write(files: dict[str, str]) -> Path:
        for name, text in files.items():
            path = tmp_path / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
        return tmp_path

    return _write


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Fast unit tests first, then the tests that need the local control plane."""
    cluster_dir = Path(__file__).parent / "cluster"
    for item in items:
        if cluster_dir in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.cluster)
    items.sort(key=lambda item: item.get_closest_marker("cluster") is not None)
