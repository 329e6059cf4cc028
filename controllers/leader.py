"""Leader election with a coordination.k8s.io Lease: only the holder runs the workload loop.

Webhooks are stateless and served by every instance; decisions are made by one. The holder
renews the Lease every cycle; another instance takes over when it has not been renewed for the
lease duration. Writes use the Lease's resourceVersion, so two instances racing for an expired
Lease cannot both win.
"""

from __future__ import annotations

import logging
import os
import socket
from datetime import UTC, datetime, timedelta

from kubernetes import client
from kubernetes.client.exceptions import ApiException

log = logging.getLogger("gpufleet.leader")


def default_identity() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


class LeaderElection:
    def __init__(
        self,
        api: client.CoordinationV1Api,
        namespace: str,
        name: str,
        identity: str | None = None,
        lease_seconds: int = 15,
    ) -> None:
        self.api = api
        self.namespace = namespace
        self.name = name
        self.identity = identity or default_identity()
        self.lease_seconds = lease_seconds
        self.leading = False

    def try_acquire_or_renew(self, now: datetime | None = None) -> bool:
        """Hold the Lease after this call? Never raises for a lost race; logs changes."""
        now = now or datetime.now(UTC)
        try:
            lease = self.api.read_namespaced_lease(self.name, self.namespace)
        except ApiException as err:
            if err.status != 404:
                raise
            return self._set(self._create(now))
        if lease.spec is None:
            lease.spec = client.V1LeaseSpec()
        spec = lease.spec
        holder = spec.holder_identity
        renewed = spec.renew_time or spec.acquire_time
        duration = timedelta(seconds=spec.lease_duration_seconds or self.lease_seconds)
        if holder != self.identity and renewed is not None and renewed + duration > now:
            return self._set(False)
        if holder != self.identity:
            spec.holder_identity = self.identity
            spec.acquire_time = now
            spec.lease_transitions = (spec.lease_transitions or 0) + 1
        spec.renew_time = now
        spec.lease_duration_seconds = self.lease_seconds
        try:
            self.api.replace_namespaced_lease(self.name, self.namespace, lease)
        except ApiException as err:
            if err.status == 409:  # somebody else wrote first
                return self._set(False)
            raise
        return self._set(True)

    def _create(self, now: datetime) -> bool:
        body = client.V1Lease(
            metadata=client.V1ObjectMeta(name=self.name, namespace=self.namespace),
            spec=client.V1LeaseSpec(
                holder_identity=self.identity,
                acquire_time=now,
                renew_time=now,
                lease_duration_seconds=self.lease_seconds,
                lease_transitions=0,
            ),
        )
        try:
            self.api.create_namespaced_lease(self.namespace, body)
        except ApiException as err:
            if err.status == 409:
                return False
            raise
        return True

    def _set(self, leading: bool) -> bool:
        if leading != self.leading:
            log.warning(
                "%s %s the lead (%s/%s)",
                self.identity,
                "took" if leading else "does not have",
                self.namespace,
                self.name,
            )
        self.leading = leading
        return leading
