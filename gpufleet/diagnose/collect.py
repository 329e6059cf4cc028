"""Collecting a failed workload's evidence from the cluster: its pods' exit codes and reasons,
the Events on them and on the Job, the GPU health of the nodes they ran on, and the last lines
of their logs (through a `LogReader`: the API server's pod logs, or fixture files in tests and
on clusters without kubelet logs)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Protocol

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpufleet.kube.calls import API_TIMEOUT_S, pod_log_lines
from gpufleet.kube.kinds import adapter_of

from .match import Evidence, xids_of

LOG_LINES = 200
log = logging.getLogger("gpufleet.diagnosis")


class LogReader(Protocol):
    def tail(self, namespace: str, pod: str, container: str, job: str, lines: int) -> list[str]:
        """The last `lines` lines of a container's log (of its last run); [] if none."""
        ...


class KubernetesLogs:
    """Pod logs through the API server (`get pods/log`, which the chart grants the
    controller). A refusal is said once, in the log: diagnosis goes on with the other signals
    but must not look as if the pods had printed nothing."""

    def __init__(self, core: client.CoreV1Api) -> None:
        self.core = core
        self.refused = False

    def tail(self, namespace: str, pod: str, container: str, job: str, lines: int) -> list[str]:
        try:
            return pod_log_lines(self.core, pod, namespace, container, lines)
        except ApiException as err:
            if err.status in (401, 403) and not self.refused:
                self.refused = True
                log.warning(
                    "cannot read pod logs (%s %s on %s/%s): diagnoses go without log lines; "
                    "grant this identity get on pods/log", err.status, err.reason, namespace, pod
                )  # fmt: skip
            return []  # the pod is gone, or no kubelet to ask: the other signals remain
        except OSError:
            return []


class FixtureLogs:
    """Log lines from files FOLDER/NAMESPACE/JOB.log: the same interface, for tests."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def tail(self, namespace: str, pod: str, container: str, job: str, lines: int) -> list[str]:
        path = self.folder / namespace / f"{job}.log"
        if not path.is_file():
            return []
        return path.read_text(errors="replace").splitlines()[-lines:]


def collect(
    core: client.CoreV1Api,
    namespace: str,
    job: dict[str, Any],
    logs: LogReader,
) -> Evidence:
    name = job["metadata"]["name"]
    kind = adapter_of(job)
    # a bare pod is its own pod (one named by generateName carries no workload label)
    selector = (
        {"field_selector": f"metadata.name={name}"}
        if kind.bare
        else {"label_selector": f"{kind.pod_label}={kind.pods_named(job) or name}"}
    )
    pods = core.list_namespaced_pod(namespace, **selector, _request_timeout=API_TIMEOUT_S).items
    exit_codes: list[int] = []
    reasons: list[str] = []
    lines: list[str] = []
    nodes: set[str] = set()
    for condition in (job.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Failed" and condition.get("reason"):
            reasons.append(condition["reason"])
    for pod in pods:
        status = pod.status
        if status.reason:
            reasons.append(status.reason)
        if pod.spec.node_name:
            nodes.add(pod.spec.node_name)
        for container in status.container_statuses or []:
            for state in (container.state, container.last_state):
                if state is None:
                    continue
                if state.terminated is not None:
                    exit_codes.append(state.terminated.exit_code)
                    if state.terminated.reason:
                        reasons.append(state.terminated.reason)
                if state.waiting is not None and state.waiting.reason:
                    reasons.append(state.waiting.reason)
            lines += logs.tail(namespace, pod.metadata.name, container.name, name, LOG_LINES)
    events, messages = [], []
    for involved in sorted({name, *(p.metadata.name for p in pods)}):
        try:
            found = core.list_namespaced_event(
                namespace,
                field_selector=f"involvedObject.name={involved}",
                _request_timeout=API_TIMEOUT_S,
            ).items
        except ApiException as err:
            if err.status not in (401, 403):
                raise  # the API is down: the diagnosis is tried again
            # refused for good: diagnosed without Events rather than never, and said
            log.warning(
                "cannot list Events in %s (%s %s): diagnoses go without them; grant this "
                "identity list on events", namespace, err.status, err.reason,
            )  # fmt: skip
            break
        events += [e.reason or "" for e in found]
        messages += [e.message or "" for e in found]
    xids: list[int] = []
    unhealthy = False
    for node_name in sorted(nodes):
        try:
            node = core.read_node(node_name, _request_timeout=API_TIMEOUT_S)
        except ApiException:
            continue  # the node is gone: its pods' reasons say so
        for condition in node.status.conditions or []:
            if condition.type == "GPUHealthy":
                unhealthy = unhealthy or condition.status == "False"
                xids += xids_of(f"{condition.reason} {condition.message}")
    return Evidence(
        exit_codes=tuple(exit_codes),
        reasons=tuple(reasons),
        events=tuple(e for e in events if e),
        event_messages=tuple(messages),
        logs=tuple(lines[-LOG_LINES:]),
        xids=tuple(xids),
        gpu_unhealthy=unhealthy,
    )
