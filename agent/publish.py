"""What the node agent writes to Kubernetes: the node's `GPUHealthy` condition and Events for
warnings (its metrics are `metrics.py`)."""

from __future__ import annotations

import functools
import logging
import time
from collections import deque
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from kubernetes import client
from kubernetes.client import CoreV1Event
from kubernetes.client.exceptions import ApiException

from gpufleet.health.signals import Finding
from gpufleet.model.keys import GPU_HEALTHY_CONDITION

log = logging.getLogger("gpufleet.agent")


class NodePublisher:
    """Writes to the API server as the agent's service account would (node status, Events).

    Never raises: while the API server cannot be reached, the condition is written again at the
    next poll and Events wait in a bounded queue, so a fault found during an outage is reported
    once it ends. The condition is also rewritten every `heartbeat_s` with a fresh
    lastHeartbeatTime, so a silent agent can be told from a healthy one."""

    PENDING_EVENTS = 100  # the oldest are dropped beyond this (the condition still says it)

    def __init__(
        self,
        core: client.CoreV1Api,
        node: str,
        namespace: str = "default",
        heartbeat_s: float = 60.0,
        on_error: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.core, self.node, self.namespace = core, node, namespace
        self.heartbeat_s, self.clock = heartbeat_s, clock
        self.on_error = on_error or (lambda what: None)
        self.last: tuple[str, str, str] | None = None
        self.written_at = 0.0  # monotonic time of the last condition write
        self.transition = ""  # lastTransitionTime we wrote
        self.pending: deque[CoreV1Event] = deque(maxlen=self.PENDING_EVENTS)

    def condition(self, fatal: list[Finding]) -> bool:
        """Set GPUHealthy when it changed or the heartbeat is due; True when the status,
        reason or message changed. The message names every failing GPU."""
        if fatal:
            status, reason = "False", fatal[0].reason
            message = "; ".join(f.message for f in fatal)[:1024]
        else:
            status, reason, message = "True", "AllChecksPassed", "every GPU check passes"
        changed = self.last != (status, reason, message)
        if not changed and self.clock() - self.written_at < self.heartbeat_s:
            return False
        now = datetime.now(UTC).isoformat()
        transition = self.transition
        if self.last is None or self.last[0] != status:
            transition = now  # only a change of status is a transition
        body: dict[str, Any] = {
            "status": {
                "conditions": [
                    {
                        "type": GPU_HEALTHY_CONDITION,
                        "status": status,
                        "reason": reason,
                        "message": message,
                        "lastHeartbeatTime": now,
                        "lastTransitionTime": transition,
                    }
                ]
            }
        }
        if not self._write("condition", lambda: self.core.patch_node_status(self.node, body)):
            return False  # written at the next poll
        self.last, self.transition = (status, reason, message), transition
        self.written_at = self.clock()
        return changed

    def event(self, reason: str, message: str, kind: str = "Warning") -> None:
        now = datetime.now(UTC)
        self.pending.append(
            client.CoreV1Event(
                metadata=client.V1ObjectMeta(
                    generate_name=f"{self.node}.", namespace=self.namespace
                ),
                involved_object=client.V1ObjectReference(
                    kind="Node", name=self.node, api_version="v1"
                ),
                reason=reason,
                message=message[:1024],
                type=kind,
                source=client.V1EventSource(component="gpufleet-agent", host=self.node),
                first_timestamp=now,
                last_timestamp=now,
                count=1,
            )
        )
        self.flush()

    def flush(self) -> None:
        """Send the Events that wait, oldest first; stop at the first that fails."""
        while self.pending:
            event = self.pending[0]
            send = functools.partial(self.core.create_namespaced_event, self.namespace, event)
            # a refused Event would be refused forever: dropped, not retried
            if not self._write(f"event {event.reason}", send, drop_refused=True):
                return
            self.pending.popleft()

    def _write(self, what: str, call: Callable[[], object], drop_refused: bool = False) -> bool:
        """True when written (or refused and `drop_refused`); False: try again later."""
        try:
            call()
        except ApiException as err:
            if err.status and 400 <= err.status < 500 and err.status not in (408, 429):
                log.warning("the API server refused the %s: %s", what, err.reason)
                self.on_error("api")
                return drop_refused
            log.warning("could not write the %s (%s); retrying later", what, err.reason)
            self.on_error("api")
            return False
        except Exception as err:  # the API server is unreachable: connection refused, timeout
            log.warning("could not write the %s (%s); retrying later", what, err)
            self.on_error("api")
            return False
        return True
