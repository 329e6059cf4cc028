"""A fleet of clusters on this machine: how fast the hub sends work, how long a burst takes to
run against the same burst on one cluster of the same GPUs, and what losing a worker costs.
Prints JSON; not a timed test.

    python benchmarks/multicluster.py --workers 2 --jobs 600 --kill-worker
    python benchmarks/multicluster.py --workers 2 --jobs 24 --nodes 3 --kill-worker  # smoke

1. One cluster (the floor): `--workers` x `--nodes` 8-GPU kwok nodes and its controller; `--jobs`
   single-GPU elastic Jobs created in it from 8 threads: `single_cluster_all_running_seconds`,
   from the first create call to the last Job with a Running pod.
2. The fleet: a hub and `--workers` workers of `--nodes` nodes each (by default each worker
   could hold every Job, so one can be lost); the same Jobs submitted to the hub:
   `create_seconds`, `dispatch_seconds` and `dispatch_per_second` (first create to the last copy
   made in a worker; it cannot beat the creates, so `dispatch_lag_seconds` says how long after
   the last create the last copy was made), `all_running_seconds` and its ratio to the floor,
   `cpu_seconds_by_process` (what the burst cost each process until then; the same for the
   floor), `all_shown_running_seconds` (until every hub Job shows its copy Running) and
   `hub_writes_per_job` (the hub's writes until then, per Job, its create included).
3. With `--kill-worker`: the first worker's API server is stopped; `lost_declared_seconds` (to the
   hub marking it Lost: its lostAfter plus a heartbeat), `requeued_after_loss_seconds` (from
   then to every Job Running again in the other workers); then it is started again and, once
   the hub has it Ready, `running_twice` (hub Jobs with a running copy in two clusters) and
   `lost` (hub Jobs running nowhere), each checked twice, 10 s apart.
4. The hub's own pace, apart from how fast its API server takes the creates: a fresh fleet whose
   Clusters take no work (spec.dispatch false) holds the Jobs until the hub has said why each
   waits; then every Cluster takes work again: `backlog_dispatch_seconds` and
   `backlog_dispatch_per_second` (to the last copy made), `backlog_all_running_seconds`.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from kubernetes import client

from gpufleet.model.keys import HUB_JOB_LABEL, HUB_MESSAGE_ANNOTATION, HUB_STATE_ANNOTATION
from gpufleet.testing.cluster import ControlPlane, default_bin_dir, missing_binaries
from gpufleet.testing.fleet import LocalFleet, hub_job

sys.path.insert(0, str(Path(__file__).resolve().parent))

from scenario import NAMESPACE, api_client, cpu_seconds, create_all

TEAMS = {"batch": {"namespaces": [NAMESPACE]}}  # scenario.py's namespace
THREADS = 8


@functools.cache
def api(kubeconfig: Path) -> client.ApiClient:
    """One client per control plane for the whole run: the polls below reuse its connections
    instead of opening new ones on the machine being measured."""
    return api_client(kubeconfig, THREADS * 2)


def create_seconds(plane: ControlPlane, bodies: list[dict[str, Any]]) -> float:
    """Create the Jobs from THREADS threads; the seconds it took."""
    started = time.monotonic()
    create_all(client.BatchV1Api(api(plane.kubeconfig)), bodies, THREADS)
    return time.monotonic() - started


# the polls ask for metadata only: a list of 600 whole pods a few times a second would cost
# the API servers being measured more than what they are measured doing
METADATA_ONLY = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"


def metadata(plane: ControlPlane, path: str, **query: str) -> list[dict[str, Any]]:
    """The objects at `path` of `NAMESPACE` (e.g. "apis/batch/v1/.../jobs"), metadata only."""
    response = api(plane.kubeconfig).call_api(
        f"/{path}",
        "GET",
        query_params=list(query.items()),
        header_params={"Accept": METADATA_ONLY},
        auth_settings=["BearerToken"],
        _return_http_data_only=True,
        _preload_content=False,
        _request_timeout=60,
    )
    items: list[dict[str, Any]] = json.loads(response.data).get("items") or []
    return items


def jobs(plane: ControlPlane, **query: str) -> list[dict[str, Any]]:
    return metadata(plane, f"apis/batch/v1/namespaces/{NAMESPACE}/jobs", **query)


def running_pods(plane: ControlPlane) -> list[dict[str, Any]]:
    pods = metadata(
        plane, f"api/v1/namespaces/{NAMESPACE}/pods", fieldSelector="status.phase=Running"
    )
    return [p for p in pods if not p["metadata"].get("deletionTimestamp")]


def running_in(fleet: LocalFleet, workers: Sequence[str]) -> int:
    """Pods running in the `workers` of the fleet, together."""
    return sum(len(running_pods(fleet.planes[w])) for w in workers)


def revision(plane: ControlPlane) -> int:
    """The control plane's etcd revision: it grows by one with each write."""
    core = client.CoreV1Api(api(plane.kubeconfig))
    return int(core.list_namespace(limit=1, _request_timeout=60).metadata.resource_version)


def wait(ready: Callable[[], bool], timeout: float, what: str) -> float:
    """Poll `ready` every 0.2 s; the monotonic time it became true."""
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.2)
    return time.monotonic()


def running_by_hub_job(fleet: LocalFleet, workers: list[str]) -> dict[str, set[str]]:
    """For each hub Job (by uid), the clusters where a pod of its copy runs."""
    where: dict[str, set[str]] = {}
    for name in workers:
        plane = fleet.planes[name]
        copies = {
            c["metadata"]["uid"]: c["metadata"]["labels"][HUB_JOB_LABEL]
            for c in jobs(plane, labelSelector=HUB_JOB_LABEL)
            if not c["metadata"].get("deletionTimestamp")
        }
        for pod in running_pods(plane):
            owner = copies.get(
                (pod["metadata"].get("labels") or {}).get("batch.kubernetes.io/controller-uid", "")
            )
            if owner is not None:
                where.setdefault(owner, set()).add(name)
    return where


def fleet_cpu(fleet: LocalFleet) -> dict[str, float]:
    """CPU seconds used so far by each process of the fleet, by "plane/process"."""
    used = {name: cpu_seconds(pid) for name, pid in fleet.processes().items()}
    return {name: seconds for name, seconds in used.items() if seconds is not None}


def cpu_during(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """CPU seconds each process used between two `fleet_cpu` readings, the busiest first."""
    spent = {name: round(after[name] - before.get(name, 0.0), 1) for name in after}
    return dict(sorted(spent.items(), key=lambda item: -item[1]))


def single_cluster(
    args: argparse.Namespace, work: Path, log: Callable[[str], None]
) -> tuple[float, dict[str, float]]:
    """All Running seconds of the Jobs on one cluster with every worker's nodes, and the CPU
    seconds each process used for them."""
    fleet = LocalFleet(
        work / "single",
        ("solo",),
        nodes=args.workers * args.nodes,
        teams=TEAMS,
        interval=args.interval,
    )
    with fleet:
        plane = fleet.planes["solo"]
        bodies = [hub_job(f"job-{i}", NAMESPACE, "batch", "elastic", 1) for i in range(args.jobs)]
        for body in bodies:
            del body["spec"]["managedBy"]  # created in the cluster itself, not sent by the hub
        log(f"single cluster: creating {args.jobs} Jobs")
        before = fleet_cpu(fleet)
        started = time.monotonic()
        create_seconds(plane, bodies)
        done = wait(lambda: len(running_pods(plane)) >= args.jobs, args.timeout, "every Job to run")
        return done - started, cpu_during(before, fleet_cpu(fleet))


def worker_names(args: argparse.Namespace) -> list[str]:
    return [f"worker-{i + 1}" for i in range(args.workers)]


def copies_made(fleet: LocalFleet) -> int:
    return sum(len(jobs(fleet.planes[w], labelSelector=HUB_JOB_LABEL)) for w in fleet.workers)


def set_dispatch(fleet: LocalFleet, on: bool) -> None:
    patch = json.dumps({"spec": {"dispatch": on}})
    for name in fleet.workers:
        fleet.hub.kubectl("patch", "clusters.gpufleet.io", name, "--type=merge", "-p", patch)


def backlog_run(args: argparse.Namespace, work: Path, log: Callable[[str], None]) -> dict[str, Any]:
    """The hub's own pace: the Jobs wait at the hub (every Cluster's dispatch off) until the
    hub has said why each waits, then every Cluster takes work again."""
    fleet = LocalFleet(
        work / "backlog", worker_names(args), nodes=args.nodes, teams=TEAMS,
        interval=args.interval,
    )  # fmt: skip
    with fleet:
        set_dispatch(fleet, False)
        bodies = [hub_job(f"job-{i}", NAMESPACE, "batch", "elastic", 1) for i in range(args.jobs)]
        log(f"backlog: {args.jobs} Jobs held at the hub, then sent at once")
        create_seconds(fleet.hub, bodies)
        wait(
            lambda: all(
                HUB_MESSAGE_ANNOTATION in (j["metadata"].get("annotations") or {})
                for j in jobs(fleet.hub)
            ),
            args.timeout,
            "the hub to hold every Job",
        )
        started = time.monotonic()
        set_dispatch(fleet, True)
        sent = wait(lambda: copies_made(fleet) >= args.jobs, args.timeout, "every Job to be sent")
        done = wait(
            lambda: running_in(fleet, fleet.workers) >= args.jobs,
            args.timeout,
            "every Job to run",
        )
        return {
            "backlog_dispatch_seconds": round(sent - started, 2),
            "backlog_dispatch_per_second": round(args.jobs / (sent - started), 1),
            "backlog_all_running_seconds": round(done - started, 2),
        }


def fleet_run(args: argparse.Namespace, work: Path, log: Callable[[str], None]) -> dict[str, Any]:
    workers = worker_names(args)
    fleet = LocalFleet(
        work / "fleet",
        workers,
        nodes=args.nodes,
        teams=TEAMS,
        lost_after=f"{args.lost_after}s",
        interval=args.interval,
    )
    figures: dict[str, Any] = {}
    with fleet:
        bodies = [hub_job(f"job-{i}", NAMESPACE, "batch", "elastic", 1) for i in range(args.jobs)]
        log(f"fleet of {args.workers}: submitting {args.jobs} Jobs to the hub")
        before, first = fleet_cpu(fleet), revision(fleet.hub)
        started = time.monotonic()
        figures["create_seconds"] = round(create_seconds(fleet.hub, bodies), 2)

        sent = wait(lambda: copies_made(fleet) >= args.jobs, args.timeout, "every Job to be sent")
        figures["dispatch_seconds"] = round(sent - started, 2)
        figures["dispatch_per_second"] = round(args.jobs / (sent - started), 1)
        # how long after the last create the last copy was made: the hub's own delay, where
        # dispatch_per_second is bounded by how fast the hub's API server takes the creates
        figures["dispatch_lag_seconds"] = round(sent - started - figures["create_seconds"], 2)
        done = wait(
            lambda: running_in(fleet, workers) >= args.jobs,
            args.timeout,
            "every Job to run",
        )
        figures["all_running_seconds"] = round(done - started, 2)
        figures["per_cluster"] = {w: len(running_pods(fleet.planes[w])) for w in workers}
        figures["cpu_seconds_by_process"] = cpu_during(before, fleet_cpu(fleet))
        shown = wait(
            lambda: all(
                (j["metadata"].get("annotations") or {}).get(HUB_STATE_ANNOTATION) == "Running"
                for j in jobs(fleet.hub)
            ),
            args.timeout,
            "every hub Job to show its copy Running",
        )
        figures["all_shown_running_seconds"] = round(shown - started, 2)
        figures["hub_writes_per_job"] = round((revision(fleet.hub) - first) / args.jobs, 2)
        if args.kill_worker:
            figures.update(kill_worker(fleet, workers, args, log))
    return figures


def kill_worker(
    fleet: LocalFleet, workers: list[str], args: argparse.Namespace, log: Callable[[str], None]
) -> dict[str, Any]:
    victim, rest = workers[0], workers[1:]
    log(f"stopping {victim}'s API server")
    stopped = time.monotonic()
    fleet.planes[victim].stop_apiserver()
    lost = wait(
        lambda: fleet.cluster(victim).get("state") == "Lost", args.timeout, f"{victim} to be lost"
    )
    again = wait(
        lambda: running_in(fleet, rest) >= args.jobs,
        args.timeout,
        "every Job to run in the other workers",
    )
    log(f"starting {victim}'s API server again")
    fleet.planes[victim].start_apiserver()
    wait(
        lambda: fleet.cluster(victim).get("state") == "Ready",
        args.timeout,
        f"{victim} to be Ready again",
    )
    checks = []
    for _ in range(2):
        where = running_by_hub_job(fleet, workers)
        hub_uids = {j["metadata"]["uid"] for j in jobs(fleet.hub)}
        checks.append(
            {
                "running_twice": sum(1 for clusters in where.values() if len(clusters) > 1),
                "lost": sum(1 for uid in hub_uids if not where.get(uid)),
            }
        )
        time.sleep(10)
    return {
        "lost_declared_seconds": round(lost - stopped, 2),
        "requeued_after_loss_seconds": round(again - lost, 2),
        "running_twice": max(c["running_twice"] for c in checks),
        "lost": max(c["lost"] for c in checks),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--jobs", type=int, default=600)
    parser.add_argument(
        "--nodes",
        type=int,
        default=0,
        help="8-GPU nodes per worker; default: enough for every Job (so one can be lost)",
    )
    parser.add_argument("--kill-worker", action="store_true")
    parser.add_argument("--lost-after", type=int, default=20, help="the Clusters' lostAfter, s")
    parser.add_argument("--interval", type=float, default=1.0, help="controllers' resync, s")
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--skip-single", action="store_true", help="no one-cluster floor run")
    parser.add_argument("--skip-backlog", action="store_true", help="no held-then-sent run")
    args = parser.parse_args()
    if args.workers < 1 or (args.kill_worker and args.workers < 2):
        parser.error("--workers must be at least 1, and 2 with --kill-worker")
    args.nodes = args.nodes or math.ceil(args.jobs / 8)
    missing = missing_binaries(default_bin_dir())
    if missing:
        parser.error(f"binaries missing ({', '.join(missing)}): run hack/k8s/build.sh")

    def log(message: str) -> None:
        print(f"[multicluster] {message}", file=sys.stderr, flush=True)

    work = Path(tempfile.mkdtemp(prefix="gpufleet-bench-multicluster-"))
    result: dict[str, Any] = {
        "workers": args.workers,
        "jobs": args.jobs,
        "nodes_per_worker": args.nodes,
        "gpus": args.workers * args.nodes * 8,
    }
    if not args.skip_single:
        seconds, cpu = single_cluster(args, work, log)
        result["single_cluster_all_running_seconds"] = round(seconds, 2)
        result["single_cluster_cpu_seconds_by_process"] = cpu
    result.update(fleet_run(args, work, log))
    if not args.skip_backlog:
        result.update(backlog_run(args, work, log))
    if "single_cluster_all_running_seconds" in result:
        result["all_running_ratio"] = round(
            result["all_running_seconds"] / result["single_cluster_all_running_seconds"], 2
        )
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
