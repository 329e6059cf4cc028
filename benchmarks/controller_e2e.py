"""End-to-end controller benchmark on the local control plane. Prints JSON; not a timed test.

    python benchmarks/controller_e2e.py                 # 125 nodes, 1,000 jobs, 500-GPU reclaim
    python benchmarks/controller_e2e.py --nodes 8 --jobs 64 --reclaim 16   # a smoke run
    python benchmarks/controller_e2e.py --system plain  # no admission control: the floor
    python benchmarks/controller_e2e.py --system ideal-suspend   # an instant controller's floor
    python benchmarks/controller_e2e.py --system ideal-webhook   # the same, gpufleet's webhook
    python benchmarks/controller_e2e.py --nodes 1000 --jobs 10000 --reclaim 0   # the scale run
    python benchmarks/controller_e2e.py --systems plain,ideal-gate,gpufleet --rounds 3
        # rounds alternating the systems: each round's figures, medians and spread, and the
        # medians' ratios to the floors
    python benchmarks/controller_e2e.py --systems plain,ideal-gate,gpufleet --gang 32
        # scenario (b): a reserved gang of 32 pods x 8 GPUs onto the full cluster

The scenario (admission of elastic Jobs, then a wave of reserved Jobs reclaiming borrowed GPUs)
is described in scenario.py. For gpufleet the report adds the loop's cycle-time quantiles and
cycle count from the controller's own metrics.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from kubernetes import client
from prometheus_client.parser import text_string_to_metric_families

from gpufleet.model.keys import CLASS_LABEL, TEAM_LABEL

sys.path.insert(0, str(Path(__file__).resolve().parent))

from scenario import (
    JOB_NAME_LABEL,
    NAMESPACE,
    SUSPEND,
    Scenario,
    System,
    api_client,
    run,
    stop_process,
)

from gpufleet.controllers.actions import unfinalize
from gpufleet.controllers.admission_process import AdmissionProcess, FleetMirror
from gpufleet.controllers.webhooks import WebhookRegistration
from gpufleet.kube.kinds.job import JOB_TRACKING_FINALIZER
from gpufleet.model.fleet import fleet_from_objects
from gpufleet.pki import create_ca, issue_serving_cert
from gpufleet.render.priorityclasses import render_priority_classes
from gpufleet.testing.cluster import ControlPlane, default_bin_dir, free_port, missing_binaries

API = "gpufleet.io/v1alpha1"
RESUME = {"spec": {"suspend": False}}


class Plain(System):
    """Kubernetes without admission control: Jobs start as soon as the scheduler places them.
    Its reclaim is the harness's floor: the client suspends a victim right after each create."""

    name = "plain"
    reclaims = True

    def start(self, plane: ControlPlane, work: Path, scenario: Scenario) -> int | None:
        return None

    def labels(self, team: str, cls: str) -> dict[str, str]:
        return {}

    def preempts_itself(self) -> bool:
        return True

    def created(self, api: client.ApiClient, name: str, victims: list[str]) -> None:
        batch = client.BatchV1Api(api)
        each(
            victims,
            lambda victim: batch.patch_namespaced_job(
                victim, NAMESPACE, SUSPEND, _preload_content=False, _request_timeout=60
            ),
        )


def each(victims: list[str], preempt: Callable[[str], object]) -> None:
    """Preempt the victims: one in the calling thread, a gang's from 8 threads, as a
    controller's writer would."""
    if len(victims) <= 1:
        for victim in victims:
            preempt(victim)
        return
    with ThreadPoolExecutor(8, thread_name_prefix="bench-preempt") as pool:
        list(pool.map(preempt, victims))


class IdealSuspend(Plain):
    """The floor of a controller that holds Jobs suspended until it admits them (gpufleet,
    Kueue): the client creates each Job suspended and resumes it at once, as an instant
    controller that costs nothing would: an elastic Job from threads of its own, as a controller
    would (the creates are then timed alone), a reserved one in the creating thread right after
    suspending its victim. The Job controller syncs each Job twice, and makes its pods only once
    it is resumed."""

    name = "ideal-suspend"

    def __init__(self) -> None:
        self.admit = ThreadPoolExecutor(8, thread_name_prefix="bench-admit")

    def suspend_on_create(self) -> bool:
        return True

    def created(self, api: client.ApiClient, name: str, victims: list[str]) -> None:
        if not victims:
            self.admit.submit(self._admit, api, name, victims)
        else:  # the reclaim at once, in the creating thread: no queue before the preemption
            self._admit(api, name, victims)

    def _admit(self, api: client.ApiClient, name: str, victims: list[str]) -> None:
        super().created(api, name, victims)
        client.BatchV1Api(api).patch_namespaced_job(
            name, NAMESPACE, RESUME, _preload_content=False, _request_timeout=60
        )

    def stop(self) -> None:
        self.admit.shutdown(wait=False, cancel_futures=True)


class IdealWebhook(IdealSuspend):
    """The same floor with gpufleet's own webhook in front of the creates: its process, sent
    the benchmark's fleet, suspends each Job and sets its PriorityClass and toleration as in
    gpufleet; the client admits at once as for ideal-suspend. What the webhook alone costs the
    creates, with no loop, GPUWorkloads or Events beside it."""

    name = "ideal-webhook"

    def __init__(self) -> None:
        super().__init__()
        self.admission: AdmissionProcess | None = None

    def start(self, plane: ControlPlane, work: Path, scenario: Scenario) -> int | None:
        plane.apply(render_priority_classes())
        source = FleetMirror()  # the benchmark's fleet, never changed
        source.fleet, source.fleet_version = fleet_from_objects(fleet_objects(scenario)).fleet, 0
        pki = create_ca(work / "webhook")
        certfile, keyfile = work / "webhook" / "webhook.crt", work / "webhook" / "webhook.key"
        issue_serving_cert(pki.ca_cert, pki.ca_key, certfile, keyfile, ["127.0.0.1"])
        port = free_port()
        self.admission = AdmissionProcess(
            "127.0.0.1", port, certfile, keyfile, source, threading.Event()
        )
        self.admission.start()
        WebhookRegistration(
            client.AdmissionregistrationV1Api(api_client(plane.kubeconfig, 1)),
            "127.0.0.1",
            port,
            pki.ca_cert,
        ).register(["kube-system"])
        pid: int | None = self.admission.pid
        return pid

    def labels(self, team: str, cls: str) -> dict[str, str]:
        return gpufleet_labels(team, cls)

    def suspend_on_create(self) -> bool:
        return False  # the webhook suspends

    def stop(self) -> None:
        super().stop()
        if self.admission is not None:
            self.admission.stop()


class IdealGate(Plain):
    """The floor of a controller that holds a Job's pods with a scheduling gate instead (as
    gpufleet holds Deployments and LeaderWorkerSets): the Job controller makes the pods at
    once, held, and the client releases each as soon as its watch shows it (one pod patch). A
    victim's running pods are deleted uncounted (the Job controller's finalizer off first, as it
    does for a suspended Job); the new pods its Job makes are left held."""

    name = "ideal-gate"
    gate = "bench.gpufleet.io/hold"

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.held: set[str] = set()  # preempted Jobs, whose pods stay gated
        self.released: set[str] = set()  # pod uids
        self.live: dict[str, dict[str, dict[str, Any]]] = {}  # Job -> pod name -> pod
        self.writes = ThreadPoolExecutor(8, thread_name_prefix="bench-release")

    def pod_seen(self, api: client.ApiClient, event: str, pod: dict[str, Any]) -> None:
        metadata = pod["metadata"]
        owner = (metadata.get("labels") or {}).get(JOB_NAME_LABEL)
        if owner is None:
            return
        with self.lock:
            pods = self.live.setdefault(owner, {})
            if event == "DELETED":
                pods.pop(metadata["name"], None)
                return
            pods[metadata["name"]] = pod
            gates = [g["name"] for g in (pod.get("spec") or {}).get("schedulingGates") or []]
            if self.gate not in gates or owner in self.held or metadata["uid"] in self.released:
                return
            self.released.add(metadata["uid"])
        release: list[dict[str, Any]] = [
            {"op": "test", "path": "/spec/schedulingGates", "value": [{"name": self.gate}]},
            {"op": "remove", "path": "/spec/schedulingGates"},
        ]
        self.writes.submit(self._patch, api, metadata["name"], release)

    def created(self, api: client.ApiClient, name: str, victims: list[str]) -> None:
        each(victims, lambda victim: self._preempt(api, victim))

    def _preempt(self, api: client.ApiClient, victim: str) -> None:
        with self.lock:
            self.held.add(victim)
            pods = list(self.live.get(victim, {}).values())
        core = client.CoreV1Api(api)
        for pod in pods:
            metadata = pod["metadata"]
            finalizers = metadata.get("finalizers") or []
            if metadata.get("deletionTimestamp") or JOB_TRACKING_FINALIZER not in finalizers:
                continue
            self._patch(api, metadata["name"], unfinalize(pod, JOB_TRACKING_FINALIZER))
            core.delete_namespaced_pod(
                metadata["name"], NAMESPACE, _preload_content=False, _request_timeout=60
            )

    @staticmethod
    def _patch(api: client.ApiClient, pod: str, patch: list[dict[str, Any]]) -> None:
        client.CoreV1Api(api).patch_namespaced_pod(
            pod, NAMESPACE, patch, _preload_content=False, _request_timeout=60
        )

    def stop(self) -> None:
        self.writes.shutdown(wait=False, cancel_futures=True)


class Gpufleet(System):
    """`gpufleet controller run` as its own process, with its webhooks."""

    name = "gpufleet"
    reclaims = True

    def __init__(self, interval: float = 5.0) -> None:
        self.interval = interval
        self.process: subprocess.Popen[bytes] | None = None
        self.metrics_port = free_port()

    def start(self, plane: ControlPlane, work: Path, scenario: Scenario) -> int | None:
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gpufleet",
                "controller",
                "run",
                f"--kubeconfig={plane.kubeconfig}",
                f"--webhook-port={free_port()}",
                f"--state-dir={work}",
                f"--metrics-port={self.metrics_port}",
                "--metrics-host=127.0.0.1",
                f"--interval={self.interval}",
            ],
            stdout=(work / "controller.log").open("wb"),
            stderr=subprocess.STDOUT,
        )
        plane.wait_until(
            lambda: (
                plane.kubectl(
                    "get", "mutatingwebhookconfiguration", "gpufleet.io", check=False
                ).returncode
                == 0
            ),
            60,
            "the controller's webhooks",
        )
        plane.apply(fleet_objects(scenario))
        time.sleep(2)  # the fleet objects reach the controller's caches through its watches
        return self.process.pid

    def labels(self, team: str, cls: str) -> dict[str, str]:
        return gpufleet_labels(team, cls)

    # suspend_on_create: False, the webhook suspends; users create Jobs as they always have

    def stop(self) -> None:
        stop_process(self.process, "the controller")

    def extra(self) -> dict[str, Any]:
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        text = urllib.request.urlopen(url, timeout=10).read().decode()
        buckets: list[tuple[float, float]] = []
        count = total = 0.0
        for family in text_string_to_metric_families(text):
            if family.name != "gpufleet_cycle_seconds":
                continue
            for sample in family.samples:
                if sample.name.endswith("_bucket"):
                    buckets.append((float(sample.labels["le"]), sample.value))
                elif sample.name.endswith("_count"):
                    count = sample.value
                elif sample.name.endswith("_sum"):
                    total = sample.value
        return {
            "cycles": int(count),
            "cycle_seconds_mean": round(total / count, 3) if count else None,
            "cycle_seconds_at_most": {
                "p50": _bucket_quantile(buckets, count, 0.5),
                "p99": _bucket_quantile(buckets, count, 0.99),
            },
        }


def gpufleet_labels(team: str, cls: str) -> dict[str, str]:
    """The labels that make a Job one of gpufleet's: its team and class."""
    return {TEAM_LABEL: team, CLASS_LABEL: cls}


def fleet_objects(scenario: Scenario) -> list[dict[str, Any]]:
    """The GitOps objects of the benchmark: one pool of every node, two teams, the owner's
    reservation (`scenario.reserved_gpus`), a one-second minRuntime."""
    return [
        {
            "apiVersion": API,
            "kind": "GPUPool",
            "metadata": {"name": "bench"},
            "spec": {
                "provider": "static",
                "gpuType": "H100",
                "gpusPerNode": 8,
                "maxGPUs": scenario.nodes * 8,
                "nodeSelector": {"gpufleet.io/pool": "bench"},
            },
        },
        # both in the benchmark's namespace: a team label is honoured only there
        *(
            {
                "apiVersion": API,
                "kind": "Team",
                "metadata": {"name": team},
                "spec": {"namespaces": [NAMESPACE]},
            }
            for team in ("batch", "owner")
        ),
        *(
            [
                {
                    "apiVersion": API,
                    "kind": "Reservation",
                    "metadata": {"name": "owner"},
                    "spec": {"team": "owner", "pool": "bench", "gpus": scenario.reserved_gpus},
                }
            ]
            if scenario.reserved_gpus  # --reclaim 0: admission only
            else []
        ),
        {
            "apiVersion": API,
            "kind": "FleetPolicy",
            "metadata": {"name": "bench"},
            "spec": {"preemption": {"minRuntime": "1s"}},
        },
    ]


SYSTEMS: dict[str, type[System]] = {
    "gpufleet": Gpufleet,
    "plain": Plain,
    "ideal-suspend": IdealSuspend,
    "ideal-webhook": IdealWebhook,
    "ideal-gate": IdealGate,
}


def _bucket_quantile(buckets: list[tuple[float, float]], count: float, q: float) -> float | None:
    """The upper bound of the histogram bucket that holds quantile `q`."""
    for bound, cumulative in sorted(buckets):
        if count and cumulative >= q * count:
            return bound
    return None


HEADLINE = {
    "create_seconds": ("create_seconds",),
    "all_running_seconds": ("all_running_seconds",),
    "reclaim_p50_seconds": ("reclaim", "latency_seconds", "p50"),
    "reclaim_p99_seconds": ("reclaim", "latency_seconds", "p99"),
    "elastic_preempted": ("reclaim", "elastic_preempted"),
    "kube_apiserver_cpu_seconds": (
        "cpu_seconds_by_process_until_all_running",
        "kube-apiserver",
    ),
    "gang_all_running_seconds": ("gang", "all_running_seconds"),
    "gang_elastic_preempted": ("gang", "elastic_preempted"),
}
FLOORS = ("plain", "ideal-gate", "ideal-suspend")


def headline(figures: dict[str, Any], jobs: int) -> dict[str, Any]:
    """The figures issue 42's acceptance is stated in, from one run's report."""
    out: dict[str, Any] = {}
    for name, path in HEADLINE.items():
        value: Any = figures
        for key in path:
            value = (value or {}).get(key) if isinstance(value, dict) else None
        out[name] = value
    requests = figures.get("apiserver_requests_until_all_running") or {}
    out["api_requests_per_job"] = round(sum(requests.values()) / jobs, 2) if requests else None
    # where a reclaim's time goes, and which requests a Job costs (not summarized: a record)
    reclaim = figures.get("reclaim") or {}
    out["reclaim_parts"] = {k: v for k, v in reclaim.items() if k.endswith("_seconds")}
    if figures.get("gang"):
        out["gang_parts"] = figures["gang"]
    out["api_requests_until_all_running"] = requests
    return out


def rounds(names: list[str], args: argparse.Namespace, scenario: Scenario) -> dict[str, Any]:
    """`args.rounds` rounds, each running every system of `names` in turn (so that a drift of
    the machine over the run is shared), a fresh control plane each: every round's headline
    figures, each system's median, min and max, and the medians' ratios to the floors."""

    def say(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    runs: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    for index in range(args.rounds):
        for name in names:
            system = Gpufleet(args.interval) if name == "gpufleet" else SYSTEMS[name]()
            say(f"round {index + 1}/{args.rounds}: {name}")
            figures = headline(run(system, scenario, say), scenario.jobs)
            runs[name].append(figures)
            print(json.dumps({"round": index + 1, name: figures}), file=sys.stderr, flush=True)
    summary: dict[str, dict[str, Any]] = {}
    for name, results in runs.items():
        summary[name] = {}
        for figure in results[0]:
            if figure in ("reclaim_parts", "gang_parts", "api_requests_until_all_running"):
                continue
            values = sorted(r[figure] for r in results if r[figure] is not None)
            if values:
                summary[name][figure] = {
                    "median": statistics.median(values),
                    "min": values[0],
                    "max": values[-1],
                }
    ratios: dict[str, float] = {}
    for name in names:
        for floor in FLOORS:
            if floor == name or floor not in summary:
                continue
            for figure, stats in summary[name].items():
                base = summary[floor].get(figure, {}).get("median")
                if base and "elastic_preempted" not in figure:
                    ratios[f"{figure} {name}/{floor}"] = round(stats["median"] / base, 2)
    return {
        "machine": {"cpus": os.cpu_count()},
        "scenario": {
            "nodes": args.nodes,
            "gpus": args.nodes * 8,
            "elastic_jobs": args.jobs,
            "reclaim_jobs": 0 if args.gang else args.reclaim,
            "gang_pods": args.gang,
            "rounds": args.rounds,
            "order": names,
        },
        "runs": runs,
        "summary": summary,
        "ratios_of_medians": ratios,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--system",
        choices=list(SYSTEMS),
        default="gpufleet",
        help="plain: no admission control; ideal-suspend, ideal-gate: the floors of a "
        "controller that holds Jobs suspended or their pods gated (the client decides, at once); "
        "ideal-webhook: ideal-suspend with gpufleet's webhook suspending the Jobs",
    )
    parser.add_argument(
        "--systems",
        help="comma-separated: run these in turn, --rounds times (overrides --system)",
    )
    parser.add_argument("--rounds", type=int, default=1, help="with --systems")
    Scenario.add_arguments(parser)
    parser.add_argument("--interval", type=float, default=5.0, help="controller resync interval")
    args = parser.parse_args()
    if missing_binaries(default_bin_dir()):
        print(json.dumps({"skipped": "control-plane binaries missing; run hack/k8s/build.sh"}))
        return
    scenario = Scenario.from_args(args)
    if args.systems:
        names = args.systems.split(",")
        unknown = [n for n in names if n not in SYSTEMS]
        if unknown:
            parser.error(
                f"unknown system(s) {', '.join(unknown)}; choose from {', '.join(SYSTEMS)}"
            )
        print(json.dumps(rounds(names, args, scenario), indent=2))
        return
    system = Gpufleet(args.interval) if args.system == "gpufleet" else SYSTEMS[args.system]()
    figures = run(system, scenario, lambda m: print(m, file=sys.stderr, flush=True))
    print(
        json.dumps(
            {
                "machine": {"cpus": os.cpu_count()},
                "system": system.name,
                "nodes": args.nodes,
                "gpus": args.nodes * 8,
                "elastic_jobs": args.jobs,
                **figures,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
