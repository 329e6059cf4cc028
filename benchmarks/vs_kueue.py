"""gpufleet side by side with Kueue and with plain Kubernetes, on the same scenario (scenario.py)
and a fresh local control plane per system. Prints JSON; not a timed test.

    hack/k8s/build.sh kueue              # once: Kueue v0.19.2's manager from its Go module
    python benchmarks/vs_kueue.py        # 125 nodes, 1,000 elastic Jobs, a 500-GPU reclaim
    python benchmarks/vs_kueue.py --nodes 8 --jobs 64 --reclaim 16    # a smoke run

Systems: `plain` (no admission control: the harness's limit), `kueue` as shipped (its API client
limited to 50 requests/s, burst 100), `kueue-500` (500/s, burst 1,000) and `gpufleet`; on
request, `ideal-suspend` and `ideal-gate` (the client itself admitting each Job at once, held
suspended or by a scheduling gate: the floors of the two ways to hold a Job, controller_e2e.py)
and `ideal-webhook` (ideal-suspend with gpufleet's webhook suspending each Job).
Kueue runs outside a cluster: leader election and its certificate management off, a self-signed
webhook pair (its webhooks are not registered: Jobs are created suspended with the
`kueue.x-k8s.io/queue-name` label and need none), batch/Job integration only, feature gate
VisibilityOnDemand off. Two ClusterQueues share one cohort: `owner` with a nominal quota of
`--reclaim` GPUs and `reclaimWithinCohort: Any`, `batch` with the rest.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

from controller_e2e import Gpufleet, IdealGate, IdealSuspend, IdealWebhook, Plain
from scenario import NAMESPACE, Scenario, System, cpu_seconds, run, stop_process

from gpufleet.pki import create_ca, issue_serving_cert
from gpufleet.testing.cluster import ControlPlane, default_bin_dir, free_port, missing_binaries

KUEUE_VERSION = "v0.19.2"
KUEUE_API = "kueue.x-k8s.io/v1beta2"
# the newest KAI Scheduler release the Go module proxy serves here (v0.13 and later are refused)
KAI_VERSION = "v0.12.0"
KAI_MODULE = "github.com/NVIDIA/KAI-scheduler"
KAI_SCHEDULER = "kai-scheduler"
KAI_BINARIES = ("kai-scheduler", "kai-binder", "kai-podgrouper", "kai-queuecontroller")
GPU = "nvidia.com/gpu"


METRICS_CERTS = Path("/etc/kueue/metrics/certs")


def ensure_metrics_certs(certs: Path) -> Path:
    """Kueue (v0.17.0, v0.19.2) reads its metrics server's pair from this fixed path when its
    own certificate management is off (cmd/kueue/main.go), even with metrics turned off."""
    if not (METRICS_CERTS / "tls.crt").exists():
        try:
            METRICS_CERTS.mkdir(parents=True, exist_ok=True)
            for name in ("tls.crt", "tls.key"):
                (METRICS_CERTS / name).write_bytes((certs / name).read_bytes())
        except OSError as err:
            raise SystemExit(
                f"Kueue needs a TLS pair in {METRICS_CERTS} ({err}); create it (any self-signed "
                "pair: tls.crt, tls.key) or run as a user who may"
            ) from None
        print(f"wrote a self-signed pair to {METRICS_CERTS} for Kueue", file=sys.stderr)
    return METRICS_CERTS


def module_dir(module: str, version: str) -> Path:
    """A Go module's source (its CRDs), from the Go module cache."""
    found = subprocess.run(
        ["go", "mod", "download", "-json", f"{module}@{version}"],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "GOFLAGS": "-mod=mod"},
    )
    return Path(json.loads(found.stdout)["Dir"])


class Kueue(System):
    reclaims = True

    def __init__(self, qps: int, burst: int) -> None:
        self.qps, self.burst = qps, burst
        self.name = "kueue" if qps == 50 else f"kueue-{qps}"
        self.process: subprocess.Popen[bytes] | None = None
        self.log: Path | None = None

    def start(self, plane: ControlPlane, work: Path, scenario: Scenario) -> int | None:
        kueue = module_dir("sigs.k8s.io/kueue", KUEUE_VERSION)
        plane.install_crds([kueue / "config/components/crd/bases"])
        certs = work / "kueue-certs"
        pki = create_ca(certs)
        issue_serving_cert(
            pki.ca_cert, pki.ca_key, certs / "tls.crt", certs / "tls.key", ["127.0.0.1"]
        )
        ensure_metrics_certs(certs)
        config = {
            "apiVersion": "config.kueue.x-k8s.io/v1beta2",
            "kind": "Configuration",
            "health": {"healthProbeBindAddress": f"127.0.0.1:{free_port()}"},
            "metrics": {"bindAddress": "0"},
            "webhook": {"port": free_port(), "host": "127.0.0.1", "certDir": str(certs)},
            "leaderElection": {"leaderElect": False},
            "internalCertManagement": {"enable": False},
            "clientConnection": {"qps": self.qps, "burst": self.burst},
            "integrations": {"frameworks": ["batch/job"]},
        }
        (work / "kueue.yaml").write_text(yaml.safe_dump(config))
        self.log = work / "kueue.log"
        self.process = subprocess.Popen(
            [
                str(default_bin_dir() / "kueue"),
                f"--config={work / 'kueue.yaml'}",
                "--feature-gates=VisibilityOnDemand=false",
            ],
            env={**os.environ, "KUBECONFIG": str(plane.kubeconfig)},
            stdout=self.log.open("wb"),
            stderr=subprocess.STDOUT,
        )
        gpus = scenario.nodes * 8
        plane.apply(
            [
                {"apiVersion": KUEUE_API, "kind": "ResourceFlavor", "metadata": {"name": "h100"}},
                self._cluster_queue("batch", gpus - scenario.reserved_gpus, reclaim=False),
                self._cluster_queue("owner", scenario.reserved_gpus, reclaim=True),
                *(
                    {
                        "apiVersion": KUEUE_API,
                        "kind": "LocalQueue",
                        "metadata": {"name": team, "namespace": NAMESPACE},
                        "spec": {"clusterQueue": team},
                    }
                    for team in ("batch", "owner")
                ),
            ]
        )
        plane.wait_until(self._active(plane), 120, "Kueue's ClusterQueues to be active")
        return self.process.pid

    @staticmethod
    def _cluster_queue(name: str, gpus: int, reclaim: bool) -> dict[str, Any]:
        spec: dict[str, Any] = {
            "namespaceSelector": {},  # every namespace (a missing selector matches none)
            "cohortName": "fleet",
            "resourceGroups": [
                {
                    "coveredResources": [GPU],
                    "flavors": [
                        {"name": "h100", "resources": [{"name": GPU, "nominalQuota": gpus}]}
                    ],
                }
            ],
        }
        if reclaim:
            spec["preemption"] = {"reclaimWithinCohort": "Any", "withinClusterQueue": "Never"}
        return {
            "apiVersion": KUEUE_API,
            "kind": "ClusterQueue",
            "metadata": {"name": name},
            "spec": spec,
        }

    def _active(self, plane: ControlPlane) -> Any:
        def check() -> bool:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"kueue exited (code {self.process.returncode}); see {self.log}")
            queues = plane.get("clusterqueues.kueue.x-k8s.io")["items"]
            return len(queues) == 2 and all(
                any(
                    c["type"] == "Active" and c["status"] == "True"
                    for c in (q.get("status") or {}).get("conditions", [])
                )
                for q in queues
            )

        return check

    def labels(self, team: str, cls: str) -> dict[str, str]:
        return {"kueue.x-k8s.io/queue-name": team}

    def suspend_on_create(self) -> bool:
        return True

    def preempts_itself(self) -> bool:
        return False

    def stop(self) -> None:
        stop_process(self.process, "kueue")

    def extra(self) -> dict[str, Any]:
        text = self.log.read_text(errors="replace") if self.log else ""
        # built against an older Kubernetes API than the harness's, it retries
        # "spec.template: field is immutable" on 1.37 while a suspended Job still has active pods
        return {"immutable_template_retries": text.count("field is immutable")}


class Kai(System):
    """NVIDIA KAI Scheduler: its scheduler, binder, pod-grouper and queue controller, each a
    process beside the control plane (leader election off; the queue controller's webhook off,
    as nothing registers it). Two leaf queues under one parent: `owner` with a quota of
    `--reclaim` GPUs, `batch` with the rest, both with no limit, so batch's Jobs borrow the
    owner's idle quota and KAI's reclaim action takes it back. The Jobs name `kai-scheduler` as
    their scheduler; a Job's pod evicted by KAI (condition DisruptionTarget, which the scheduler
    is told to set) is not counted as failed, so a preempted Job makes its pod again and waits,
    as gpufleet's do."""

    reclaims = True
    name = "kai"

    def __init__(self) -> None:
        self.processes: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, plane: ControlPlane, work: Path, scenario: Scenario) -> int | None:
        plane.install_crds([module_dir(KAI_MODULE, KAI_VERSION) / "deployments/kai-scheduler/crds"])

        def bind() -> str:
            return f"127.0.0.1:{free_port()}"

        flags = {
            "kai-scheduler": [
                f"--scheduler-name={KAI_SCHEDULER}",
                f"--listen-address={bind()}",
                f"--plugin-server-port={free_port()}",
                "--update-pod-eviction-condition=true",
            ],
            "kai-binder": [
                f"--scheduler-name={KAI_SCHEDULER}",
                f"--metrics-bind-address={bind()}",
                f"--health-probe-bind-address={bind()}",
            ],
            "kai-podgrouper": [
                f"--scheduler-name={KAI_SCHEDULER}",
                f"--metrics-bind-address={bind()}",
                f"--health-probe-bind-address={bind()}",
            ],
            "kai-queuecontroller": ["--enable-webhook=false", f"--metrics-listen-address={bind()}"],
        }
        for binary, args in flags.items():
            self.processes[binary] = subprocess.Popen(
                [str(default_bin_dir() / binary), *args],
                env={**os.environ, "KUBECONFIG": str(plane.kubeconfig)},
                stdout=(work / f"{binary}.log").open("wb"),
                stderr=subprocess.STDOUT,
            )
        gpus = scenario.nodes * 8
        plane.apply(
            [
                self._queue("fleet", gpus, None),
                self._queue("batch", gpus - scenario.reserved_gpus, "fleet"),
                self._queue("owner", scenario.reserved_gpus, "fleet"),
            ]
        )
        plane.wait_until(self._ready(work), 120, "KAI's scheduler to see its queues")
        return self.processes["kai-scheduler"].pid

    @staticmethod
    def _queue(name: str, gpus: int, parent: str | None) -> dict[str, Any]:
        spec: dict[str, Any] = {
            "resources": {
                resource: {"quota": quota, "limit": -1, "overQuotaWeight": 1}
                for resource, quota in (("gpu", gpus), ("cpu", -1), ("memory", -1))
            }
        }
        if parent is not None:
            spec["parentQueue"] = parent
        return {
            "apiVersion": "scheduling.run.ai/v2",
            "kind": "Queue",
            "metadata": {"name": name},
            "spec": spec,
        }

    def _ready(self, work: Path) -> Callable[[], bool]:
        def check() -> bool:
            for binary, process in self.processes.items():
                if process.poll() is not None:
                    where = work / f"{binary}.log"
                    raise RuntimeError(f"{binary} exited (code {process.returncode}); see {where}")
            # the queues have no status before they have work: the scheduler's log says it
            # sees both leaf queues
            log = (work / "kai-scheduler.log").read_text(errors="replace")
            return "<2> Queues in total" in log

        return check

    def labels(self, team: str, cls: str) -> dict[str, str]:
        return {"kai.scheduler/queue": team}

    def shape(self, body: dict[str, Any]) -> dict[str, Any]:
        body["spec"]["template"]["spec"]["schedulerName"] = KAI_SCHEDULER
        body["spec"]["podFailurePolicy"] = {
            "rules": [{"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}]
        }
        return body

    def stop(self) -> None:
        for binary, process in self.processes.items():
            stop_process(process, binary)

    def extra(self) -> dict[str, Any]:
        """Each process's CPU seconds so far (the run's figures by process count only the
        scheduler's), and its exit code where it stopped on its own during the run."""
        return {
            "cpu_seconds_by_kai_process": {
                binary: round(cpu_seconds(process.pid) or 0.0, 1)
                for binary, process in self.processes.items()
            },
            "exited": {
                binary: process.returncode
                for binary, process in self.processes.items()
                if process.poll() not in (None, 0, -15)
            },
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    Scenario.add_arguments(parser)
    parser.add_argument(
        "--systems", default="plain,kueue,kueue-500,gpufleet", help="comma-separated, in order"
    )
    args = parser.parse_args()
    names = args.systems.split(",")
    extra = {"kueue": ("kueue",), "kueue-500": ("kueue",), "kai": KAI_BINARIES}
    wanted = {b for name in names for b in extra.get(name, ())}
    missing = missing_binaries(default_bin_dir()) + sorted(
        b for b in wanted if not (default_bin_dir() / b).exists()
    )
    if missing:
        targets = " ".join(sorted({"kai" if b.startswith("kai") else "kueue" for b in wanted}))
        skipped = f"{', '.join(missing)} missing; run hack/k8s/build.sh {targets}"
        print(json.dumps({"skipped": skipped}))
        return
    scenario = Scenario.from_args(args)
    systems: dict[str, Callable[[], System]] = {
        "plain": Plain,
        "kueue": lambda: Kueue(50, 100),
        "kueue-500": lambda: Kueue(500, 1000),
        "kai": Kai,
        "gpufleet": Gpufleet,
        "ideal-suspend": IdealSuspend,
        "ideal-gate": IdealGate,
        "ideal-webhook": IdealWebhook,
    }
    results: dict[str, Any] = {}
    for name in names:
        system = systems[name]()
        started = time.monotonic()
        results[name] = run(system, scenario, lambda m: print(m, file=sys.stderr, flush=True))
        results[name]["benchmark_seconds"] = round(time.monotonic() - started, 1)
        # each system's figures as soon as they are known: a later failure loses nothing
        print(json.dumps({name: results[name]}), file=sys.stderr, flush=True)
    print(
        json.dumps(
            {
                "machine": {"cpus": os.cpu_count()},
                "scenario": vars(args),
                "systems": results,
                "ratios": ratios(results),
            },
            indent=2,
        )
    )


def ratios(results: dict[str, Any]) -> dict[str, Any]:
    """gpufleet against the others, on the acceptance figures."""
    ours = results.get("gpufleet")
    if not ours:
        return {}
    out: dict[str, Any] = {}
    for name, other in results.items():
        if name == "gpufleet":
            continue
        for figure in ("create_seconds", "all_running_seconds"):
            if other.get(figure):
                out[f"{figure} gpufleet/{name}"] = round(ours[figure] / other[figure], 2)
        theirs = (other.get("reclaim") or {}).get("latency_seconds", {}).get("p99")
        mine = (ours.get("reclaim") or {}).get("latency_seconds", {}).get("p99")
        if theirs and mine:
            out[f"reclaim_p99 gpufleet/{name}"] = round(mine / theirs, 2)
        theirs = (other.get("gang") or {}).get("all_running_seconds")
        mine = (ours.get("gang") or {}).get("all_running_seconds")
        if theirs and mine:
            out[f"gang_all_running gpufleet/{name}"] = round(mine / theirs, 2)
    return out


if __name__ == "__main__":
    main()
