"""Real nodes for the local control plane: containerd, runc, the CNI bridge plugin and a kubelet
per node, on this machine, registered beside the kwok GPU nodes; and one kube-proxy, so that
pods reach Services (the API server's `kubernetes` Service first of all).

A real node runs real containers: the chart's pods, under their ServiceAccounts, from images
imported into its containerd from OCI archives (`make image`), never pulled from a registry
outside this machine. Linux and root only. This machine's facts, checked by `check_host`:
cgroup v1 hierarchies (the kubelet runs with `failCgroupV1: false`), overlayfs, network
namespaces, bridges and iptables.

Each node has its own containerd (state under a short folder in /run: socket paths are limited
to 108 bytes), pod network (a bridge and a /24 of POD_CIDR), kubelet port and cgroup root, so
that N nodes on one machine never see each other's containers. `stop()` removes what a node
made: its containers and their shims, mounts, network namespaces, cgroups and bridge.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from gpufleet.pki import issue_client_cert

from .cluster import (
    ClusterError,
    ControlPlane,
    build_script,
    free_port,
    host_address,
    kubeconfig_yaml,
    run_tool,
)

NODE_BINARIES = (
    "kubelet",
    "kube-proxy",
    "containerd",
    "ctr",
    "containerd-shim-runc-v2",
    "runc",
)
CNI_PLUGINS = ("bridge", "host-local", "loopback", "portmap")
CNI_FOLDER = "cni-plugins"  # beside the binaries
POD_CIDR = "10.244.0.0/16"  # node i gets 10.244.i.0/24
PAUSE_IMAGE = "localhost/gpufleet/pause:3.10.2"  # hack/image/build.sh pause
CGROUP_ROOT = Path("/sys/fs/cgroup")
RUN_ROOT = Path("/run/gpufleet")
REAL_NODE_LABEL = "gpufleet.io/real-node"


def missing_node_binaries(bin_dir: Path) -> list[str]:
    missing = [name for name in NODE_BINARIES if not os.access(bin_dir / name, os.X_OK)]
    missing += [
        f"{CNI_FOLDER}/{name}"
        for name in CNI_PLUGINS
        if not os.access(bin_dir / CNI_FOLDER / name, os.X_OK)
    ]
    return missing


def check_host() -> list[str]:
    """Why this machine cannot run a real node (empty when it can): each reason names what is
    missing and how to get it."""
    problems = []
    if os.geteuid() != 0:
        problems.append("a real node needs root (containerd, runc and the kubelet run as root)")
    filesystems = Path("/proc/filesystems").read_text()
    if "overlay" not in filesystems:
        problems.append("the kernel has no overlayfs (containerd's snapshotter): modprobe overlay")
    if (
        not any((CGROUP_ROOT / c).is_dir() for c in ("memory", "cpu"))
        and not (CGROUP_ROOT / "cgroup.controllers").exists()
    ):
        problems.append(f"no cgroup hierarchy is mounted under {CGROUP_ROOT}")
    for tool, package in (("iptables", "iptables"), ("ip", "iproute2")):
        if shutil.which(tool) is None:
            problems.append(f"{tool} not found: apt-get install {package}")
    return problems


def _sysctl(name: str, value: str) -> None:
    path = Path("/proc/sys") / name.replace(".", "/")
    if path.exists() and path.read_text().strip() != value:
        path.write_text(value)


@dataclass
class RealNode:
    """One real node of `plane` (which must have been started with `real_nodes=True`)."""

    plane: ControlPlane
    index: int = 1
    images: Sequence[Path] = ()  # OCI archives imported into its containerd before it registers
    labels: dict[str, str] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return f"real-{self.index}"

    @property
    def folder(self) -> Path:
        return self.plane.work_dir / "nodes" / self.name

    @property
    def run_folder(self) -> Path:
        """containerd's socket and state: short, whatever the plane's work folder is."""
        key = hashlib.sha256(str(self.plane.work_dir.resolve()).encode()).hexdigest()[:8]
        return RUN_ROOT / f"{key}-{self.index}"

    @property
    def socket(self) -> Path:
        return self.run_folder / "containerd.sock"

    @property
    def bridge(self) -> str:
        return f"gfbr{self.index}"

    @property
    def pod_cidr(self) -> str:
        return f"10.244.{self.index}.0/24"

    @property
    def cgroup_parent(self) -> str:
        """The kubelet's cgroup root: its own, so nodes never count each other's pods."""
        return f"/gpufleet-{self.run_folder.name}"

    @property
    def bin_dir(self) -> Path:
        return self.plane.bin_dir

    # --- lifecycle -------------------------------------------------------------------------

    def start(self, timeout: float = 120) -> None:
        problems = check_host()
        missing = missing_node_binaries(self.bin_dir)
        if missing:
            problems.append(
                f"missing real-node binaries in {self.bin_dir}: {', '.join(missing)}; "
                "run hack/k8s/build.sh"
            )
        if not self.plane.real_nodes:
            problems.append("the control plane was not started with real_nodes=True")
        others = _other_planes_nodes(self.run_folder.name.rsplit("-", 1)[0])
        if others:
            # their bridges, pod addresses and kube-proxy would collide with this plane's
            problems.append(
                f"another control plane's real nodes run on this machine ({', '.join(others)} "
                f"in {RUN_ROOT}): stop it first (gpufleet dev cluster down)"
            )
        if problems:
            raise ClusterError("cannot start a real node: " + "; ".join(problems))
        self.stop()  # what an earlier run of this node left behind
        for folder in (self.folder, self.run_folder):
            folder.mkdir(parents=True, exist_ok=True)
        _sysctl("net.ipv4.ip_forward", "1")
        # pod-to-Service traffic that stays on a bridge must pass kube-proxy's iptables rules
        _sysctl("net.bridge.bridge-nf-call-iptables", "1")
        self.plane.log(f"{self.name}: containerd")
        self._start_containerd(timeout)
        for archive in self.images:
            self.import_image(archive)
        self.plane.log(f"{self.name}: kubelet")
        self._start_kubelet()
        self.plane.wait_until(self._ready, timeout, f"real node {self.name} to be Ready")

    def stop(self) -> None:
        """End the kubelet, every container, containerd and its shims; undo mounts, network
        namespaces, cgroups and the bridge. Safe to call on a node that never started."""
        self.plane.stop_process(f"kubelet-{self.name}")
        if self.socket.exists():
            self._kill_containers()
        self.plane.stop_process(f"containerd-{self.name}")
        self._kill_shims()
        _unmount_under((self.folder, self.run_folder))
        _remove_cgroups(self.cgroup_parent)
        subprocess.run(
            ["ip", "link", "delete", self.bridge], capture_output=True, check=False, timeout=30
        )
        shutil.rmtree(self.run_folder, ignore_errors=True)

    def _ready(self) -> bool:
        node = self.plane.kubectl("get", "node", self.name, "-o", "json", check=False)
        if node.returncode != 0:
            return False
        conditions = json.loads(node.stdout).get("status", {}).get("conditions", [])
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    # --- containerd --------------------------------------------------------------------------

    def _start_containerd(self, timeout: float) -> None:
        state, root = self.run_folder / "state", self.folder / "containerd"
        config = {
            "version": 3,
            "root": str(root),
            "state": str(state),
            "grpc": {"address": str(self.socket)},
            "ttrpc": {"address": str(self.run_folder / "containerd.sock.ttrpc")},
            "plugins": {
                "io.containerd.cri.v1.images": {
                    "snapshotter": "overlayfs",
                    "pinned_images": {"sandbox": PAUSE_IMAGE},
                },
                "io.containerd.cri.v1.runtime": {
                    "netns_mounts_under_state_dir": True,
                    # this machine withholds CAP_SYS_RESOURCE even from root: no process may
                    # lower its OOM score below containerd's, as the kubelet asks for pause and
                    # Guaranteed pods
                    "restrict_oom_score_adj": True,
                    "containerd": {
                        "default_runtime_name": "runc",
                        "runtimes": {
                            "runc": {
                                "runtime_type": "io.containerd.runc.v2",
                                "options": {
                                    "BinaryName": str(self.bin_dir / "runc"),
                                    "Root": str(self.run_folder / "runc"),
                                    "SystemdCgroup": False,
                                },
                            }
                        },
                    },
                    "cni": {
                        "bin_dirs": [str(self.bin_dir / CNI_FOLDER)],
                        "conf_dir": str(self.folder / "cni"),
                    },
                },
                # the node resource interface's socket is one per machine: not ours to take
                "io.containerd.nri.v1.nri": {"disable": True},
            },
        }
        path = self.folder / "containerd.toml"
        path.write_text(_toml(config))
        self._write_cni_config()
        self.plane.start_process(
            f"containerd-{self.name}",
            ["containerd", f"--config={path}"],
            # the shim is found on PATH
            env={"PATH": f"{self.bin_dir}:{os.environ.get('PATH', '')}"},
            ready=lambda: self.socket.exists() and self.ctr("version", check=False).returncode == 0,
            timeout=timeout,
        )

    def _write_cni_config(self) -> None:
        folder = self.folder / "cni"
        folder.mkdir(exist_ok=True)
        config = {
            "cniVersion": "1.0.0",
            "name": "gpufleet",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": self.bridge,
                    "isGateway": True,
                    # pods only talk to this machine and to each other: nothing to masquerade
                    "ipMasq": False,
                    "hairpinMode": True,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": self.pod_cidr}]],
                        "routes": [{"dst": "0.0.0.0/0"}],
                        "dataDir": str(self.folder / "ipam"),
                    },
                },
                {"type": "portmap", "capabilities": {"portMappings": True}},
            ],
        }
        (folder / "10-gpufleet.conflist").write_text(json.dumps(config, indent=2))

    def ctr(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        command = [str(self.bin_dir / "ctr"), f"--address={self.socket}", "--namespace=k8s.io"]
        return run_tool([*command, *args], f"ctr {' '.join(args)}", check, 300)

    def import_image(self, archive: Path) -> None:
        """Import an OCI archive into the node's containerd (kubelet's namespace, unpacked), so
        pods run it with imagePullPolicy IfNotPresent and no registry."""
        if not archive.is_file():
            raise ClusterError(f"image archive {archive} not found: build it with make image")
        self.plane.log(f"{self.name}: import {archive.name}")
        self.ctr("images", "import", "--snapshotter=overlayfs", str(archive))

    def _kill_containers(self) -> None:
        tasks = self.ctr("tasks", "list", "--quiet", check=False).stdout.split()
        for task in tasks:
            self.ctr("tasks", "kill", "--signal=SIGKILL", task, check=False)
        deadline = time.monotonic() + 10
        for task in tasks:
            while time.monotonic() < deadline:
                if self.ctr("tasks", "delete", task, check=False).returncode == 0:
                    break
                time.sleep(0.2)

    def _kill_shims(self) -> None:
        """Shims leave containerd's process group when they start: found by their address."""
        for pid, cmdline in _processes_naming(str(self.socket)):
            if b"containerd-shim" in cmdline:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)

    # --- kubelet -----------------------------------------------------------------------------

    def _start_kubelet(self) -> None:
        folder = self.folder / "kubelet"
        folder.mkdir(exist_ok=True)
        pki = self.plane.pki
        cert, key = folder / "client.crt", folder / "client.key"
        issue_client_cert(pki, cert, key, f"system:node:{self.name}", "system:nodes")
        kubeconfig = folder / "kubeconfig"
        kubeconfig.write_text(kubeconfig_yaml(self.plane.server, pki.ca_cert, cert, key, "node"))
        _make_cgroup(self.cgroup_parent)
        healthz = free_port()
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            # this machine mounts cgroup v1 hierarchies only (cgroup2 has no controllers)
            "failCgroupV1": False,
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": self.cgroup_parent,
            "containerRuntimeEndpoint": f"unix://{self.socket}",
            "address": "0.0.0.0",
            "port": free_port(),
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": healthz,
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": True},
                "x509": {"clientCAFile": str(pki.ca_cert)},
            },
            "authorization": {"mode": "Webhook"},
            "failSwapOn": False,
            "podLogsDir": str(self.folder / "pod-logs"),
            "podCIDR": self.pod_cidr,
            "registerNode": True,
            "resolvConf": "/etc/resolv.conf",
            "serializeImagePulls": False,
            # the machine's disk is shared with everything else: never evict for it
            "evictionHard": {"memory.available": "100Mi"},
            "imageGCHighThresholdPercent": 100,
            "syncFrequency": "10s",
            "fileCheckFrequency": "10s",
        }
        config_path = folder / "config.yaml"
        config_path.write_text(yaml.safe_dump(config))
        labels = {REAL_NODE_LABEL: "true", **self.labels}
        self.plane.start_process(
            f"kubelet-{self.name}",
            [
                "kubelet",
                f"--config={config_path}",
                f"--kubeconfig={kubeconfig}",
                f"--root-dir={folder / 'root'}",
                f"--cert-dir={folder / 'pki'}",
                f"--hostname-override={self.name}",
                f"--node-ip={host_address()}",
                "--node-labels=" + ",".join(f"{k}={v}" for k, v in sorted(labels.items())),
                "--v=1",
            ],
            env={"PATH": f"{self.bin_dir}:{os.environ.get('PATH', '')}"},
            ready_url=f"http://127.0.0.1:{healthz}/healthz",
        )


def start_kube_proxy(plane: ControlPlane, node: str, timeout: float = 60) -> None:
    """One kube-proxy for every real node of this machine (they share its network): iptables
    rules that take Service addresses to their pods. Removed again by `stop_kube_proxy`."""
    if "kube-proxy" in plane.records:
        return
    metrics, healthz = free_port(), free_port()
    config = {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(plane.kubeconfig)},
        "mode": "iptables",
        "clusterCIDR": POD_CIDR,
        "bindAddress": "0.0.0.0",
        "metricsBindAddress": f"127.0.0.1:{metrics}",
        "healthzBindAddress": f"127.0.0.1:{healthz}",
        # the machine's conntrack table is not ours to resize
        "conntrack": {"maxPerCore": 0, "min": 0},
        # the node it runs for (its topology hints); the rules serve every node of the machine
        "hostnameOverride": node,
    }
    path = plane.work_dir / "kube-proxy.yaml"
    path.write_text(yaml.safe_dump(config))
    plane.start_process(
        "kube-proxy",
        ["kube-proxy", f"--config={path}"],
        env={},
        ready_url=f"http://127.0.0.1:{healthz}/healthz",
        timeout=timeout,
    )


def stop_kube_proxy(plane: ControlPlane) -> None:
    if "kube-proxy" not in plane.records:
        return
    plane.stop_process("kube-proxy")
    subprocess.run(
        [str(plane.bin_dir / "kube-proxy"), "--cleanup"],
        capture_output=True,
        check=False,
        timeout=60,
    )


def _remove_kube_chains() -> None:
    """Remove the iptables chains kube-proxy and the kubelet leave behind (KUBE-FIREWALL, which
    `kube-proxy --cleanup` keeps, drops connections to 127.0.0.1 from other addresses; the
    canaries and the hint are the kubelet's), with the jumps to them."""
    for tool in ("iptables", "ip6tables"):
        if shutil.which(tool) is None:
            continue
        for table in ("filter", "nat", "mangle"):
            listed = subprocess.run(
                [tool, "-w", "-t", table, "-S"], capture_output=True, text=True, check=False
            )
            rules = listed.stdout.splitlines()
            for rule in rules:
                parts = shlex.split(rule)
                if parts[:1] == ["-A"] and not parts[1].startswith("KUBE-") and "KUBE-" in rule:
                    subprocess.run(
                        [tool, "-w", "-t", table, "-D", *parts[1:]],
                        capture_output=True,
                        check=False,
                    )
            chains = [r.split()[1] for r in rules if r.startswith("-N KUBE-")]
            for flag in ("-F", "-X"):
                for chain in chains:
                    subprocess.run(
                        [tool, "-w", "-t", table, flag, chain], capture_output=True, check=False
                    )


# --- what a node leaves on the machine ------------------------------------------------------


def leftovers(node: RealNode) -> list[str]:
    """What of a stopped node is still on the machine (empty after `stop` and
    `remove_real_nodes`): its processes, mounts, cgroups, bridge, kube-proxy's rules."""
    found = [f"process {pid}" for pid, _ in _processes_naming(str(node.socket))]
    found += [f"mount {m}" for m in _mounts_under((node.folder, node.run_folder))]
    found += [f"cgroup {h / node.cgroup_parent.lstrip('/')}" for h in _controllers()
              if (h / node.cgroup_parent.lstrip("/")).exists()]  # fmt: skip
    if Path(f"/sys/class/net/{node.bridge}").exists():
        found.append(f"bridge {node.bridge}")
    rules = subprocess.run(["iptables", "-w", "-t", "nat", "-S"], capture_output=True, text=True)
    found += [f"iptables {r}" for r in rules.stdout.splitlines() if "KUBE-" in r]
    return found


def _other_planes_nodes(plane_key: str) -> list[str]:
    """The run folders of live real nodes of other control planes (their containerd answers)."""
    live = []
    for folder in RUN_ROOT.glob("*-*") if RUN_ROOT.is_dir() else []:
        if folder.name.rsplit("-", 1)[0] == plane_key:
            continue
        with socket.socket(socket.AF_UNIX) as sock, contextlib.suppress(OSError):
            sock.settimeout(1)
            sock.connect(str(folder / "containerd.sock"))
            live.append(folder.name)
    return live


def _processes_naming(text: str) -> list[tuple[int, bytes]]:
    """The processes whose command line holds `text` (a node's socket), with that line."""
    found = []
    for proc in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if proc.name.isdigit() and text.encode() in (
                cmdline := (proc / "cmdline").read_bytes()
            ):
                found.append((int(proc.name), cmdline))
    return found


def _mounts_under(folders: Sequence[Path]) -> list[str]:
    """The mount points below `folders` (overlay roots, shm, netns, volumes)."""
    prefixes = tuple(str(f.resolve()) + "/" for f in folders)
    mounts = (line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines())
    return [m for m in mounts if m.startswith(prefixes)]


def _unmount_under(folders: Sequence[Path]) -> None:
    """Unmount everything mounted below `folders`, deepest first."""
    for mount in sorted(_mounts_under(folders), key=len, reverse=True):
        subprocess.run(["umount", "-l", mount], capture_output=True, check=False, timeout=30)


def _controllers() -> list[Path]:
    return [p for p in CGROUP_ROOT.iterdir() if p.is_dir() and not p.is_symlink()]


def _make_cgroup(path: str) -> None:
    for hierarchy in _controllers():
        if hierarchy.name == "unified":
            continue
        with contextlib.suppress(OSError):
            (hierarchy / path.lstrip("/")).mkdir(exist_ok=True)


def _remove_cgroups(path: str) -> None:
    """Kill every process left in the node's cgroup tree (a container whose shim is gone
    outlives it), then rmdir the tree in every hierarchy, leaves first (the kernel refuses a
    cgroup that still has children or tasks)."""
    tops = [h / path.lstrip("/") for h in _controllers() if (h / path.lstrip("/")).is_dir()]
    folders = [Path(d) for top in tops for d, _, _ in os.walk(top)]
    pids = set()
    for folder in folders:
        with contextlib.suppress(OSError):
            pids |= {int(p) for p in (folder / "cgroup.procs").read_text().split()}
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    for folder in sorted(folders, key=lambda p: len(p.parts), reverse=True):
        while True:
            try:
                folder.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError:  # busy until the killed processes have exited
                if time.monotonic() > deadline:
                    break
                time.sleep(0.1)


def _toml(config: dict[str, object], prefix: str = "") -> str:
    """The little TOML containerd's config needs: tables of strings, numbers, booleans, lists."""
    scalars, tables = [], []
    for key, value in config.items():
        quoted = key if key.replace("_", "").isalnum() else f"'{key}'"
        if isinstance(value, dict):
            tables.append((f"{prefix}.{quoted}" if prefix else quoted, value))
        else:
            scalars.append(f"{quoted} = {json.dumps(value)}")
    text = (f"[{prefix}]\n" if prefix and scalars else "") + "".join(s + "\n" for s in scalars)
    for name, table in tables:
        text += _toml(table, name)
    return text


LOCAL_STORAGE_CLASS = "local"


def add_local_storage(plane: ControlPlane, count: int = 4, size: str = "10Gi") -> None:
    """A default StorageClass with `count` volumes in folders of this machine, for the
    PersistentVolumeClaims of pods on real nodes (the chart's SQLite ledger): what a managed
    cluster's default class gives. The folders are writable by any user, as kind's local-path
    provisioner makes them (a host path gets no fsGroup)."""
    objects: list[dict[str, object]] = [
        {
            "apiVersion": "storage.k8s.io/v1",
            "kind": "StorageClass",
            "metadata": {
                "name": LOCAL_STORAGE_CLASS,
                "annotations": {"storageclass.kubernetes.io/is-default-class": "true"},
            },
            "provisioner": "kubernetes.io/no-provisioner",
            "volumeBindingMode": "WaitForFirstConsumer",
            "reclaimPolicy": "Delete",
        }
    ]
    for index in range(1, count + 1):
        folder = plane.work_dir / "volumes" / f"pv-{index}"
        folder.mkdir(parents=True, exist_ok=True)
        folder.chmod(0o777)
        objects.append(
            {
                "apiVersion": "v1",
                "kind": "PersistentVolume",
                "metadata": {"name": f"local-{index}"},
                "spec": {
                    "capacity": {"storage": size},
                    "accessModes": ["ReadWriteOnce"],
                    "storageClassName": LOCAL_STORAGE_CLASS,
                    "persistentVolumeReclaimPolicy": "Retain",
                    "hostPath": {"path": str(folder), "type": "Directory"},
                    "nodeAffinity": {
                        "required": {
                            "nodeSelectorTerms": [
                                {
                                    "matchExpressions": [
                                        {
                                            "key": REAL_NODE_LABEL,
                                            "operator": "In",
                                            "values": ["true"],
                                        }
                                    ]
                                }
                            ]
                        }
                    },
                },
            }
        )
    plane.apply(objects)


def default_images() -> list[Path]:
    """The OCI archives `make image` leaves in the checkout's build/image: the pause image
    (required: every pod's sandbox) and the gpufleet image when it was built."""
    script = build_script()
    if script is None:
        return []
    folder = script.parents[2] / "build" / "image"
    return [p for p in (folder / "pause.oci.tar", folder / "gpufleet.oci.tar") if p.is_file()]


def real_node_indexes(plane: ControlPlane) -> list[int]:
    """The indexes of the real nodes whose kubelet or containerd `plane` recorded."""
    found = set()
    for name in plane.records:
        for prefix in ("kubelet-real-", "containerd-real-"):
            if name.startswith(prefix) and name.removeprefix(prefix).isdigit():
                found.add(int(name.removeprefix(prefix)))
    return sorted(found)


def add_real_nodes(plane: ControlPlane, count: int, images: Sequence[Path]) -> list[RealNode]:
    """Start `count` more real nodes (after those running), kube-proxy and the default
    storage with the first."""
    if not any(p.name.startswith("pause") for p in images):
        raise ClusterError(
            "real nodes need the pause image (every pod's sandbox): build it with make image "
            "(hack/image/build.sh pause)"
        )
    first = max(real_node_indexes(plane), default=0) + 1
    nodes = []
    for index in range(first, first + count):
        node = RealNode(plane, index, images=images)
        node.start()
        nodes.append(node)
    if nodes and first == 1:
        start_kube_proxy(plane, nodes[0].name)
        add_local_storage(plane)
    return nodes


@contextlib.contextmanager
def cluster_with_real_node(
    work_dir: Path,
    images: Sequence[Path],
    gpu_nodes: int = 2,
    pool: str | None = None,
    log: Callable[[str], None] = lambda message: None,
) -> Iterator[tuple[ControlPlane, RealNode, dict[str, float]]]:
    """A fresh control plane with one real node (labelled as the GPU Operator labels a GPU
    node, so the chart's agent runs there) and `gpu_nodes` kwok nodes of 8 H100s (labelled
    gpufleet.io/pool=`pool`); the seconds
    each took to be ready. Everything is stopped and undone on exit."""
    if work_dir.exists():
        shutil.rmtree(work_dir)
    plane = ControlPlane(work_dir, real_nodes=True, log=log)
    timings = {}
    started = time.monotonic()
    plane.start()
    try:
        timings["control_plane_seconds"] = round(time.monotonic() - started, 2)
        started = time.monotonic()
        (node,) = add_real_nodes(plane, 1, images)
        timings["real_node_ready_seconds"] = round(time.monotonic() - started, 2)
        plane.kubectl("label", "node", node.name, "nvidia.com/gpu.present=true")
        plane.add_gpu_nodes(gpu_nodes, gpus_per_node=8, gpu_type="H100", pool=pool)
        yield plane, node, timings
    finally:
        remove_real_nodes(plane)
        plane.stop()


def remove_real_nodes(plane: ControlPlane) -> list[str]:
    """Stop every real node of `plane` and kube-proxy, undoing what they made on the machine."""
    names = []
    for index in real_node_indexes(plane):
        node = RealNode(plane, index)
        node.stop()
        names.append(node.name)
    stop_kube_proxy(plane)
    if names:
        _remove_kube_chains()
    return names
