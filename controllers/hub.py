"""The hub of a fleet of clusters: it watches every worker cluster, keeps a heartbeat per
cluster, sends each Job submitted to the hub where the engine admits it soonest, mirrors the
copy's status back, and moves the unfinished work of a lost cluster to the others.

A hub Job (spec.managedBy gpufleet.io/hub, so the hub's own Job controller leaves it alone) is
copied into one worker, whose gpufleet controller enforces it like any Job. What the hub knows
lives in the hub Job's annotations (where its copy is; the clusters lost while a copy was there)
and in the workers' own objects, so a restarted hub picks up where it stopped.

Order of a cycle: heartbeats → lost clusters give their work back → returning clusters have
their stale copies removed (no new work until they are gone, so nothing runs twice) → orphan
copies removed → dispatch → statuses mirrored → Cluster statuses.

Several hubs may run (the chart's hub.replicas): the holder of the Lease gpufleet-hub runs the
cycles; the others keep their watch caches of the hub and of every worker warm, and write
nothing. A copy is sent only while the lead will outlast the write (`LeaderElection.holds` with
the write's timeout spare), and a hub taking the lead lists every worker's copies again before
its first cycle, so a copy the last leader made a moment ago is adopted, never made twice.
"""

from __future__ import annotations

import functools
import json
import logging
import threading
import time
from collections.abc import Collection
from concurrent.futures import ThreadPoolExecutor
from copy import deepcopy
from datetime import UTC, datetime
from typing import Any, TypeVar

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from gpufleet.engine.dispatch import Candidate, dispatch
from gpufleet.engine.types import Workload
from gpufleet.kube.cache import (
    ClusterCache,
    Informer,
    Store,
    node_matters,
    trim_node,
    workload_trim,
)
from gpufleet.kube.calls import API_TIMEOUT_S, KubernetesSecrets, api_message
from gpufleet.kube.hub import (
    annotation,
    copies_by_hub_job,
    copy_for_worker,
    dispatched_to,
    finished,
    hub_workload,
    is_hub_job,
    key,
    mirrored_status,
    pinned_cluster,
    stale_in,
    worker_snapshot,
)
from gpufleet.kube.kinds import JOB
from gpufleet.kube.observe import node_of
from gpufleet.kube.request import RequestError
from gpufleet.kube.workers import WorkerError, worker_api
from gpufleet.model.api import GROUP, VERSION, Cluster
from gpufleet.model.durations import parse_duration
from gpufleet.model.fleet import Fleet, fleet_from_objects
from gpufleet.model.keys import (
    DISPATCHED_TO_ANNOTATION,
    HUB_JOB_LABEL,
    HUB_MESSAGE_ANNOTATION,
    HUB_STATE_ANNOTATION,
    STALE_IN_ANNOTATION,
)
from gpufleet.notify.delivery import DeliveryError

from .leader import LeaderElection

log = logging.getLogger("gpufleet.hub")
V = TypeVar("V")
REGISTRY = CollectorRegistry()
DISPATCHED = Counter(
    "gpufleet_hub_dispatched", "Hub Jobs sent to a cluster.", ["cluster"], registry=REGISTRY
)
REQUEUED = Counter(
    "gpufleet_hub_requeued",
    "Hub Jobs sent again because their cluster was lost while they were there.",
    ["cluster"],
    registry=REGISTRY,
)
WAITING = Gauge(
    "gpufleet_hub_waiting_workloads", "Hub Jobs no cluster admits now.", registry=REGISTRY
)
CLUSTER_STATE = Gauge(
    "gpufleet_cluster_state",
    "1 for the state each cluster is in (Unknown, Ready, Lost, Recovering), else 0.",
    ["cluster", "state"],
    registry=REGISTRY,
)
CLUSTER_STATES = ("Unknown", "Ready", "Lost", "Recovering")
LEADING = Gauge(
    "gpufleet_hub_leading", "1 while this hub holds the lead (runs the cycles), else 0.",
    registry=REGISTRY,
)  # fmt: skip
LEASE_NAME = "gpufleet-hub"
# a copy is sent only while the lead outlasts its write (API_TIMEOUT_S): the lead is held
# LEASE_S * 0.8 after a renewal, and renewed every RENEW_S, so the sends a cycle queues have
# 24 - 10 - 5 = 9 s to start
LEASE_S, RENEW_S = 30, 5.0
CYCLE = Histogram("gpufleet_hub_cycle_seconds", "Seconds per hub cycle.", registry=REGISTRY)
SLOW_CYCLE_S = 1.0
HUB_FLEET_KINDS = ("clusters", "gpupools", "teams", "reservations", "fleetpolicies")
HEARTBEAT_S = 1.0  # how often the hub asks each worker's API server whether it answers
CLUSTER_STATUS_EVERY_S = 5.0  # a Cluster's counts are rewritten at most this often
WRITERS = 16  # the hub's writes in flight at once (copies into workers, its Jobs' annotations)
MIRROR_WRITERS = 4
# a hub Job's status and annotations are written at most this often; the first time, once its
# copy runs with its pods ready (or has been on its way MIRROR_SETTLE_S): a copy that starts at
# once is mirrored once, not once per step (Pending, active, ready, Running), which in a burst
# would be most of the hub's writes
MIRROR_EVERY_S = 2.0
MIRROR_SETTLE_S = 30.0
SETTLING_STATES = (None, "Pending", "Queued", "Starting")
# events closer together than this are one cycle: a cycle reads every hub Job and every
# worker's copies, and a burst brings several events per Job from each cluster
DEBOUNCE_S = 0.5


class Worker:
    """One worker cluster: its API client, its watch caches and its heartbeat."""

    def __init__(
        self, name: str, kubeconfig: str, stop: threading.Event, changed: threading.Event
    ) -> None:
        self.name = name
        self.kubeconfig = kubeconfig
        self.api = worker_api(kubeconfig, WRITERS + 8)
        self.custom = client.CustomObjectsApi(self.api)
        self.stop = threading.Event()
        self.hub_stop = stop
        self.cache = ClusterCache(
            [Store("nodes", trim_node, node_matters), Store("gpuworkloads"), Store("jobs")]
        )
        self.cache.changed = changed  # a worker's change wakes the hub's loop
        custom = self.custom.list_cluster_custom_object
        core = client.CoreV1Api(self.api)
        self.informers = [
            Informer(self.cache, "nodes", core.list_node, self.stop),
            Informer(
                self.cache,
                "gpuworkloads",
                functools.partial(custom, GROUP, VERSION, "gpuworkloads"),
                self.stop,
                optional=True,  # until the worker's controller installs its CRDs
            ),
            Informer(
                self.cache,
                "jobs",
                functools.partial(custom, "batch", "v1", "jobs"),
                self.stop,
                label_selector=HUB_JOB_LABEL,
            ),
        ]
        self.last_heartbeat: datetime | None = None
        self.last_seen = 0.0  # monotonic time of the last answer
        self.version: str | None = None
        self.state = "Unknown"
        self.message: str | None = None
        # the heartbeat asks once: an API server that does not answer at once missed a beat
        # (the client's own retries would hide that, and log each)
        beat = deepcopy(self.api.configuration)
        beat.retries = 0
        self.version_api = client.VersionApi(client.ApiClient(beat))

    def start(self) -> None:
        for informer in self.informers:
            informer.start()
        threading.Thread(target=self._beat, name=f"gpufleet-hub-{self.name}", daemon=True).start()

    def close(self) -> None:
        self.stop.set()

    def _beat(self) -> None:
        while not (self.stop.is_set() or self.hub_stop.is_set()):
            try:
                info = self.version_api.get_code(_request_timeout=2)
                self.version = str(info.git_version)
                self.last_seen = time.monotonic()
                self.last_heartbeat = datetime.now(UTC)
                self.message = None
            except Exception as err:  # unreachable, refused, timed out: no heartbeat
                self.message = f"no answer from its API server: {type(err).__name__}"
            self.stop.wait(HEARTBEAT_S)

    def answering(self, lost_after: float) -> bool:
        return self.last_seen > 0 and time.monotonic() - self.last_seen < lost_after

    def synced(self) -> bool:
        return self.cache.synced()


class Hub:
    def __init__(
        self,
        api: client.ApiClient,
        interval: float,
        stop: threading.Event,
        lease_namespace: str | None = None,  # None: the only hub, always leading
    ) -> None:
        self.custom = client.CustomObjectsApi(api)
        self.leader = (
            None
            if lease_namespace is None
            else LeaderElection(
                client.CoordinationV1Api(api),
                lease_namespace,
                LEASE_NAME,
                lease_seconds=LEASE_S,
                renew_seconds=RENEW_S,
            )
        )
        self.led = False  # whether the last cycle ran under the lead
        self.core = client.CoreV1Api(api)
        self.secrets = KubernetesSecrets(self.core)
        self.interval = interval
        self.stop = stop
        # a LIST's items come without their kind, which the engine's view of a Job needs
        self.cache = ClusterCache(
            [Store("jobs", workload_trim(JOB)), *(Store(kind) for kind in HUB_FLEET_KINDS)]
        )
        self.workers: dict[str, Worker] = {}
        self.in_flight: dict[str, str] = {}  # hub Job key -> cluster, sent by this process
        self.pool = ThreadPoolExecutor(WRITERS, thread_name_prefix="gpufleet-hub-write")
        # mirroring has its own few writers, and never waits: a burst's 600 status writes
        # would otherwise hold the cycle (and the sending) for seconds
        self.mirror_pool = ThreadPoolExecutor(
            MIRROR_WRITERS, thread_name_prefix="gpufleet-hub-mirror"
        )
        self.mirroring: set[str] = set()  # hub Jobs whose mirror writes are in flight
        self.mirrored_at: dict[str, float] = {}  # hub Job -> its last mirror write or sending
        # hub Job -> the versions of (it, its copy, the copy's GPUWorkload) it last showed
        self.mirror_seen: dict[str, tuple[str, ...]] = {}
        self.mirror_lock = threading.Lock()
        # per Cluster: when its status was last written, what it said, and the fleet it read
        self.status_written: dict[str, tuple[float, dict[str, Any], int]] = {}
        self._fleet: tuple[int, Fleet] | None = None
        # each hub Job's engine view by uid, with the (generation, fleet version) it was read at
        self.workloads: dict[str, tuple[tuple[Any, int], Workload | None]] = {}
        self.problems: dict[str, str] = {}  # why a Cluster cannot be connected to
        # each worker's copies by the uid of their hub Job, as the cycle began
        self.copies: dict[str, dict[str, dict[str, Any]]] = {}

    # --- the loop ---------------------------------------------------------------------------

    def start_informers(self, timeout: float = 60) -> None:
        custom = self.custom.list_cluster_custom_object
        informers = [
            Informer(
                self.cache, "jobs", functools.partial(custom, "batch", "v1", "jobs"), self.stop
            ),
            *(
                Informer(
                    self.cache, kind, functools.partial(custom, GROUP, VERSION, kind), self.stop
                )
                for kind in HUB_FLEET_KINDS
            ),
        ]
        for informer in informers:
            informer.start()
        if not self.cache.wait_for_sync(timeout):
            raise RuntimeError(f"the hub's watch caches did not fill within {timeout:.0f}s")

    def run(self) -> None:
        while not self.stop.is_set():
            self.cache.changed.wait(self.interval)
            self.cache.changed.clear()
            if not self.lead():
                self.stop.wait(DEBOUNCE_S)
                continue
            started = time.monotonic()
            try:
                self.cycle()
            except Exception:
                log.exception("hub cycle failed; the next one tries again")
            took = time.monotonic() - started
            CYCLE.observe(took)
            if took > SLOW_CYCLE_S:
                log.info("slow cycle: %.2fs", took)
            self.stop.wait(DEBOUNCE_S)
        for worker in self.workers.values():
            worker.close()
        # no copy is sent from here on (`_send` sees `stop`); those under way land before the
        # lead is given up, or a standby that takes it at once could miss them
        self.pool.shutdown(wait=self.leader is not None, cancel_futures=True)
        self.mirror_pool.shutdown(wait=False, cancel_futures=True)
        if self.leader is not None:
            self.leader.release()  # a standby takes over at once, not a lease later
            LEADING.set(0)

    def lead(self) -> bool:
        """Renew (or try to take) the lead when due; whether this hub runs the next cycle. A
        standby keeps its workers connected (their caches warm), and writes nothing."""
        leader = self.leader
        if leader is None:
            return True
        try:
            leading = leader.lead()
        except (ApiException, OSError) as err:  # the hub's API server: tried again soon
            log.warning("the Lease %s could not be read or renewed: %s", leader.name, err)
            leading = leader.holds()
        LEADING.set(1 if leading else 0)
        if not leading:
            self.led = False
            try:
                self._connect(self.fleet())
            except Exception:
                log.exception("a standby's connecting failed; tried again next time")
            return False
        if not self.led:
            self._take_over()
            self.led = True
        return True

    def _take_over(self) -> None:
        """Forget what this process knew from an earlier lead (another hub has led since), and
        list every connected worker's copies afresh: a copy the last leader made a moment ago
        may not have reached this hub's watch yet, and must be adopted, not sent again."""
        self.in_flight.clear()
        self.status_written.clear()
        self.mirrored_at.clear()
        self.mirror_seen.clear()
        for worker in list(self.workers.values()):
            try:
                listed = worker.custom.list_cluster_custom_object(
                    "batch", "v1", "jobs", label_selector=HUB_JOB_LABEL,
                    _request_timeout=API_TIMEOUT_S,
                )  # fmt: skip
            except Exception as err:  # unreachable now: its watch fills in once it answers
                log.info("cluster %s: copies not listed on taking the lead: %s", worker.name, err)
                continue
            for copy in listed.get("items", []):
                worker.cache.store("jobs", copy)

    def fleet(self) -> Fleet:
        """The fleet as the caches hold it, read again only when a GitOps object changed."""
        version = sum(self.cache.versions[kind] for kind in HUB_FLEET_KINDS)
        if self._fleet is None or version != self._fleet[0]:
            objects = [o for kind in HUB_FLEET_KINDS for o in self.cache.items(kind)]
            loaded = fleet_from_objects(objects, "hub")
            for problem in loaded.problems:
                log.warning("ignoring invalid object %s: %s", problem.file, problem.message)
            self._fleet = (version, loaded.fleet)
        return self._fleet[1]

    def cycle(self) -> None:
        fleet = self.fleet()
        self._connect(fleet)
        jobs = {key(j): j for j in self.cache.items("jobs") if is_hub_job(j)}
        # forget the Jobs that are gone
        if len(self.workloads) > len(jobs):
            self.workloads = _kept(self.workloads, {j["metadata"]["uid"] for j in jobs.values()})
        self.mirrored_at = _kept(self.mirrored_at, jobs)
        self.mirror_seen = _kept(self.mirror_seen, jobs)
        self._states(fleet, jobs)
        self.copies = {
            name: copies_by_hub_job(worker.cache.items("jobs"))
            for name, worker in self.workers.items()
        }
        self._remove_stale(jobs)
        self._dispatch(fleet, jobs)
        self._mirror(jobs)
        self._cluster_status(fleet, jobs)

    # --- clusters ---------------------------------------------------------------------------

    def _connect(self, fleet: Fleet) -> None:
        """A Worker per Cluster, made again when its kubeconfig changes."""
        for name in list(self.workers):
            if name not in fleet.clusters:
                self.workers.pop(name).close()
        for name, cluster in fleet.clusters.items():
            try:
                kubeconfig = self.secrets(cluster.spec.kubeconfig_secret_ref)
            except DeliveryError as err:
                self._unreachable(name, f"its kubeconfig: {err}")
                continue
            self.problems.pop(name, None)
            held = self.workers.get(name)
            if held is not None and held.kubeconfig == kubeconfig:
                continue
            if held is not None:
                held.close()
            try:
                worker = Worker(name, kubeconfig, self.stop, self.cache.changed)
            except WorkerError as err:  # a malformed kubeconfig
                self._unreachable(name, f"its kubeconfig: {err}")
                continue
            if held is not None:
                worker.state, worker.last_seen = held.state, held.last_seen
            worker.start()
            self.workers[name] = worker

    def _unreachable(self, name: str, message: str) -> None:
        if self.problems.get(name) != message:  # said once, not every cycle
            log.warning("cluster %s: %s", name, message)
        self.problems[name] = message
        worker = self.workers.get(name)
        if worker is not None:
            worker.message = message

    def _states(self, fleet: Fleet, jobs: dict[str, dict[str, Any]]) -> None:
        """Ready while heartbeats arrive; Lost after lostAfter without one (its unfinished
        work is sent elsewhere); Recovering once it answers again, until its stale copies are
        removed."""
        for name, worker in self.workers.items():
            lost_after = parse_duration(fleet.clusters[name].spec.lost_after).total_seconds()
            answering = worker.answering(lost_after)
            if worker.state in ("Unknown", "Ready") and answering:
                worker.state = "Ready" if worker.synced() else worker.state
            elif worker.state == "Lost" and answering:
                worker.state = "Recovering"
                log.info("cluster %s answers again: removing its stale copies", name)
            elif worker.state in ("Ready", "Recovering", "Unknown") and not answering:
                if worker.last_seen == 0 and worker.state == "Unknown":
                    continue  # never seen: nothing of the hub's can be there
                if worker.state != "Recovering" or time.monotonic() - worker.last_seen > lost_after:
                    worker.state = "Lost"
                    log.warning("cluster %s is lost (no heartbeat for %.0fs)", name, lost_after)
            if worker.state == "Lost":
                self._give_back(name, jobs)

    def _give_back(self, cluster: str, jobs: dict[str, dict[str, Any]]) -> None:
        """The unfinished hub Jobs whose copy is in a lost cluster wait at the hub again; the
        cluster is remembered on each, so its copy is removed when it returns."""
        for name, job in jobs.items():
            if self._where(name, job) != cluster or finished(job):
                continue
            stale = sorted({*stale_in(job), cluster})
            self.in_flight.pop(name, None)
            REQUEUED.labels(cluster).inc()
            self._annotate(
                job,
                {
                    DISPATCHED_TO_ANNOTATION: None,
                    STALE_IN_ANNOTATION: ",".join(stale),
                    HUB_MESSAGE_ANNOTATION: f"cluster {cluster} was lost while it ran there; "
                    "sent again",
                },
            )

    def _remove_stale(self, jobs: dict[str, dict[str, Any]]) -> None:
        """In a cluster that answers, delete the copies that must not run: those of hub Jobs
        sent elsewhere after it was lost (or that a hub restarted while it was lost did not
        know of), and those whose hub Job is gone."""
        uids = {j["metadata"]["uid"]: (name, j) for name, j in jobs.items()}
        stale = {
            name: stale_in(j) for name, j in jobs.items() if annotation(j, STALE_IN_ANNOTATION)
        }
        for name, worker in self.workers.items():
            if worker.state not in ("Ready", "Recovering") or not worker.synced():
                continue
            left = 0
            for uid, copy in self.copies[name].items():
                deleting = bool(copy["metadata"].get("deletionTimestamp"))
                owner = uids.get(uid)
                if owner is None:
                    if self.cache.synced() and not deleting:
                        self._delete_copy(worker, copy)
                    continue
                where = self._where(*owner)
                if where != name and (name in stale.get(owner[0], ()) or where is not None):
                    left += 1  # until it is gone: a copy made again would meet it (409)
                    if not deleting:
                        self._delete_copy(worker, copy)
            for job_name, clusters in stale.items():
                job = jobs[job_name]
                if name in clusters and job["metadata"]["uid"] not in self.copies[name]:
                    rest = [c for c in clusters if c != name]
                    self._annotate(job, {STALE_IN_ANNOTATION: ",".join(rest) or None})
            if worker.state == "Recovering" and left == 0:
                worker.state = "Ready"
                log.info("cluster %s is ready again: no stale copy is left there", name)

    # --- dispatch ---------------------------------------------------------------------------

    def _dispatch(self, fleet: Fleet, jobs: dict[str, dict[str, Any]]) -> bool:
        """Send what the engine admits somewhere; True if anything was sent."""
        now = datetime.now(UTC)
        ready = {
            name: w
            for name, w in self.workers.items()
            if w.state == "Ready" and w.synced() and fleet.clusters[name].spec.dispatch
        }
        unavailable = {
            name: _unavailable(w, fleet.clusters[name])
            for name, w in self.workers.items()
            if name not in ready
        }
        for name in fleet.clusters:
            unavailable.setdefault(name, "is not connected")
        waiting: list[Candidate] = []
        sent: dict[str, list[Workload]] = {name: [] for name in ready}
        for name, job in jobs.items():
            cluster = self._where(name, job)
            if finished(job):
                continue
            if cluster is not None:
                worker = ready.get(cluster)
                if worker is not None and self._copy_gone(name, job, cluster):
                    continue  # sent again from the next cycle
                # the worker shows the copy (named as the hub Job) once its controller saw it
                if worker is not None and _gpuworkload_of(worker, job) is None:
                    workload = self._workload(job, fleet, now)
                    if workload is not None:
                        sent[cluster].append(workload)
                continue
            adopted = self._adopt(job, ready)
            if adopted:
                continue
            workload = self._workload(job, fleet, now)
            if workload is not None:
                waiting.append(Candidate(workload, pinned_cluster(job)))
        if not waiting:
            WAITING.set(0)
            return False
        waiting.sort(key=lambda c: (c.workload.submitted_at, c.workload.name))
        snapshots = {
            name: worker_snapshot(
                fleet.for_cluster(name),
                worker.cache.items("nodes"),
                worker.cache.items("gpuworkloads"),
                now,
                sent[name],
            )
            for name, worker in ready.items()
        }
        result = dispatch(snapshots, waiting, unavailable)
        WAITING.set(len(result.waiting))
        # not waited for: the next cycle decides while these are made, and counts them where
        # they go (in_flight) until each is made or refused
        self.in_flight.update(result.sent)
        for name, cluster in result.sent.items():
            self.pool.submit(self._send, jobs[name], ready[cluster])
        writes = []
        for name, message in result.waiting.items():
            if annotation(jobs[name], HUB_MESSAGE_ANNOTATION) != message:
                writes.append(
                    self.pool.submit(self._annotate, jobs[name], {HUB_MESSAGE_ANNOTATION: message})
                )
        for write in writes:
            write.result()
        return bool(result.sent)

    def _workload(self, job: dict[str, Any], fleet: Fleet, now: datetime) -> Workload | None:
        """The engine's view of a hub Job, read again only when its spec or the fleet changed
        (a burst's Jobs are asked about every cycle until they are sent)."""
        uid, generation = job["metadata"]["uid"], job["metadata"].get("generation")
        known = self.workloads.get(uid)
        if known is not None and known[0] == (generation, self._fleet_version()):
            return known[1]
        try:
            workload = hub_workload(job, fleet, now)
        except RequestError as err:
            if annotation(job, HUB_MESSAGE_ANNOTATION) != str(err):
                self._annotate(job, {HUB_MESSAGE_ANNOTATION: str(err)})
            return None
        self.workloads[uid] = ((generation, self._fleet_version()), workload)
        return workload

    def _fleet_version(self) -> int:
        return self._fleet[0] if self._fleet is not None else -1

    def _copy_gone(self, name: str, job: dict[str, Any], cluster: str) -> bool:
        """Whether the copy the hub Job records was deleted in its worker (by someone there):
        the Job is then sent again, as after a lost cluster, rather than waiting for a copy
        that no longer exists."""
        if name in self.in_flight or dispatched_to(job) != cluster:
            return False  # not recorded yet: the copy may still be on its way
        if job["metadata"]["uid"] in self.copies.get(cluster, {}):
            return False
        log.info("%s: its copy in %s is gone; sending it again", name, cluster)
        self._annotate(
            job,
            {
                DISPATCHED_TO_ANNOTATION: None,
                HUB_MESSAGE_ANNOTATION: f"its copy in cluster {cluster} was deleted there; "
                "sent again",
            },
        )
        return True

    def _adopt(self, job: dict[str, Any], ready: dict[str, Worker]) -> bool:
        """A copy made before the hub recorded where (a hub stopped between the two writes)
        is the hub Job's copy: recorded now, never made twice."""
        for name in ready:
            if name in stale_in(job):
                continue
            if job["metadata"]["uid"] in self.copies.get(name, {}):
                self._annotate(job, {DISPATCHED_TO_ANNOTATION: name})
                return True
        return False

    def _send(self, job: dict[str, Any], worker: Worker) -> None:
        if self.stop.is_set() or (
            self.leader is not None and not self.leader.holds(spare=API_TIMEOUT_S)
        ):
            # stopping, or the lead may pass before this write lands: the next leader decides
            self.in_flight.pop(key(job), None)
            return
        body = copy_for_worker(job)
        metadata = body["metadata"]
        try:
            made = worker.custom.create_namespaced_custom_object(
                "batch", "v1", metadata["namespace"], "jobs", body,
                _preload_content=False, _request_timeout=API_TIMEOUT_S,
            )  # fmt: skip
            worker.cache.store("jobs", json.loads(made.data))
        except ApiException as err:
            if err.status != 409:  # 409: made already, by an earlier try
                self.in_flight.pop(key(job), None)
                message = (
                    f"cluster {worker.name} refused its copy: {api_message(err) or err.reason}"
                )
                log.warning("%s: %s", key(job), message)
                self._annotate(job, {HUB_MESSAGE_ANNOTATION: message})
                return
        except Exception as err:  # the worker stopped answering: asked again next cycle
            self.in_flight.pop(key(job), None)
            log.info("%s: copy into %s failed (%s)", key(job), worker.name, err)
            return
        DISPATCHED.labels(worker.name).inc()
        self.mirrored_at[key(job)] = time.monotonic()

    def _where(self, name: str, job: dict[str, Any]) -> str | None:
        """The cluster of the hub Job's copy: as recorded on it, or as sent by this process
        and not recorded yet (that write waits until a burst is sent)."""
        return dispatched_to(job) or self.in_flight.get(name)

    # --- status ---------------------------------------------------------------------------

    def _mirror(self, jobs: dict[str, dict[str, Any]]) -> None:
        """Each dispatched hub Job records where its copy is, and shows the copy's status and
        its GPUWorkload's state (written in the background, one Job's writes at a time, each
        Job's at most every MIRROR_EVERY_S)."""
        now = time.monotonic()
        for name, job in jobs.items():
            cluster = self._where(name, job)
            worker = self.workers.get(cluster or "")
            if worker is None or worker.state != "Ready":
                continue
            copy = self.copies.get(worker.name, {}).get(job["metadata"]["uid"])
            if copy is None:
                continue
            found = _gpuworkload_of(worker, copy)
            versions = (
                worker.name,
                _version(job),
                _version(copy),
                _version(found) if found is not None else "",
            )
            if self.mirror_seen.get(name) == versions:
                continue  # nothing of the three changed since it showed all of it
            patch = mirrored_status(job, copy)
            state = (found.get("status") or {}).get("state") if found is not None else None
            wanted = {
                DISPATCHED_TO_ANNOTATION: worker.name,
                HUB_STATE_ANNOTATION: state or "Pending",
                HUB_MESSAGE_ANNOTATION: None,
            }
            changed = any(annotation(job, k) != v for k, v in wanted.items())
            if not changed and self.in_flight.get(name) == worker.name:
                del self.in_flight[name]  # recorded on the hub Job now
            if patch is None and not changed:
                self.mirror_seen[name] = versions
                continue
            since = now - self.mirrored_at.get(name, 0.0)
            if since < MIRROR_EVERY_S or (_settling(state, copy) and since < MIRROR_SETTLE_S):
                continue  # a later cycle writes what it has then
            with self.mirror_lock:
                if name in self.mirroring:
                    continue
                self.mirroring.add(name)
            self.mirrored_at[name] = now
            self.mirror_pool.submit(self._mirror_one, name, job, patch, wanted if changed else None)

    def _mirror_one(
        self,
        name: str,
        job: dict[str, Any],
        patch: dict[str, Any] | None,
        annotations: dict[str, str | None] | None,
    ) -> None:
        try:
            if patch is not None:
                self._status(job, patch)
            if annotations is not None:
                self._annotate(job, annotations)
        finally:
            with self.mirror_lock:
                self.mirroring.discard(name)

    def _status(self, job: dict[str, Any], patch: dict[str, Any]) -> None:
        metadata = job["metadata"]
        try:
            made = self.custom.patch_namespaced_custom_object_status(
                "batch", "v1", metadata["namespace"], "jobs", metadata["name"],
                {"status": patch}, _preload_content=False, _request_timeout=API_TIMEOUT_S,
            )  # fmt: skip
            self.cache.store("jobs", json.loads(made.data))
        except ApiException as err:
            log.warning("%s: status not mirrored: %s", key(job), api_message(err) or err.reason)

    def _annotate(self, job: dict[str, Any], values: dict[str, str | None]) -> None:
        metadata = job["metadata"]
        try:
            made = self.custom.patch_namespaced_custom_object(
                "batch", "v1", metadata["namespace"], "jobs", metadata["name"],
                {"metadata": {"annotations": values}},
                _preload_content=False, _request_timeout=API_TIMEOUT_S,
            )  # fmt: skip
            self.cache.store("jobs", json.loads(made.data))
        except ApiException as err:
            if err.status != 404:
                log.warning("%s: not annotated: %s", key(job), api_message(err) or err.reason)

    def _delete_copy(self, worker: Worker, copy: dict[str, Any]) -> None:
        metadata = copy["metadata"]
        try:
            worker.custom.delete_namespaced_custom_object(
                "batch", "v1", metadata["namespace"], "jobs", metadata["name"],
                body={"propagationPolicy": "Background", "preconditions": {"uid": metadata["uid"]}},
                _request_timeout=API_TIMEOUT_S,
            )  # fmt: skip
            log.info(
                "removed %s/%s from cluster %s",
                metadata["namespace"],
                metadata["name"],
                worker.name,
            )
        except ApiException as err:
            if err.status not in (404, 409):
                log.warning("cannot remove a copy from %s: %s", worker.name, api_message(err))
        except Exception as err:
            log.info("cannot remove a copy from %s yet (%s)", worker.name, err)

    def _cluster_status(self, fleet: Fleet, jobs: dict[str, dict[str, Any]]) -> None:
        fleet_version = self._fleet_version()
        for name in fleet.clusters:
            worker = self.workers.get(name)
            state = worker.state if worker is not None else "Unknown"
            for each in CLUSTER_STATES:
                CLUSTER_STATE.labels(name, each).set(1 if state == each else 0)
            held = self.status_written.get(name)
            now = time.monotonic()
            if (
                held is not None
                and held[1]["state"] == state
                and held[2] == fleet_version  # a pool added in git shows at once
                and now - held[0] < CLUSTER_STATUS_EVERY_S
            ):
                continue  # its counts are rewritten at most every CLUSTER_STATUS_EVERY_S
            if worker is not None:
                status = cluster_status(worker, fleet, jobs)
            else:  # never connected: say why
                status = {"state": "Unknown", "message": self.problems.get(name)}
            if held is not None and held[1] == status:
                # looked at again in a while
                self.status_written[name] = (now, status, fleet_version)
                continue
            try:
                self.custom.patch_cluster_custom_object_status(
                    GROUP, VERSION, "clusters", name, {"status": status},
                    _request_timeout=API_TIMEOUT_S,
                )  # fmt: skip
                self.status_written[name] = (now, status, fleet_version)
            except ApiException as err:
                log.warning("Cluster %s: status not written: %s", name, api_message(err))


def _kept(held: dict[str, V], keys: Collection[str]) -> dict[str, V]:
    """`held` without the entries whose key is not in `keys` (itself when none is gone)."""
    if len(held) <= len(keys):
        return held
    return {k: v for k, v in held.items() if k in keys}


def _settling(state: str | None, copy: dict[str, Any]) -> bool:
    """Whether the copy is on its way to running: admitted or not yet, or its pods not all
    ready (each step would be one more write of the hub Job)."""
    status = copy.get("status") or {}
    return state in SETTLING_STATES or (status.get("active") or 0) != (status.get("ready") or 0)


def _gpuworkload_of(worker: Worker, job: dict[str, Any]) -> dict[str, Any] | None:
    """The worker's GPUWorkload of a copy (or of the hub Job: a copy has its name)."""
    metadata = job["metadata"]
    return worker.cache.get("gpuworkloads", (metadata["namespace"], metadata["name"]))


def _version(obj: dict[str, Any]) -> str:
    return str(obj["metadata"].get("resourceVersion", ""))


def _unavailable(worker: Worker, cluster: Cluster) -> str:
    if not cluster.spec.dispatch:
        return "takes no new work (spec.dispatch is false)"
    if worker.state == "Lost":
        return f"is lost (no heartbeat for {cluster.spec.lost_after})"
    if worker.state == "Recovering":
        return "is back and its stale copies are being removed"
    return "is not connected yet" + (f" ({worker.message})" if worker.message else "")


def cluster_status(worker: Worker, fleet: Fleet, jobs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    nodes = [n for n in (node_of(o) for o in worker.cache.items("nodes")) if n is not None]
    held = 0.0
    for obj in worker.cache.items("gpuworkloads"):
        spec, status = obj.get("spec") or {}, obj.get("status") or {}
        if status.get("state") in ("Queued", "Starting", "Running"):
            held += float(spec.get("gpus", 0)) * int(spec.get("pods", 1))
    return {
        "state": worker.state,
        "message": worker.message if worker.state != "Ready" else None,
        "lastHeartbeat": worker.last_heartbeat.isoformat().replace("+00:00", "Z")
        if worker.last_heartbeat
        else None,
        "kubernetesVersion": worker.version,
        "nodes": len(nodes),
        "gpus": sum(n.gpus for n in nodes),
        "allocatedGPUs": held,
        "workloads": sum(
            1 for j in jobs.values() if dispatched_to(j) == worker.name and not finished(j)
        ),
        "pools": fleet.pools_in(worker.name),
    }
