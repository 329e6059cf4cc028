"""A real, local Kubernetes control plane: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler and kwok (simulated GPU nodes and pods), as processes on 127.0.0.1; on request
also the real Karpenter with its kwok provider, which launches simulated nodes for the NodePools
gpufleet renders.

Used by the cluster tests (one control plane per test session) and by `gpufleet dev cluster`.
The binaries are built from Go modules by `hack/k8s/build.sh` into a cache outside the
repository. Everything a control plane writes (certificates, etcd data, kubeconfig, logs) lives
in its work folder; `stop()` ends every process it started.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from gpufleet.model.keys import GPU_RESOURCE
from gpufleet.pki import PKI, create_pki

from .process_record import ProcessRecord

K8S_VERSION = "v1.37.2"
BINARIES = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubectl",
    "kwok",
    "karpenter-kwok",
)
KARPENTER_CRDS = "karpenter-kwok-crds"  # beside the binaries, copied from Karpenter's module
INSTANCE_TYPES_FILE = "instance-types.json"
FAKE_NODE_ANNOTATION = "kwok.x-k8s.io/node"
GPU_DRIVER = "gpu.nvidia.com"  # NVIDIA's DRA driver and its DeviceClass
STATE_FILE = "cluster.json"
SERVICE_CIDR = "10.96.0.0/24"
KUBERNETES_SERVICE_IP = "10.96.0.1"  # the first address of SERVICE_CIDR


class ClusterError(RuntimeError):
    """The control plane could not be started or used; the message says what to do."""


def default_bin_dir() -> Path:
    configured = os.environ.get("GPUFLEET_K8S_BIN")
    if configured:
        return Path(configured)
    return Path.home() / ".cache" / "gpufleet" / "k8s" / K8S_VERSION


def default_work_dir() -> Path:
    return Path.home() / ".cache" / "gpufleet" / "dev-cluster"


def build_script() -> Path | None:
    """hack/k8s/build.sh of the checkout this package runs from, if it is a checkout."""
    script = Path(__file__).resolve().parents[2] / "hack" / "k8s" / "build.sh"
    return script if script.exists() else None


def missing_binaries(bin_dir: Path) -> list[str]:
    missing = [name for name in BINARIES if not os.access(bin_dir / name, os.X_OK)]
    if not (bin_dir / KARPENTER_CRDS).is_dir() and "karpenter-kwok" not in missing:
        missing.append(KARPENTER_CRDS)
    return missing


def ensure_binaries(
    bin_dir: Path, build: bool = True, also: Callable[[Path], list[str]] | None = None
) -> None:
    """Build the control-plane binaries when any is missing (needs Go and a checkout); `also`
    names more that must be there (the real nodes')."""

    def missing(folder: Path) -> list[str]:
        return missing_binaries(folder) + (also(folder) if also else [])

    if not missing(bin_dir):
        return
    script = build_script()
    if not build or script is None:
        raise ClusterError(
            f"missing binaries in {bin_dir}: {', '.join(missing(bin_dir))}. Build them with "
            "hack/k8s/build.sh from a gpufleet checkout (needs Go 1.26), or point "
            "GPUFLEET_K8S_BIN at a folder that has them."
        )
    env = {**os.environ, "GPUFLEET_K8S_CACHE": str(bin_dir)}
    result = subprocess.run(["bash", str(script)], env=env, check=False)
    if result.returncode != 0 or missing(bin_dir):
        raise ClusterError(
            f"building the control plane failed ({script} exit code "
            f"{result.returncode}); see its output above"
        )


# the audit policy of `audit_jobs`: Job creates, their metadata only
AUDIT_JOB_CREATES = """apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: Metadata
    verbs: [create]
    resources: [{group: batch, resources: [jobs]}]
  - level: None
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class ControlPlane:
    """One local control plane. Use as a context manager, or `start()` and `stop()`."""

    work_dir: Path
    bin_dir: Path = field(default_factory=default_bin_dir)
    log: Callable[[str], None] = lambda message: None
    # serve pods on real nodes (gpufleet.testing.node): the API server listens on this machine's
    # address as well, mounts ServiceAccount tokens into pods, authorizes kubelets as nodes and
    # keeps the `kubernetes` Service's endpoint (kube-proxy routes pods to it)
    real_nodes: bool = False
    # the API server's audit log of Job creates (`audit_log`): who made each Job, and as whom
    # (an impersonated user); one line per create, nothing else
    audit_jobs: bool = False
    ports: dict[str, int] = field(default_factory=dict)
    # what identifies each process it started; only a process that still matches is signalled
    records: dict[str, ProcessRecord] = field(default_factory=dict)
    _processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def kubeconfig(self) -> Path:
        return self.work_dir / "kubeconfig"

    @property
    def logs(self) -> Path:
        return self.work_dir / "logs"

    @property
    def pki(self) -> PKI:
        return PKI(self.work_dir / "pki")

    @property
    def audit_log(self) -> Path:
        return self.logs / "audit.log"

    def audited(self) -> list[dict[str, Any]]:
        """The audit log's events (`audit_jobs`), oldest first."""
        if not self.audit_log.is_file():
            return []
        lines = self.audit_log.read_text(errors="replace").splitlines()
        return [json.loads(line) for line in lines if line.strip()]

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.ports['apiserver']}"

    # --- lifecycle -------------------------------------------------------------------------

    def __enter__(self) -> ControlPlane:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, timeout: float = 120, attempts: int = 3) -> None:
        """Start every component. The ports are free when chosen, but another process (an
        outgoing connection's ephemeral port) may take one before its component binds it:
        then the whole control plane starts again on new ports."""
        for attempt in range(1, attempts + 1):
            try:
                self._start(timeout)
                return
            except ClusterError:
                if attempt == attempts or not self._lost_a_port():
                    raise
                self.log(f"a port was taken before its component bound it; try {attempt + 1}")
                shutil.rmtree(self.logs, ignore_errors=True)

    def _lost_a_port(self) -> bool:
        return any(
            "address already in use" in log.read_text(errors="replace")
            for log in self.logs.glob("*.log")
        )

    def _start(self, timeout: float) -> None:
        missing = missing_binaries(self.bin_dir)
        if missing:
            raise ClusterError(
                f"missing control-plane binaries in {self.bin_dir}: "
                f"{', '.join(missing)}; run hack/k8s/build.sh"
            )
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(exist_ok=True)
        for name in ("etcd", "etcd-peer", "apiserver", "controller-manager", "scheduler", "kwok"):
            self.ports[name] = free_port()
        started = time.monotonic()
        try:
            self.log("certificates")
            extra = (KUBERNETES_SERVICE_IP, host_address()) if self.real_nodes else ()
            pki = create_pki(self.work_dir / "pki", extra_hosts=extra)
            self._write_kubeconfig(pki)
            self.log("etcd")
            self._start_etcd(pki)
            self.log("kube-apiserver")
            self._start_apiserver(pki)
            self._wait(lambda: self._get("/readyz") == 200, timeout, "kube-apiserver /readyz")
            self.log("kube-controller-manager, kube-scheduler, kwok")
            self._start_controller_manager(pki)
            self._start_scheduler()
            self._start_kwok()
            self._wait(
                lambda: self._namespace_ready("default"), timeout, "the default ServiceAccount"
            )
            # serving their own /healthz: bound to their ports (not merely started)
            self._wait(
                lambda: all(
                    self._healthy(self.ports[n]) for n in ("scheduler", "controller-manager")
                ),
                timeout,
                "kube-scheduler and kube-controller-manager /healthz",
            )
        except BaseException:
            self.stop()
            raise
        self._save_state()
        self.log(f"ready in {time.monotonic() - started:.1f}s")

    def stop(self) -> list[str]:
        """End every process of this control plane (also those of an earlier `gpufleet` run),
        in reverse start order so etcd outlives the API server's shutdown. A process recorded
        by an earlier run is signalled only while it is still the process that run started
        (same pid, start time, executable and boot); a stale record is reported, not acted on.
        Returns the names of the processes it stopped."""
        stopped = [name for name in reversed(list(self.records)) if self._stop_process(name)]
        for name, process in self._processes.items():
            if name not in self.records:  # started, but it died before it could be recorded
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(timeout=5)
        self.records.clear()
        self._processes.clear()
        state = self.work_dir / STATE_FILE
        if state.exists():
            state.unlink()
        return stopped

    def _stop_process(self, name: str) -> bool:
        """SIGTERM, SIGKILL after 10 s; False (and nothing signalled) for a stale record."""
        record, process = self.records[name], self._processes.get(name)
        if process is None and not record.alive():
            self.log(f"{name}: not stopped, {record.why_stale()} (stale record)")
            return False
        record.signal_group(signal.SIGTERM)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and _alive(record, process):
            time.sleep(0.05)
        if _alive(record, process):
            record.signal_group(signal.SIGKILL)
        if process is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=5)
        return True

    # --- autoscaling -------------------------------------------------------------------------

    def start_autoscaler(
        self, instance_types: Sequence[dict[str, Any]], timeout: float = 60
    ) -> None:
        """Start Karpenter's kwok provider (restart it when it runs: it reads its instance types
        once) with `instance_types` (`gpufleet.render.karpenter.kwok_instance_types`). It
        launches Nodes annotated for kwok, which this control plane's kwok makes Ready, for the
        pods kube-scheduler marks unschedulable, within the NodePools' limits."""
        crds = self.bin_dir / KARPENTER_CRDS
        if not crds.is_dir() or not os.access(self.bin_dir / "karpenter-kwok", os.X_OK):
            raise ClusterError(
                f"Karpenter's kwok provider is not built in {self.bin_dir}; run hack/k8s/build.sh"
            )
        self.install_crds([crds])
        types_file = self.work_dir / INSTANCE_TYPES_FILE
        types_file.write_text(json.dumps(list(instance_types), indent=1))
        if "karpenter-kwok" in self.records:
            self._stop_process("karpenter-kwok")
            del self.records["karpenter-kwok"]
        for name in ("karpenter-metrics", "karpenter-health"):
            self.ports[name] = free_port()
        log = self.logs / "karpenter-kwok.log"
        offset = log.stat().st_size if log.exists() else 0
        self._spawn(
            "karpenter-kwok",
            ["karpenter-kwok"],
            env={
                "KUBECONFIG": str(self.kubeconfig),  # it has no --kubeconfig flag
                "DISABLE_LEADER_ELECTION": "true",
                "INSTANCE_TYPES_FILE_PATH": str(types_file),
                "METRICS_PORT": str(self.ports["karpenter-metrics"]),
                "HEALTH_PROBE_PORT": str(self.ports["karpenter-health"]),
                "KUBE_CLIENT_QPS": "200",
                "KUBE_CLIENT_BURST": "300",
            },
        )
        health = f"http://127.0.0.1:{self.ports['karpenter-health']}/readyz"
        self._wait(lambda: _http_ok(health), timeout, "Karpenter's /readyz")
        # a file it cannot parse is only logged and leaves it with no instance types at all
        with log.open("rb") as lines:
            lines.seek(offset)
            for line in lines:
                if b"failed constructing instance types" in line:
                    self._stop_process("karpenter-kwok")
                    raise ClusterError(
                        f"Karpenter could not read {types_file}: {line.decode(errors='replace')}"
                    )
        self._save_state()

    # --- other processes (the operators of workload kinds) ------------------------------------

    def start_process(
        self,
        name: str,
        args: Sequence[str],
        env: dict[str, str],
        ready_url: str = "",
        timeout: float = 60,
        ready: Callable[[], bool] | None = None,
    ) -> None:
        """Start a binary of `bin_dir` beside the control plane (with this control plane's
        kubeconfig in KUBECONFIG) and wait until `ready_url` answers 200 (or `ready()` is
        true); `stop_process` ends it, `stop` with the rest."""
        self._spawn(name, args, env={"KUBECONFIG": str(self.kubeconfig), **env})
        if ready is None:
            self._wait(lambda: _http_ok(ready_url), timeout, f"{name}'s {ready_url}")
        else:
            self._wait(ready, timeout, f"{name} to be ready")
        self._save_state()

    def stop_process(self, name: str) -> None:
        if name in self.records:
            self._stop_process(name)
            del self.records[name]
            self._processes.pop(name, None)
            self._save_state()

    def restart_apiserver(self, down_for: float = 0.0, timeout: float = 120) -> None:
        """Stop kube-apiserver, wait `down_for` seconds and start it again on the same port;
        etcd keeps the state, the other parts reconnect."""
        self.stop_apiserver()
        time.sleep(down_for)
        self.start_apiserver(timeout)

    def stop_apiserver(self) -> None:
        """SIGTERM; SIGKILL when it still drains its watches 10 s later."""
        name = "kube-apiserver"
        process = self._processes.get(name)
        for sig, grace in ((signal.SIGTERM, 10), (signal.SIGKILL, 30)):
            self.records[name].signal_group(sig)
            if process is None:
                break
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=grace)
                break

    def start_apiserver(self, timeout: float = 120) -> None:
        """Start the API server again (after `stop_apiserver`) and wait until it is ready."""
        self._start_apiserver(self.pki)
        self._wait(lambda: self._get("/readyz") == 200, timeout, "kube-apiserver /readyz")
        self._save_state()

    @classmethod
    def attach(cls, work_dir: Path) -> ControlPlane | None:
        """The control plane recorded in `work_dir` by an earlier `start()`, if any. Records
        of an older format (a bare pid) are dropped: nothing can tell whose that pid is now."""
        state = work_dir / STATE_FILE
        if not state.exists():
            return None
        data = json.loads(state.read_text())
        records = {}
        for name, value in (data.get("processes") or {}).items():
            record = ProcessRecord.load(value)
            if record is not None:
                records[name] = record
        return cls(
            work_dir=work_dir,
            bin_dir=Path(data["bin_dir"]),
            real_nodes=bool(data.get("real_nodes")),
            ports=data["ports"],
            records=records,
        )

    def running(self) -> bool:
        return bool(self.records) and all(r.alive() for r in self.records.values())

    def _save_state(self) -> None:
        state = {
            "bin_dir": str(self.bin_dir),
            "real_nodes": self.real_nodes,
            "ports": self.ports,
            "processes": {name: r.dump() for name, r in self.records.items()},
        }
        (self.work_dir / STATE_FILE).write_text(json.dumps(state, indent=2))

    # --- processes -------------------------------------------------------------------------

    def _spawn(self, name: str, args: Sequence[str], env: dict[str, str] | None = None) -> None:
        log = (self.logs / f"{name}.log").open("ab")
        process = subprocess.Popen(
            [str(self.bin_dir / args[0]), *args[1:]],
            env={**os.environ, **env} if env else None,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=self.work_dir,
            start_new_session=True,  # outlives `gpufleet dev cluster up`
        )
        log.close()
        self._processes[name] = process
        time.sleep(0.2)
        record = ProcessRecord.of(process.pid)
        if process.poll() is not None or record is None:
            raise ClusterError(
                f"{name} exited at once (code {process.poll()}); see {self.logs / (name + '.log')}"
            )
        self.records[name] = record

    def _start_etcd(self, pki: PKI) -> None:
        data = self.work_dir / "etcd"
        if data.exists():
            shutil.rmtree(data)
        client = f"https://127.0.0.1:{self.ports['etcd']}"
        peer = f"http://127.0.0.1:{self.ports['etcd-peer']}"  # one member: no peer talks to it
        self._spawn(
            "etcd",
            [
                "etcd",
                f"--data-dir={data}",
                "--name=default",
                f"--listen-client-urls={client}",
                f"--advertise-client-urls={client}",
                f"--cert-file={pki.etcd_cert}",
                f"--key-file={pki.etcd_key}",
                "--client-cert-auth=true",
                f"--trusted-ca-file={pki.etcd.ca_cert}",
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=default={peer}",
                "--unsafe-no-fsync=true",
                "--log-level=warn",
            ],
        )

    def _start_apiserver(self, pki: PKI) -> None:
        port = self.ports["apiserver"]
        if self.real_nodes:
            where = ["--bind-address=0.0.0.0", f"--advertise-address={host_address()}"]
            # pods get their ServiceAccount's token; kubelets are authorized as their node; the
            # API server reaches kubelets (logs, exec) with the admin certificate
            access = [
                "--authorization-mode=Node,RBAC",
                "--enable-admission-plugins=NodeRestriction",
                f"--kubelet-client-certificate={pki.admin_cert}",
                f"--kubelet-client-key={pki.admin_key}",
                # real nodes are named, not resolvable: reach the kubelet at its address
                "--kubelet-preferred-address-types=InternalIP",
                "--endpoint-reconciler-type=lease",
            ]
        else:
            where = ["--bind-address=127.0.0.1", "--advertise-address=127.0.0.1"]
            access = [
                "--authorization-mode=RBAC",
                # no kubelet mounts tokens here, and pods must not wait for a namespace's
                # ServiceAccount to appear (envtest does the same)
                "--disable-admission-plugins=ServiceAccount",
                "--endpoint-reconciler-type=none",
            ]
        self._spawn(
            "kube-apiserver",
            [
                "kube-apiserver",
                f"--etcd-servers=https://127.0.0.1:{self.ports['etcd']}",
                f"--etcd-cafile={pki.etcd.ca_cert}",
                f"--etcd-certfile={pki.etcd_client_cert}",
                f"--etcd-keyfile={pki.etcd_client_key}",
                *where,
                f"--secure-port={port}",
                f"--tls-cert-file={pki.server_cert}",
                f"--tls-private-key-file={pki.server_key}",
                f"--client-ca-file={pki.ca_cert}",
                f"--service-account-issuer=https://127.0.0.1:{port}/",
                f"--service-account-key-file={pki.sa_pub}",
                f"--service-account-signing-key-file={pki.sa_key}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                *access,
                *self._audit_args(),
                "--allow-privileged=true",
                "--enable-priority-and-fairness=false",
            ],
        )

    def _audit_args(self) -> list[str]:
        if not self.audit_jobs:
            return []
        policy = self.work_dir / "audit-policy.yaml"
        policy.write_text(AUDIT_JOB_CREATES)
        return [f"--audit-policy-file={policy}", f"--audit-log-path={self.audit_log}"]

    def _start_controller_manager(self, pki: PKI) -> None:
        self._spawn(
            "kube-controller-manager",
            [
                "kube-controller-manager",
                f"--kubeconfig={self.kubeconfig}",
                "--bind-address=127.0.0.1",
                f"--secure-port={self.ports['controller-manager']}",
                "--leader-elect=false",
                f"--root-ca-file={pki.ca_cert}",
                f"--service-account-private-key-file={pki.sa_key}",
                "--use-service-account-credentials=false",
                "--controllers=*,-node-ipam-controller",
                "--kube-api-qps=500",
                "--kube-api-burst=1000",
            ],
        )

    def _start_scheduler(self) -> None:
        self._spawn(
            "kube-scheduler",
            [
                "kube-scheduler",
                f"--kubeconfig={self.kubeconfig}",
                "--bind-address=127.0.0.1",
                f"--secure-port={self.ports['scheduler']}",
                "--leader-elect=false",
                "--kube-api-qps=500",
                "--kube-api-burst=1000",
            ],
        )

    def _start_kwok(self) -> None:
        config = self.work_dir / "kwok.yaml"
        config.write_text(resources.files("gpufleet.testing").joinpath("kwok.yaml").read_text())
        self._spawn(
            "kwok",
            [
                "kwok",
                f"--kubeconfig={self.kubeconfig}",
                f"--config={config}",
                "--manage-all-nodes=false",
                f"--manage-nodes-with-annotation-selector={FAKE_NODE_ANNOTATION}=fake",
                "--node-lease-duration-seconds=40",
                f"--server-address=127.0.0.1:{self.ports['kwok']}",
            ],
        )

    def _write_kubeconfig(self, pki: PKI) -> None:
        self.kubeconfig.write_text(
            kubeconfig_yaml(self.server, pki.ca_cert, pki.admin_cert, pki.admin_key, "admin")
        )

    # --- talking to the API ------------------------------------------------------------------

    def _ssl(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.pki.ca_cert))
        context.load_cert_chain(str(self.pki.admin_cert), str(self.pki.admin_key))
        return context

    def _get(self, path: str) -> int:
        try:
            with urllib.request.urlopen(
                self.server + path, context=self._ssl(), timeout=5
            ) as response:
                status: int = response.status
                return status
        except OSError:
            return 0

    def _healthy(self, port: int) -> bool:
        """A component's /healthz on its secure port answers 200 (its serving certificate is
        self-signed: not verified)."""
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        try:
            url = f"https://127.0.0.1:{port}/healthz"
            with urllib.request.urlopen(url, context=context, timeout=2) as response:
                return bool(response.status == 200)
        except (OSError, ValueError):
            return False

    def _namespace_ready(self, namespace: str) -> bool:
        return self._get(f"/api/v1/namespaces/{namespace}/serviceaccounts/default") == 200

    def _wait(self, ready: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name, process in self._processes.items():
                if process.poll() is not None:
                    raise ClusterError(
                        f"{name} exited (code {process.returncode}) while "
                        f"waiting for {what}; see {self.logs / (name + '.log')}"
                    )
            if ready():
                return
            time.sleep(0.2)
        raise ClusterError(
            f"timed out after {timeout:.0f}s waiting for {what}; logs in {self.logs}"
        )

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """Run the built kubectl against this control plane."""
        command = [str(self.bin_dir / "kubectl"), f"--kubeconfig={self.kubeconfig}", *args]
        return run_tool(command, f"kubectl {' '.join(args)}", check, 120, input)

    def kubectl_as(
        self, token: str, *args: str, input: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """kubectl as the holder of `token` alone: no kubeconfig, so no admin certificate
        beside the token (what a ServiceAccount's pod, or a tenant, may do)."""
        command = [
            str(self.bin_dir / "kubectl"), "--kubeconfig=/dev/null", f"--server={self.server}",
            f"--certificate-authority={self.pki.ca_cert}", f"--token={token}", *args,
        ]  # fmt: skip
        return run_tool(command, f"kubectl {' '.join(args)} (by token)", check, 120, input)

    def apply(
        self, objects: Sequence[dict[str, Any]] | str, server_side: bool = True, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        text = objects if isinstance(objects, str) else yaml.safe_dump_all(list(objects))
        args = ["apply", "-f", "-"]
        if server_side:
            args[1:1] = ["--server-side", "--field-manager=gpufleet-tests"]
        return self.kubectl(*args, input=text, check=check)

    def get(self, *args: str) -> Any:
        return json.loads(self.kubectl("get", *args, "-o", "json").stdout)

    def wait_until(
        self, ready: Callable[[], bool], timeout: float = 60, what: str = "the condition"
    ) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if ready():
                return
            time.sleep(0.25)
        raise ClusterError(f"timed out after {timeout:.0f}s waiting for {what}")

    # --- fake GPU nodes and CRDs -------------------------------------------------------------

    def add_gpu_nodes(
        self,
        count: int,
        gpus_per_node: int = 8,
        gpu_type: str = "H100",
        pool: str | None = None,
        zone: str = "zone-a",
        prefix: str | None = None,
    ) -> list[str]:
        """Add `count` fake nodes with `gpus_per_node` allocatable `nvidia.com/gpu`, the GPU
        Operator's product labels, a zone, `gpufleet.io/pool` (when `pool` is given) and the
        `nvidia.com/gpu` NoSchedule taint GPU node pools carry. Returns the new node names."""
        prefix = prefix or f"{(pool or gpu_type).lower()}"
        existing = {n["metadata"]["name"] for n in self.get("nodes")["items"]}
        names: list[str] = []
        index = 1
        while len(names) < count:
            name = f"{prefix}-{index}"
            index += 1
            if name not in existing:
                names.append(name)
        product = {
            "H100": "NVIDIA-H100-80GB-HBM3",
            "A100": "NVIDIA-A100-SXM4-80GB",
            "L4": "NVIDIA-L4",
        }.get(gpu_type, f"NVIDIA-{gpu_type}")
        capacity = {"cpu": "96", "memory": "1Ti", "pods": "110", GPU_RESOURCE: str(gpus_per_node)}
        nodes = []
        for name in names:
            labels = {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "type": "kwok",
                "nvidia.com/gpu.present": "true",
                "nvidia.com/gpu.product": product,
                "nvidia.com/gpu.count": str(gpus_per_node),
                "topology.kubernetes.io/zone": zone,
                "gpufleet.io/gpu-type": gpu_type,
            }
            if pool:
                labels["gpufleet.io/pool"] = pool
            nodes.append(
                {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "metadata": {
                        "name": name,
                        "labels": labels,
                        "annotations": {FAKE_NODE_ANNOTATION: "fake"},
                    },
                    "spec": {
                        "taints": [{"key": GPU_RESOURCE, "value": "true", "effect": "NoSchedule"}]
                    },
                    "status": {"capacity": capacity, "allocatable": capacity},
                }
            )
        for start in range(0, len(nodes), 200):  # one kubectl per batch, not per node
            self.kubectl("create", "-f", "-", input=yaml.safe_dump_all(nodes[start : start + 200]))
        wanted = set(names)
        self.wait_until(
            lambda: wanted <= self._ready_nodes(),
            60 + len(names) / 20,
            f"{len(names)} new nodes ({names[0]} ...) to be Ready",
        )
        return names

    def publish_gpu_devices(self, nodes: Sequence[str], gpus_per_node: int = 8) -> None:
        """Publish the nodes' GPUs for Dynamic Resource Allocation as NVIDIA's DRA driver does
        for real nodes (driver and DeviceClass `gpu.nvidia.com`, devices `gpu-0`..., attribute
        `index`): one ResourceSlice per node. The scheduler allocates ResourceClaims against
        them with no node plugin, and kwok runs the pods that use them."""
        objects: list[dict[str, Any]] = [
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "DeviceClass",
                "metadata": {"name": GPU_DRIVER},
                "spec": {
                    "selectors": [{"cel": {"expression": f"device.driver == '{GPU_DRIVER}'"}}]
                },
            }
        ]
        for node in nodes:
            devices = [
                {"name": f"gpu-{i}", "attributes": {"index": {"int": i}, "type": {"string": "gpu"}}}
                for i in range(gpus_per_node)
            ]
            objects.append(
                {
                    "apiVersion": "resource.k8s.io/v1",
                    "kind": "ResourceSlice",
                    "metadata": {"name": f"{node}-{GPU_DRIVER}"},
                    "spec": {
                        "driver": GPU_DRIVER,
                        "nodeName": node,
                        "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                        "devices": devices,
                    },
                }
            )
        self.apply(objects)

    def _ready_nodes(self) -> set[str]:
        """Names of the Ready nodes, from one LIST (1,000 nodes cost one request, not 1,000)."""
        return {
            node["metadata"]["name"]
            for node in self.get("nodes")["items"]
            if any(
                c["type"] == "Ready" and c["status"] == "True"
                for c in node.get("status", {}).get("conditions", [])
            )
        }

    def install_crds(self, paths: Sequence[Path]) -> list[str]:
        """Install CRD files (folders are searched for *.yaml) and wait until they are served."""
        names = []
        for path in paths:
            files = sorted(path.rglob("*.yaml")) if path.is_dir() else [path]
            for file in files:
                for doc in yaml.safe_load_all(file.read_text()):
                    if isinstance(doc, dict) and doc.get("kind") == "CustomResourceDefinition":
                        self.apply([doc])
                        names.append(doc["metadata"]["name"])
        for name in names:
            # polled, not `kubectl wait`: that fails on a CRD whose status has no conditions
            # yet, as one just created may not
            self.wait_until(functools.partial(self._established, name), 60, f"CRD {name} served")
        return names

    def _established(self, crd: str) -> bool:
        path = '{.status.conditions[?(@.type=="Established")].status}'
        found = self.kubectl("get", "crd", crd, "-o", f"jsonpath={path}", check=False)
        return found.stdout.strip() == "True"


def kubeconfig_yaml(server: str, ca: Path, cert: Path, key: Path, user: str) -> str:
    """A kubeconfig for `server` with one user, who authenticates by a client certificate."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "gpufleet-dev",
        "clusters": [
            {
                "name": "gpufleet-dev",
                "cluster": {"server": server, "certificate-authority": str(ca)},
            }
        ],
        "users": [
            {"name": user, "user": {"client-certificate": str(cert), "client-key": str(key)}}
        ],
        "contexts": [
            {"name": "gpufleet-dev", "context": {"cluster": "gpufleet-dev", "user": user}}
        ],
    }
    return yaml.safe_dump(config, sort_keys=False)


def run_tool(
    command: Sequence[str], what: str, check: bool, timeout: float, input: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Run a command-line tool of the harness; with `check`, a failure raises a ClusterError
    that names `what` and quotes the tool's error."""
    result = subprocess.run(
        command, input=input, capture_output=True, text=True, check=False, timeout=timeout
    )
    if check and result.returncode != 0:
        raise ClusterError(f"{what} failed: {result.stderr.strip()}")
    return result


def host_address() -> str:
    """This machine's address on its default route: where pods on a real node reach the API
    server (loopback is the pod's own)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            sock.connect(("203.0.113.1", 9))  # no packet is sent: only the route is looked up
        except OSError as error:
            raise ClusterError(
                f"this machine has no default route, so real nodes cannot be served: {error}"
            ) from error
        address: str = sock.getsockname()[0]
        return address


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def _alive(record: ProcessRecord, process: subprocess.Popen[bytes] | None) -> bool:
    if process is not None:
        return process.poll() is None
    return record.alive()


@contextlib.contextmanager
def control_plane(work_dir: Path, bin_dir: Path | None = None) -> Iterator[ControlPlane]:
    plane = ControlPlane(work_dir, bin_dir or default_bin_dir())
    with plane:
        yield plane
