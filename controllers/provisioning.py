"""Why nodes the engine counted on do not come: work admitted onto nodes still to be
provisioned waits for Karpenter, and when Karpenter cannot launch them (no offering of the
pool's instance types, the NodePool's limit, an unknown NodeClass) it says so only in Events on
the pods. This reads those Events for work that has waited a while, so the GPUWorkload says
why it is not running instead of sitting in Starting without a word.

Events are read only for such work, at most every CHECK_EVERY_S, one LIST per namespace that
has some: nothing is read while every admission finds its nodes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpufleet.kube.calls import API_TIMEOUT_S
from gpufleet.kube.observe import Observed, parse_time
from gpufleet.model.fleet import Fleet
from gpufleet.model.virtual_nodes import to_be_provisioned

from .actions import Change

log = logging.getLogger("gpufleet.provisioning")
NODES_NOT_LAUNCHED = "NodesNotLaunched"
WAIT_BEFORE_ASKING_S = 15.0  # Karpenter batches pending pods for up to 10 s before launching
CHECK_EVERY_S = 10.0
AUTOSCALER = "karpenter"


class ProvisioningWatch:
    def __init__(self, api: client.ApiClient) -> None:
        self.core = client.CoreV1Api(api)
        self.checked_at = 0.0
        self.said: dict[str, str] = {}  # workload key -> what Karpenter last said about it

    def changes(
        self,
        fleet: Fleet,
        observed: Iterable[Observed],
        pods_of: dict[str, list[dict[str, Any]]],
        now: datetime,
        decided: set[str],
    ) -> list[Change]:
        """Status changes (and an Event) for admitted work whose nodes Karpenter did not launch;
        `decided` are the workloads this cycle already changes (left alone until the next)."""
        waiting = [item for item in observed if _waits_for_new_nodes(item, fleet, now)]
        if not waiting:
            self.said = {}
            return []
        if time.monotonic() - self.checked_at >= CHECK_EVERY_S:
            self.checked_at = time.monotonic()
            self.said = self._read(waiting, pods_of)
        out = []
        for item in waiting:
            said = self.said.get(item.key)
            status = item.workload.get("status") or {}
            if said is None or item.key in decided:
                continue
            pool = status.get("pool")
            message = f"Karpenter launches no node of pool {pool} for it: {said}"
            if status.get("reason") == NODES_NOT_LAUNCHED and status.get("message") == message:
                continue
            metadata = item.workload["metadata"]
            out.append(
                Change(
                    metadata["namespace"],
                    metadata["name"],
                    status={"reason": NODES_NOT_LAUNCHED, "message": message},
                    event=(NODES_NOT_LAUNCHED, message),
                )
            )
        return out

    def _read(
        self, waiting: list[Observed], pods_of: dict[str, list[dict[str, Any]]]
    ) -> dict[str, str]:
        """The latest thing Karpenter said about each waiting workload's pods."""
        said: dict[str, str] = {}
        namespaces = sorted({item.obj["metadata"]["namespace"] for item in waiting})
        latest: dict[tuple[str, str], tuple[float, str]] = {}
        for namespace in namespaces:
            try:
                events = self.core.list_namespaced_event(
                    namespace,
                    field_selector="involvedObject.kind=Pod,reason=FailedScheduling",
                    _request_timeout=API_TIMEOUT_S,
                ).items
            except (ApiException, OSError) as err:
                log.info("could not read the scheduling events of %s: %s", namespace, err)
                continue
            for event in events:
                if AUTOSCALER not in (_source(event), event.reporting_component):
                    continue
                at = _when(event)
                key = (namespace, event.involved_object.name)
                if key not in latest or at > latest[key][0]:
                    latest[key] = (at, event.message or "")
        for item in waiting:
            namespace = item.obj["metadata"]["namespace"]
            pods = [(namespace, p["metadata"]["name"]) for p in pods_of.get(item.key, [])]
            found = [latest[pod] for pod in pods if pod in latest]
            if found:
                pool = (item.workload.get("status") or {}).get("pool") or ""
                said[item.key] = about_pool(max(found)[1], pool)
        return said


def _waits_for_new_nodes(item: Observed, fleet: Fleet, now: datetime) -> bool:
    """Admitted onto nodes still to be provisioned, pods not running, for a while."""
    if item.state not in ("Queued", "Starting") or not item.nodes:
        return False
    if not all(to_be_provisioned(node, fleet) for node in item.nodes):
        return False
    admitted = parse_time((item.workload.get("status") or {}).get("admittedAt"))
    return admitted is not None and (now - admitted).total_seconds() >= WAIT_BEFORE_ASKING_S


def _source(event: Any) -> str | None:
    return event.source.component if event.source is not None else None


def _when(event: Any) -> float:
    for value in (event.last_timestamp, event.event_time, event.first_timestamp):
        if value is not None:
            return float(value.timestamp())
    return 0.0


def about_pool(message: str, pool: str) -> str:
    """What Karpenter said about the pool's NodePool, in at most 300 characters. Its message
    lists why each NodePool it considered cannot take the pod, joined by "; " (a NodePool is
    named as `(NodePool=NAME)`); a NodePool it does not consider at all goes unmentioned."""
    message = message.removeprefix("Failed to schedule pod, ").strip()
    clauses = [c for c in message.split("; ") if f"(NodePool={pool})" in c]
    if clauses:
        message = "; ".join(clauses)
    else:
        message = (
            f"it does not consider NodePool {pool} (it skips a NodePool none of whose instance "
            f"types it can launch, or whose NodeClass is not ready); of the others: {message}"
        )
    return message if len(message) <= 300 else message[:297] + "..."
