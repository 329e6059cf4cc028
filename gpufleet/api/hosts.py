"""The server's shell for standalone agents' reports: a GPUHost made on a host's first report,
its status replaced after each batch (`hosts.status.apply` computes it) under the object's
resourceVersion, so that two replicas taking the same batch cannot count it twice; and the
newest report's series kept in memory for `/hosts/{name}/metrics`."""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from gpufleet.api.context import Refused
from gpufleet.hosts.report import ReportError
from gpufleet.hosts.status import Applied, Report, apply, drained
from gpufleet.kube.calls import API_TIMEOUT_S, api_message
from gpufleet.model.api import GROUP, VERSION, GPUHost

log = logging.getLogger("gpufleet.server")
PLURAL = GPUHost.plural
CONFLICT_TRIES = 5
KEPT_HOSTS = 10_000  # the newest report's text of at most this many hosts is kept


class Latest:
    """The newest report's metrics of each host, bounded (the least recently reported go)."""

    def __init__(self, limit: int = KEPT_HOSTS) -> None:
        self.limit = limit
        self.lock = threading.Lock()
        self.held: OrderedDict[str, tuple[datetime, str]] = OrderedDict()

    def keep(self, name: str, reports: Sequence[Report]) -> None:
        if not reports:
            return
        newest = max(reports, key=lambda r: r.time)
        with self.lock:
            held = self.held.get(name)
            if held is None or held[0] <= newest.time:
                self.held[name] = (newest.time, newest.metrics)
                self.held.move_to_end(name)
            while len(self.held) > self.limit:
                self.held.popitem(last=False)

    def latest(self, name: str) -> tuple[datetime, str] | None:
        with self.lock:
            return self.held.get(name)


class KubernetesHosts:
    """GPUHosts in the server's cluster, written with the server's own service account once
    the caller was checked (`update gpuhosts NAME`)."""

    def __init__(self, api: Any) -> None:
        from kubernetes import client

        self.custom = client.CustomObjectsApi(api)
        self.api_exception = client.ApiException
        self.kept = Latest()

    def take(
        self, name: str, reports: Sequence[Report], agent_version: str | None, now: datetime
    ) -> Applied:
        for _ in range(CONFLICT_TRIES):
            found = self._get(name)
            status = (found or {}).get("status")
            try:
                applied = apply(status, reports, now, agent_version)
            except ReportError as err:
                raise Refused(422, f"a report of host {name}: {err}") from None
            try:
                if found is None:
                    self._create(name, applied.status)
                else:
                    self._replace(found, applied.status)
            except self.api_exception as err:
                if err.status == 409:
                    continue  # made or changed meanwhile (another replica): read it again
                raise Refused(
                    502, f"GPUHost {name} not written: {err.status} {api_message(err)}"
                ) from None
            if applied.accepted:
                self.kept.keep(name, reports)
            return replace(applied, drain=drained(found or {}))
        raise Refused(503, f"GPUHost {name} changed {CONFLICT_TRIES} times meanwhile: send again")

    def latest(self, name: str) -> tuple[datetime, str] | None:
        return self.kept.latest(name)

    def _get(self, name: str) -> dict[str, Any] | None:
        try:
            found: dict[str, Any] = self.custom.get_cluster_custom_object(
                GROUP, VERSION, PLURAL, name, _request_timeout=API_TIMEOUT_S
            )
        except self.api_exception as err:
            if err.status == 404:
                return None
            raise Refused(502, f"GPUHost {name} not read: {api_message(err)}") from None
        return found

    def _create(self, name: str, status: dict[str, Any]) -> None:
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "GPUHost",
            "metadata": {"name": name, "labels": {"app.kubernetes.io/managed-by": "gpufleet"}},
            "spec": {},
            "status": status,
        }
        self.custom.create_cluster_custom_object(
            GROUP, VERSION, PLURAL, body, _request_timeout=API_TIMEOUT_S
        )
        log.info("GPUHost %s registered by its first report", name)

    def _replace(self, found: dict[str, Any], status: dict[str, Any]) -> None:
        body = {**found, "status": status}  # metadata.resourceVersion: a change meanwhile is 409
        self.custom.replace_cluster_custom_object(
            GROUP, VERSION, PLURAL, found["metadata"]["name"], body,
            _request_timeout=API_TIMEOUT_S,
        )  # fmt: skip
