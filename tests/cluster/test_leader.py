"""Leader election on real Lease objects: one holder at a time, take-over after expiry."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from gpufleet.controllers.leader import LeaderElection
from kubernetes import client, config

from gpufleet.testing.cluster import ControlPlane


def test_one_leader_and_take_over(cluster: ControlPlane) -> None:
    api = client.CoordinationV1Api(config.new_client_from_config(str(cluster.kubeconfig)))
    name = f"lease-{uuid.uuid4().hex[:6]}"
    a = LeaderElection(api, "default", name, "a", lease_seconds=15)
    b = LeaderElection(api, "default", name, "b", lease_seconds=15)
    now = datetime.now(UTC)
    assert a.try_acquire_or_renew(now)
    assert not b.try_acquire_or_renew(now)
    assert a.try_acquire_or_renew(now + timedelta(seconds=10))  # renewing keeps it
    assert not b.try_acquire_or_renew(now + timedelta(seconds=20))  # renewed at +10: not expired
    # a stops renewing: after the lease duration, b takes over and a cannot take it back
    assert b.try_acquire_or_renew(now + timedelta(seconds=26))
    assert not a.try_acquire_or_renew(now + timedelta(seconds=27))
    lease = api.read_namespaced_lease(name, "default")
    assert lease.spec is not None
    assert lease.spec.holder_identity == "b"
    assert lease.spec.lease_transitions == 1
    api.delete_namespaced_lease(name, "default")
