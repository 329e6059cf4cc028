"""The server's view of a fleet of clusters, for a server on the hub (`gpufleet server
--fleet`): the hub's own GitOps objects and Clusters, and the GPUWorkloads, nodes, pods and
pools of every worker its Clusters name, each marked with its cluster (`views.tagged`).

Each worker is watched with the kubeconfig in its Cluster's Secret, the way the hub reaches it
(`gpufleet.kube.workers`); a worker that cannot be reached is logged once and left out until it
can. What a caller may see is still decided by the hub's RBAC, as for every route."""

from __future__ import annotations

import logging
import threading
from collections.abc import Hashable
from typing import Any

from gpufleet.api import views
from gpufleet.api.source import ClusterSource
from gpufleet.kube.calls import KubernetesSecrets
from gpufleet.kube.workers import WorkerError, kubeconfig_of, worker_api

log = logging.getLogger("gpufleet.server")
CONNECT_EVERY_S = 10.0  # how often the Clusters and their Secrets are looked at again
WORKER_SYNC_S = 60.0


class _Worker:
    def __init__(self, name: str, kubeconfig: str) -> None:
        self.name, self.kubeconfig = name, kubeconfig
        self.source = ClusterSource(worker_api(kubeconfig))
        self.failed = False
        threading.Thread(target=self._start, name=f"gpufleet-fleet-{name}", daemon=True).start()

    def _start(self) -> None:
        try:
            self.source.start(WORKER_SYNC_S)
        except Exception as err:  # unreachable, refused, not allowed: tried again later
            log.warning("cluster %s: cannot watch it: %s", self.name, err)
            self.failed = True
            self.source.stop.set()

    def ready(self) -> bool:
        return not self.failed and self.source.cache.synced()

    def close(self) -> None:
        self.source.stop.set()


class FleetSource:
    """A `Source` over the hub and its workers."""

    def __init__(self, api: Any) -> None:
        from kubernetes import client

        self.hub = ClusterSource(api)
        self.secrets = KubernetesSecrets(client.CoreV1Api(api))
        self.workers: dict[str, _Worker] = {}
        self.problems: dict[str, str] = {}
        self.lock = threading.Lock()
        self.stop = self.hub.stop

    def start(self, timeout: float = 60) -> None:
        self.hub.start(timeout)
        self.connect()
        threading.Thread(target=self._keep_connected, name="gpufleet-fleet", daemon=True).start()

    def _keep_connected(self) -> None:
        while not self.stop.wait(CONNECT_EVERY_S):
            try:
                self.connect()
            except Exception:
                log.exception("cannot look at the fleet's clusters; trying again")

    def connect(self) -> None:
        """A watched worker per Cluster of the hub, made again when its kubeconfig changed
        or its watches could not start."""
        clusters = {c["metadata"]["name"]: c for c in self.hub.cache.items("clusters")}
        with self.lock:
            for name in [n for n in self.workers if n not in clusters]:
                self.workers.pop(name).close()
            for name, obj in clusters.items():
                try:
                    kubeconfig = kubeconfig_of(obj, self.secrets)
                    held = self.workers.get(name)
                    if held is not None and held.kubeconfig == kubeconfig and not held.failed:
                        continue
                    if held is not None:
                        held.close()
                    self.workers[name] = _Worker(name, kubeconfig)
                    self.problems.pop(name, None)
                except WorkerError as err:
                    if self.problems.get(name) != str(err):  # said once
                        log.warning("%s", err)
                    self.problems[name] = str(err)

    def _ready(self) -> list[_Worker]:
        with self.lock:
            return [w for _, w in sorted(self.workers.items()) if w.ready()]

    def objects(self) -> views.Objects:
        workers = {w.name: w.source.objects() for w in self._ready()}
        return views.of_fleet(self.hub.objects(), workers)

    def version(self) -> Hashable:
        return (
            self.hub.version(),
            tuple((w.name, w.source.version()) for w in self._ready()),
        )

    def workload_object(
        self, namespace: str, name: str, cluster: str | None = None
    ) -> dict[str, Any] | None:
        found = [
            views.tagged(obj, w.name)
            for w in self._ready()
            if cluster in (None, w.name)
            and (obj := w.source.workload_object(namespace, name)) is not None
        ]
        if len(found) > 1:
            where = ", ".join(views.cluster_of(f) or "" for f in found)
            raise LookupError(
                f"{namespace}/{name} is a workload of several clusters ({where}): name one "
                "with ?cluster="
            )
        return found[0] if found else None

    def hosts(self) -> list[dict[str, Any]]:
        return self.hub.hosts()  # hosts report to the hub's server, not to a worker

    def events(self, namespace: str, cluster: str | None = None) -> list[dict[str, Any]]:
        return [
            views.tagged(event, w.name)
            for w in self._ready()
            if cluster in (None, w.name)
            for event in w.source.events(namespace)
        ]
