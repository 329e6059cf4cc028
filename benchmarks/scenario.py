"""The admission-and-reclaim scenario of `controller_e2e.py` and `vs_kueue.py`, for any system
that admits batch/v1 Jobs (plain Kubernetes, gpufleet, Kueue) on a fresh local control plane.

1. Admission: `jobs` single-GPU elastic Jobs of team `batch`, created by one client with
   `threads` threads, onto `nodes` fake 8-GPU nodes: create_seconds (first create call to the
   last one's answer) and all_running_seconds (to the last of them with a Running pod).
2. Reclaim (systems that reclaim): team `owner` holds a reservation of `reclaim` GPUs that
   `batch` has borrowed; `reclaim` single-GPU Jobs of `owner` arrive; each is timed from its own
   create call to its pod Running (an elastic Job must be preempted first). Plain Kubernetes
   has no reservations: its wave is the harness's floor for any system that preempts by
   suspending Jobs, the benchmark's client itself suspending one elastic Job right after each
   reserved create (a decision that costs nothing and is never late). The "ideal" systems of
   controller_e2e.py go further: the client holds every Job as a controller would (suspended,
   or its pods by a scheduling gate) and admits it at once, the floor of each way to hold one.
2b. Gang reclaim (`gang` > 0, instead of 2): `owner` holds a reservation of `gang` × 8 GPUs,
   all lent; one reserved Job of `gang` pods × 8 GPUs arrives, timed from its create call to
   all its pods Running. A system without a controller preempts from the client: every
   elastic Job on `gang` nodes, right after the create.

Times come from a pod watch of the benchmark's own, so every system is measured the same way;
the admitting process's CPU time and peak memory come from /proc; the API requests every
client sent, per verb and resource, from kube-apiserver's `apiserver_request_total`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client, config
from prometheus_client.parser import text_string_to_metric_families

from gpufleet.kube.cache import ClusterCache, Informer, Store, trim_pod
from gpufleet.testing.cluster import ControlPlane

NAMESPACE = "bench"
GPU = "nvidia.com/gpu"
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
SUSPEND = {"spec": {"suspend": True}}


@dataclass(frozen=True)
class Scenario:
    nodes: int = 125
    jobs: int = 1000
    reclaim: int = 500
    threads: int = 8
    timeout: float = 900
    quiet: float = 20  # seconds of nothing new after admission: what the system asks then
    gang: int = 0  # pods (8 GPUs each) of one reserved gang instead of the reclaim wave

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        """The scenario's command-line options (every benchmark that runs it takes them)."""
        parser.add_argument("--nodes", type=int, default=125)
        parser.add_argument("--jobs", type=int, default=1000)
        parser.add_argument("--reclaim", type=int, default=500)
        parser.add_argument(
            "--gang",
            type=int,
            default=0,
            help="scenario (b): instead of the reclaim wave, one reserved Job of this many pods "
            "x 8 GPUs onto the full cluster (the issue's is 32)",
        )
        parser.add_argument(
            "--threads", type=int, default=8, help="client threads that create Jobs"
        )
        parser.add_argument("--timeout", type=float, default=900)
        parser.add_argument(
            "--quiet", type=float, default=20, help="seconds with nothing new, after admission"
        )

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Scenario:
        return cls(
            args.nodes, args.jobs, args.reclaim, args.threads, args.timeout, args.quiet, args.gang
        )

    @property
    def reserved_gpus(self) -> int:
        """The GPUs of the owner's reservation, all lent to elastic work when it comes."""
        return self.gang * 8 if self.gang else self.reclaim


class System:
    """What the scenario needs from the system under test; the defaults are those of a system
    that runs on its own (a controller of its own, not the benchmark's client)."""

    name: str
    reclaims: bool  # False: the reclaim wave is skipped (nothing would preempt)
    gate: str | None = None  # a scheduling gate on every Job's pod template, None for none

    def start(self, plane: ControlPlane, work: Path, scenario: Scenario) -> int | None:
        """Install and start the system; the pid whose CPU and memory are reported."""
        raise NotImplementedError

    def labels(self, team: str, cls: str) -> dict[str, str]:
        raise NotImplementedError

    def suspend_on_create(self) -> bool:
        return False

    def shape(self, body: dict[str, Any]) -> dict[str, Any]:
        """What the system's users write into each Job beyond labels (a scheduler's name);
        the Job as it is by default."""
        return body

    def preempts_itself(self) -> bool:
        """True when the system has no controller of its own: the client preempts a victim per
        reclaim (`created` is then called with one)."""
        return False

    def created(self, api: client.ApiClient, name: str, victims: list[str]) -> None:
        """What the client does right after Job `name` is created, with `victims` the elastic
        Jobs it is to preempt for it; the systems with a controller do nothing."""

    def pod_seen(self, api: client.ApiClient, event: str, pod: dict[str, Any]) -> None:
        """Each event of the benchmark's pod watch (the whole pod), for a system whose client
        acts on pods."""

    def stop(self) -> None:
        pass

    def extra(self) -> dict[str, Any]:
        """System-specific figures for the report (cycle times, retries, ...)."""
        return {}


def job(
    name: str,
    labels: dict[str, str],
    suspend: bool,
    gate: str | None,
    pods: int = 1,
    gpus: int = 1,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": labels},
        "spec": {
            "suspend": suspend,
            "backoffLimit": 0,
            "parallelism": pods,
            "completions": pods,
            "template": {
                "metadata": {"annotations": {"gpufleet.io/run-for": "24h"}},
                "spec": {
                    "restartPolicy": "Never",
                    # the kwok GPU nodes carry the GPU Operator's taint; every system's Jobs
                    # get the same toleration so that none is slowed by a mutation the others skip
                    "tolerations": [{"key": GPU, "operator": "Exists", "effect": "NoSchedule"}],
                    "containers": [
                        {"name": "c", "image": "x", "resources": {"limits": {GPU: str(gpus)}}}
                    ],
                },
            },
        },
    }
    if gate is not None:
        body["spec"]["template"]["spec"]["schedulingGates"] = [{"name": gate}]
    return body


class RunningPods(ClusterCache):
    """The benchmark's pod and Job watches: when each Job was first admitted (seen unsuspended
    with no scheduling gate in its template, or a pod of it seen with no gate: a system that
    holds pods at a gate admits by releasing them), first had a pod, and first had a Running
    pod."""

    def __init__(self, on_pod: Callable[[str, dict[str, Any]], None]) -> None:
        super().__init__([Store("pods", trim=trim_pod), Store("jobs")])
        self.on_pod = on_pod
        self.admitted_at: dict[str, float] = {}
        self.created_at: dict[str, float] = {}
        self.running_at: dict[str, float] = {}
        # per Job, when each of its pods was first seen, released and Running (for a gang)
        self.pods_created: dict[str, dict[str, float]] = {}
        self.pods_released: dict[str, dict[str, float]] = {}
        self.pods_running: dict[str, dict[str, float]] = {}

    def _seen(self, kind: str, obj: dict[str, Any]) -> None:
        if kind == "jobs":
            spec = obj.get("spec") or {}
            gated = ((spec.get("template") or {}).get("spec") or {}).get("schedulingGates")
            if spec.get("suspend") is False and not gated:
                self.admitted_at.setdefault(obj["metadata"]["name"], time.monotonic())
            return
        pod = obj
        name = (pod["metadata"].get("labels") or {}).get(JOB_NAME_LABEL)
        if not name:
            return
        now = time.monotonic()
        pod_name = pod["metadata"]["name"]
        self.created_at.setdefault(name, now)
        self.pods_created.setdefault(name, {}).setdefault(pod_name, now)
        if not (pod.get("spec") or {}).get("schedulingGates"):
            self.admitted_at.setdefault(name, now)
            self.pods_released.setdefault(name, {}).setdefault(pod_name, now)
        if (pod.get("status") or {}).get("phase") == "Running":
            self.running_at.setdefault(name, now)
            self.pods_running.setdefault(name, {}).setdefault(pod_name, now)

    def apply_event(self, kind: str, event_type: str, obj: dict[str, Any]) -> None:
        self._seen(kind, obj)
        if kind == "pods":
            self.on_pod(event_type, obj)
        super().apply_event(kind, event_type, obj)

    def replace(self, kind: str, items: list[dict[str, Any]]) -> None:
        for obj in items:
            self._seen(kind, obj)
            if kind == "pods":
                self.on_pod("ADDED", obj)
        super().replace(kind, items)

    def running_jobs(self) -> set[str]:
        """The Jobs with a Running pod now (one not being deleted)."""
        return {
            (p["metadata"].get("labels") or {}).get(JOB_NAME_LABEL, "")
            for p in self.items("pods")
            if (p.get("status") or {}).get("phase") == "Running"
            and not p["metadata"].get("deletionTimestamp")
        }

    def count(self, prefix: str) -> int:
        return sum(name.startswith(prefix) for name in list(self.running_at))

    def jobs_on_nodes(self, prefix: str, nodes: int) -> list[str]:
        """The Jobs named `prefix`... with a Running pod on the first `nodes` nodes (by name)
        that run any: what a client that preempts must clear for a gang of `nodes` pods."""
        on: dict[str, set[str]] = {}
        for p in self.items("pods"):
            owner = (p["metadata"].get("labels") or {}).get(JOB_NAME_LABEL, "")
            node = (p.get("spec") or {}).get("nodeName")
            running = (p.get("status") or {}).get("phase") == "Running"
            if owner.startswith(prefix) and node and running:
                on.setdefault(node, set()).add(owner)
        return sorted(j for node in sorted(on)[:nodes] for j in on[node])


def api_client(kubeconfig: Path, pool: int) -> client.ApiClient:
    configuration = client.Configuration()
    config.load_kube_config(str(kubeconfig), client_configuration=configuration)
    configuration.connection_pool_maxsize = pool
    return client.ApiClient(configuration)


def create_all(
    batch: client.BatchV1Api,
    jobs: list[dict[str, Any]],
    threads: int,
    created: Callable[[int], None] | None = None,
) -> dict[str, float]:
    """Create the Jobs from `threads` threads; when each create call was made. `created(i)`
    runs right after the create of Job i returns."""
    called: dict[str, float] = {}

    def one(i: int) -> None:
        body = jobs[i]
        called[body["metadata"]["name"]] = time.monotonic()
        batch.create_namespaced_job(NAMESPACE, body, _preload_content=False, _request_timeout=60)
        if created is not None:
            created(i)

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(one, range(len(jobs))))
    return called


def apiserver_requests(plane: ControlPlane) -> Counter[str]:
    """apiserver_request_total summed per "VERB resource[/subresource]"."""
    text = plane.kubectl("get", "--raw", "/metrics").stdout
    totals: Counter[str] = Counter()
    for family in text_string_to_metric_families(text):
        if family.name != "apiserver_request":
            continue
        for sample in family.samples:
            if sample.name != "apiserver_request_total":
                continue
            labels = sample.labels
            resource = labels.get("resource", "")
            if labels.get("subresource"):
                resource += "/" + labels["subresource"]
            if labels.get("verb") in ("WATCH", "CONNECT") or not resource:
                continue  # long-running; counted in requests, not in load
            totals[f"{labels['verb']} {resource}"] += int(sample.value)
    return totals


WEBHOOKS = "apiserver_admission_webhook_admission_duration_seconds"
# every admission plugin's time, the admission policies' CEL among them
PLUGINS = "apiserver_admission_controller_admission_duration_seconds"


def webhook_seconds(plane: ControlPlane, metric: str = WEBHOOKS) -> dict[str, tuple[float, int]]:
    """Per admission webhook (or plugin), the API server's total seconds in it and its calls."""
    text = plane.kubectl("get", "--raw", "/metrics").stdout
    out: dict[str, tuple[float, int]] = {}
    for family in text_string_to_metric_families(text):
        if family.name != metric:
            continue
        for sample in family.samples:
            name = sample.labels.get("name", "?")
            total, calls = out.get(name, (0.0, 0))
            if sample.name.endswith("_sum"):
                out[name] = (total + sample.value, calls)
            elif sample.name.endswith("_count"):
                out[name] = (total, calls + int(sample.value))
    return out


def proc_usage(pid: int | None) -> dict[str, float] | None:
    """CPU seconds and peak RSS of the system under test: its process and the processes it
    started (gpufleet's webhook process), the peaks added up (an upper bound: they need not
    come at the same moment)."""
    if pid is None:
        return None
    pids = [pid, *children(pid)]  # one scan of /proc serves both figures
    used = [_own_cpu_seconds(p) for p in pids]
    peaks = [peak_rss_kib(p) for p in pids]
    if used[0] is None or peaks[0] is None:
        return None
    figures = {
        "cpu_seconds": round(sum(u for u in used if u is not None), 1),
        "peak_rss_mib": round(sum(p for p in peaks if p is not None) / 1024, 1),
    }
    if len(pids) > 1:
        figures["peak_rss_mib_main_process"] = round(peaks[0] / 1024, 1)
    return figures


def children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def peak_rss_kib(pid: int) -> int | None:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return None
    return next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM"))


def cpu_seconds(pid: int) -> float | None:
    """CPU seconds of `pid` and of the children it has started that are still running."""
    own = _own_cpu_seconds(pid)
    if own is None:
        return None
    return own + sum(filter(None, map(_own_cpu_seconds, children(pid))))


def _own_cpu_seconds(pid: int) -> float | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return None
    return (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK")


def cpu_by_process(plane: ControlPlane, system: str, pid: int | None) -> dict[str, float]:
    """CPU seconds used so far by each process of the run: the control plane's, the system
    under test's and this benchmark's own (its client threads and watches). On a machine whose
    cores they share, this says whose work sets the pace."""
    pids = {name: record.pid for name, record in plane.records.items()}
    if pid is not None:
        pids[system] = pid
    used = {name: cpu_seconds(p) for name, p in pids.items()}
    mine = os.times()
    used["benchmark client"] = mine.user + mine.system
    return {name: round(v, 1) for name, v in used.items() if v is not None}


def _spent(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {name: round(after[name] - before.get(name, 0.0), 1) for name in after}


def stop_process(process: subprocess.Popen[bytes] | None, what: str) -> None:
    """SIGTERM, then SIGKILL after 30 s: a system that hangs on its way out loses no figures."""
    if process is None or process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        print(f"{what} did not stop within 30 s; killed", file=sys.stderr)
        process.kill()
        process.wait()


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))], 2)


def wait_for(ready: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.1)


def run(system: System, scenario: Scenario, log: Callable[[str], None]) -> dict[str, Any]:
    """The scenario on a fresh control plane; the system's figures."""
    work = Path(tempfile.mkdtemp(prefix=f"gpufleet-bench-{system.name}-"))
    with ControlPlane(
        work / "cluster", log=lambda m: log(f"[{system.name}] control plane: {m}")
    ) as plane:
        log(f"[{system.name}] {scenario.nodes} nodes")
        plane.add_gpu_nodes(scenario.nodes, 8, "H100", pool="bench", prefix="gpu")
        plane.kubectl("create", "namespace", NAMESPACE)
        try:
            log(f"[{system.name}] starting")
            pid = system.start(plane, work, scenario)
            return _measure(plane, system, scenario, pid, log)
        finally:
            system.stop()


def _measure(
    plane: ControlPlane,
    system: System,
    scenario: Scenario,
    pid: int | None,
    log: Callable[[str], None],
) -> dict[str, Any]:
    api = api_client(plane.kubeconfig, scenario.threads * 2)
    batch = client.BatchV1Api(api)
    pods = RunningPods(lambda event, pod: system.pod_seen(api, event, pod))
    stop = threading.Event()
    Informer(
        pods, "pods", client.CoreV1Api(api).list_namespaced_pod, stop, namespace=NAMESPACE
    ).start()
    Informer(pods, "jobs", batch.list_namespaced_job, stop, namespace=NAMESPACE).start()
    try:
        wait_for(pods.synced, 60, "the benchmark's pod watch")
        requests_before = apiserver_requests(plane)
        hooks_before = webhook_seconds(plane)
        plugins_before = webhook_seconds(plane, PLUGINS)
        cpu_before = cpu_by_process(plane, system.name, pid)
        suspend = system.suspend_on_create()
        elastic = [
            system.shape(
                job(f"elastic-{i}", system.labels("batch", "elastic"), suspend, system.gate)
            )
            for i in range(scenario.jobs)
        ]
        expected = min(scenario.jobs, scenario.nodes * 8)
        log(f"[{system.name}] creating {len(elastic)} elastic Jobs")
        started = time.monotonic()
        create_all(
            batch,
            elastic,
            scenario.threads,
            lambda i: system.created(api, elastic[i]["metadata"]["name"], []),
        )
        created_s = time.monotonic() - started
        hooks = webhook_seconds(plane)
        wait_for(lambda: pods.count("elastic-") >= expected, scenario.timeout, "admission")
        all_running_s = max(pods.running_at.values()) - started
        after_admission = proc_usage(pid)
        cpu_admission = _spent(cpu_before, cpu_by_process(plane, system.name, pid))
        requests_admission = apiserver_requests(plane) - requests_before
        plugins = webhook_seconds(plane, PLUGINS)
        figures: dict[str, Any] = {
            "create_seconds": round(created_s, 1),
            "all_running_seconds": round(all_running_s, 1),
            "admissions_per_second": round(expected / all_running_s, 1),
            "process_after_admission": after_admission,
            # from the first create until all of them ran
            "cpu_seconds_by_process_until_all_running": cpu_admission,
            "apiserver_requests_until_all_running": dict(sorted(requests_admission.items())),
            # the mean wait of a create on each admission webhook, during the burst of creates
            "webhook_mean_ms": {
                name: round(1000 * (total - hooks_before.get(name, (0.0, 0))[0]) / calls_made, 1)
                for name, (total, calls) in hooks.items()
                if (calls_made := calls - hooks_before.get(name, (0.0, 0))[1]) > 0
            },
            # the API server's seconds in each admission plugin until all ran (of every
            # request: the admission policies' CEL shows here), where it spent any
            "admission_plugin_seconds_until_all_running": {
                name: spent
                for name, (total, _) in sorted(plugins.items())
                if (spent := round(total - plugins_before.get(name, (0.0, 0))[0], 2)) > 0
            },
        }
        if scenario.quiet:
            figures["quiet"] = _quiet(plane, system, scenario, log)
        if system.reclaims and scenario.gang:
            figures["gang"] = _gang(api, pods, system, scenario, log)
        elif system.reclaims and scenario.reclaim:
            figures["reclaim"] = _reclaim(api, pods, system, scenario, log)
        figures["process"] = proc_usage(pid)
        figures["cpu_seconds_by_process"] = _spent(
            cpu_before, cpu_by_process(plane, system.name, pid)
        )
        after = apiserver_requests(plane)
        figures["apiserver_requests"] = dict(sorted((after - requests_before).items()))
        figures["events_by_reason"] = _events_by_reason(client.CoreV1Api(api))
        figures.update(system.extra())
        return figures
    finally:
        stop.set()


def _quiet(
    plane: ControlPlane, system: System, scenario: Scenario, log: Callable[[str], None]
) -> dict[str, Any]:
    """The API requests of a window in which nothing new arrives (the work runs on): a
    controller that re-lists, or rewrites what has not changed, shows here in proportion to the
    cluster's size; one fed by watches that writes only changes asks (almost) nothing."""
    log(f"[{system.name}] {scenario.quiet:.0f}s with nothing new")
    before, cycles_before = apiserver_requests(plane), system.extra().get("cycles")
    time.sleep(scenario.quiet)
    after, cycles_after = apiserver_requests(plane), system.extra().get("cycles")
    quiet: dict[str, Any] = {
        "seconds": scenario.quiet,
        "apiserver_requests": dict(sorted((after - before).items())),
    }
    if cycles_before is not None and cycles_after is not None:
        quiet["cycles"] = cycles_after - cycles_before
    return quiet


def _reclaim(
    api: client.ApiClient,
    pods: RunningPods,
    system: System,
    scenario: Scenario,
    log: Callable[[str], None],
) -> dict[str, Any]:
    wave = [
        system.shape(
            job(
                f"reserved-{i}",
                system.labels("owner", "reserved"),
                system.suspend_on_create(),
                system.gate,
            )
        )
        for i in range(scenario.reclaim)
    ]
    batch = client.BatchV1Api(api)
    log(f"[{system.name}] reclaim wave of {len(wave)} reserved Jobs")
    wave_start = time.monotonic()
    # a system without a controller preempts from the client: one elastic Job per reserved
    # one, while there are any
    victims = [
        [f"elastic-{i}"] if system.preempts_itself() and i < scenario.jobs else []
        for i in range(scenario.reclaim)
    ]
    called = create_all(
        batch,
        wave,
        scenario.threads,
        lambda i: system.created(api, wave[i]["metadata"]["name"], victims[i]),
    )
    try:
        wait_for(lambda: pods.count("reserved-") >= len(wave), scenario.timeout, "the reclaim")
    except TimeoutError as err:
        log(f"[{system.name}] {err}")
    running = {n: t for n, t in pods.running_at.items() if n.startswith("reserved-")}
    latencies = [running[n] - called[n] for n in running]
    # where the time went: until the Job controller made the pod (admission, then the Job
    # controller's queue), and from then until it ran (the evicted pods' GPUs, the scheduler)
    created = {n: pods.created_at[n] for n in running if n in pods.created_at}
    until_pod = [created[n] - called[n] for n in created]
    pod_to_running = [running[n] - created[n] for n in created]
    admitted = {n: pods.admitted_at[n] for n in created if n in pods.admitted_at}
    until_admitted = [admitted[n] - called[n] for n in admitted]
    # a system that holds pods at a gate has them made before it admits: no time waited
    admitted_to_pod = [max(0.0, created[n] - admitted[n]) for n in admitted]
    preempted = _preempted(batch, pods)
    return {
        "reserved_jobs": len(wave),
        "running": len(running),
        "elastic_preempted": preempted,
        "wave_seconds": round(max(running.values(), default=wave_start) - wave_start, 1),
        "latency_seconds": {"p50": percentile(latencies, 50), "p99": percentile(latencies, 99)},
        "until_admitted_seconds": {  # seen unsuspended (systems that suspend on create)
            "p50": percentile(until_admitted, 50),
            "p99": percentile(until_admitted, 99),
        },
        "admitted_to_pod_created_seconds": {
            "p50": percentile(admitted_to_pod, 50),
            "p99": percentile(admitted_to_pod, 99),
        },
        "until_pod_created_seconds": {
            "p50": percentile(until_pod, 50),
            "p99": percentile(until_pod, 99),
        },
        "pod_created_to_running_seconds": {
            "p50": percentile(pod_to_running, 50),
            "p99": percentile(pod_to_running, 99),
        },
    }


def _preempted(batch: client.BatchV1Api, pods: RunningPods) -> int:
    """Elastic Jobs held again: suspended, or (a system that gates pods) with no pod running."""
    listed = json.loads(
        batch.list_namespaced_job(NAMESPACE, _preload_content=False, _request_timeout=60).data
    )
    running_now = pods.running_jobs()
    return sum(
        1
        for j in listed["items"]
        if j["metadata"]["name"].startswith("elastic-")
        and (j["spec"].get("suspend") or j["metadata"]["name"] not in running_now)
    )


def _gang(
    api: client.ApiClient,
    pods: RunningPods,
    system: System,
    scenario: Scenario,
    log: Callable[[str], None],
) -> dict[str, Any]:
    """Scenario 2b: one reserved gang of `scenario.gang` pods × 8 GPUs onto a full cluster."""
    name = "gang"
    body = system.shape(
        job(
            name,
            system.labels("owner", "reserved"),
            system.suspend_on_create(),
            system.gate,
            pods=scenario.gang,
            gpus=8,
        )
    )
    # a system without a controller clears whole nodes, one per pod, from the client
    victims = pods.jobs_on_nodes("elastic-", scenario.gang) if system.preempts_itself() else []
    batch = client.BatchV1Api(api)
    log(f"[{system.name}] a reserved gang of {scenario.gang} pods x 8 GPUs")
    called = create_all(batch, [body], 1, lambda i: system.created(api, name, victims))[name]
    try:
        wait_for(
            lambda: len(pods.pods_running.get(name, {})) >= scenario.gang,
            scenario.timeout,
            "the gang",
        )
    except TimeoutError as err:
        log(f"[{system.name}] {err}")

    def after(times: dict[str, float], last: bool) -> float | None:
        if len(times) < scenario.gang:
            return None
        return round((max(times.values()) if last else min(times.values())) - called, 2)

    preempted = _preempted(batch, pods)
    return {
        "pods": scenario.gang,
        "gpus": scenario.gang * 8,
        "all_running_seconds": after(pods.pods_running.get(name, {}), last=True),
        "pods_running": len(pods.pods_running.get(name, {})),
        "first_pod_created_seconds": after(pods.pods_created.get(name, {}), last=False),
        "all_pods_created_seconds": after(pods.pods_created.get(name, {}), last=True),
        "all_pods_released_seconds": after(pods.pods_released.get(name, {}), last=True),
        "elastic_preempted": preempted,
        "elastic_preempted_needed": scenario.gang * 8,
    }


def _events_by_reason(core: client.CoreV1Api) -> dict[str, int]:
    """Events in the benchmark's namespace per "source: reason" (their count field summed)."""
    listed = json.loads(
        core.list_namespaced_event(NAMESPACE, _preload_content=False, _request_timeout=60).data
    )
    counts: Counter[str] = Counter()
    for event in listed["items"]:
        source = (event.get("source") or {}).get("component") or event.get(
            "reportingComponent", "?"
        )
        counts[f"{source}: {event.get('reason')}"] += int(event.get("count") or 1)
    return dict(sorted(counts.items()))
