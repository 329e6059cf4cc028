"""Notifications on the real control plane: a preemption reaches a Slack-format receiver,
with the route's URL read from a Kubernetes Secret, and the FleetPolicy shows the route ready;
a reservation's idle and expiry alerts fire, and a controller restart repeats neither."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from receivers import Receiver

from gpufleet.testing.cluster import ControlPlane

from .conftest import ControllerProcess

SECRETS_NAMESPACE = "gpufleet-system"  # where a route's Secrets are looked for by default


def test_a_preemption_is_told_on_slack(cluster: ControlPlane, scenario: Any) -> None:
    receiver = Receiver()
    s = scenario(1)
    owner, lender = s.team("owner"), s.team("lender")
    s.reserve(owner, 8)
    cluster.kubectl("create", "namespace", SECRETS_NAMESPACE, check=False)
    secret = f"slack-{s.id}"
    cluster.kubectl("create", "secret", "generic", secret, "-n", SECRETS_NAMESPACE,
                    f"--from-literal=url={receiver.url}")  # fmt: skip
    route = f"chat-{s.id}"
    queue = Receiver()  # the owner's queue news, as a signed-less webhook
    s.policy(
        notifications={
            "routes": [
                {
                    "name": route,
                    "type": "slack",
                    "urlSecretRef": {"name": secret, "key": "url"},
                    "teams": [lender],
                    "events": ["preempted"],
                },
                {
                    "name": f"queue-{s.id}",
                    "type": "webhook",
                    "url": queue.url,
                    "teams": [owner],
                    "events": ["submitted", "queued", "started"],
                },
            ]
        }
    )
    s.apply()
    try:
        s.job("borrow", lender, "elastic", 8)
        s.wait_states({"borrow": "Running"})
        s.job("claim", owner, "reserved", 8)
        s.wait_states({"borrow": "Preempted", "claim": "Running"}, 60)
        cluster.wait_until(lambda: bool(receiver.received), 30, "the Slack message")
        (message,) = receiver.json()  # only the preemption: the route takes no other kind
        assert message["text"].startswith(f"{s.namespace}/borrow preempted in {s.pool}")
        assert f"taken back by {s.namespace}/claim" in message["blocks"][0]["text"]["text"]

        def route_ready() -> bool:
            policy = cluster.get("fleetpolicy.gpufleet.io", f"policy-{s.id}")
            routes = (policy.get("status") or {}).get("notifications") or []
            return any(r["name"] == route and r["ready"] for r in routes)

        cluster.wait_until(route_ready, 30, "the FleetPolicy to show the route ready")

        def owner_news() -> list[str]:
            return [m["kind"] for m in queue.json()]

        cluster.wait_until(lambda: "started" in owner_news(), 30, "the claim's start")
        print("NEWS", queue.json())
        assert owner_news()[0] == "submitted" and owner_news().count("started") == 1
        assert all(m["subject"].startswith(f"{s.namespace}/claim@") for m in queue.json())
    finally:
        receiver.server.shutdown()
        queue.server.shutdown()
        cluster.kubectl("delete", "secret", secret, "-n", SECRETS_NAMESPACE, check=False)
    assert json.dumps(message)  # the payload is plain JSON, as Slack's webhook takes it


def test_idle_and_expiry_alerts_fire_once_across_a_restart(
    cluster: ControlPlane, controller: ControllerProcess, scenario: Any
) -> None:
    receiver = Receiver()
    s = scenario(1)
    owner = s.team("owner")
    s.reserve(owner, 8)  # nothing of the team runs: all of it idle
    expires = datetime.now(UTC) + timedelta(days=2)
    s.objects[-1]["spec"]["expiresAt"] = expires.isoformat().replace("+00:00", "Z")
    s.policy(
        notifications={
            "alerts": {"reservationIdlePercent": 80, "reservationIdleFor": "2s"},
            "routes": [
                {
                    "name": f"ops-{s.id}",
                    "type": "webhook",
                    "url": receiver.url,
                    "teams": [owner],
                    "events": ["reservation-idle", "reservation-expiring"],
                }
            ],
        }
    )
    s.apply()
    try:
        cluster.wait_until(lambda: len(receiver.received) >= 2, 60, "the idle and expiry alerts")
        told = sorted(m["kind"] for m in receiver.json())
        assert told == ["reservation-expiring", "reservation-idle"]
        assert all(m["team"] == owner for m in receiver.json())
        controller.wait_cycles(2)  # what the alerts remember reaches the ledger
        controller.kill()  # a crash: nothing is saved on the way out
        controller.start()
        controller.wait_cycles(5)
        assert sorted(m["kind"] for m in receiver.json()) == told  # neither told again
    finally:
        receiver.server.shutdown()
