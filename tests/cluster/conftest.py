"""One real control plane per test session (etcd, kube-apiserver, kube-controller-manager,
kube-scheduler, kwok), a namespace per test. Logs stay in build/test-cluster/logs."""

from __future__ import annotations

import contextlib
import json
import shutil
import socket
import ssl
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from conftest import skip_unless_ci

from gpufleet.kube.policies import PARAMS
from gpufleet.testing.cluster import ControlPlane, default_bin_dir, free_port, missing_binaries
from gpufleet.testing.fleet import dry_run_held
from gpufleet.testing.fleet import job_manifest as job_manifest  # re-exported for the tests
from gpufleet.testing.metrics import CYCLES, scraped, wait_cycles

API = "gpufleet.io/v1alpha1"

REPO = Path(__file__).resolve().parents[2]
WORK_DIR = REPO / "build" / "test-cluster"


@pytest.fixture(scope="session")
def cluster() -> Iterator[ControlPlane]:
    bin_dir = default_bin_dir()
    missing = missing_binaries(bin_dir)
    if missing:
        skip_unless_ci(
            f"control-plane binaries missing in {bin_dir} ({', '.join(missing)}): "
            "run hack/k8s/build.sh (needs Go 1.26); `make test` does this"
        )
    if WORK_DIR.exists():
        shutil.rmtree(WORK_DIR)
    started = time.monotonic()
    plane = ControlPlane(WORK_DIR, bin_dir, audit_jobs=True)  # who made each Job, as whom
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


class ControllerProcess:
    """`gpufleet controller run` against the session's control plane, as its own process."""

    def __init__(self, cluster: ControlPlane, state: Path, ledger: str | None = None) -> None:
        self.cluster = cluster
        self.state = state
        # the usage ledger (a SQLite file in its state folder unless given)
        self.ledger = ledger or str(state / "ledger.db")
        # container logs for diagnosis (kwok has no kubelet): LOGS/NAMESPACE/JOB.log
        self.logs = state / "logs"
        self.port = free_port()
        self.metrics_port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with (self.cluster.logs / "gpufleet-controller.log").open("ab") as log:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "gpufleet",
                    "controller",
                    "run",
                    f"--kubeconfig={self.cluster.kubeconfig}",
                    f"--webhook-port={self.port}",
                    f"--state-dir={self.state}",
                    "--interval=0.5",
                    f"--metrics-port={self.metrics_port}",
                    "--metrics-host=127.0.0.1",
                    f"--ledger={self.ledger}",
                    "--ledger-hosts-every=2",  # the hosts' tests read it back
                    f"--log-fixtures={self.logs}",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )

        def ready() -> bool:
            assert self.process is not None and self.process.poll() is None, "controller died"
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
            except OSError:
                return False  # the webhook server is not listening yet
            return (
                self.cluster.kubectl(
                    "get", "mutatingwebhookconfiguration", "gpufleet.io", check=False
                ).returncode
                == 0
            )

        self.cluster.wait_until(ready, 60, "the controller to serve its webhooks")
        self.cluster.wait_until(self.holds_jobs, 30, "the API server to hold GPU Jobs")

    def holds_jobs(self) -> bool:
        """Whether the API server applies the holding policy the controller applied (it picks
        a new policy, binding and params up a moment later): a GPU Job created in a dry run
        comes back held at its pods, or (its team unknown) is held and refused by the check."""
        body = job_manifest("probe", "default", {"gpufleet.io/team": "probe"}, 1, 1, "1s")
        held = dry_run_held(self.cluster, body)
        if isinstance(held, str):
            # held and marked to be checked (no such team): the webhook refuses it
            return "check-jobs.gpufleet.io" in held
        return held

    def cycles(self) -> int:
        """Workload-loop cycles done so far (quarantines are decided in them too), from the
        controller's /metrics."""
        return int(scraped(f"http://127.0.0.1:{self.metrics_port}/metrics", CYCLES) or 0)

    def wait_cycles(self, count: int = 3, timeout: float = 120) -> None:
        """Let `count` whole cycles pass from now (`gpufleet.testing.metrics.wait_cycles`)."""
        wait_cycles(self.cluster, self.cycles, count, timeout)

    def kill(self) -> None:
        """SIGKILL: no cleanup, as in a crash."""
        assert self.process is not None
        self.process.kill()
        self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()


@pytest.fixture(scope="session")
def controller(
    cluster: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ControllerProcess]:
    process = ControllerProcess(cluster, tmp_path_factory.mktemp("controller"))
    process.start()
    try:
        yield process
    finally:
        process.stop()


def policy_params(cluster: ControlPlane) -> dict[str, str]:
    """The data of the admission policies' params as the session's controller wrote them (in
    its namespace, kube-system); empty before it has."""
    found = cluster.kubectl(
        "get", "configmap", PARAMS, "-n", "kube-system", "-o", "json", check=False
    )
    if found.returncode != 0:
        return {}
    data: dict[str, str] = json.loads(found.stdout).get("data") or {}
    return data


def gpufleet_cli(cluster: ControlPlane, *args: str) -> str:
    """Run the gpufleet CLI against the control plane; its output (it must succeed)."""
    result = subprocess.run(
        [sys.executable, "-m", "gpufleet", *args, f"--kubeconfig={cluster.kubeconfig}"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


class Scenario:
    """One test's pool, teams, reservations and namespace, cleaned up afterwards."""

    def __init__(self, cluster: ControlPlane, nodes: int) -> None:
        self.cluster = cluster
        self.id = uuid.uuid4().hex[:6]
        self.pool = f"pool-{self.id}"
        self.namespace = f"ns-{self.id}"
        self.objects: list[dict[str, Any]] = [
            {
                "apiVersion": API,
                "kind": "GPUPool",
                "metadata": {"name": self.pool},
                "spec": {
                    "provider": "static",
                    "gpuType": "H100",
                    "gpusPerNode": 8,
                    "maxGPUs": nodes * 8,
                    "nodeSelector": {"gpufleet.io/pool": self.pool},
                },
            }
        ]
        self.nodes = cluster.add_gpu_nodes(nodes, 8, "H100", pool=self.pool, prefix=self.pool)
        cluster.kubectl("create", "namespace", self.namespace)

    def team(self, name: str, **spec: Any) -> str:
        """A team that lists the test's namespace (its label is refused anywhere else)."""
        full = f"{name}-{self.id}"
        spec = {"namespaces": [self.namespace], **spec}
        self.objects.append(
            {"apiVersion": API, "kind": "Team", "metadata": {"name": full}, "spec": spec}
        )
        return full

    def reserve(self, team: str, gpus: int) -> None:
        self.objects.append(
            {
                "apiVersion": API,
                "kind": "Reservation",
                "metadata": {"name": f"{team}-{self.pool}"},
                "spec": {"team": team, "pool": self.pool, "gpus": gpus},
            }
        )

    def policy(self, **spec: Any) -> None:
        self.objects.append(
            {
                "apiVersion": API,
                "kind": "FleetPolicy",
                "metadata": {"name": f"policy-{self.id}"},
                "spec": spec,
            }
        )

    def apply(self) -> None:
        self.cluster.apply(self.objects)

    def job(
        self,
        name: str,
        team: str,
        cls: str,
        gpus: int,
        pods: int = 1,
        priority: str = "normal",
        run_for: str = "600s",
    ) -> subprocess.CompletedProcess[str]:
        labels = {
            "gpufleet.io/team": team,
            "gpufleet.io/class": cls,
            "gpufleet.io/priority": priority,
            # in this test's pool: elastic work may borrow any pool, and pools of the tests
            # before (deleted without waiting) can still be in the controller's caches
            "gpufleet.io/pool": self.pool,
        }
        body = job_manifest(name, self.namespace, labels, gpus, pods, run_for)
        return self.cluster.kubectl("create", "-f", "-", input=yaml.safe_dump(body), check=False)

    def state(self, name: str) -> str | None:
        found = self.cluster.kubectl(
            "get", "gwl", name, "-n", self.namespace, "-o", "jsonpath={.status.state}", check=False
        )
        return found.stdout or None

    def wait_states(self, expected: dict[str, str], timeout: float = 60) -> None:
        self.cluster.wait_until(
            lambda: all(self.state(n) == s for n, s in expected.items()),
            timeout,
            f"states {expected}",
        )

    def events(self, job: str) -> str:
        return self.cluster.kubectl(
            "get", "events", "-n", self.namespace, f"--field-selector=involvedObject.name={job}"
        ).stdout

    def cleanup(self) -> None:
        self.cluster.kubectl("delete", "namespace", self.namespace, "--wait=false", check=False)
        for obj in self.objects:
            self.cluster.kubectl(
                "delete",
                f"{obj['kind'].lower()}.gpufleet.io",
                obj["metadata"]["name"],
                "--wait=false",
                check=False,
            )
        self.cluster.kubectl("delete", "node", *self.nodes, "--wait=false", check=False)


@pytest.fixture
def scenario(cluster: ControlPlane, controller: subprocess.Popen[bytes]) -> Iterator[Any]:
    made: list[Scenario] = []

    def make(nodes: int) -> Scenario:
        made.append(Scenario(cluster, nodes))
        return made[-1]

    yield make
    for item in made:
        item.cleanup()


class ServerProcess:
    def __init__(
        self, cluster: ControlPlane, *args: str, ca: Path | None = None, port: int | None = None
    ) -> None:
        self.port = port or free_port()
        self.url = f"{'https' if ca else 'http'}://127.0.0.1:{self.port}"
        verify: Any = ssl.create_default_context(cafile=str(ca)) if ca else True
        log = (cluster.logs / f"gpufleet-server-{self.port}.log").open("ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "gpufleet", "server", f"--kubeconfig={cluster.kubeconfig}",
             f"--port={self.port}", *args],
            stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip

        def ready() -> bool:
            assert self.process.poll() is None, f"gpufleet server died; see {log.name}"
            try:
                return httpx.get(f"{self.url}/healthz", timeout=1, verify=verify).status_code == 200
            except httpx.HTTPError:
                return False

        cluster.wait_until(ready, 60, "gpufleet server to answer")

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()


@contextlib.contextmanager
def prometheus_scraping(targets: list[str], work: Path) -> Iterator[str]:
    """A real Prometheus scraping `targets` (host:port) every second; its base URL."""
    binary = shutil.which("prometheus")
    if binary is None:
        skip_unless_ci("prometheus not installed: apt-get install prometheus (make test does)")
    config = {
        "global": {"scrape_interval": "1s"},
        "scrape_configs": [{"job_name": "gpufleet", "static_configs": [{"targets": targets}]}],
    }
    (work / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    log = (work / "prometheus.log").open("wb")
    process = subprocess.Popen(
        [
            str(binary),
            f"--config.file={work / 'prometheus.yml'}",
            f"--storage.tsdb.path={work / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(timeout=20)
        log.close()
