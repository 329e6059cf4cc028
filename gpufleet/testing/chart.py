"""The Helm chart installed as a new user would, onto a local control plane with a real node
(gpufleet.testing.node) beside kwok GPU nodes, and what that user then sees: the chart's pods
Ready on the real node, the fleet's GPUs and their idle share from the server's Service, the
GPU agent's report on its node; then the day-2 paths: the controller's pod deleted while
tenants create work, `helm upgrade` to a changed value, `helm uninstall`.

`install_scenario` runs it all once and returns what it timed and saw; the cluster test
(tests/cluster/test_install.py) asserts on that, benchmarks/install.py prints it as JSON.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gpufleet.model.keys import ADMISSION_GATE, GPU_RESOURCE

from .cluster import ClusterError, ControlPlane, build_script
from .metrics import CYCLES, scraped, wait_cycles
from .node import RealNode

RELEASE = "gpufleet"
NAMESPACE = "gpufleet-system"
TENANT = "tenant-install"
TEAM = "ml"
POOL = "h100"  # the kwok GPU nodes' gpufleet.io/pool label
REAL_POOL = "real-node"  # the real node's pool, once it advertises GPUs
REAL_NODE_GPUS = 2  # as many as the agent's scripted NVML has
# what PyTorch prints when a GPU's memory runs out; the container prints it and fails
CUDA_OOM = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a total "
    "capacity of 79.19 GiB of which 1.12 GiB is free."
)
API = "gpufleet.io/v1alpha1"
# no GPU here: the agent plays a scripted NVML, without the NVIDIA runtime (the only values
# the scenario sets besides the image)
SCRIPTED_NVML = "gpus: 2\nuuidPrefix: GPU-real\n"
# what must be gone after `helm uninstall` (CRDs stay by Helm's rule; the ledger's claim by
# the chart's resource-policy)
CLUSTER_SCOPED = (
    "mutatingwebhookconfigurations",
    "validatingwebhookconfigurations",
    "mutatingadmissionpolicies",
    "mutatingadmissionpolicybindings",
    "validatingadmissionpolicies",
    "validatingadmissionpolicybindings",
    "clusterroles",
    "clusterrolebindings",
)


def chart_folder() -> Path:
    script = build_script()
    if script is None:
        raise ClusterError("the chart is found in a gpufleet checkout (charts/gpufleet)")
    return script.parents[2] / "charts" / "gpufleet"


@dataclass
class Install:
    """The chart on `plane`, whose real node `node` runs its pods."""

    plane: ControlPlane
    node: RealNode
    gpus: int  # on the kwok GPU nodes: what the fleet status must report
    log: Callable[[str], None] = lambda message: None
    found: dict[str, Any] = field(default_factory=dict)

    # --- helm and kubectl ------------------------------------------------------------------

    def helm(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        home = self.plane.work_dir / "helm"
        env = {
            **os.environ,
            "HELM_CACHE_HOME": str(home / "cache"),
            "HELM_CONFIG_HOME": str(home / "config"),
            "HELM_DATA_HOME": str(home / "data"),
        }
        return subprocess.run(
            [str(self.plane.bin_dir / "helm"), f"--kubeconfig={self.plane.kubeconfig}", *args],
            capture_output=True,
            text=True,
            env=env,
            check=False,
            timeout=timeout,
        )

    def values(self, *extra: str) -> list[str]:
        timeline = self.plane.work_dir / "scripted-nvml.yaml"
        timeline.write_text(SCRIPTED_NVML)
        return [
            "--set",
            "agent.runtimeClassName=",
            "--set-file",
            f"agent.scriptedNVML={timeline}",
            *extra,
        ]

    def pods(self) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self.plane.get("pods", "-n", NAMESPACE)["items"]
        return items

    def ready(self) -> bool:
        """Every pod of the release Ready, the agent's on the real node among them."""
        pods = [p for p in self.pods() if p["metadata"].get("deletionTimestamp") is None]
        on_node = [p for p in pods if p["spec"].get("nodeName") == self.node.name]
        components = {p["metadata"]["labels"].get("app.kubernetes.io/component") for p in on_node}
        return {"controller", "server", "agent"} <= components and all(map(_pod_ready, pods))

    # --- what a user sees --------------------------------------------------------------------

    def viewer_token(self) -> str:
        """A token of a ServiceAccount bound to the chart's viewer ClusterRole, as a person
        reading the dashboard would have."""
        self.plane.apply(
            [
                {
                    "apiVersion": "v1",
                    "kind": "ServiceAccount",
                    "metadata": {"name": "dashboard-reader", "namespace": "default"},
                },
                {
                    "apiVersion": "rbac.authorization.k8s.io/v1",
                    "kind": "ClusterRoleBinding",
                    "metadata": {"name": "dashboard-reader"},
                    "roleRef": {
                        "apiGroup": "rbac.authorization.k8s.io",
                        "kind": "ClusterRole",
                        "name": f"{RELEASE}-viewer",
                    },
                    "subjects": [
                        {
                            "kind": "ServiceAccount",
                            "name": "dashboard-reader",
                            "namespace": "default",
                        }
                    ],
                },
            ]
        )
        created = self.plane.kubectl("create", "token", "dashboard-reader", "-n", "default")
        return created.stdout.strip()

    def server_url(self) -> str:
        """The server's Service, by its cluster IP (kube-proxy's rules take it to the pod)."""
        service = self.plane.get("service", f"{RELEASE}-server", "-n", NAMESPACE)
        port = service["spec"]["ports"][0]["port"]
        return f"http://{service['spec']['clusterIP']}:{port}"

    def controller_cycles(self) -> int | None:
        """Workload-loop cycles the controller behind its Service has done (its /metrics);
        None while it does not answer."""
        # the controller's Service (named for its webhook; its metrics port beside it)
        service = self.plane.get("service", f"{RELEASE}-webhook", "-n", NAMESPACE)
        port = next(p["port"] for p in service["spec"]["ports"] if p["name"] == "metrics")
        try:
            found = scraped(f"http://{service['spec']['clusterIP']}:{port}/metrics", CYCLES, 5)
        except OSError:
            return None
        return int(found or 0)

    def fleet_status(self, url: str, token: str) -> dict[str, Any] | None:
        request = urllib.request.Request(
            f"{url}/api/v1/status", headers={"Authorization": f"Bearer {token}"}
        )
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                status: dict[str, Any] = json.load(response)
                return status
        except (OSError, ValueError):
            return None

    def gap_visible(self, status: dict[str, Any] | None) -> bool:
        """The fleet's GPUs all counted, with their idle share: the utilisation gap."""
        totals = (status or {}).get("totals") or {}
        return totals.get("totalGPUs") == self.gpus and "idleGPUs" in totals

    def dashboard(self, url: str) -> str:
        with urllib.request.urlopen(f"{url}/", timeout=5) as response:
            return str(response.read().decode())

    def logs_as(self, account: str, component: str, lines: int = 20) -> dict[str, Any]:
        """The last `lines` of the log of the release's `component` pod on the real node, read
        through the API server (from the node's kubelet) with a token of `account`, one of the
        release's ServiceAccounts, as its pod would: the chart's RBAC at work."""
        pod = next(
            p["metadata"]["name"]
            for p in self.pods()
            if p["spec"].get("nodeName") == self.node.name
            and p["metadata"]["labels"].get("app.kubernetes.io/component") == component
        )
        token = self.plane.kubectl("create", "token", account, "-n", NAMESPACE).stdout.strip()
        read = self.plane.kubectl_as(
            token, "logs", pod, "-n", NAMESPACE, f"--tail={lines}", check=False
        )
        return {"pod": pod, "lines": read.stdout.splitlines(), "error": read.stderr.strip()}

    def containers(self) -> list[dict[str, str]]:
        """The release's containers on the real node, as its pods and containerd tell."""
        found = []
        for pod in self.pods():
            if pod["spec"].get("nodeName") != self.node.name:
                continue
            for status in pod.get("status", {}).get("containerStatuses", []):
                container_id = status.get("containerID", "")
                info = self.node.ctr(
                    "containers", "info", container_id.split("//")[-1], check=False
                )
                image = json.loads(info.stdout).get("Image", "") if info.returncode == 0 else ""
                found.append(
                    {
                        "pod": pod["metadata"]["name"],
                        "node": pod["spec"]["nodeName"],
                        "serviceAccount": pod["spec"].get("serviceAccountName", ""),
                        "containerID": container_id,
                        "containerdImage": image,
                    }
                )
        return found

    def gpu_healthy(self) -> dict[str, Any] | None:
        node = self.plane.get("node", self.node.name)
        for condition in node.get("status", {}).get("conditions", []):
            if condition["type"] == "GPUHealthy":
                found: dict[str, Any] = condition
                return found
        return None

    def leftovers(self) -> list[str]:
        left = []
        for kind in CLUSTER_SCOPED:
            listed = self.plane.kubectl("get", kind, "-o", "name", check=False)
            left += [n for n in listed.stdout.split() if RELEASE in n]
        return left

    def kept(self) -> dict[str, list[str]]:
        """What an uninstall keeps on purpose (install-helm.md): the CRDs, the ledger's claim,
        the PriorityClasses the controller made."""

        def names(*args: str) -> list[str]:
            return self.plane.kubectl("get", *args, "-o", "name", check=False).stdout.split()

        return {
            "crds": [n for n in names("crd") if n.endswith(".gpufleet.io")],
            "claims": names("pvc", "-n", NAMESPACE),
            "priorityClasses": names(
                "priorityclass", "-l", "app.kubernetes.io/managed-by=gpufleet"
            ),
        }

    # --- tenants -------------------------------------------------------------------------------

    def tenant_jobs(self, count: int, prefix: str) -> list[str]:
        """Create `count` GPU Jobs of a tenant (one kubectl each, as users do); the errors of
        the creates that failed."""
        self.plane.kubectl("create", "namespace", TENANT, check=False)
        errors = []
        for index in range(count):
            job = _tenant_job(f"{prefix}-{index}")
            made = self.plane.kubectl("create", "-f", "-", input=yaml.safe_dump(job), check=False)
            if made.returncode != 0:
                errors.append(made.stderr.strip())
        return errors

    def tenant_work(self) -> dict[str, Any]:
        """The tenant's Jobs, their pods (how many held at the gate, how many running) and
        GPUWorkloads."""
        jobs = self.plane.get("jobs", "-n", TENANT)["items"]
        pods = self.plane.get("pods", "-n", TENANT)["items"]
        workloads = self.plane.get("gpuworkloads", "-n", TENANT)["items"]
        gated = [p for p in pods if _held(p)]
        running = sorted(
            p["metadata"]["uid"] for p in pods if p.get("status", {}).get("phase") == "Running"
        )
        return {
            "jobs": len(jobs),
            "pods": len(pods),
            "heldPods": len(gated),
            "runningPods": len(running),
            "gpuWorkloads": len(workloads),
            "runningPodUIDs": running,
        }

    def held_pods(self, prefix: str) -> int:
        """Pods of the tenant's Jobs named `prefix`-N held at the gate."""
        pods = self.plane.get("pods", "-n", TENANT)["items"]
        return sum(
            1
            for p in pods
            if _held(p) and p["metadata"]["labels"].get("job-name", "").startswith(f"{prefix}-")
        )

    def gpu_failure_on_the_node(self, timeout: float = 180) -> dict[str, Any]:
        """A GPU Job that fails on the real node as a CUDA out-of-memory does, diagnosed by the
        chart's controller from the log the kubelet serves (no log fixture).

        The node advertises GPUs in its status, as a device plugin would (the kubelet admits a
        pod asking for them: no plugin owns the name), and is a static pool of its own, where
        the Job asks to run. Returns where the pod ran, how it ended and the diagnosis."""
        node = self.node.name
        gpus = str(REAL_NODE_GPUS)
        self.plane.kubectl("label", "node", node, f"gpufleet.io/pool={REAL_POOL}", "--overwrite")
        self.plane.kubectl(
            "patch", "node", node, "--subresource=status", "--type=merge", "-p",
            json.dumps({"status": {"capacity": {GPU_RESOURCE: gpus},
                                   "allocatable": {GPU_RESOURCE: gpus}}}),
        )  # fmt: skip
        self.plane.apply(
            [
                {
                    "apiVersion": API,
                    "kind": "GPUPool",
                    "metadata": {"name": REAL_POOL},
                    "spec": {
                        "provider": "static",
                        "gpuType": "H100",
                        "gpusPerNode": REAL_NODE_GPUS,
                        "maxGPUs": REAL_NODE_GPUS,
                        "nodeSelector": {"gpufleet.io/pool": REAL_POOL},
                    },
                }
            ]
        )
        image = self.pods()[0]["spec"]["containers"][0]["image"]  # on the node already
        job = _tenant_job("cuda-oom")
        job["metadata"]["labels"]["gpufleet.io/pool"] = REAL_POOL
        template = job["spec"]["template"]
        del template["metadata"]["annotations"]  # a real container: it ends by itself
        (container,) = template["spec"]["containers"]
        container.update(
            image=image,
            imagePullPolicy="Never",
            command=["python3", "-c", f"import sys; print({CUDA_OOM!r}); sys.exit(1)"],
        )
        self.plane.kubectl("create", "-f", "-", input=yaml.safe_dump(job))
        status: dict[str, Any] = {}

        def diagnosed() -> bool:
            nonlocal status
            found = self.plane.kubectl("get", "gwl", "cuda-oom", "-n", TENANT, "-o", "json",
                                       check=False)  # fmt: skip
            status = json.loads(found.stdout).get("status") or {} if found.returncode == 0 else {}
            return bool(status.get("diagnosis"))

        try:
            self.plane.wait_until(
                diagnosed, timeout, "the failed GPU Job on the real node diagnosed"
            )
        except ClusterError as err:
            raise ClusterError(f"{err}: {json.dumps(self._story('cuda-oom'))[:6000]}") from None
        pods = self.plane.get("pods", "-n", TENANT, "-l", "job-name=cuda-oom")["items"]
        # what a user reads of it: `gpufleet workloads logs`, from the same kubelet
        shown = subprocess.run(
            [sys.executable, "-m", "gpufleet", "workloads", "logs", "cuda-oom", "-n", TENANT,
             f"--kubeconfig={self.plane.kubeconfig}"],
            capture_output=True, text=True, check=False, timeout=120,
        )  # fmt: skip
        return {
            "logs_shown": {
                "exit": shown.returncode,
                "stdout": shown.stdout,
                "stderr": shown.stderr[-2000:],
            },
            "pods": [
                {"node": p["spec"].get("nodeName"), "phase": p.get("status", {}).get("phase")}
                for p in pods
            ],
            "state": status.get("state"),
            "diagnosis": status.get("diagnosis"),
        }

    def _story(self, job: str) -> dict[str, Any]:
        """What became of a tenant's Job, for a failure's message."""

        def get(*args: str) -> Any:
            found = self.plane.kubectl("get", *args, "-o", "json", check=False)
            return json.loads(found.stdout) if found.returncode == 0 else found.stderr

        logs = self.plane.kubectl(
            "logs", "-n", NAMESPACE, "-l", "app.kubernetes.io/component=controller", "--tail=40",
            check=False,
        )  # fmt: skip
        return {
            "job": (get("job", job, "-n", TENANT) or {}).get("status"),
            "pods": [
                (p["metadata"]["name"], p["spec"].get("nodeName"), p.get("status"))
                for p in get("pods", "-n", TENANT, "-l", f"job-name={job}")["items"]
            ],
            "workloads": [w["metadata"]["name"] for w in get("gwl", "-n", TENANT)["items"]],
            "controller": logs.stdout.splitlines()[-40:] or logs.stderr,
        }

    def declare_fleet(self) -> None:
        """A new user's first pull request after observing: the GPU nodes as a static pool,
        and a team that owns the tenant's namespace (no reservation: its work is elastic)."""
        self.plane.kubectl("create", "namespace", TENANT, check=False)
        self.plane.apply(
            [
                {
                    "apiVersion": API,
                    "kind": "GPUPool",
                    "metadata": {"name": POOL},
                    "spec": {
                        "provider": "static",
                        "gpuType": "H100",
                        "gpusPerNode": 8,
                        "maxGPUs": self.gpus,
                        "nodeSelector": {"gpufleet.io/pool": POOL},
                    },
                },
                {
                    "apiVersion": API,
                    "kind": "Team",
                    "metadata": {"name": TEAM},
                    "spec": {"namespaces": [TENANT]},
                },
            ]
        )


def install_scenario(install: Install, tenant_jobs: int = 6) -> dict[str, Any]:
    """Install with the default values, wait for the pods and the gap, then the day-2 paths
    (the tenant creates `tenant_jobs` one-GPU Jobs twice: all must fit the fleet's GPUs).
    Returns what it timed (seconds from the start of `helm install`) and what it saw."""
    plane, result = install.plane, install.found
    if 2 * tenant_jobs > install.gpus:
        raise ClusterError(f"{2 * tenant_jobs} one-GPU Jobs do not fit {install.gpus} GPUs")
    chart = chart_folder()
    started = time.monotonic()
    out = install.helm(
        "install", RELEASE, str(chart), "-n", NAMESPACE, "--create-namespace", *install.values()
    )
    result["helm_install_seconds"] = round(time.monotonic() - started, 2)
    if out.returncode != 0:
        raise ClusterError(f"helm install failed: {out.stderr.strip()}")
    install.log("helm install done; waiting for the pods")
    plane.wait_until(install.ready, 180, "every pod of the release Ready")
    result["all_pods_ready_seconds"] = round(time.monotonic() - started, 2)
    token, url = install.viewer_token(), install.server_url()
    status: dict[str, Any] | None = None

    def visible() -> bool:
        nonlocal status
        status = install.fleet_status(url, token)
        return install.gap_visible(status)

    plane.wait_until(visible, 180, "the fleet's GPUs and idle share from the server's Service")
    result["gap_visible_seconds"] = round(time.monotonic() - started, 2)
    result["status"] = status
    result["dashboard_served"] = "<title>gpufleet</title>" in install.dashboard(url)
    result["pods"] = [
        {
            "name": p["metadata"]["name"],
            "component": p["metadata"]["labels"].get("app.kubernetes.io/component"),
            "node": p["spec"].get("nodeName"),
            "ip": p.get("status", {}).get("podIP"),
            "serviceAccount": p["spec"].get("serviceAccountName"),
            "ready": _pod_ready(p),
        }
        for p in install.pods()
    ]
    result["containers"] = install.containers()
    plane.wait_until(
        lambda: install.gpu_healthy() is not None, 60, "the agent's GPUHealthy condition"
    )
    result["gpu_healthy"] = install.gpu_healthy()
    # what diagnosis reads of a failed pod: its log, from the kubelet, as the controller
    result["controller_reads_logs"] = install.logs_as(f"{RELEASE}-controller", "server")

    # observed; now declared (a pool, a team). The controller's pod deleted while a tenant
    # creates Jobs; then no controller at all (scaled to zero) while it creates more: every
    # create succeeds, held by the API server's policy, and each Job is admitted once when a
    # controller is back
    install.declare_fleet()
    install.log("deleting the controller's pod")
    plane.kubectl(
        "delete", "pod", "-n", NAMESPACE, "-l", "app.kubernetes.io/component=controller",
        "--wait=false",
    )  # fmt: skip
    down = time.monotonic()
    errors = install.tenant_jobs(tenant_jobs, "while-restarting")
    result["creates_while_controller_restarts"] = {
        "attempted": tenant_jobs,
        "succeeded": tenant_jobs - len(errors),
        "errors": errors[:3],
    }
    plane.wait_until(install.ready, 180, "the controller's new pod Ready")
    result["controller_back_seconds"] = round(time.monotonic() - down, 2)
    install.log("scaling the controller to zero")
    controller = f"deployment/{RELEASE}-controller"
    plane.kubectl("scale", controller, "-n", NAMESPACE, "--replicas=0")
    plane.wait_until(lambda: not _controllers(install), 120, "no controller pod left")
    errors = install.tenant_jobs(tenant_jobs, "while-down")
    with contextlib.suppress(ClusterError):  # the Job controller makes their pods, held
        plane.wait_until(
            lambda: install.held_pods("while-down") == tenant_jobs - len(errors), 60, "pods"
        )
    result["creates_while_controller_down"] = {
        "attempted": tenant_jobs,
        "succeeded": tenant_jobs - len(errors),
        "errors": errors[:3],
        "heldPods": install.held_pods("while-down"),
    }
    back = time.monotonic()
    plane.kubectl("scale", controller, "-n", NAMESPACE, "--replicas=1")
    created = result["creates_while_controller_restarts"]["succeeded"] + tenant_jobs - len(errors)
    plane.wait_until(
        lambda: install.tenant_work()["runningPods"] == created,
        180,
        "the tenant's Jobs admitted and running",
    )
    result["all_admitted_seconds"] = round(time.monotonic() - back, 2)
    result["tenant_after_restart"] = install.tenant_work()

    # an upgrade to a changed value: the same pods still run after the controller rolled
    before = install.tenant_work()
    started = time.monotonic()
    out = install.helm(
        "upgrade", RELEASE, str(chart), "-n", NAMESPACE,
        *install.values("--set", "controller.interval=3"),
    )  # fmt: skip
    if out.returncode != 0:
        raise ClusterError(f"helm upgrade failed: {out.stderr.strip()}")
    plane.wait_until(lambda: _rolled(install, "--interval=3"), 180, "the upgraded controller")
    result["upgrade_seconds"] = round(time.monotonic() - started, 2)
    wait_cycles(plane, install.controller_cycles)  # of the new controller: nothing changes
    after = install.tenant_work()
    result["tenant_before_upgrade"], result["tenant_after_upgrade"] = before, after
    result["workloads_lost_in_upgrade"] = len(
        set(before["runningPodUIDs"]) - set(after["runningPodUIDs"])
    )
    install.log("a GPU Job that fails on the real node")
    result["gpu_failure"] = install.gpu_failure_on_the_node()

    started = time.monotonic()
    out = install.helm("uninstall", RELEASE, "-n", NAMESPACE, "--wait")
    if out.returncode != 0:
        raise ClusterError(f"helm uninstall failed: {out.stderr.strip()}")
    result["uninstall_seconds"] = round(time.monotonic() - started, 2)
    result["left_behind"] = install.leftovers()
    result["kept_after_uninstall"] = install.kept()
    return result


def _controllers(install: Install) -> list[dict[str, Any]]:
    return [
        p
        for p in install.pods()
        if p["metadata"]["labels"].get("app.kubernetes.io/component") == "controller"
    ]


def _rolled(install: Install, arg: str) -> bool:
    pods = _controllers(install)
    return (
        len(pods) == 1
        and arg in pods[0]["spec"]["containers"][0]["args"]
        and _pod_ready(pods[0])
        and install.ready()
    )


def _held(pod: dict[str, Any]) -> bool:
    return {"name": ADMISSION_GATE} in (pod["spec"].get("schedulingGates") or [])


def _pod_ready(pod: dict[str, Any]) -> bool:
    return any(
        c["type"] == "Ready" and c["status"] == "True"
        for c in pod.get("status", {}).get("conditions", [])
    )


def _tenant_job(name: str) -> dict[str, Any]:
    """One pod of one GPU, of the tenant's team, that kwok runs for an hour."""
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": TENANT, "labels": {"gpufleet.io/team": TEAM}},
        "spec": {
            "backoffLimit": 0,
            "template": {
                # how long kwok runs the pod (gpufleet.testing's kwok stages)
                "metadata": {"annotations": {"gpufleet.io/run-for": "1h"}},
                "spec": {
                    "restartPolicy": "Never",
                    "tolerations": [{"key": GPU_RESOURCE, "operator": "Exists"}],
                    "containers": [
                        {
                            "name": "train",
                            "image": "example.com/train:1",
                            "resources": {"limits": {GPU_RESOURCE: "1"}},
                        }
                    ],
                },
            },
        },
    }
