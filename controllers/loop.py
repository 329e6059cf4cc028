"""The workload loop. A cycle is five steps: observe (the caches → the managed workloads as
they are) → decide (a snapshot → the engine) → plan (decisions → changes) → publish (the
cycle's outcome to its subscribers: metrics, derived objects, diagnosis, alerts, the ledger;
subscribers.py) → apply (hand the writes to the `Writer`).

Cycles run on watch events (debounced) and on the loop's own timers (back-off ends, minimum
runtimes), with a resync at least every `interval` seconds. A cycle reads only the watch
caches and never waits on a write: the writes of one cycle go on while the next observes, which
sees their outcomes as assumed by the cache (so nothing is decided twice). The loop is
level-triggered, so a restarted controller picks up where the last one stopped: all state lives
in the workloads' own objects (Jobs, JobSets, ...) and their GPUWorkloads.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, Literal, Protocol

import urllib3

from gpufleet.engine import Decisions, Snapshot, SnapshotError, decide
from gpufleet.kube.cache import ClusterCache
from gpufleet.kube.kinds import KINDS, POD, WorkloadKind
from gpufleet.kube.observe import (
    Kept,
    Observed,
    Partition,
    Seen,
    Use,
    admissions_to_undo,
    foreign_use,
    gpu_nodes,
    is_managed,
    next_timer,
    partition,
    snapshot,
    unchanged,
    workload_state,
)
from gpufleet.kube.request import Request, RequestError, request_of
from gpufleet.lifecycle import LifecycleEvent, PoolFacts, Publisher, Transition, pool_facts
from gpufleet.model.api import GROUP, VERSION, GPUHost
from gpufleet.model.durations import parse_duration
from gpufleet.model.fleet import Fleet
from gpufleet.model.keys import SUBMITTER_ANNOTATION, TEAM_LABEL
from gpufleet.model.states import ADMITTED_STATES

from . import metrics
from .actions import Change, changes_for, lifecycle_event
from .derived import DerivedSync
from .diagnosis import Diagnoser
from .health import HealthReconciler
from .leader import LeaderElection
from .ledger import LedgerSink
from .notifications import Dispatcher
from .provisioning import ProvisioningWatch
from .status import fleet_status
from .subscribers import (
    Alerts,
    CycleOutcome,
    Subscriber,
    diagnose,
    record_metrics,
    record_usage,
    sync_derived,
)
from .writer import Writer

log = logging.getLogger("gpufleet.controller")
WAITING_REFRESH_S = 5.0  # a waiting workload's position and ETA are rewritten at most this often
# ... and all of them together at most this many times a second: a long queue refreshes each
# workload less often instead of costing the API server requests in proportion to its length
WAITING_REFRESHES_PER_S = 20.0
# a GitOps object's status (its pool's allocated GPUs, a team's used ones) is rewritten at most
# this often: in a burst it changes every cycle, and was a write per object per cycle; a change
# held back is written by a cycle after this (one runs at least every `--interval`)
FLEET_STATUS_EVERY_S = 2.0
HEALTHY_CYCLES = 12  # /healthz fails after this many loop intervals without a cycle
FLEET_PLURALS = {
    "GPUPool": "gpupools",
    "Team": "teams",
    "Reservation": "reservations",
    "FleetPolicy": "fleetpolicies",
}


@dataclass(frozen=True)
class Observation:
    """What a cycle observed."""

    observed: list[Observed]
    new: set[tuple[str, str]]  # workloads whose GPUWorkload the writer creates
    pods_of: dict[str, list[dict[str, Any]]]  # each workload's pods
    pods: list[dict[str, Any]]
    nodes: list[dict[str, Any]]  # after this cycle's quarantine decisions
    parts: Partition
    foreign: dict[str, Use]  # what pods the engine does not see take of each node
    # admissions undone this cycle (in parts.requeue): their GPUs were still held by victims
    undone: frozenset[str] = frozenset()


class FleetSource(Protocol):
    fleet_objects: list[dict[str, Any]]

    def load_fleet(self) -> Fleet: ...


class WorkloadLoop:
    def __init__(
        self,
        cache: ClusterCache,
        fleet: FleetSource,
        leader: LeaderElection,
        health: HealthReconciler,
        writer: Writer,
        derived: DerivedSync,
        stop: threading.Event,
        interval: float,
        debounce: float,
        provisioning: ProvisioningWatch | None = None,
        ledger: LedgerSink | None = None,
        notifier: Dispatcher | None = None,
        diagnoser: Diagnoser | None = None,
    ) -> None:
        self.cache, self.fleet, self.leader, self.health = cache, fleet, leader, health
        self.provisioning = provisioning
        # every lifecycle transition goes to the subscribers (ledger, metrics, notifications)
        # once: the writer publishes a change's transition when its writes succeeded
        self.lifecycle = Publisher()
        writer.published = self.lifecycle.publish
        if ledger is not None:
            self.lifecycle.subscribe(ledger.publish)
        if notifier is not None:
            self.lifecycle.subscribe(notifier.lifecycle)
        self.notifier = notifier
        # what follows every cycle, in this order
        self.subscribers: list[Subscriber] = [record_metrics, sync_derived(derived)]
        if diagnoser is not None:
            self.subscribers.append(diagnose(diagnoser))
        hosts = self._hosts
        if notifier is not None:
            self.subscribers.append(Alerts(notifier, ledger, hosts))
        if ledger is not None:
            self.subscribers.append(record_usage(ledger, hosts))
        self.holding: dict[str, Observed] = {}  # workloads holding GPUs at the last cycle
        # each workload as the last cycle observed it, with its pods: derived again only when
        # its object, GPUWorkload or pods are other objects (the caches replace, never edit)
        self.last_observed: dict[tuple[str, str], Seen] = {}
        self.writer, self.derived, self.stop = writer, derived, stop
        self.interval, self.debounce = interval, debounce
        self.wake = cache.changed  # watch events; the writer sets it after each write too
        self.cycles = 0
        self.next_timer: datetime | None = None
        self.alive_at = time.monotonic()
        self.fleet_status_written: dict[tuple[str, str], float] = {}  # (kind, name) -> when
        # when a fleet status held back by FLEET_STATUS_EVERY_S is due: a cycle then (nothing
        # else may start one soon: `gpufleet status` read a pool's allocation seconds late)
        self.fleet_status_due: float | None = None
        self.waiting_written: dict[str, float] = {}  # workload -> when its waiting status was
        # the engine's placements and their inputs, kept between cycles: a cycle places again
        # only what changed (the engine places everything where that could differ)
        self.kept = Kept()
        # the uids of held workloads that cannot be admitted as written, each told once
        self.refused: set[str] = set()

    def _hosts(self) -> list[dict[str, Any]]:
        """The GPUHosts (hosts outside Kubernetes), as the watch holds them."""
        return self.cache.items(GPUHost.plural) if GPUHost.plural in self.cache.stores else []

    def _refuse(self, obj: dict[str, Any], kind: WorkloadKind, reason: str) -> None:
        """Say once, in the log and in an Event on the object, why a workload held for
        admission cannot be admitted: one the API server held while no webhook refused it, or
        one the fleet changed under (its Team deleted). It stays held until it is fixed."""
        uid = obj["metadata"].get("uid", "")
        if uid in self.refused:
            return
        self.refused.add(uid)
        log.warning("%s", reason)
        if kind.suspended(obj) or kind.holds_pods(obj):
            self.writer.event(obj, "Refused", f"{reason} (it stays held until then)")

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                if not self.leader.lead():
                    self.alive_at = time.monotonic()
                    self.stop.wait(2)  # a standby instance: serve webhooks, decide nothing
                    continue
                self.wake.clear()  # events from here on start another cycle
                started = time.monotonic()
                with metrics.CYCLE_SECONDS.time():
                    self.cycle()
                self.alive_at = time.monotonic()
                # wait as long as the cycle took: without the wait, cycles in a burst ran back
                # to back deciding a few Jobs each (the default benchmark: twice the cycles,
                # 35-55 % more CPU, no Job running sooner), CPU the watches and, in a small
                # cluster, the API server wanted
                self.stop.wait(min(self.alive_at - started, self.interval))
            except (urllib3.exceptions.HTTPError, OSError) as err:
                # the API server restarts or is unreachable: no traceback for what is expected
                metrics.RECONCILE_ERRORS.inc()
                log.warning("workload loop: API server not reachable (%s); retrying", err)
                self.stop.wait(1)
            except Exception:  # keep the loop alive; the next cycle starts from scratch
                metrics.RECONCILE_ERRORS.inc()
                log.exception("workload loop failed; retrying")
                self.stop.wait(1)
            self.wake.wait(self._sleep_seconds())
            self.stop.wait(self.debounce)  # let a burst of events arrive

    def health_problem(self) -> str | None:
        """Why the liveness probe should fail, or None: the loop has not completed a cycle (or
        a standby round) for HEALTHY_CYCLES intervals, e.g. a cycle hangs on the API."""
        stalled = time.monotonic() - self.alive_at
        limit = HEALTHY_CYCLES * self.interval + 30  # +30: the watches' first LIST
        if stalled > limit:
            return f"the workload loop has not completed a cycle for {stalled:.0f}s"
        return None

    def _sleep_seconds(self) -> float:
        sleep = self.interval
        if self.next_timer is not None:
            sleep = min((self.next_timer - datetime.now(UTC)).total_seconds(), sleep)
        if self.fleet_status_due is not None:
            sleep = min(self.fleet_status_due - time.monotonic(), sleep)
        return max(sleep, 0.0)

    def cycle(self) -> None:
        now = datetime.now(UTC)
        fleet = self.fleet.load_fleet()
        seen = self._observe(fleet, now)
        cluster, decisions, seen = self._decide_step(fleet, seen, now)
        status = self._write_fleet_status(fleet, cluster, seen.nodes, seen.foreign)
        facts = pool_facts(fleet, seen.nodes)
        changes = self._plan(fleet, seen, decisions, now, facts)
        if (changes or seen.new) and not self.leader.holds():
            log.warning("lost the lead during the cycle; its changes are not written")
            return
        self._publish(changes, seen.observed, now, facts)
        outcome = CycleOutcome(
            now, fleet, facts, cluster, decisions, seen.observed, status, seen.nodes, seen.pods
        )
        for subscriber in self.subscribers:
            subscriber(outcome)
        self._apply(changes, seen)
        self.cycles += 1

    def _observe(self, fleet: Fleet, now: datetime) -> Observation:
        """Every managed workload as the caches show it (its state derived again only where
        one of its objects changed), the nodes after this cycle's quarantine decisions, and
        which workloads the engine decides about."""
        # the pods are read once: bare pods are workloads among them
        pods = self.cache.items("pods")
        objects = [
            (kind, o)
            for kind in KINDS
            if kind.plural in self.cache.stores
            for o in (pods if kind.plural == "pods" else self.cache.items(kind.plural))
            if is_managed(o)
        ]
        workloads = {_key(w): w for w in self.cache.items("gpuworkloads")}
        stale = self._repair_bare_pods(workloads.values())
        pods_by_owner = group_pods(pods)
        # a new workload's GPUWorkload is decided with the rest now and created by the writer
        # with the first decision's status
        new: set[tuple[str, str]] = set()
        observed = []
        pods_of: dict[str, list[dict[str, Any]]] = {}
        last, self.last_observed = self.last_observed, {}
        for adapter, obj in objects:
            namespace, name = _key(obj)
            key = (namespace, adapter.workload_name(name))
            if key in stale:
                continue  # a bare pod made anew by its owner: a new GPUWorkload next cycle
            workload = workloads.get(key)
            if workload is None:
                try:
                    workload = _workload_body(obj, adapter, fleet)
                except RequestError as err:
                    self._refuse(obj, adapter, str(err))
                    continue
                if workload is None:
                    continue
                workloads[key] = workload
                new.add(key)
            named = adapter.pods_named(obj)
            if adapter.bare:
                own = [obj]  # a bare pod is its own pod
            else:
                own = pods_by_owner.get((namespace, adapter.pod_label, named), []) if named else []
            item = unchanged(last.get(key), obj, workload, own)
            if item is None:
                state, nodes = workload_state(obj, workload, own)
                writes_pods = adapter.gated or adapter.pod_finalizer is not None
                item = Observed(obj, workload, state, nodes, tuple(own) if writes_pods else ())
            self.last_observed[key] = (item, tuple(own))
            pods_of[item.key] = own
            observed.append(item)
        # quarantine decisions first: the engine must see a quarantined node as unhealthy now
        node_objects = self.health.reconcile(
            fleet.policy.health, self.cache.items("nodes"), now, self._hosts()
        )
        parts = partition(fleet, node_objects, observed)
        # GPUs of pods the engine does not see (unmanaged or hidden work) still count as used
        seen = {_key(p) for o in parts.included for p in pods_of[o.key]}
        foreign = foreign_use(pods, seen, gpu_nodes(node_objects))
        return Observation(observed, new, pods_of, pods, node_objects, parts, foreign)

    def _decide_step(
        self, fleet: Fleet, seen: Observation, now: datetime
    ) -> tuple[Snapshot, Decisions, Observation]:
        """The snapshot, the engine's decisions, and what was observed with the admissions
        this cycle undoes added to those it places again."""
        cluster = snapshot(fleet, seen.nodes, seen.parts.included, now, seen.foreign, self.kept)
        decisions, undone = self._decide(cluster)
        self.next_timer = next_timer(cluster, now)
        if undone:
            again = [*seen.parts.requeue, *(o for o in seen.parts.included if o.key in undone)]
            seen = replace(seen, parts=replace(seen.parts, requeue=again), undone=undone)
        return cluster, decisions, seen

    def _apply(self, changes: list[Change], seen: Observation) -> None:
        """Hand every change to the writer: all of a decision's writes, or its admissions
        could land on GPUs whose evictions were held back; evictions first, so their GPUs start
        draining before anything else. A new workload without a change gets its GPUWorkload."""
        by_key = {o.key: o for o in seen.observed}
        changed = {c.key for c in changes}
        for change in sorted(changes, key=lambda c: not c.evicts):
            item = by_key[change.key]
            self.writer.workload(item.obj, item.workload, change, _key(item.workload) in seen.new)
        for key in seen.new:
            name = f"{key[0]}/{key[1]}"
            if name not in changed and name in by_key:
                item = by_key[name]
                self.writer.workload(item.obj, item.workload, None, True)

    def _repair_bare_pods(self, workloads: Iterable[dict[str, Any]]) -> set[tuple[str, str]]:
        """Hand the writer the repairs of bare pods' GPUWorkloads (none while a write of that
        workload is in flight); returns the GPUWorkloads that go this cycle."""
        repairs = bare_pod_repairs(workloads, lambda key: self.cache.get("pods", key))
        if not repairs:
            return set()
        busy = self.writer.busy()
        stale = set()
        for repair in repairs:
            key = _key(repair.workload)
            if f"{key[0]}/{key[1]}" in busy:
                continue
            if repair.action == "remake":
                self.writer.remake_pod(repair.workload)
            elif repair.action == "adopt":
                self.writer.adopt_pod(repair.workload, repair.uid)
            else:
                stale.add(key)
                self.writer.delete_workload(repair.workload)
        return stale

    def _publish(
        self,
        changes: list[Change],
        observed: list[Observed],
        now: datetime,
        facts: dict[str, PoolFacts],
    ) -> None:
        """Publish a cancellation for each workload that held GPUs at the last cycle and whose
        object is gone now (the writer publishes the transitions of `changes` once written)."""
        present = {o.key for o in observed}
        cancelled = [
            lifecycle_event(Transition.CANCELLED, gone, now, facts, reason="Deleted")
            for key, gone in self.holding.items()
            if key not in present
        ]
        events: list[LifecycleEvent] = [c.lifecycle for c in changes if c.lifecycle is not None]
        started = {e.workload for e in events if e.transition.starts_segment}
        ended = {e.workload for e in events if e.transition.ends_segment}
        self.holding = {
            o.key: o
            for o in observed
            if (o.state in ADMITTED_STATES or o.key in started) and o.key not in ended
        }
        self.lifecycle.publish(cancelled)

    def _plan(
        self,
        fleet: Fleet,
        seen: Observation,
        decisions: Decisions,
        now: datetime,
        facts: dict[str, PoolFacts],
    ) -> list[Change]:
        """The changes of this cycle, and what Karpenter said of the nodes waiting work asked
        for. A waiting workload's status (position, ETA) is rewritten at most every
        WAITING_REFRESH_S (longer when many wait) unless its state or reason changed."""
        mono = time.monotonic()
        waiting = {w.workload for w in decisions.pending}
        refresh_s = waiting_refresh_seconds(len(waiting))
        settled = {k for k, at in self.waiting_written.items() if mono - at < refresh_s}
        changes = changes_for(
            decisions, seen.observed, now, seen.parts.requeue, settled, facts, seen.undone
        )
        self.waiting_written = {
            k: at for k, at in self.waiting_written.items() if k in settled and k in waiting
        }
        for change in changes:
            if change.key in waiting and change.status:
                self.waiting_written[change.key] = mono
        if self.provisioning is not None:
            decided = {c.key for c in changes}
            parts = seen.parts.included
            changes += self.provisioning.changes(fleet, parts, seen.pods_of, now, decided)
        return changes

    def _write_fleet_status(
        self,
        fleet: Fleet,
        cluster: Snapshot,
        nodes: list[dict[str, Any]],
        foreign: dict[str, Use],
    ) -> dict[tuple[str, str], dict[str, Any]]:
        reservations = {
            name: (r.spec.team, r.spec.pool, r.spec.gpus) for name, r in fleet.reservations.items()
        }
        timeout = parse_duration(fleet.policy.health.agent_timeout)
        wanted = fleet_status(cluster, nodes, foreign, reservations, timeout)
        if self.notifier is not None:
            wanted.update(self._policy_status(fleet))
        self.fleet_status_due = None
        for obj in self.fleet.fleet_objects:
            kind, name = obj["kind"], obj["metadata"]["name"]
            status = wanted.get((kind, name))
            if status is None or kind not in FLEET_PLURALS:
                continue
            held = self.cache.get(FLEET_PLURALS[kind], ("", name)) or obj
            current = held.get("status") or {}
            if all(current.get(k) == v for k, v in status.items()):
                continue
            now = time.monotonic()
            due = self.fleet_status_written.get((kind, name), -FLEET_STATUS_EVERY_S)
            due += FLEET_STATUS_EVERY_S
            if now < due:
                self.fleet_status_due = min(due, self.fleet_status_due or due)
                continue
            self.fleet_status_written[(kind, name)] = now
            self.writer.fleet_status(FLEET_PLURALS[kind], held, status)
        return wanted

    def _policy_status(self, fleet: Fleet) -> dict[tuple[str, str], dict[str, Any]]:
        """Each FleetPolicy's notification routes: ready, or why not."""
        assert self.notifier is not None
        known = self.notifier.route_status()
        return {
            ("FleetPolicy", name): {
                "notifications": [
                    {
                        "name": route.name,
                        "ready": known.get(route.name, (False, ""))[0],
                        "message": known.get(route.name, (False, "not checked yet"))[1],
                    }
                    for route in policy.spec.notifications.routes
                ]
            }
            for name, policy in fleet.policies.items()
        }

    def _decide(self, state: Snapshot) -> tuple[Decisions, frozenset[str]]:
        """The engine's decisions, and the admissions to undo. Where the engine finds pods on
        more GPUs than a node has, an admission the contradiction shows to be only a plan
        (`admissions_to_undo`) is undone: placed again, it evicts its victims again. Any other
        workload the engine finds contradictory (e.g. pods waiting for nodes still being
        registered) is left out of this cycle rather than stopping every other workload."""
        undone: set[str] = set()
        while True:
            try:
                return decide(state, placed=self.kept.placed), frozenset(undone)
            except SnapshotError as err:
                plans = admissions_to_undo(state.workloads, err.workload) if err.taken else ()
                if plans:
                    log.warning("placing %s again: %s", ", ".join(plans), err)
                else:
                    log.warning("leaving %s out of this cycle: %s", err.workload, err)
                out = set(plans) or {err.workload}
                undone.update(plans)
                kept = tuple(w for w in state.workloads if w.name not in out)
                state = replace(state, workloads=kept)


def waiting_refresh_seconds(waiting: int) -> float:
    """How long a waiting workload's position and ETA stand before they are rewritten."""
    return max(WAITING_REFRESH_S, waiting / WAITING_REFRESHES_PER_S)


def _key(obj: dict[str, Any]) -> tuple[str, str]:
    return obj["metadata"]["namespace"], obj["metadata"]["name"]


def group_pods(pods: list[dict[str, Any]]) -> dict[tuple[str, str, str], list[dict[str, Any]]]:
    """Pods by (namespace, label, value) for each label a kind marks its pods with: the pods
    of a workload are those whose label names it."""
    labels = {kind.pod_label for kind in KINDS}
    out: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for pod in pods:
        pod_labels = pod["metadata"].get("labels") or {}
        for label in labels & pod_labels.keys():
            out.setdefault((pod["metadata"]["namespace"], label, pod_labels[label]), []).append(pod)
    return out


def _workload_body(obj: dict[str, Any], kind: WorkloadKind, fleet: Fleet) -> dict[str, Any] | None:
    """The GPUWorkload of a managed workload (owned by its object, so it goes when the object
    goes), or None when gpufleet leaves the object alone; RequestError when it is not a valid
    request of the fleet as it is now."""
    request = request_of(obj, fleet)
    if request is None:
        return None
    metadata = obj["metadata"]
    reference = {
        "apiVersion": kind.api_version,
        "kind": kind.kind,
        "name": metadata["name"],
        "uid": metadata["uid"],
    }
    body: dict[str, Any] = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "GPUWorkload",
        "metadata": {
            "name": kind.workload_name(metadata["name"]),
            "namespace": metadata["namespace"],
            "labels": {TEAM_LABEL: request.team},
            "ownerReferences": [{**reference, "controller": True, "blockOwnerDeletion": False}],
        },
        "spec": _workload_spec(request, reference),
    }
    submitter = (metadata.get("annotations") or {}).get(SUBMITTER_ANNOTATION)
    if submitter:
        body["spec"]["submitter"] = submitter
    if kind.bare:
        # it outlives the pod a preemption deletes (the loop deletes it when its owner
        # deletes the pod) and keeps what the pod is made again from
        del body["metadata"]["ownerReferences"]
        body["spec"]["podTemplate"] = POD.manifest(obj)
    return body


@dataclass(frozen=True)
class Repair:
    """What a bare pod's GPUWorkload needs: its pod made again (`remake`), the pod made
    again recorded (`adopt`, its uid), or to go with a pod its owner deleted (`delete`)."""

    action: Literal["remake", "adopt", "delete"]
    workload: dict[str, Any]
    uid: str = ""


def bare_pod_repairs(
    workloads: Iterable[dict[str, Any]], pod: Callable[[tuple[str, str]], dict[str, Any] | None]
) -> list[Repair]:
    """The repairs of the GPUWorkloads of bare pods (`pod`: the pod of a namespace and name, or
    None). A GPUWorkload whose `podDeletedAt` is set is owed its pod: a preemption deleted it.
    Without that, a pod gone or made anew (another uid) was its owner's doing."""
    out = []
    for workload in workloads:
        reference = workload["spec"].get("workloadRef") or {}
        if reference.get("kind") != POD.kind or reference.get("apiVersion") != POD.api_version:
            continue
        found = pod((workload["metadata"]["namespace"], reference.get("name", "")))
        owed = bool((workload.get("status") or {}).get("podDeletedAt"))
        if found is None:
            out.append(Repair("remake" if owed else "delete", workload))
        elif found["metadata"].get("uid") != reference.get("uid"):
            uid = str(found["metadata"].get("uid", ""))
            out.append(Repair("adopt", workload, uid) if owed else Repair("delete", workload))
    return out


def _workload_spec(request: Request, reference: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "team": request.team,
        "class": request.workload_class,
        "priority": request.priority,
        "gpus": request.gpus,
        "pods": request.pods,
        "workloadRef": reference,
    }
    if request.pool:
        spec["pool"] = request.pool
    if request.topology:
        spec["topology"] = request.topology
    if request.gpu_types:
        spec["gpuTypes"] = list(request.gpu_types)
    return spec
