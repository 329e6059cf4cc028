"""In-memory caches of the cluster, fed by watches: the loop and the webhooks read these, never
a LIST per cycle.

One `Informer` per resource: it LISTs once, then WATCHes from the list's resourceVersion (with
bookmarks), and LISTs again when the watch reports 410 Gone or fails. A re-LIST replaces the
store, so deletions missed while the watch was down are not kept. Objects are stored as plain
dicts, trimmed by a per-kind function to what the controllers read (a pod keeps its labels,
node, containers' GPU limits and phase, not its whole spec; a bare pod of a team is kept
whole), which keeps a 10,000-pod cluster in tens of MB.

Writes made by the controller are stored at once (`ClusterCache.store`) from the API's answer:
a cycle that starts before the watch delivers the change still sees it, so nothing is decided
twice. An object is replaced only by one with a newer resourceVersion. While a write is in
flight the object is *assumed* (`ClusterCache.assume`, as kube-scheduler assumes a pod bound
before the binding returns): readers see what the write will make of it, so a cycle that runs
meanwhile neither decides it again nor gives its GPUs to someone else; the assumption goes
(`forget`) when the write returns, leaving the API's answer or, on failure, what was before.
"""

from __future__ import annotations

import functools
import json
import logging
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from kubernetes import watch
from kubernetes.client.exceptions import ApiException

from gpufleet.model.keys import (
    ADMITTED_AT_ANNOTATION,
    ADMITTED_NODES_ANNOTATION,
    ADMITTED_POOL_ANNOTATION,
)

from .kinds import POD, WorkloadKind, stamped

log = logging.getLogger("gpufleet.cache")

Key = tuple[str, str]  # (namespace or "", name)
ABSENT_RECHECK_S = 30  # how often a kind the API server does not serve is looked for again
Trim = Callable[[dict[str, Any]], dict[str, Any]]


def key_of(obj: dict[str, Any]) -> Key:
    metadata = obj["metadata"]
    return (metadata.get("namespace") or "", metadata["name"])


def _now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _version(obj: dict[str, Any]) -> int:
    try:
        return int(obj["metadata"].get("resourceVersion") or 0)
    except ValueError:  # opaque to clients in principle; etcd revisions in practice
        return 0


def trim_pod(pod: dict[str, Any]) -> dict[str, Any]:
    """What the controllers read of a pod; a bare pod of a team is a workload of its own and
    is kept whole (with its apiVersion and kind: a LIST's items come without)."""
    if POD.selected(pod):
        return stamped(trim_managed_fields(pod), POD)
    metadata, spec, status = pod["metadata"], pod.get("spec") or {}, pod.get("status") or {}
    return {
        "metadata": {
            k: metadata[k]
            for k in (
                "name",
                "namespace",
                "labels",
                "resourceVersion",
                "uid",
                "ownerReferences",
                "creationTimestamp",
                "deletionTimestamp",
                "finalizers",  # a preempted Job's pods are deleted once the Job's is off
            )
            if k in metadata
        }
        | _admission_record(metadata, bool(spec.get("schedulingGates"))),
        "spec": {
            "nodeName": spec.get("nodeName"),
            "containers": [
                {"name": c.get("name"), "resources": c.get("resources") or {}}
                for c in spec.get("containers") or []
            ],
            # a pod held by a scheduling gate: what its release patches; a pod not bound yet:
            # the node its release pinned it to, which the release of its mates must leave
            # (few pods at a time)
            **(
                {k: spec[k] for k in ("schedulingGates", "nodeSelector", "affinity") if k in spec}
                if spec.get("schedulingGates") or not spec.get("nodeName")
                else {}
            ),
        },
        "status": {
            k: status[k] for k in ("phase", "conditions", "containerStatuses") if k in status
        },
    }


ADMISSION_RECORD = (ADMITTED_POOL_ANNOTATION, ADMITTED_AT_ANNOTATION, ADMITTED_NODES_ANNOTATION)


def _admission_record(metadata: dict[str, Any], held: bool) -> dict[str, Any]:
    """A held pod's annotations (its release adds to them: `actions.release`), of any other
    pod only the admission its release recorded."""
    if "annotations" not in metadata:
        return {}
    annotations = metadata["annotations"] or {}
    if held:
        return {"annotations": annotations}
    record = {k: annotations[k] for k in ADMISSION_RECORD if k in annotations}
    return {"annotations": record} if record else {}


def trim_node(node: dict[str, Any]) -> dict[str, Any]:
    """What the controllers read of a node: no image list, addresses or system info (a
    1,000-node cluster's nodes shrink to a few MB)."""
    metadata, spec, status = node["metadata"], node.get("spec") or {}, node.get("status") or {}
    return {
        "metadata": {
            k: metadata[k]
            for k in ("name", "labels", "annotations", "resourceVersion", "uid")
            if k in metadata
        },
        "spec": {k: spec[k] for k in ("taints", "unschedulable") if k in spec},
        "status": {k: status[k] for k in ("allocatable", "capacity", "conditions") if k in status},
    }


def node_matters(before: dict[str, Any], after: dict[str, Any]) -> bool:
    """Whether a node's change can change a decision. Heartbeats (the kubelet's and the GPU
    agent's lastHeartbeatTime) cannot: on a large cluster they arrive many times a second and
    would start a cycle each. Their absence is found by time, at the loop's resync."""

    def decisive(node: dict[str, Any]) -> tuple[Any, ...]:
        status = node.get("status") or {}
        conditions = sorted(
            (c.get("type"), c.get("status"), c.get("reason"), c.get("lastTransitionTime"))
            for c in status.get("conditions") or []
        )
        return (
            node["metadata"].get("labels"),
            node["metadata"].get("annotations"),
            node.get("spec"),
            status.get("allocatable"),
            conditions,
        )

    return decisive(before) != decisive(after)


def trim_managed_fields(obj: dict[str, Any]) -> dict[str, Any]:
    obj.get("metadata", {}).pop("managedFields", None)
    return obj


def workload_trim(kind: WorkloadKind) -> Trim:
    """What the store of a workload kind keeps: the object with its apiVersion and kind."""

    def trim(obj: dict[str, Any]) -> dict[str, Any]:
        return stamped(trim_managed_fields(obj), kind)

    return trim


SHARED_STRING_MAX = 24  # longer strings are mostly unique (uids, messages): not worth a lookup


def compact(value: Any) -> Any:
    """`value` with its keys and short strings shared with every other cached object.

    Each decoded watch event has its own copy of every key ("metadata", "creationTimestamp",
    ...) and of values such as "NonIndexed" or a team's name: in the scale run's 10,000 Jobs,
    pods and GPUWorkloads that duplication was over half of a cached Job's memory."""
    if isinstance(value, dict):
        return {sys.intern(k): compact(v) for k, v in value.items()}
    if isinstance(value, list):
        return [compact(v) for v in value]
    if isinstance(value, str) and len(value) <= SHARED_STRING_MAX:
        return sys.intern(value)
    return value


@dataclass
class Store:
    """The objects of one kind, by key."""

    kind: str
    trim: Trim = trim_managed_fields
    # whether a change of an object can change a decision (wakes the loop); None: every change
    matters: Callable[[dict[str, Any], dict[str, Any]], bool] | None = None
    objects: dict[Key, dict[str, Any]] = field(default_factory=dict)
    synced: bool = False

    def upsert(self, obj: dict[str, Any]) -> bool:
        """Store `obj` unless a newer version is held; True if anything changed."""
        key = key_of(obj)
        held = self.objects.get(key)
        if held is not None and _version(held) >= _version(obj) > 0:
            return False
        self.objects[key] = compact(self.trim(obj))
        return True

    def delete(self, obj: dict[str, Any]) -> bool:
        return self.objects.pop(key_of(obj), None) is not None

    def replace(self, items: list[dict[str, Any]]) -> None:
        self.objects = {key_of(o): compact(self.trim(o)) for o in items}
        self.synced = True


class ClusterCache:
    """The stores of every kind the controllers read, one lock, and a wake-up signal."""

    def __init__(self, kinds: list[Store]) -> None:
        self.lock = threading.Lock()
        self.stores = {s.kind: s for s in kinds}
        self.changed = threading.Event()
        self.versions: dict[str, int] = dict.fromkeys(self.stores, 0)  # bumps per change
        self.assumed: dict[str, dict[Key, dict[str, Any]]] = {}
        self.listeners: list[tuple[frozenset[str], threading.Event]] = []

    def listen(self, kinds: Iterable[str]) -> threading.Event:
        """An event set whenever an object of one of `kinds` changes (its reader clears it)."""
        event = threading.Event()
        with self.lock:
            self.listeners.append((frozenset(kinds), event))
        return event

    def _bump(self, kind: str) -> None:
        """Count a change of `kind` (under the lock) and tell its listeners."""
        self.versions[kind] += 1
        for kinds, event in self.listeners:
            if kind in kinds:
                event.set()

    def items(self, kind: str) -> list[dict[str, Any]]:
        with self.lock:
            objects = self.stores[kind].objects
            assumed = self.assumed.get(kind)
            if not assumed:
                return list(objects.values())
            return list({**objects, **assumed}.values())

    def get(self, kind: str, key: Key) -> dict[str, Any] | None:
        with self.lock:
            found = self.assumed.get(kind, {}).get(key)
            return found if found is not None else self.stores[kind].objects.get(key)

    def assume(self, kind: str, obj: dict[str, Any]) -> None:
        """Show `obj` to readers until `forget`: a write of ours that has not returned yet."""
        with self.lock:
            self.assumed.setdefault(kind, {})[key_of(obj)] = obj

    def forget(self, kind: str, obj: dict[str, Any]) -> None:
        """Drop the assumption `obj`, unless a later write's assumption replaced it."""
        with self.lock:
            assumed = self.assumed.get(kind, {})
            if assumed.get(key_of(obj)) is obj:
                del assumed[key_of(obj)]

    def synced(self) -> bool:
        with self.lock:
            return all(s.synced for s in self.stores.values())

    def store(self, kind: str, obj: dict[str, Any]) -> None:
        """Record an object the API just returned (a write of ours)."""
        with self.lock:
            changed = self.stores[kind].upsert(obj)
            if changed:
                self._bump(kind)

    def store_deleting(self, kind: str, obj: dict[str, Any]) -> None:
        """Record what a delete of ours answered, marked as being deleted, where the store
        still holds that object (the same uid). Forgetting the write's assumption would
        otherwise show the object as the watch last saw it, alive, until the watch catches up,
        and a cycle in between would count a preempted workload's pods as running; a delete
        the watch has already seen never brings the object back."""
        metadata = obj.get("metadata") or {}
        with self.lock:
            store = self.stores[kind]
            held = store.objects.get(key_of(obj))
            if held is None or (held.get("metadata") or {}).get("uid") != metadata.get("uid"):
                return
            if _version(held) > _version(obj):
                return  # the watch has seen more since
            if not metadata.get("deletionTimestamp"):  # deleted at once: gone, the watch says
                obj = {**obj, "metadata": {**metadata, "deletionTimestamp": _now_iso()}}
            store.objects[key_of(obj)] = compact(store.trim(obj))
            self._bump(kind)

    def apply_event(self, kind: str, event_type: str, obj: dict[str, Any]) -> None:
        with self.lock:
            store = self.stores[kind]
            before = store.objects.get(key_of(obj))
            changed = store.delete(obj) if event_type == "DELETED" else store.upsert(obj)
            if changed:
                self._bump(kind)
            after = store.objects.get(key_of(obj))
            wake = changed and (
                store.matters is None
                or before is None
                or after is None
                or store.matters(before, after)
            )
        if wake:
            self.changed.set()

    def replace(self, kind: str, items: list[dict[str, Any]]) -> None:
        with self.lock:
            self.stores[kind].replace(items)
            self._bump(kind)
        self.changed.set()

    def wait_for_sync(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.synced():
                return True
            time.sleep(0.05)
        return self.synced()


class Informer:
    """LIST, then WATCH from the list's resourceVersion, forever (until `stop` is set)."""

    def __init__(
        self,
        cache: ClusterCache,
        kind: str,
        list_call: Callable[..., Any],
        stop: threading.Event,
        request_timeout: float = 30,
        optional: bool = False,
        **selectors: Any,
    ) -> None:
        # optional: a kind the API server may not serve (a workload kind whose operator is not
        # installed) or this controller may not read; it is empty until it can be listed
        self.optional = optional
        self.cache = cache
        self.kind = kind
        self.list_call = list_call
        self.stop = stop
        self.request_timeout = request_timeout
        self.selectors = selectors

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self.run, name=f"gpufleet-watch-{self.kind}", daemon=True)
        thread.start()
        return thread

    def run(self) -> None:
        backoff = 0.5
        absent = False
        while not self.stop.is_set():
            try:
                version = self._list()
                backoff = 0.5
                if absent:
                    log.info("%s are served now; watching them", self.kind)
                    absent = False
                self._watch(version)
            except ApiException as err:
                if not self.optional or err.status not in (403, 404) or self.stop.is_set():
                    log.info(
                        "watch of %s ended (%s); listing again in %.1fs",
                        self.kind,
                        err.reason,
                        backoff,
                    )
                    self.stop.wait(backoff)
                    backoff = min(backoff * 2, 10.0)
                    continue
                # a workload kind whose operator (and CRD) is not installed, or that this
                # controller may not read: none of them exist for it until that changes, which
                # is looked for now and then (the other kinds are managed meanwhile)
                if not absent:
                    if err.status == 403:
                        log.warning(
                            "no permission to list %s: they are not managed; give the "
                            "controller's ClusterRole get, list, watch and patch on them",
                            self.kind,
                        )
                    else:
                        log.info(
                            "%s are not served (no CRD); looking again every %ds",
                            self.kind,
                            ABSENT_RECHECK_S,
                        )
                    absent = True
                self.cache.replace(self.kind, [])
                self.stop.wait(ABSENT_RECHECK_S)
            except Exception as err:  # the API server restarted, a timeout, ...: LIST again
                if self.stop.is_set():
                    return
                log.info("watch of %s ended (%s); listing again in %.1fs", self.kind, err, backoff)
                self.stop.wait(backoff)
                backoff = min(backoff * 2, 10.0)

    def _list(self) -> str:
        response = self.list_call(
            _preload_content=False, _request_timeout=self.request_timeout, **self.selectors
        )
        listed = json.loads(response.data)
        self.cache.replace(self.kind, listed.get("items") or [])
        return str(listed["metadata"].get("resourceVersion") or "")

    def _watch(self, version: str) -> None:
        while not self.stop.is_set():
            for event in self._stream(version):
                kind, obj = event["type"], event["raw_object"]
                if kind == "ERROR":
                    code = obj.get("code")
                    raise RuntimeError(f"watch error {code}: {obj.get('message', '')}")
                version = obj.get("metadata", {}).get("resourceVersion") or version
                if kind == "BOOKMARK":
                    continue
                self.cache.apply_event(self.kind, kind, obj)
                if self.stop.is_set():
                    return

    def _stream(self, version: str) -> Iterator[dict[str, Any]]:
        stream = watch.Watch()
        try:
            # through a partial, the client finds no model type to build: events stay plain
            # JSON (building a V1Job per event costs more than the rest of the controller)
            yield from stream.stream(
                functools.partial(self.list_call),
                resource_version=version,
                allow_watch_bookmarks=True,
                timeout_seconds=240,  # the server ends the watch; it is resumed from `version`
                _request_timeout=270,
                **self.selectors,
            )
        except ApiException as err:
            if err.status == 410:
                raise RuntimeError("resourceVersion too old (410 Gone)") from err
            raise
        finally:
            stream.stop()


Watch = tuple[str, Callable[..., Any], dict[str, Any]]  # kind, its LIST call, selectors


def start_watches(
    cache: ClusterCache,
    watches: list[Watch],
    stop: threading.Event,
    timeout: float,
    optional: frozenset[str] = frozenset(),
) -> list[Informer]:
    """An informer per kind, started; returns once each kind has been listed (or, for the
    `optional` kinds, found not served), or raises RuntimeError naming the kinds that were not
    within `timeout` seconds."""
    informers = [
        Informer(cache, kind, call, stop, optional=kind in optional, **selectors)
        for kind, call, selectors in watches
    ]
    for informer in informers:
        informer.start()
    if not cache.wait_for_sync(timeout):
        missing = ", ".join(k for k, store in cache.stores.items() if not store.synced)
        raise RuntimeError(f"the watch caches of {missing} did not fill within {timeout:.0f}s")
    return informers
