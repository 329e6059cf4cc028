"""Leader election on real Lease objects: one holder at a time, take-over after expiry."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from kubernetes import client, config

from gpufleet.controllers.leader import LeaderElection
from gpufleet.testing.cluster import ControlPlane


def test_one_leader_and_take_over(cluster: ControlPlane) -> None:
    """Times are each instance's own monotonic clock: expiry is what an instance observed."""
    api = client.CoordinationV1Api(config.new_client_from_config(str(cluster.kubeconfig)))
    name = f"lease-{uuid.uuid4().hex[:6]}"
    a = LeaderElection(api, "default", name, "a", lease_seconds=15)
    b = LeaderElection(api, "default", name, "b", lease_seconds=15)
    assert a.try_acquire_or_renew(0)
    assert a.holds(5) and not a.holds(13)  # by its own clock, with a margin
    assert a.holds(5, spare=6) and not a.holds(5, spare=8)  # a write of 8s could outlive it
    assert not b.try_acquire_or_renew(0)
    assert a.try_acquire_or_renew(10)  # renewing keeps it
    assert not b.try_acquire_or_renew(20)  # b sees the renewal first at 20
    assert not b.try_acquire_or_renew(34)  # unchanged for 14s of b's clock: not expired yet
    # a stops renewing: 15s after b last saw a change, b takes over; a cannot take it back
    assert b.try_acquire_or_renew(36)
    assert not a.try_acquire_or_renew(37)
    lease = api.read_namespaced_lease(name, "default")
    assert lease.spec is not None
    assert lease.spec.holder_identity == "b"
    assert lease.spec.lease_transitions == 1
    api.delete_namespaced_lease(name, "default")


def test_a_released_lease_is_taken_at_once(cluster: ControlPlane) -> None:
    """A holder that shuts down cleanly gives the Lease up: the next instance leads without
    waiting out the lease duration; one that no longer holds it cannot release it."""
    api = client.CoordinationV1Api(config.new_client_from_config(str(cluster.kubeconfig)))
    name = f"lease-{uuid.uuid4().hex[:6]}"
    a = LeaderElection(api, "default", name, "a", lease_seconds=15)
    b = LeaderElection(api, "default", name, "b", lease_seconds=15)
    assert a.try_acquire_or_renew(0)
    assert not b.try_acquire_or_renew(1)
    assert a.release() and not a.holds(2)
    assert b.try_acquire_or_renew(2)  # 1s after it first saw a's Lease, not 15
    assert not a.release()  # no longer the holder: b's Lease is left alone
    lease = api.read_namespaced_lease(name, "default")
    assert lease.spec is not None and lease.spec.holder_identity == "b"
    api.delete_namespaced_lease(name, "default")


def test_expiry_ignores_the_other_machines_clock(cluster: ControlPlane) -> None:
    """A holder whose clock runs an hour behind writes renewTimes that look expired; as long
    as they keep changing, nobody takes over."""
    api = client.CoordinationV1Api(config.new_client_from_config(str(cluster.kubeconfig)))
    name = f"lease-{uuid.uuid4().hex[:6]}"
    skewed = datetime.now(UTC) - timedelta(hours=1)
    api.create_namespaced_lease(
        "default",
        client.V1Lease(
            metadata=client.V1ObjectMeta(name=name),
            spec=client.V1LeaseSpec(
                holder_identity="slow-clock",
                renew_time=skewed,
                acquire_time=skewed,
                lease_duration_seconds=15,
            ),
        ),
    )
    b = LeaderElection(api, "default", name, "b", lease_seconds=15)
    assert not b.try_acquire_or_renew(0)
    lease = api.read_namespaced_lease(name, "default")
    assert lease.spec is not None
    lease.spec.renew_time = skewed + timedelta(seconds=10)  # the holder renews
    api.replace_namespaced_lease(name, "default", lease)
    assert not b.try_acquire_or_renew(12)
    assert not b.try_acquire_or_renew(26)  # 14s since it saw the renewal
    assert b.try_acquire_or_renew(28)  # the holder stopped: 16s without a change
    api.delete_namespaced_lease(name, "default")
