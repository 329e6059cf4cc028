"""The server's shell: watch caches of the objects the views read (the controller's
`ClusterCache` and `Informer`, one LIST per kind at start, then watches), and the two writes."""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Hashable
from datetime import UTC, datetime
from typing import Any

from gpufleet.api import views
from gpufleet.api.access import Caller
from gpufleet.api.context import Conflict, Refused
from gpufleet.kube.cache import (
    ClusterCache,
    Store,
    Watch,
    start_watches,
    trim_node,
    trim_pod,
)
from gpufleet.kube.calls import API_TIMEOUT_S, api_message, create_as, delete_object
from gpufleet.kube.kinds import kind_of, referred_to
from gpufleet.model.api import GROUP, VERSION
from gpufleet.model.keys import QUARANTINE_TAINT, RELEASE_ANNOTATION

log = logging.getLogger("gpufleet.server")
CUSTOM_KINDS = (
    "gpupools",
    "teams",
    "reservations",
    "gpuworkloads",
    "clusters",
    "workloadtemplates",
    "gpuhosts",
)
# pods that hold no GPUs any more need not be watched (the views count running GPU pods)
LIVE_PODS = "status.phase!=Succeeded,status.phase!=Failed"


def new_cache() -> ClusterCache:
    return ClusterCache(
        [
            *(Store(kind) for kind in CUSTOM_KINDS),
            Store("nodes", trim_node),
            Store("pods", trim_pod),
        ]
    )


class CacheSource:
    """The views' objects as a `ClusterCache` holds them."""

    def __init__(self, cache: ClusterCache) -> None:
        self.cache = cache

    def objects(self) -> views.Objects:
        items = self.cache.items
        return views.Objects(
            pools=items("gpupools"),
            teams=items("teams"),
            reservations=items("reservations"),
            workloads=items("gpuworkloads"),
            nodes=items("nodes"),
            pods=items("pods"),
            clusters=items("clusters"),
            templates=items("workloadtemplates"),
            hosts=items("gpuhosts"),
        )

    def version(self) -> Hashable:
        with self.cache.lock:
            return tuple(v for kind, v in self.cache.versions.items() if kind != "gpuhosts")

    def hosts(self) -> list[dict[str, Any]]:
        return self.cache.items("gpuhosts")

    def workload_object(
        self, namespace: str, name: str, cluster: str | None = None
    ) -> dict[str, Any] | None:
        found = self.cache.get("gpuworkloads", (namespace, name))
        return None if cluster is not None else found  # one cluster: it names none

    def events(self, namespace: str, cluster: str | None = None) -> list[dict[str, Any]]:
        return []  # a cache alone holds no Events


class ClusterSource(CacheSource):
    """A `CacheSource` filled by watches of the cluster."""

    def __init__(self, api: Any) -> None:
        from kubernetes import client

        super().__init__(new_cache())
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.stop = threading.Event()

    def start(self, timeout: float = 60) -> None:
        """Start the watches and wait until each kind has been listed once."""
        custom = functools.partial(self.custom.list_cluster_custom_object, GROUP, VERSION)
        served = [kind for kind in CUSTOM_KINDS if self._served(custom, kind)]
        watches: list[Watch] = [
            *((kind, functools.partial(custom, kind), {}) for kind in served),
            ("nodes", self.core.list_node, {}),
            ("pods", self.core.list_pod_for_all_namespaces, {"field_selector": LIVE_PODS}),
        ]
        try:
            start_watches(self.cache, watches, self.stop, timeout)
        except RuntimeError as err:
            raise RuntimeError(f"{err}: may this identity list and watch them?") from None

    def events(self, namespace: str, cluster: str | None = None) -> list[dict[str, Any]]:
        if cluster is not None:
            return []  # one cluster: it names none
        found = self.core.list_namespaced_event(namespace, _request_timeout=API_TIMEOUT_S)
        items: list[dict[str, Any]] = self.core.api_client.sanitize_for_serialization(found)[
            "items"
        ]
        return items

    def _served(self, custom: Any, kind: str) -> bool:
        """Whether the API serves `kind`. Before gpufleet's CRDs are installed the server still
        shows the GPU nodes by product (observe mode); it sees the CRDs once restarted."""
        from kubernetes.client.exceptions import ApiException

        try:
            custom(kind, limit=1, _request_timeout=30)
        except ApiException as err:
            if err.status != 404:
                raise RuntimeError(
                    f"cannot list {kind}.{GROUP}: {err.status} {err.reason}"
                ) from None
            log.warning("%s.%s is not installed: shown as empty until a restart", kind, GROUP)
            self.cache.replace(kind, [])
            return False
        return True


class KubernetesActions:
    """Cancel a workload (delete what it stands for) and release a node, with the server's
    own service account, once the caller's own permission was checked (for a cancel, on the
    kind deleted too). A cancel deletes by uid: never an object made again under its name."""

    def __init__(self, api: Any) -> None:
        from kubernetes import client

        self.api = api
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.api_exception = client.ApiException

    def create(
        self, obj: dict[str, Any], namespace: str, caller: Caller | None, dry_run: bool
    ) -> dict[str, Any]:
        kind = kind_of(obj)
        assert kind is not None  # manifest_of made or checked it
        try:
            return create_as(
                self.api,
                kind,
                namespace,
                obj,
                caller.user if caller else None,
                caller.groups if caller else (),
                caller.uid if caller else "",
                dry_run,
            )
        except self.api_exception as err:
            reason = api_message(err) or str(err.reason)
            if err.status == 404:
                raise Refused(
                    404,
                    f"the cluster does not serve {kind.kind}s, or namespace {namespace} does not "
                    f"exist: {reason}",
                ) from None
            if err.status in (400, 403, 409, 422):
                raise Refused(err.status, reason) from None
            raise Refused(502, f"the Kubernetes API answered {err.status}: {reason}") from None

    def cancel(self, workload: dict[str, Any]) -> str:
        meta = workload["metadata"]
        namespace = meta["namespace"]
        target = referred_to(workload)
        if target is None:
            kind_name = (workload["spec"].get("workloadRef") or {}).get("kind")
            raise Conflict(f"cancelling a {kind_name} is not supported: delete it yourself")
        kind, name = target
        uid = (workload["spec"].get("workloadRef") or {}).get("uid")
        try:
            delete_object(self.custom, self.core, kind, namespace, name, uid)
        except self.api_exception as err:
            if err.status == 404:
                raise LookupError(f"{kind.kind} {namespace}/{name} is already gone") from None
            if err.status == 409:
                raise Conflict(
                    f"{kind.kind} {namespace}/{name} is not the one this workload stands for "
                    f"(uid {uid}): it was made again; nothing deleted"
                ) from None
            raise
        return f"cancelled {namespace}/{meta['name']}: {kind.kind} {name} deleted, its pods stop"

    def release(self, node: str, by: str) -> str:
        try:
            found = self.core.read_node(node)
        except self.api_exception as err:
            if err.status == 404:
                raise LookupError(f"no node {node}") from None
            raise
        if not any(t.key == QUARANTINE_TAINT for t in found.spec.taints or []):
            raise Conflict(
                f"node {node} is not quarantined (no {QUARANTINE_TAINT} taint): nothing to release"
            )
        stamp = f"{by} at {datetime.now(UTC).isoformat(timespec='seconds')}"
        self.core.patch_node(node, {"metadata": {"annotations": {RELEASE_ANNOTATION: stamp}}})
        return f"release of node {node} requested; the health controller applies it"
