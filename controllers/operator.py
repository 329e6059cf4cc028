"""The gpufleet operator: admission webhooks for Jobs and the workload loop.

A thin shell: `jobs` says what a Job asks for, `observe` turns the cluster into an engine
snapshot, the engine decides, `actions` says what to change, and this module talks to the API.
The loop is level-triggered (it re-reads the cluster each cycle, woken early by Job events), so a
restarted controller picks up where the last one stopped: all state lives in the Jobs and their
GPUWorkloads.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import kopf
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic import DynamicClient

from gpufleet.engine import Decisions, Snapshot, SnapshotError, decide
from gpufleet.model.api import GROUP, NAMED_PRIORITIES, VERSION
from gpufleet.model.fleet import Fleet, fleet_from_objects
from gpufleet.pki import create_pki, issue_serving_cert
from gpufleet.render import ClusterSettings, Target, render
from gpufleet.render.common import MANAGED_BY, MANAGED_BY_LABEL
from gpufleet.render.crds import render_crds
from gpufleet.render.kai import queue_name_for_team
from gpufleet.render.priorityclasses import (
    RESERVED_CLASS,
    elastic_class_name,
    render_priority_classes,
)

from . import metrics
from .actions import Change, plan
from .cache import ClusterCache, Informer, Store, trim_pod
from .health import HealthReconciler
from .jobs import (
    TEAM_LABEL,
    Request,
    RequestError,
    creation_patch,
    request_of,
)
from .leader import LeaderElection
from .observe import (
    Observed,
    discovered_pools,
    foreign_gpus,
    is_managed,
    job_state,
    next_timer,
    partition,
    snapshot,
)
from .status import fleet_status
from .webhooks import WebhookRegistration

log = logging.getLogger("gpufleet.controller")
# (apiVersion, kind, CRD that must be installed first; None: built in)
DERIVED = (
    ("scheduling.k8s.io/v1", "PriorityClass", None),
    ("karpenter.sh/v1", "NodePool", "nodepools.karpenter.sh"),
    ("karpenter.k8s.aws/v1", "EC2NodeClass", "ec2nodeclasses.karpenter.k8s.aws"),
    ("karpenter.k8s.gcp/v1alpha1", "GCENodeClass", "gcenodeclasses.karpenter.k8s.gcp"),
    ("scheduling.run.ai/v2", "Queue", "queues.scheduling.run.ai"),
)
FIELD_MANAGER = "gpufleet-controller"
API_TIMEOUT_S = 10  # no API call of the loop may hang it
FLEET_GRACE_S = 1.0  # how long admission waits for a GitOps object it has not seen yet
DERIVED_SYNC_S = 10.0  # how often derived objects (NodePools, Queues, ...) are checked
WAITING_REFRESH_S = 5.0  # a waiting workload's position and ETA are rewritten at most this often
HEALTHY_CYCLES = 12  # /healthz fails after this many loop intervals without a cycle
FLEET_KINDS = ("gpupools", "teams", "reservations", "fleetpolicies")
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"


class Settings:
    """Process-wide settings, set by `gpufleet controller run` before kopf starts."""

    # the longest the loop sleeps without a watch event or a timer of its own (resync)
    interval = float(os.environ.get("GPUFLEET_LOOP_INTERVAL", "5.0"))
    # events closer together than this are decided in one cycle
    debounce = float(os.environ.get("GPUFLEET_DEBOUNCE", "0.05"))
    webhook_host = os.environ.get("GPUFLEET_WEBHOOK_HOST", "127.0.0.1")
    webhook_port = int(os.environ.get("GPUFLEET_WEBHOOK_PORT", "9443"))
    state_dir = Path(os.environ.get("GPUFLEET_STATE_DIR", tempfile.gettempdir()))
    lease_namespace = os.environ.get("GPUFLEET_LEASE_NAMESPACE", "kube-system")
    scheduler_name = os.environ.get("GPUFLEET_SCHEDULER_NAME", "")
    metrics_host = os.environ.get("GPUFLEET_METRICS_HOST", "0.0.0.0")
    metrics_port = int(os.environ.get("GPUFLEET_METRICS_PORT", "8080"))
    # in a cluster (the Helm chart): certificates from a Secret, webhook configurations and
    # CRDs installed by the chart, so the controller needs no rights on them
    webhook_cert_dir = os.environ.get("GPUFLEET_WEBHOOK_CERT_DIR", "")
    manage_webhooks = os.environ.get("GPUFLEET_MANAGE_WEBHOOKS", "true") == "true"
    install = os.environ.get("GPUFLEET_INSTALL", "true") == "true"


class Controller:
    """The API access and the workload loop."""

    def __init__(self) -> None:
        if not os.environ.get("KUBECONFIG") and os.environ.get("KUBERNETES_SERVICE_HOST"):
            config.load_incluster_config()
        else:
            config.load_kube_config(os.environ.get("KUBECONFIG"))
        self.core = client.CoreV1Api()
        self.batch = client.BatchV1Api()
        self.custom = client.CustomObjectsApi()
        self.extensions = client.ApiextensionsV1Api()
        self.dynamic = DynamicClient(client.ApiClient())
        self.leader = LeaderElection(
            client.CoordinationV1Api(), Settings.lease_namespace, "gpufleet-controller"
        )
        self.fleet = Fleet()
        self.fleet_objects: list[dict[str, Any]] = []
        self.derived_fingerprint = ""
        self.derived_synced_at = 0.0
        self.cluster_name = os.environ.get("GPUFLEET_CLUSTER_NAME", "gpufleet")
        self.pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="gpufleet-apply")
        # Events are a record for people, not part of a decision: sent off the loop's path
        self.events = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gpufleet-events")
        self.stop = threading.Event()
        self.cache = ClusterCache(
            [
                Store("jobs"),
                Store("pods", trim_pod),
                Store("nodes"),
                Store("gpuworkloads"),
                *(Store(kind) for kind in FLEET_KINDS),
            ]
        )
        self.wake = self.cache.changed
        self.fleet_version = -1
        self.fleet_lock = threading.Lock()
        self.cycles = 0
        self.next_timer: datetime | None = None
        self.health = HealthReconciler(self.core, Settings.lease_namespace)
        self.informers: list[Informer] = []
        self.webhooks: WebhookRegistration | None = None
        self.alive_at = time.monotonic()
        self.waiting_written: dict[str, float] = {}  # workload -> when its waiting status was

    def start_informers(self, timeout: float = 60) -> None:
        """Start the watches and wait until each kind has been listed once."""
        custom = functools.partial(self.custom.list_cluster_custom_object, GROUP, VERSION)
        calls: list[tuple[str, Any]] = [
            ("jobs", self.batch.list_job_for_all_namespaces),
            ("pods", self.core.list_pod_for_all_namespaces),
            ("nodes", self.core.list_node),
            ("gpuworkloads", functools.partial(custom, "gpuworkloads")),
            *((kind, functools.partial(custom, kind)) for kind in FLEET_KINDS),
        ]
        for kind, call in calls:
            informer = Informer(self.cache, kind, call, self.stop)
            informer.start()
            self.informers.append(informer)
        if not self.cache.wait_for_sync(timeout):
            raise RuntimeError(f"the watch caches did not fill within {timeout:.0f}s")

    # --- setup -----------------------------------------------------------------------------

    def install(self) -> None:
        """Install our CRDs and PriorityClasses (server-side apply; idempotent)."""
        for crd in render_crds():
            self._apply(crd)
        for name in [c["metadata"]["name"] for c in render_crds()]:
            self._wait_established(name)
        for priority_class in render_priority_classes():
            self._apply(priority_class)

    def _apply(self, obj: dict[str, Any]) -> None:
        """Server-side apply with our field manager: we own what we render, nothing else."""
        resource = self.dynamic.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
        self.dynamic.server_side_apply(
            resource, body=obj, field_manager=FIELD_MANAGER, force_conflicts=True
        )

    def _wait_established(self, name: str, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            crd = self.extensions.read_custom_resource_definition(name)
            conditions = (crd.status.conditions or []) if crd.status else []
            if any(c.type == "Established" and c.status == "True" for c in conditions):
                return
            time.sleep(0.2)
        raise RuntimeError(f"CRD {name} was not established in {timeout}s")

    # --- reading the cluster -----------------------------------------------------------------

    def load_fleet(self) -> Fleet:
        """The fleet as the caches hold it, rebuilt only when a GitOps object changed."""
        with self.fleet_lock:
            version = sum(self.cache.versions[kind] for kind in FLEET_KINDS)
            if version == self.fleet_version:
                return self.fleet
            objects = [o for kind in FLEET_KINDS for o in self.cache.items(kind)]
            loaded = fleet_from_objects(objects)
            for problem in loaded.problems:
                log.warning("ignoring invalid object %s: %s", problem.file, problem.message)
            self.fleet, self.fleet_objects, self.fleet_version = loaded.fleet, objects, version
            return loaded.fleet

    # --- the loop ----------------------------------------------------------------------------

    def run_loop(self) -> None:
        """Cycles on watch events (debounced) and on the loop's own timers (back-off ends,
        minimum runtimes), with a resync at least every `interval` seconds."""
        while not self.stop.is_set():
            try:
                if self.leader.due():
                    self.leader.try_acquire_or_renew()
                if not self.leader.holds():
                    self.alive_at = time.monotonic()
                    self.stop.wait(2)  # a standby instance: serve webhooks, decide nothing
                    continue
                self.wake.clear()  # events from here on start another cycle
                started = time.monotonic()
                with metrics.CYCLE_SECONDS.time():
                    self.reconcile()
                self.alive_at = time.monotonic()
                # the loop takes at most half of the interpreter: the webhooks answer Job
                # creates in the other half, even in a burst
                self.stop.wait(min(self.alive_at - started, Settings.interval))
            except Exception:  # keep the loop alive; the next cycle starts from scratch
                metrics.RECONCILE_ERRORS.inc()
                log.exception("workload loop failed; retrying")
                self.stop.wait(1)
            self.wake.wait(self._sleep_seconds())
            self.stop.wait(Settings.debounce)  # let a burst of events arrive

    def health_problem(self) -> str | None:
        """Why the liveness probe should fail, or None: the loop has not completed a cycle (or
        a standby round) for HEALTHY_CYCLES intervals, e.g. a cycle hangs on the API."""
        stalled = time.monotonic() - self.alive_at
        limit = HEALTHY_CYCLES * Settings.interval + 30  # +30: the watches' first LIST
        if stalled > limit:
            return f"the workload loop has not completed a cycle for {stalled:.0f}s"
        return None

    def _sleep_seconds(self) -> float:
        if self.next_timer is None:
            return Settings.interval
        left = (self.next_timer - datetime.now(UTC)).total_seconds()
        return min(max(left, 0.0), Settings.interval)

    def reconcile(self) -> None:
        now = datetime.now(UTC)
        fleet = self.load_fleet()
        jobs = [j for j in self.cache.items("jobs") if is_managed(j)]
        workloads = {
            (w["metadata"]["namespace"], w["metadata"]["name"]): w
            for w in self.cache.items("gpuworkloads")
        }
        pods = self.cache.items("pods")
        pods_by_job: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for pod in pods:
            job_name = (pod["metadata"].get("labels") or {}).get(JOB_NAME_LABEL)
            if job_name is not None:
                key = (pod["metadata"]["namespace"], job_name)
                pods_by_job.setdefault(key, []).append(pod)
        new = [
            j for j in jobs if (j["metadata"]["namespace"], j["metadata"]["name"]) not in workloads
        ]
        # new Jobs' GPUWorkloads are created in parallel: a burst of creates is one round trip
        for job, created in zip(
            new, self.pool.map(lambda job: self._create_workload(job, fleet), new), strict=True
        ):
            if created is not None:
                workloads[_key(job)] = created
        observed = []
        for job in jobs:
            key = (job["metadata"]["namespace"], job["metadata"]["name"])
            workload = workloads.get(key)
            if workload is None:
                continue
            state, nodes = job_state(job, workload, pods_by_job.get(key, []))
            observed.append(Observed(job, workload, state, nodes))
        # quarantine decisions first: the engine must see a quarantined node as unhealthy now
        node_objects = self.health.reconcile(fleet.policy.health, self.cache.items("nodes"), now)
        parts = partition(fleet, node_objects, observed)
        # GPUs of pods the engine does not see (unmanaged or hidden work) still count as used
        seen = {(o.job["metadata"]["namespace"], o.job["metadata"]["name"]) for o in parts.included}
        foreign = foreign_gpus(pods, seen)
        cluster = snapshot(fleet, node_objects, parts.included, now, foreign)
        decisions = self._decide(cluster)
        status = self._update_fleet_status(cluster, node_objects, foreign)
        if fleet.pools:
            metrics.record_state(cluster, status)
        else:
            metrics.record_discovered(discovered_pools(node_objects, pods))
        metrics.record_decisions(decisions, cluster, {o.key: o.workload for o in observed}, now)
        self.next_timer = next_timer(cluster, now)
        if time.monotonic() - self.derived_synced_at > DERIVED_SYNC_S:
            self._sync_derived(fleet)
            self.derived_synced_at = time.monotonic()
        # all observed workloads: those the engine did not see still get their state synced
        mono = time.monotonic()
        settled = {k for k, at in self.waiting_written.items() if mono - at < WAITING_REFRESH_S}
        changes = plan(decisions, observed, now, parts.requeue, settled)
        waiting = {w.workload for w in decisions.pending}
        self.waiting_written = {
            k: at for k, at in self.waiting_written.items() if k in settled and k in waiting
        }
        for change in changes:
            written = f"{change.namespace}/{change.name}"
            if written in waiting and change.status:
                self.waiting_written[written] = mono
        by_key = {o.key: o for o in observed}
        evictions = [c for c in changes if c.job_patch == {"spec": {"suspend": True}}]
        others = [c for c in changes if c.job_patch != {"spec": {"suspend": True}}]
        # evictions first, so their GPUs start draining before anything is admitted onto them;
        # each group in parallel (the changes are independent objects)
        if (evictions or others) and not self.leader.holds():
            log.warning("lost the lead during the cycle; its changes are not written")
            return
        for group in (evictions, others):
            list(self.pool.map(lambda change: self._apply_change(change, by_key), group))
        self.cycles += 1

    def _update_fleet_status(
        self, cluster: Snapshot, nodes: list[dict[str, Any]], foreign: dict[str, int]
    ) -> dict[tuple[str, str], dict[str, Any]]:
        reservations = {
            name: (r.spec.team, r.spec.pool, r.spec.gpus)
            for name, r in self.fleet.reservations.items()
        }
        wanted = fleet_status(cluster, nodes, foreign, reservations)
        plural = {"GPUPool": "gpupools", "Team": "teams", "Reservation": "reservations"}
        for obj in self.fleet_objects:
            key = (obj["kind"], obj["metadata"]["name"])
            status = wanted.get(key)
            current = obj.get("status") or {}
            if status is None or all(current.get(k) == v for k, v in status.items()):
                continue
            try:
                self.custom.patch_cluster_custom_object_status(
                    GROUP, VERSION, plural[key[0]], key[1], {"status": status}
                )
            except ApiException as err:
                log.info("could not update status of %s/%s: %s", *key, err.reason)
        return wanted

    def _sync_derived(self, fleet: Fleet) -> None:
        """Render what the fleet implies (PriorityClasses; Karpenter NodePools and NodeClasses
        and KAI Queues where their CRDs are installed), apply it, and delete what gpufleet
        rendered before but no longer does. Objects without our label are never touched."""
        kinds = [k for k in DERIVED if k[2] is None or self._crd_installed(k[2])]
        objects = render(fleet, Target.ALL, ClusterSettings(name=self.cluster_name))
        served = {(k[0], k[1]) for k in kinds}
        wanted = [o for o in objects if (o["apiVersion"], o["kind"]) in served]
        fingerprint = json.dumps([sorted(served), wanted], sort_keys=True)
        if fingerprint == self.derived_fingerprint:
            return
        for obj in wanted:
            self._apply(obj)
        for api_version, kind, _crd in kinds:
            resource = self.dynamic.resources.get(api_version=api_version, kind=kind)
            names = {o["metadata"]["name"] for o in wanted if o["kind"] == kind}
            listed = resource.get(label_selector=f"{MANAGED_BY_LABEL}={MANAGED_BY}")
            for item in listed.items:
                if item.metadata.name not in names:
                    log.info("pruning %s %s, no longer rendered", kind, item.metadata.name)
                    resource.delete(name=item.metadata.name)
        self.derived_fingerprint = fingerprint

    def _crd_installed(self, name: str) -> bool:
        try:
            self.extensions.read_custom_resource_definition(name)
        except ApiException as err:
            if err.status == 404:
                return False
            raise
        return True

    def _decide(self, state: Snapshot) -> Decisions:
        """The engine's decisions; a workload the engine finds contradictory (its pods on
        more GPUs than a node has, as the cluster reports it) is left out of this cycle rather
        than stopping every other workload."""
        while True:
            try:
                return decide(state)
            except SnapshotError as err:
                log.warning("leaving %s out of this cycle: %s", err.workload, err)
                kept = tuple(w for w in state.workloads if w.name != err.workload)
                state = replace(state, workloads=kept)

    def _create_workload(self, job: dict[str, Any], fleet: Fleet) -> dict[str, Any] | None:
        try:
            request = request_of(job, fleet)
        except RequestError as err:
            log.warning("%s", err)
            return None
        if request is None:
            return None
        metadata = job["metadata"]
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "GPUWorkload",
            "metadata": {
                "name": metadata["name"],
                "namespace": metadata["namespace"],
                "labels": {TEAM_LABEL: request.team},
                "ownerReferences": [
                    {
                        "apiVersion": "batch/v1",
                        "kind": "Job",
                        "name": metadata["name"],
                        "uid": metadata["uid"],
                        "controller": True,
                        "blockOwnerDeletion": False,
                    }
                ],
            },
            "spec": _workload_spec(request, job),
        }
        namespace, name = metadata["namespace"], metadata["name"]
        try:
            self.custom.create_namespaced_custom_object(
                GROUP, VERSION, namespace, "gpuworkloads", body, _request_timeout=API_TIMEOUT_S
            )
            status = {"state": "Pending", "submittedAt": metadata["creationTimestamp"]}
            found = self.custom.patch_namespaced_custom_object_status(
                GROUP,
                VERSION,
                namespace,
                "gpuworkloads",
                name,
                {"status": status},
                _request_timeout=API_TIMEOUT_S,
            )
        except ApiException as err:
            if err.status != 409:
                log.info("could not create GPUWorkload %s/%s: %s", namespace, name, err.reason)
                return None
            # it exists and the watch has not brought it yet: take it as it is
            found = self.custom.get_namespaced_custom_object(
                GROUP, VERSION, namespace, "gpuworkloads", name, _request_timeout=API_TIMEOUT_S
            )
        created = cast(dict[str, Any], found)
        self.cache.store("gpuworkloads", created)
        return created

    def _apply_change(self, change: Change, observed: dict[str, Observed]) -> None:
        item = observed[f"{change.namespace}/{change.name}"]
        try:
            if change.job_patch is not None:
                response = self.batch.patch_namespaced_job(
                    change.name,
                    change.namespace,
                    change.job_patch,
                    _preload_content=False,
                    _request_timeout=API_TIMEOUT_S,
                )
                self.cache.store("jobs", json.loads(response.data))
            if change.status:
                patched = self.custom.patch_namespaced_custom_object_status(
                    GROUP,
                    VERSION,
                    change.namespace,
                    "gpuworkloads",
                    change.name,
                    {"status": change.status},
                    _request_timeout=API_TIMEOUT_S,
                )
                self.cache.store("gpuworkloads", cast(dict[str, Any], patched))
        except ApiException as err:
            # e.g. the Job changed or its pods still terminate: the next cycle decides again
            log.info(
                "could not update %s/%s (%s: %s); retrying next cycle",
                change.namespace,
                change.name,
                err.reason,
                _api_message(err),
            )
            return
        if change.event is not None:
            self.events.submit(self._event, item.job, *change.event)

    def _event(self, job: dict[str, Any], reason: str, message: str) -> None:
        now = datetime.now(UTC)
        metadata = job["metadata"]
        event = client.CoreV1Event(
            metadata=client.V1ObjectMeta(
                generate_name=f"{metadata['name']}.", namespace=metadata["namespace"]
            ),
            involved_object=client.V1ObjectReference(
                api_version="batch/v1",
                kind="Job",
                name=metadata["name"],
                namespace=metadata["namespace"],
                uid=metadata["uid"],
            ),
            reason=reason,
            message=message[:1024],
            type="Normal",
            source=client.V1EventSource(component="gpufleet"),
            first_timestamp=now,
            last_timestamp=now,
            count=1,
        )
        try:
            self.core.create_namespaced_event(metadata["namespace"], event)
        except ApiException as err:
            log.info("could not record event %s on %s: %s", reason, metadata["name"], err.reason)


def _key(obj: dict[str, Any]) -> tuple[str, str]:
    return obj["metadata"]["namespace"], obj["metadata"]["name"]


def _api_message(err: ApiException) -> str:
    try:
        return str(json.loads(err.body or "")["message"])[:300]
    except (ValueError, KeyError, TypeError):
        return ""


def _workload_spec(request: Request, job: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "team": request.team,
        "class": request.workload_class,
        "priority": request.priority,
        "gpus": request.gpus,
        "pods": request.pods,
        "workloadRef": {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "name": job["metadata"]["name"],
            "uid": job["metadata"]["uid"],
        },
    }
    if request.pool:
        spec["pool"] = request.pool
    return spec


def priority_class_for(request: Request) -> str:
    if request.workload_class == "reserved":
        return RESERVED_CLASS
    closest = min(
        NAMED_PRIORITIES,
        key=lambda n: (abs(NAMED_PRIORITIES[n] - request.priority), -NAMED_PRIORITIES[n]),
    )
    return elastic_class_name(closest)


# --- kopf wiring -------------------------------------------------------------------------------

CONTROLLER: Controller | None = None


@kopf.on.startup()
def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
    global CONTROLLER
    controller = Controller()
    if Settings.install:
        controller.install()
    controller.start_informers()
    controller.load_fleet()
    if Settings.webhook_cert_dir:
        # mounted from a Secret (the chart's generated certificate or cert-manager's)
        given = Path(Settings.webhook_cert_dir)
        settings.admission.server = kopf.WebhookServer(
            addr="0.0.0.0",  # all interfaces: reached through the chart's Service
            port=Settings.webhook_port,
            host=Settings.webhook_host,
            certfile=str(given / "tls.crt"),
            pkeyfile=str(given / "tls.key"),
        )
        if Settings.manage_webhooks:  # certificates given by hand: kopf registers the webhooks
            settings.admission.managed = "gpufleet.io"
    else:
        cert_dir = Settings.state_dir / "webhook"
        pki = create_pki(cert_dir)
        issue_serving_cert(
            pki.ca_cert,
            pki.ca_key,
            cert_dir / "webhook.crt",
            cert_dir / "webhook.key",
            [Settings.webhook_host],
        )
        settings.admission.server = kopf.WebhookServer(
            addr=Settings.webhook_host,
            port=Settings.webhook_port,
            host=Settings.webhook_host,
            certfile=str(cert_dir / "webhook.crt"),
            pkeyfile=str(cert_dir / "webhook.key"),
            cafile=str(pki.ca_cert),
        )
        if Settings.manage_webhooks:
            controller.webhooks = WebhookRegistration(
                client.AdmissionregistrationV1Api(),
                Settings.webhook_host,
                Settings.webhook_port,
                pki.ca_cert,
            )
            # the cluster's own Jobs and the controller's never wait on a dev controller
            controller.webhooks.register_when_serving(["kube-system", Settings.lease_namespace])
    settings.posting.level = logging.WARNING
    # a line per admission request (aiohttp's access log, kopf's "Webhook succeeded") costs
    # more than the answer itself in a burst of creates; refusals are still logged
    for name in ("aiohttp.access", "kopf.objects"):
        logging.getLogger(name).setLevel(logging.WARNING)
    if Settings.metrics_port:
        metrics.serve(Settings.metrics_port, Settings.metrics_host, controller.health_problem)
    CONTROLLER = controller
    threading.Thread(target=controller.run_loop, name="gpufleet-workload-loop", daemon=True).start()


@kopf.on.cleanup()
def cleanup(**_: Any) -> None:
    if CONTROLLER is not None:
        CONTROLLER.stop.set()
        CONTROLLER.wake.set()
        if CONTROLLER.webhooks is not None:
            CONTROLLER.webhooks.remove()  # a clean exit leaves no webhook behind


def _fleet() -> Fleet:
    """The fleet for admission, from the watch caches: no API call on the admission path."""
    return CONTROLLER.load_fleet() if CONTROLLER is not None else Fleet()


async def _request(job: dict[str, Any]) -> Request | None:
    """The Job's request against the cached fleet. A Job may arrive a moment before the watch
    event of the Team or pool it names: a request the fleet refuses is asked again once the
    fleet's caches change, for up to a second, before the refusal stands."""
    deadline = time.monotonic() + FLEET_GRACE_S
    while True:
        version = CONTROLLER.fleet_version if CONTROLLER is not None else 0
        try:
            return request_of(job, _fleet())
        except RequestError:
            if CONTROLLER is None or time.monotonic() >= deadline:
                raise
            while CONTROLLER.fleet_version == version and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
                CONTROLLER.load_fleet()


# One webhook, not a validating and a mutating one: a mutating webhook may refuse, and every
# Job create waits on each webhook in turn. The handler is a coroutine so that kopf answers it
# on its event loop instead of handing it to a thread pool (one GIL hand-off less per create).
@kopf.on.mutate("batch", "v1", "jobs", id="admit-jobs", operation="CREATE")
async def admit_job(body: kopf.Body, patch: kopf.Patch, **_: Any) -> None:
    """Refuse a malformed GPU Job of a team with the reason; suspend a valid one on creation
    (the workload loop admits it when the engine says)."""
    job = dict(body)
    try:
        request = await _request(job)
    except RequestError as err:
        raise kopf.AdmissionError(str(err), code=422) from None
    if request is None:
        return
    fleet = CONTROLLER.fleet if CONTROLLER is not None else Fleet()
    change = creation_patch(
        job,
        request,
        priority_class_for(request),
        Settings.scheduler_name or None,
        queue_name_for_team(fleet, request.team),
    )
    patch.metadata["annotations"] = change["metadata"]["annotations"]
    patch.metadata["labels"] = change["metadata"]["labels"]
    patch.spec["suspend"] = True
    patch.spec["template"] = change["spec"]["template"]
