"""Leader election with a coordination.k8s.io Lease: only the holder runs the workload loop.

Webhooks are stateless and served by every instance; decisions are made by one. The holder
renews the Lease every third of its duration. As in client-go, expiry is judged by this
process's own clock: another holder's Lease is expired when its renewTime (or holder) has not
changed for the lease duration *as observed here*, never by comparing the renewTime, written by
another machine's clock, with ours. The holder checks, by its own clock, that its last renewal is
recent enough before it writes a cycle's changes. Writes use the Lease's resourceVersion, so two
instances racing for an expired Lease cannot both win.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from datetime import UTC, datetime

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpufleet.kube.calls import API_TIMEOUT_S

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
        renew_seconds: float | None = None,  # default: a third of the lease
    ) -> None:
        self.api = api
        self.namespace = namespace
        self.name = name
        self.identity = identity or default_identity()
        self.lease_seconds = lease_seconds
        self.renew_seconds = lease_seconds / 3 if renew_seconds is None else renew_seconds
        self.leading = False
        self.renewed_at: float | None = None  # our clock (monotonic) at our last renewal
        self._observed: tuple[str | None, str | None] | None = None  # holder, renewTime
        self._observed_at = 0.0  # our clock when `_observed` last changed

    def due(self, now: float | None = None) -> bool:
        """Time to renew (or to try to take the lead)?"""
        now = time.monotonic() if now is None else now
        return self.renewed_at is None or now - self.renewed_at >= self.renew_seconds

    def holds(self, now: float | None = None, spare: float = 0.0) -> bool:
        """Still the leader by our own clock: renewed less than a lease duration ago (less a
        safety margin for the time a write takes). `spare`: seconds a write about to start may
        take, still under this lead (a write that must land before anyone else can lead)."""
        now = time.monotonic() if now is None else now
        return (
            self.leading
            and self.renewed_at is not None
            and now - self.renewed_at + spare < self.lease_seconds * 0.8
        )

    def lead(self) -> bool:
        """Renew the Lease (or try to take it) when that is due; whether this instance leads
        now. Raises what reading or writing the Lease raised."""
        if self.due():
            self.try_acquire_or_renew()
        return self.holds()

    def try_acquire_or_renew(self, now: float | None = None) -> bool:
        """Hold the Lease after this call? `now` is this process's monotonic clock (injected in
        tests). Never raises for a lost race; logs changes."""
        now = time.monotonic() if now is None else now
        try:
            lease = self.api.read_namespaced_lease(
                self.name, self.namespace, _request_timeout=API_TIMEOUT_S
            )
        except ApiException as err:
            if err.status != 404:
                raise
            return self._set(self._create(now), now)
        if lease.spec is None:
            lease.spec = client.V1LeaseSpec()
        spec = lease.spec
        holder = spec.holder_identity
        renewed = spec.renew_time or spec.acquire_time
        observed = (holder, renewed.isoformat() if renewed else None)
        if observed != self._observed:
            self._observed, self._observed_at = observed, now
        duration = spec.lease_duration_seconds or self.lease_seconds
        if holder and holder != self.identity and now - self._observed_at < duration:
            return self._set(False, now)
        wall = datetime.now(UTC)  # for people reading the Lease; never compared
        if holder != self.identity:
            spec.holder_identity = self.identity
            spec.acquire_time = wall
            spec.lease_transitions = (spec.lease_transitions or 0) + 1
        spec.renew_time = wall
        spec.lease_duration_seconds = self.lease_seconds
        try:
            self.api.replace_namespaced_lease(
                self.name, self.namespace, lease, _request_timeout=API_TIMEOUT_S
            )
        except ApiException as err:
            if err.status == 409:  # somebody else wrote first
                return self._set(False, now)
            raise
        return self._set(True, now)

    def release(self) -> bool:
        """Give the Lease up on a clean shutdown, so that a standby (or the next pod of a
        Recreate rollout) takes the lead at once instead of a lease duration later: the holder
        is cleared, as client-go's ReleaseOnCancel does. Only the holder's own Lease is
        touched, by resourceVersion; True when it was released."""
        if not self.leading:
            return False
        self.leading = False  # from here on this instance writes nothing
        try:
            lease = self.api.read_namespaced_lease(
                self.name, self.namespace, _request_timeout=API_TIMEOUT_S
            )
            if lease.spec is None or lease.spec.holder_identity != self.identity:
                return False
            lease.spec.holder_identity = None
            lease.spec.renew_time = datetime.now(UTC)
            self.api.replace_namespaced_lease(
                self.name, self.namespace, lease, _request_timeout=API_TIMEOUT_S
            )
        except (ApiException, OSError) as err:  # it expires as before
            log.warning("could not release the Lease %s/%s: %s", self.namespace, self.name, err)
            return False
        log.warning("%s released the lead (%s/%s)", self.identity, self.namespace, self.name)
        return True

    def _create(self, now: float) -> bool:
        wall = datetime.now(UTC)
        body = client.V1Lease(
            metadata=client.V1ObjectMeta(name=self.name, namespace=self.namespace),
            spec=client.V1LeaseSpec(
                holder_identity=self.identity,
                acquire_time=wall,
                renew_time=wall,
                lease_duration_seconds=self.lease_seconds,
                lease_transitions=0,
            ),
        )
        try:
            self.api.create_namespaced_lease(self.namespace, body, _request_timeout=API_TIMEOUT_S)
        except ApiException as err:
            if err.status == 409:
                return False
            raise
        return True

    def _set(self, leading: bool, now: float) -> bool:
        if leading:
            self.renewed_at = now
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
