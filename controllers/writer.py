"""The loop's writes, made in the background so that the loop never waits on the API.

A cycle hands each object it changes to the `Writer` and goes on: the next cycle can start
while the API server still answers the last one's writes (a Job created mid-apply is decided
within a debounce, not after the whole batch). Until a write returns, the cache *assumes* its
outcome, so no cycle decides that object again or counts its GPUs as free. The writes to one
object run in the order they were handed over (a later cycle's write waits for the earlier
one); different objects are written in parallel. Every write of a cycle is handed over: were
an eviction held back, the admission onto its GPUs would over-allocate the node.

One request per change where the API allows it: a GPUWorkload has no status subresource, so
a new workload's GPUWorkload is created with its first status (the engine's first decision
about it) in one request; an unchanged status is never written (`actions.changes_for` only
returns changes). A status that may wait (`Change.status_may_wait`: an admission's record, which
the admitted object or its released pods also carry) is held back, assumed, until the
workload's next status write (Running, a moment later), which carries both, or until its
deadline. A workload admitted at its first decision thus costs one GPUWorkload request, the
create that carries its admission and Running together.
"""

from __future__ import annotations

import itertools
import json
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, cast

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpufleet.kube.cache import ClusterCache
from gpufleet.kube.calls import API_TIMEOUT_S, api_message
from gpufleet.kube.kinds import POD, adapter_of, stamped
from gpufleet.kube.kinds.base import merge_patch
from gpufleet.lifecycle import LifecycleEvent
from gpufleet.model.api import GROUP, VERSION

from .actions import Change, PodWrite

log = logging.getLogger("gpufleet.writer")
Assumed = tuple[str, dict[str, Any]]  # (kind, the object as the write will leave it)
RETRY_HELD_S = 1.0  # a held status whose write failed is tried again this much later


@dataclass(frozen=True)
class HeldStatus:
    """A GPUWorkload status held back to be written with the next one, or at `deadline`."""

    key: str  # namespace/name of the GPUWorkload
    status: dict[str, Any]
    assumed: dict[str, Any]  # the GPUWorkload as the write will leave it (assumed meanwhile)
    deadline: float  # time.monotonic()
    releasing: bool = False  # its own write is handed over
    # the GPUWorkload to create with the status, where none exists yet (a workload admitted at
    # its first decision): its create is held back with the record
    create: dict[str, Any] | None = None


def _workload_key(workload: dict[str, Any]) -> str:
    return f"{workload['metadata']['namespace']}/{workload['metadata']['name']}"


class Writer:
    """Background writes with assumed outcomes; see the module docstring."""

    def __init__(
        self,
        cache: ClusterCache,
        custom: client.CustomObjectsApi,
        core: client.CoreV1Api,
        written: threading.Event,
        workers: int = 16,
    ) -> None:
        self.cache, self.custom, self.core = cache, custom, core
        self.written = written  # set after every write: the loop may now decide that object
        self.workers = workers
        # objects whose next write is due, most urgent first (`submit`), for `workers` threads
        self.ready: queue.PriorityQueue[tuple[int, int, str]] = queue.PriorityQueue()
        self.order = itertools.count()
        # per object waiting in `ready`, the order number of its live entry there and whether
        # it is urgent: an urgent write behind a waiting one of the same object enters it
        # again, ahead, and the entry it supersedes is passed over
        self.entries: dict[str, tuple[int, bool]] = {}
        for index in range(workers):
            threading.Thread(target=self._work, name=f"gpufleet-write-{index}", daemon=True).start()
        # Events are a record for people, not part of a decision: one at a time, behind the rest
        self.events = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gpufleet-events")
        self.lock = threading.Lock()
        # per object, the writes not yet done, in the order handed over (with their urgency);
        # the first is running
        self.queued: dict[str, deque[tuple[list[Assumed], Callable[[], None], bool]]] = {}
        # a change's lifecycle transition is published once its writes succeeded: the ledger
        # and notifications never hear of an admission the cluster did not get
        self.published: Callable[[Sequence[LifecycleEvent]], None] | None = None
        # statuses held back, by object key: taken by the next status write of that object
        # when it runs (writes to one object run in order), or written on their own when due
        self.held: dict[str, HeldStatus] = {}
        self.held_changed = threading.Condition(self.lock)
        threading.Thread(target=self._release_due, name="gpufleet-held", daemon=True).start()

    def busy(self) -> set[str]:
        """Keys of the objects with a write in flight, queued or held back."""
        with self.lock:
            return set(self.queued) | set(self.held)

    def wait_idle(self, timeout: float) -> bool:
        """Write what is held back now, and wait until no write is in flight (at shutdown);
        False if some still were."""
        with self.lock:
            keys = list(self.held)
        for key in keys:
            self._release(key)
        deadline = time.monotonic() + timeout
        while self.busy():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.02)
        return True

    # --- statuses held back ----------------------------------------------------------------

    def _hold(self, key: str, held: HeldStatus) -> None:
        """Hold `held` back (under any status still held for the object, which it updates)."""
        with self.lock:
            earlier = self.held.get(key)
            if earlier is not None:
                status = {**earlier.status, **held.status}
                held = replace(
                    held,
                    status=status,
                    deadline=min(earlier.deadline, held.deadline),
                    create=earlier.create if earlier.create is not None else held.create,
                )
            self.held[key] = held
            self.held_changed.notify()
        self.cache.assume("gpuworkloads", held.assumed)

    def _take_held(self, key: str) -> HeldStatus | None:
        """The status held back for `key`, which the caller now writes (run in that object's
        turn)."""
        with self.lock:
            return self.held.pop(key, None)

    def _release_due(self) -> None:
        with self.lock:
            while True:
                now = time.monotonic()
                waiting = [h for h in self.held.values() if not h.releasing]
                due = [h.key for h in waiting if h.deadline <= now]
                if not due:
                    wait = min((h.deadline for h in waiting), default=now + 60) - now
                    self.held_changed.wait(wait)
                    continue
                self.lock.release()
                try:
                    for key in due:
                        self._release(key)
                finally:
                    self.lock.acquire()

    def _release(self, key: str) -> None:
        """Hand over the write of the status held back for `key` on its own."""
        with self.lock:
            held = self.held.get(key)
            if held is None or held.releasing:
                return
            self.held[key] = replace(held, releasing=True)

        def work() -> None:
            self._write_status(key, {})  # unless a write of the object took it meanwhile

        self.submit(key, [], work)

    def _write_status(self, key: str, status: dict[str, Any]) -> None:
        """Patch a GPUWorkload's status with `status` over any status held back for it (or
        create it with them, where its create was held back too); a held status whose write
        fails is held again (tried once more soon)."""
        held = self._take_held(key)
        create = held.create if held is not None else None
        if held is not None:
            status = {**held.status, **status}
        if not status and create is None:
            return
        namespace, name = key.split("/", 1)
        try:
            if create is not None:
                written = self._create({**create, "status": status})
            else:
                written = self._patch_workload(namespace, name, {"status": status})
        except Exception as err:
            refused = isinstance(err, ApiException) and 400 <= (err.status or 0) < 500
            if held is not None and not refused:  # e.g. the API server is restarting
                retry = time.monotonic() + RETRY_HELD_S
                self._hold(key, replace(held, deadline=retry, releasing=False))
            elif held is not None:  # e.g. gone with its Job: nothing to record any more
                self.cache.forget("gpuworkloads", held.assumed)
            raise
        self.cache.store("gpuworkloads", written)
        if held is not None:
            self.cache.forget("gpuworkloads", held.assumed)

    def _patch_workload(self, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        """Merge-patch a GPUWorkload (its spec and status alike: it has no status
        subresource)."""
        return cast(
            dict[str, Any],
            self.custom.patch_namespaced_custom_object(
                GROUP, VERSION, namespace, "gpuworkloads", name, patch,
                _request_timeout=API_TIMEOUT_S,
            ),
        )  # fmt: skip

    def submit(
        self, key: str, assumed: list[Assumed], work: Callable[[], None], urgent: bool = False
    ) -> None:
        """Run `work` in the background after the writes to the same object handed over
        before it; readers see `assumed` (kind, object) from now until it has run. An `urgent`
        write (one that frees or hands over GPUs: an eviction, a pod's release) goes before the
        others that are due: in a reclaim wave the GPUWorkloads and statuses of hundreds of
        workloads would otherwise hold the releases back by seconds."""
        for kind, obj in assumed:
            self.cache.assume(kind, obj)
        with self.lock:
            waiting = self.queued.setdefault(key, deque())
            waiting.append((assumed, work, urgent))
            in_line = self.entries.get(key)  # None while its write runs
            if len(waiting) == 1 or (urgent and in_line is not None and not in_line[1]):
                # its first write, or one the others wait behind: a reserved Job's release
                # waited behind its GPUWorkload's create, itself behind hundreds of others
                self._due(key, urgent)
            # else a write in flight starts this one when it ends

    def _due(self, key: str, urgent: bool) -> None:
        """Put the object's next write in line (called with the lock held)."""
        entry = next(self.order)
        self.entries[key] = (entry, urgent)
        self.ready.put((0 if urgent else 1, entry, key))

    def _work(self) -> None:
        while True:
            _, entry, key = self.ready.get()
            if not key:
                return  # shut down
            with self.lock:
                in_line = self.entries.get(key)
                if in_line is None or in_line[0] != entry:
                    continue  # an urgent write put the object in line again, ahead
                del self.entries[key]
            self._run(key)

    def _run(self, key: str) -> None:
        with self.lock:
            assumed, work, _ = self.queued[key][0]
        try:
            work()
        except ApiException as err:
            # e.g. the Job changed or its pods still terminate: the next cycle decides again
            log.info("could not update %s (%s: %s)", key, err.reason, api_message(err))
        except Exception:
            log.exception("writing %s failed; the next cycle decides it again", key)
        finally:
            # what the API answered is stored by `work`; on failure what was before shows again
            for kind, obj in assumed:
                self.cache.forget(kind, obj)
            with self.lock:
                waiting = self.queued[key]
                waiting.popleft()
                if waiting:
                    self._due(key, any(urgent for _, _, urgent in waiting))
                else:
                    del self.queued[key]
            self.written.set()

    # --- the workload writes ---------------------------------------------------------------

    def workload(
        self,
        obj: dict[str, Any],
        workload: dict[str, Any],
        change: Change | None,
        create: bool,
    ) -> None:
        """Write one managed workload's change: create its GPUWorkload with its status when
        `create` (held back with an admission's record that may wait), then the patches of its
        object and its pods in order, then the GPUWorkload status (first where the change says
        so); the Event once all of them succeeded."""
        metadata = obj["metadata"]
        kind = adapter_of(obj)
        namespace, name = metadata["namespace"], workload["metadata"]["name"]
        key = f"{namespace}/{name}"
        status = dict(change.status) if change is not None else {}
        if create:
            status.setdefault("state", "Pending")
            status["submittedAt"] = metadata["creationTimestamp"]
        patches = change.patches if change is not None else ()
        assumed: list[Assumed] = []
        if patches:
            after = obj
            for patch in patches:
                after = merge_patch(after, patch)
            assumed.append((kind.plural, after))
        pod_writes = change.pod_writes if change is not None else ()
        assumed.extend(("pods", w.after) for w in pod_writes)
        status_after = merge_patch(workload, {"status": status}) if status else workload
        if status or create:
            assumed.append(("gpuworkloads", status_after))
        status_first = change is not None and change.status_first
        may_wait = change.status_may_wait if change is not None and not status_first else 0.0

        # a new workload's GPUWorkload is created with its status, in one request; with an
        # admission's record that may wait, that request waits with it
        create_now = create and may_wait <= 0
        body = {**workload, "status": status} if create_now else None

        def write_status() -> None:
            if may_wait > 0:  # the object's patches succeeded: the record may wait
                deadline = time.monotonic() + may_wait
                # a copy of its own: the assumption of this write ends when it returns
                held = HeldStatus(
                    key, status, dict(status_after), deadline, create=workload if create else None
                )
                self._hold(key, held)
            elif body is None:
                self._write_status(key, status)

        def work() -> None:
            if body is not None:
                self.cache.store("gpuworkloads", self._create(body))
            if status and status_first:
                write_status()
            for patch in patches:
                # a merge patch through the generic path serves every kind, batch/v1 included
                response = self.custom.patch_namespaced_custom_object(
                    kind.group,
                    kind.version,
                    namespace,
                    kind.plural,
                    metadata["name"],
                    patch,
                    _preload_content=False,
                    _request_timeout=API_TIMEOUT_S,
                )
                self.cache.store(kind.plural, stamped(json.loads(response.data), kind))
            for write in pod_writes:
                self._pod(namespace, write)
            if status and not status_first:
                write_status()
            if change is not None and change.lifecycle is not None and self.published:
                self.published([change.lifecycle])
            if change is not None and change.event is not None:
                self.events.submit(self._event, obj, *change.event)

        urgent = change is not None and (change.evicts or bool(change.pod_writes))
        self.submit(key, assumed, work, urgent)

    def _pod(self, namespace: str, write: PodWrite) -> None:
        """Release (JSON patch) or delete one pod (a finalized one once its finalizer is
        off); a pod already gone is no error (a gated kind's controller makes another, held;
        a suspended Job's makes none)."""
        try:
            if write.unfinalize is not None:
                try:
                    self.core.patch_namespaced_pod(
                        write.name,
                        namespace,
                        write.unfinalize,
                        _preload_content=False,
                        _request_timeout=API_TIMEOUT_S,
                    ).read()  # to the end: only then does the connection go back to the pool
                except ApiException as err:
                    if err.status != 422:
                        raise
                    # its finalizers changed since it was cached: deleted now it might count
                    # as failed; its controller deletes it as it should
                    log.info(
                        "pod %s/%s left to its controller: %s",
                        namespace,
                        write.name,
                        api_message(err),
                    )
                    return
            if write.patch is None:
                response = self.core.delete_namespaced_pod(
                    write.name, namespace, _preload_content=False, _request_timeout=API_TIMEOUT_S
                )
                # read to the end (only then does the connection go back to the pool) and keep
                # the pod shown as deleting until the watch says what became of it
                answer = json.loads(response.data)
                if answer.get("kind") == "Pod":
                    self.cache.store_deleting("pods", answer)
            else:
                response = self.core.patch_namespaced_pod(
                    write.name,
                    namespace,
                    write.patch,
                    _preload_content=False,
                    _request_timeout=API_TIMEOUT_S,
                )
                self.cache.store("pods", json.loads(response.data))
        except ApiException as err:
            if err.status != 404:
                raise

    # --- bare pods: made again after a preemption, their GPUWorkload kept in step -----------

    def remake_pod(self, workload: dict[str, Any]) -> None:
        """Make a preempted bare pod again, held, from the manifest its GPUWorkload keeps (the
        next cycle finds it and records its new uid: `adopt_pod`)."""
        namespace, key = workload["metadata"]["namespace"], _workload_key(workload)
        spec = workload["spec"]
        pod = POD.remade(namespace, spec["workloadRef"]["name"], spec.get("podTemplate") or {})

        def work() -> None:
            try:
                response = self.core.create_namespaced_pod(
                    namespace, pod, _preload_content=False, _request_timeout=API_TIMEOUT_S
                )
            except ApiException as err:
                if err.status != 409:
                    raise
                return  # the old pod is not gone yet, or the new one is there: next cycle
            self.cache.store("pods", json.loads(response.data))
            log.info("made bare pod %s/%s again, held", namespace, pod["metadata"]["name"])

        self.submit(key, [], work)

    def adopt_pod(self, workload: dict[str, Any], uid: str) -> None:
        """Point a bare pod's GPUWorkload at the pod made again (its new uid) and clear the
        debt (`podDeletedAt`)."""
        namespace, name = workload["metadata"]["namespace"], workload["metadata"]["name"]
        reference = {**workload["spec"]["workloadRef"], "uid": uid}
        after = merge_patch(
            workload, {"spec": {"workloadRef": reference}, "status": {"podDeletedAt": None}}
        )

        def work() -> None:
            patch = {"spec": {"workloadRef": reference}, "status": {"podDeletedAt": None}}
            self.cache.store("gpuworkloads", self._patch_workload(namespace, name, patch))

        self.submit(_workload_key(workload), [("gpuworkloads", after)], work)

    def delete_workload(self, workload: dict[str, Any]) -> None:
        """Delete the GPUWorkload of a bare pod its owner deleted (what the garbage collector
        does for the other kinds, whose GPUWorkload their object owns)."""
        namespace, name = workload["metadata"]["namespace"], workload["metadata"]["name"]

        def work() -> None:
            held = self._take_held(_workload_key(workload))
            if held is not None:  # its create was held back: nothing to delete but that
                self.cache.forget("gpuworkloads", held.assumed)
            try:
                self.custom.delete_namespaced_custom_object(
                    GROUP, VERSION, namespace, "gpuworkloads", name, _request_timeout=API_TIMEOUT_S
                )
            except ApiException as err:
                if err.status != 404:
                    raise
            self.cache.apply_event("gpuworkloads", "DELETED", workload)

        self.submit(_workload_key(workload), [], work)

    def _create(self, body: dict[str, Any]) -> dict[str, Any]:
        """Create a GPUWorkload with its status; where it exists already (an earlier
        controller made it and the watch has not brought it yet), patch its status."""
        namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
        try:
            created = self.custom.create_namespaced_custom_object(
                GROUP, VERSION, namespace, "gpuworkloads", body, _request_timeout=API_TIMEOUT_S
            )
        except ApiException as err:
            if err.status != 409:
                raise
            return self._patch_workload(namespace, name, {"status": body.get("status") or {}})
        return cast(dict[str, Any], created)

    def fleet_status(self, plural: str, obj: dict[str, Any], status: dict[str, Any]) -> None:
        """Patch a GitOps object's status (GPUPool, Team, Reservation)."""
        kind = obj["kind"]
        name = obj["metadata"]["name"]

        def work() -> None:
            patched = self.custom.patch_cluster_custom_object_status(
                GROUP, VERSION, plural, name, {"status": status}, _request_timeout=API_TIMEOUT_S
            )
            self.cache.store(plural, cast(dict[str, Any], patched))

        self.submit(f"{kind}/{name}", [(plural, merge_patch(obj, {"status": status}))], work)

    def event(self, obj: dict[str, Any], reason: str, message: str) -> None:
        """Record an Event on a workload's object, behind the other writes."""
        self.events.submit(self._event, obj, reason, message)

    def _event(self, obj: dict[str, Any], reason: str, message: str) -> None:
        now = datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
        metadata = obj["metadata"]
        kind = adapter_of(obj)
        # a plain body and an unparsed answer: building and reading the client's models would
        # cost more of the interpreter than all the other writes of a burst together
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {
                "generateName": f"{metadata['name']}.",
                "namespace": metadata["namespace"],
            },
            "involvedObject": {
                "apiVersion": kind.api_version,
                "kind": kind.kind,
                "name": metadata["name"],
                "namespace": metadata["namespace"],
                "uid": metadata["uid"],
            },
            "reason": reason,
            "message": message[:1024],
            "type": "Normal",
            "source": {"component": "gpufleet"},
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            response = self.core.create_namespaced_event(
                metadata["namespace"], event, _preload_content=False, _request_timeout=API_TIMEOUT_S
            )
            # read to the end: only then does the connection go back to the pool (left unread,
            # every Event cost the next request a new connection and TLS handshake)
            response.data  # noqa: B018
        except ApiException as err:
            log.info("could not record event %s on %s: %s", reason, metadata["name"], err.reason)

    def shutdown(self, timeout: float) -> None:
        """Let the writes in flight end (up to `timeout`); drop queued Events, so that a
        backlog of them never keeps a stopping controller alive."""
        self.events.shutdown(wait=False, cancel_futures=True)
        if not self.wait_idle(timeout):
            log.warning("stopping with writes still in flight: %s", sorted(self.busy())[:10])
        for _ in range(self.workers):
            self.ready.put((2, next(self.order), ""))  # after everything due: each thread ends
