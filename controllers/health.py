"""The health controller's shell: reads GPU nodes, asks `gpufleet.health.quarantine` what to
do, and applies it (taint, annotations, Events, the breaker ConfigMap, metrics). The workload
loop then sees quarantined nodes as unhealthy and the engine requeues their workloads."""

from __future__ import annotations

import copy
import json
import logging
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpufleet.health.quarantine import Action, ActionKind, NodeHealth, decide
from gpufleet.kube.calls import API_TIMEOUT_S
from gpufleet.kube.observe import HOST_PREFIX, host_health, node_health
from gpufleet.model.api import GROUP, VERSION, GPUHost, HealthPolicy
from gpufleet.model.durations import parse_duration
from gpufleet.model.keys import (
    HEALTH_BREAKER,
    QUARANTINE_ESCALATED_ANNOTATION,
    QUARANTINE_HISTORY_ANNOTATION,
    QUARANTINE_REASON_ANNOTATION,
    QUARANTINE_TAINT,
    QUARANTINED_AT_ANNOTATION,
    RELEASE_ANNOTATION,
    RELEASED_MANUALLY_ANNOTATION,
)
from gpufleet.notify.alerts import breaker_open, node_quarantined
from gpufleet.notify.messages import Notification

from . import metrics

log = logging.getLogger("gpufleet.health")
AGENT_SILENT = "GPUAgentSilent"  # the Event's reason
ALERTED = (ActionKind.QUARANTINE, ActionKind.ESCALATE)  # actions people are notified of


class HealthReconciler:
    # the breaker ConfigMap is read at most this often, not on every cycle of the loop
    BREAKER_TTL_S = 5.0

    def __init__(
        self,
        core: client.CoreV1Api,
        namespace: str,
        alert: Callable[[Sequence[Notification]], None] | None = None,
        custom: client.CustomObjectsApi | None = None,  # for the GPUHosts' annotations
    ) -> None:
        self.core, self.namespace, self.custom = core, namespace, custom
        self.alert = alert  # quarantines and a tripped breaker, for notifications
        self.reported: set[tuple[str, str, str]] = set()  # (node, action, since): Events once
        self._breaker: tuple[float, bool] | None = None  # (read at, open)

    def breaker_open(self) -> bool:
        now = time.monotonic()
        if self._breaker is not None and now - self._breaker[0] < self.BREAKER_TTL_S:
            return self._breaker[1]
        try:
            self.core.read_namespaced_config_map(
                HEALTH_BREAKER, self.namespace, _request_timeout=API_TIMEOUT_S
            )
            is_open = True
        except ApiException as err:
            if err.status != 404:
                raise
            is_open = False
        self._breaker = (now, is_open)
        return is_open

    def reconcile(
        self,
        policy: HealthPolicy,
        nodes: list[dict[str, Any]],
        now: datetime,
        hosts: Sequence[dict[str, Any]] = (),
    ) -> list[dict[str, Any]]:
        """Apply the plan; returns the node objects as they are after it (for this cycle).
        The hosts outside Kubernetes (GPUHosts) are decided with the nodes, under the same
        guard rails: a quarantined host's agent drains its Slurm node."""
        health = [h for h in (node_health(n) for n in nodes) if h is not None]
        health += [host_health(h) for h in hosts]
        is_open = self.breaker_open()
        plan = decide(health, policy, now, is_open)
        if plan.trip_breaker:
            self._trip(now, [a.node for a in plan.actions])
            is_open = True
            if self.alert is not None:
                self.alert([breaker_open(sorted({a.node for a in plan.actions}), now)])
        # copied only where this cycle changes them: the others are the cache's, read-only
        by_name = {n["metadata"]["name"]: n for n in nodes}
        by_name |= {HOST_PREFIX + h["metadata"]["name"]: h for h in hosts}
        for action in plan.actions:
            by_name[action.node] = copy.deepcopy(by_name[action.node])
        since = {h.name: h.since.isoformat() if h.since else "" for h in health}
        for action in plan.actions:
            key = (action.node, action.kind.value, since.get(action.node, ""))
            if action.kind in (ActionKind.BLOCKED_LIMIT, ActionKind.BLOCKED_BREAKER):
                if key not in self.reported:
                    self._event(action.node, action.kind, action.message, "Warning")
                    self.reported.add(key)
                continue
            by_name[action.node] = self._apply(by_name[action.node], action, now)
            metrics.QUARANTINE_ACTIONS.labels(action.kind.value).inc()
            self._event(action.node, action.kind, action.message, _event_type(action.kind))
            if (
                self.alert is not None
                and action.kind in (ActionKind.QUARANTINE, ActionKind.ESCALATE)
                and not action.node.startswith(HOST_PREFIX)  # told as host-unhealthy
            ):
                self.alert([node_quarantined(action.node, action.kind.value, action.message, now)])
        silent = self._report_silent_agents(
            [h for h in health if not h.name.startswith(HOST_PREFIX)], policy, now
        )
        after = [
            *(h for h in (node_health(by_name[n["metadata"]["name"]]) for n in nodes) if h),
            *(host_health(by_name[HOST_PREFIX + h["metadata"]["name"]]) for h in hosts),
        ]
        for pool in {h.pool for h in health}:
            quarantined = sum(1 for h in after if h.pool == pool and h.quarantined)
            metrics.QUARANTINED_NODES.labels(pool).set(quarantined)
            metrics.QUARANTINE_BLOCKED.labels(pool).set(plan.blocked.get(pool, 0))
            metrics.AGENT_SILENT_NODES.labels(pool).set(sum(1 for h in silent if h.pool == pool))
        metrics.HEALTH_BREAKER_OPEN.set(1 if is_open else 0)
        return [by_name[n["metadata"]["name"]] for n in nodes]

    def _report_silent_agents(
        self, health: list[NodeHealth], policy: HealthPolicy, now: datetime
    ) -> list[NodeHealth]:
        """Nodes whose agent went silent; an Event once per silence (the engine itself keeps new
        work off them, see observe.node_of)."""
        timeout = parse_duration(policy.agent_timeout)
        silent = [h for h in health if h.agent_silent(now, timeout)]
        for node in silent:
            last = node.heartbeat.isoformat() if node.heartbeat else ""
            key = (node.name, AGENT_SILENT, last)
            if key in self.reported:
                continue
            self.reported.add(key)
            self._event(
                node.name,
                AGENT_SILENT,
                f"no heartbeat from the GPU agent since {last or 'ever'} (agentTimeout "
                f"{policy.agent_timeout}): GPU health unknown; no new work is placed here, "
                "running work stays",
                "Warning",
            )
        return silent

    def _apply(self, node: dict[str, Any], action: Action, now: datetime) -> dict[str, Any]:
        """Change our taint and annotations only. The patch carries the node's resourceVersion:
        a node changed since it was read (another controller added a taint) is a conflict, and
        the change is made again on the fresh node, so no taint of another owner is lost. A
        host outside Kubernetes (a GPUHost) gets the annotations alone."""
        host = action.node.startswith(HOST_PREFIX)
        what = "host" if host else "node"
        for _attempt in range(3):
            try:
                return self._patch(node, action, now, host)
            except ApiException as err:
                if err.status != 409:
                    log.warning("could not %s %s %s: %s", action.kind, what, _name(node),
                                err.reason)  # fmt: skip
                    return node
                node = self._read(_name(node), host)
        log.warning("could not %s %s %s: it kept changing", action.kind, what, _name(node))
        return node

    def _read(self, name: str, host: bool) -> dict[str, Any]:
        if host and self.custom is not None:
            found: dict[str, Any] = self.custom.get_cluster_custom_object(
                GROUP, VERSION, GPUHost.plural, name, _request_timeout=API_TIMEOUT_S
            )
            return found
        response = self.core.read_node(name, _preload_content=False, _request_timeout=API_TIMEOUT_S)
        read: dict[str, Any] = json.loads(response.data)
        return read

    def _patch(
        self, node: dict[str, Any], action: Action, now: datetime, host: bool = False
    ) -> dict[str, Any]:
        name = node["metadata"]["name"]
        taints = [
            t for t in node.get("spec", {}).get("taints") or [] if t.get("key") != QUARANTINE_TAINT
        ]
        annotations: dict[str, str | None] = {}
        if action.kind is ActionKind.QUARANTINE:
            taints.append({"key": QUARANTINE_TAINT, "value": "true", "effect": "NoSchedule"})
            annotations = {
                QUARANTINE_REASON_ANNOTATION: action.message[:512],
                QUARANTINED_AT_ANNOTATION: now.isoformat(),
                QUARANTINE_HISTORY_ANNOTATION: ",".join(t.isoformat() for t in action.history),
            }
        elif action.kind is ActionKind.ESCALATE:
            annotations = {QUARANTINE_ESCALATED_ANNOTATION: now.isoformat()}
            taints.append({"key": QUARANTINE_TAINT, "value": "true", "effect": "NoSchedule"})
        elif action.kind is ActionKind.RELEASE:
            annotations = {QUARANTINE_REASON_ANNOTATION: None, QUARANTINED_AT_ANNOTATION: None}
        elif action.kind is ActionKind.MANUAL_RELEASE:
            annotations = {
                QUARANTINE_REASON_ANNOTATION: None,
                QUARANTINED_AT_ANNOTATION: None,
                QUARANTINE_ESCALATED_ANNOTATION: None,
                RELEASE_ANNOTATION: None,
                RELEASED_MANUALLY_ANNOTATION: f"{now.isoformat()} {action.message}",
            }
        metadata: dict[str, Any] = {"annotations": annotations}
        if node["metadata"].get("resourceVersion"):
            metadata["resourceVersion"] = node["metadata"]["resourceVersion"]
        if host:
            if self.custom is None:
                raise ApiException(status=500, reason="no client for GPUHosts")
            self.custom.patch_cluster_custom_object(
                GROUP, VERSION, GPUHost.plural, name, {"metadata": metadata},
                _request_timeout=API_TIMEOUT_S,
            )  # fmt: skip
            log.info("host %s: %s (%s)", name, action.kind, action.message)
        else:
            body = {"spec": {"taints": taints or None}, "metadata": metadata}
            self.core.patch_node(name, body, _request_timeout=API_TIMEOUT_S)
            log.info("node %s: %s (%s)", name, action.kind, action.message)
        updated = copy.deepcopy(node)
        if not host:
            updated.setdefault("spec", {})["taints"] = taints
        current = updated["metadata"].setdefault("annotations", {}) or {}
        for k, v in annotations.items():
            if v is None:
                current.pop(k, None)
            else:
                current[k] = v
        updated["metadata"]["annotations"] = current
        return updated

    def _trip(self, now: datetime, nodes: list[str]) -> None:
        body = client.V1ConfigMap(
            metadata=client.V1ObjectMeta(name=HEALTH_BREAKER, namespace=self.namespace),
            data={
                "state": "Tripped",
                "since": now.isoformat(),
                "nodes": ",".join(sorted(set(nodes))),
                "reset": "delete this ConfigMap (gpufleet nodes reset-breaker) to close it",
            },
        )
        self._breaker = (time.monotonic(), True)
        try:
            self.core.create_namespaced_config_map(
                self.namespace, body, _request_timeout=API_TIMEOUT_S
            )
        except ApiException as err:
            if err.status != 409:
                raise
        log.error("health circuit breaker tripped: fatal GPU findings on %s", ", ".join(nodes))

    def _event(self, node: str, kind: str, message: str, event_type: str) -> None:
        now = datetime.now(UTC)
        if node.startswith(HOST_PREFIX):
            node = node.removeprefix(HOST_PREFIX)
            about = client.V1ObjectReference(kind="GPUHost", name=node,
                                             api_version=f"{GROUP}/{VERSION}")  # fmt: skip
        else:
            about = client.V1ObjectReference(kind="Node", name=node, api_version="v1")
        event = client.CoreV1Event(
            metadata=client.V1ObjectMeta(generate_name=f"{node}.", namespace="default"),
            involved_object=about,
            reason=str(kind),
            message=message[:1024],
            type=event_type,
            source=client.V1EventSource(component="gpufleet-health"),
            first_timestamp=now,
            last_timestamp=now,
            count=1,
        )
        try:
            self.core.create_namespaced_event("default", event, _request_timeout=API_TIMEOUT_S)
        except ApiException as err:
            log.info("could not record event %s on node %s: %s", kind, node, err.reason)


def _name(node: dict[str, Any]) -> str:
    return str(node["metadata"]["name"])


def _event_type(kind: ActionKind) -> str:
    return "Normal" if kind in (ActionKind.RELEASE, ActionKind.MANUAL_RELEASE) else "Warning"
