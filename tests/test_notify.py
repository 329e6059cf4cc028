"""Notifications over real protocols: a local HTTP receiver for Slack and webhooks (signature
checked), a local SMTP server with STARTTLS and login for e-mail; de-duplication, rate limits,
retries, route status; capacity alerts; validation of the configuration."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from engine_helpers import gitops
from receivers import Receiver
from typer.testing import CliRunner

from gpufleet.cli.main import app
from gpufleet.controllers import notifications
from gpufleet.lifecycle import LifecycleEvent, Transition
from gpufleet.model.api import NotificationPolicy, NotificationRoute, SecretKeyRef
from gpufleet.model.fleet import fleet_from_objects
from gpufleet.notify import delivery
from gpufleet.notify.alerts import CapacityWatch
from gpufleet.notify.delivery import DeliveryError, send
from gpufleet.notify.messages import (
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    from_lifecycle,
    in_cluster,
    probe_notification,
    route_matches,
    verify,
    webhook_payload,
)

KEY = "s3cret-signing-key"
T0 = datetime(2026, 12, 2, 9, 0, tzinfo=UTC)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = Receiver()
    yield server
    server.server.shutdown()


def preempted(name: str = "ml/sweep", team: str = "nlp", minutes: float = 0) -> LifecycleEvent:
    return LifecycleEvent(
        transition=Transition.PREEMPTED,
        workload=name,
        uid=name,
        at=T0 + timedelta(minutes=minutes),
        team=team,
        workload_class="elastic",
        gpus=8,
        pool="h100",
        reason="ReservedWorkload",
        by="ml/pretrain",
        message="reserved work of team cv needs the GPUs",
    )


def slack(url_secret: str = "hook", **extra: Any) -> NotificationRoute:
    return NotificationRoute.model_validate(
        {
            "name": "slack",
            "type": "slack",
            "urlSecretRef": {"name": url_secret, "key": "url"},
            **extra,
        }
    )


def secrets(values: dict[str, str]) -> Any:
    def read(ref: SecretKeyRef) -> str:
        if ref.name not in values:
            raise DeliveryError(f"Secret {ref.namespace}/{ref.name} not found")
        return values[ref.name]

    return read


def dispatcher(values: dict[str, str], *routes: NotificationRoute) -> Any:
    stop = threading.Event()
    sender = notifications.Dispatcher(secrets(values), stop, retries=3, backoff_s=0.05)
    sender.configure(NotificationPolicy(routes=list(routes)))
    return sender.start(), stop


def test_a_preemption_reaches_slack_as_a_readable_message(receiver: Receiver) -> None:
    sender, stop = dispatcher({"hook": receiver.url}, slack())
    try:
        sender.lifecycle([preempted()])
        assert sender.drain(5)
    finally:
        stop.set()
    (message,) = receiver.json()
    assert message["text"].startswith("ml/sweep preempted in h100")
    assert "taken back by ml/pretrain" in message["blocks"][0]["text"]["text"]
    fields = {f["text"] for f in message["blocks"][1]["fields"]}
    assert "*preempted by*\nml/pretrain" in fields and "*team*\nnlp" in fields
    assert sender.route_status()["slack"][0] is True


def test_a_worker_of_a_fleet_says_which_cluster(receiver: Receiver) -> None:
    """A worker's controller names its cluster in each message: the same news from two
    clusters is two messages."""
    sender, stop = dispatcher({"hook": receiver.url}, slack())
    sender.cluster = "east"
    try:
        sender.lifecycle([preempted()])
        sender.cluster = "west"
        sender.lifecycle([preempted()])  # the same workload name, in another cluster
        assert sender.drain(5)
    finally:
        stop.set()
    messages = receiver.json()
    assert [m["text"].split(":")[0] for m in messages] == [
        "[east] ml/sweep preempted in h100",
        "[west] ml/sweep preempted in h100",
    ]
    fields = {f["text"] for f in messages[0]["blocks"][1]["fields"]}
    assert "*cluster*\neast" in fields
    note = in_cluster(from_lifecycle(preempted()) or pytest.fail("no note"), "east")
    assert webhook_payload(note)["cluster"] == "east"
    assert in_cluster(note, None) is note and webhook_payload(in_cluster(note, "west")) == (
        webhook_payload(note)
    )  # told once: a note that names its cluster keeps it


def test_duplicates_and_the_rate_limit_hold_messages_back(receiver: Receiver) -> None:
    sender, stop = dispatcher(
        {"hook": receiver.url}, slack(rateLimitPerHour=2, teams=["nlp"], events=["preempted"])
    )
    try:
        event = preempted()
        sender.lifecycle([event, event])  # the same news twice: once
        sender.lifecycle([preempted("ml/other", minutes=1), preempted("ml/third", minutes=2)])
        sender.lifecycle([preempted("cv/job", team="cv", minutes=3)])  # another team's
        done = LifecycleEvent(**{**event.__dict__, "transition": Transition.COMPLETED})
        sender.lifecycle([done])  # not a kind this route takes
        assert sender.drain(5)
    finally:
        stop.set()
    titles = [m["text"].split(":")[0] for m in receiver.json()]
    assert titles == ["ml/sweep preempted in h100", "ml/other preempted in h100"]


def test_a_signed_webhook_is_retried_until_it_is_taken() -> None:
    receiver = Receiver(fail_first=2)
    route = NotificationRoute.model_validate(
        {
            "name": "ops",
            "type": "webhook",
            "url": receiver.url,
            "signingSecretRef": {"name": "signing", "key": "key"},
        }
    )
    sender, stop = dispatcher({"signing": KEY}, route)
    try:
        sender.lifecycle([preempted()])
        assert sender.drain(10)
    finally:
        stop.set()
        receiver.server.shutdown()
    ((headers, body),) = receiver.received
    assert verify(body, KEY.encode(), headers[TIMESTAMP_HEADER], headers[SIGNATURE_HEADER])
    assert not verify(body, b"another key", headers[TIMESTAMP_HEADER], headers[SIGNATURE_HEADER])
    payload = json.loads(body)
    assert payload["kind"] == "preempted" and payload["team"] == "nlp"
    assert sender.route_status()["ops"] == (True, "last preempted message delivered")


def status_after_a_preemption(values: dict[str, str], route: NotificationRoute) -> Any:
    """The route's (ready, message) once a preemption's message was tried over it."""
    sender, stop = dispatcher(values, route)
    try:
        sender.lifecycle([preempted()])
        assert sender.drain(10)
        assert sender.thread.is_alive()
        return sender.route_status()[route.name]
    finally:
        stop.set()


def test_a_missing_secret_is_the_routes_status_not_a_crash(receiver: Receiver) -> None:
    ready, message = status_after_a_preemption({}, slack("absent"))
    assert not ready and "Secret gpufleet-system/absent not found" in message


@pytest.mark.parametrize(
    "url",
    [
        # a Secret written with `echo`: the newline makes the URL invalid, and the error
        # Python raises quotes the path, which is the webhook's secret
        "https://hooks.slack.com/services/T0000/B0000/XXSECRETXXSECRETXX\n",
        "http://127.0.0.1:1/services/T0000/B0000/XXSECRETXXSECRETXX",  # nothing listens
    ],
)
def test_a_failed_delivery_never_shows_the_webhooks_secret(url: str) -> None:
    ready, message = status_after_a_preemption({"hook": url}, slack())
    assert not ready and message.startswith("delivery failed")
    assert "XXSECRETXX" not in message and "T0000" not in message, message
    note = from_lifecycle(preempted())
    assert note is not None
    with pytest.raises(DeliveryError) as err:
        send(slack(), note, secrets({"hook": url}))
    assert "XXSECRETXX" not in str(err.value)


@pytest.fixture
def smtp_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """aiosmtpd with STARTTLS required before login, its certificate signed by a test CA that
    the client trusts through SSL_CERT_FILE."""
    import ssl

    from aiosmtpd.controller import Controller
    from aiosmtpd.smtp import AuthResult, LoginPassword

    from gpufleet.pki import create_ca, issue_serving_cert

    pki = create_ca(tmp_path / "pki")
    cert, key = tmp_path / "smtp.crt", tmp_path / "smtp.key"
    issue_serving_cert(pki.ca_cert, pki.ca_key, cert, key, ["127.0.0.1"])
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    monkeypatch.setenv("SSL_CERT_FILE", str(pki.ca_cert))
    received: list[Any] = []

    class Handler:
        async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
            received.append(envelope)
            return "250 OK"

    def authenticate(server: Any, session: Any, envelope: Any, mechanism: str, data: Any) -> Any:
        ok = isinstance(data, LoginPassword) and (data.login, data.password) == (
            b"gpufleet",
            b"mail-pass",
        )
        return AuthResult(success=ok)

    from gpufleet.testing.cluster import free_port

    controller = Controller(
        Handler(),
        hostname="127.0.0.1",
        port=free_port(),
        tls_context=context,
        require_starttls=True,
        authenticator=authenticate,
        auth_required=True,
    )
    controller.start()
    controller.received = received  # type: ignore[attr-defined]
    yield controller
    controller.stop()


def test_email_over_starttls_with_login(smtp_server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    port = smtp_server.port
    route = NotificationRoute.model_validate(
        {
            "name": "mail",
            "type": "email",
            "email": {
                "host": "127.0.0.1",
                "port": port,
                "from": "gpufleet@example.com",
                "to": ["ops@example.com"],
                "username": "gpufleet",
            },
            "passwordSecretRef": {"name": "smtp", "key": "password"},
        }
    )
    note = from_lifecycle(preempted())
    assert note is not None
    send(route, note, secrets({"smtp": "mail-pass"}))
    (envelope,) = smtp_server.received
    assert envelope.mail_from == "gpufleet@example.com"
    assert envelope.rcpt_tos == ["ops@example.com"]
    text = envelope.content.decode()
    assert "Subject: [gpufleet] ml/sweep preempted in h100" in text
    from gpufleet.testing.cluster import free_port

    nowhere = route.model_copy(
        update={"email": route.email.model_copy(update={"port": free_port()})}  # type: ignore[union-attr]
    )
    with pytest.raises(DeliveryError, match="Connection refused"):  # a bad SMTP host or port
        send(nowhere, note, secrets({"smtp": "mail-pass"}))
    monkeypatch.setattr(delivery, "TIMEOUT_S", 2.0)  # aiosmtpd holds a failed login back
    with pytest.raises(DeliveryError, match=r"SMTP 127\.0\.0\.1"):
        send(route, note, secrets({"smtp": "wrong"}))


def test_capacity_alerts_fire_once_per_episode() -> None:
    objects = gitops({"h100": {"maxGPUs": 16}}, {"nlp": {}}, {("nlp", "h100"): 8})
    objects[-1]["spec"]["expiresAt"] = (T0 + timedelta(days=3)).isoformat()
    fleet = fleet_from_objects(objects).fleet
    watch = CapacityWatch()

    def status(allocated: float, used: float) -> dict[tuple[str, str], dict[str, Any]]:
        return {
            ("GPUPool", "h100"): {"healthyGPUs": 16, "allocatedGPUs": allocated},
            ("Reservation", "nlp-h100"): {"reservedGPUs": 8, "usedGPUs": used},
        }

    first = watch.check(fleet, status(15, 0), T0)
    assert sorted(n.kind for n in first) == ["pool-nearly-full", "reservation-expiring"]
    assert watch.check(fleet, status(16, 0), T0 + timedelta(hours=1)) == []  # still full
    later = watch.check(fleet, status(2, 0), T0 + timedelta(hours=25))
    assert [n.kind for n in later] == ["reservation-idle", "reservation-expiring"]  # next day
    assert watch.check(fleet, status(15, 8), T0 + timedelta(hours=26))[0].kind == (
        "pool-nearly-full"  # full again after it was not
    )


def test_routes_match_by_team_kind_namespace_pool_and_cluster() -> None:
    note = from_lifecycle(preempted())
    assert note is not None
    assert route_matches(slack(), note)
    assert not route_matches(slack(teams=["cv"]), note)
    assert not route_matches(slack(events=["failed"]), note)
    assert route_matches(slack(teams=["cv"]), probe_notification("x", T0))  # for everybody
    assert route_matches(slack(namespaces=["ml"], pools=["h100"]), note)
    assert not route_matches(slack(namespaces=["vision"]), note)
    assert not route_matches(slack(pools=["a100"]), note)
    assert route_matches(slack(clusters=["eu"]), note)  # a cluster of one: no cluster to check
    assert not route_matches(slack(clusters=["eu"]), in_cluster(note, "us"))
    assert route_matches(slack(clusters=["us"]), in_cluster(note, "us"))
    assert route_matches(slack(pools=["a100"]), probe_notification("x", T0))


def test_a_restarted_controller_tells_nothing_again(tmp_path: Path, receiver: Receiver) -> None:
    """The alerts' memory and what was delivered live in the ledger: a controller started
    again on it repeats neither a capacity alert nor a workload's news, and the delivery log
    shows what went out and what could not."""
    from gpufleet.controllers.ledger import LedgerSink
    from gpufleet.controllers.subscribers import Alerts, CycleOutcome
    from gpufleet.ledger.store import open_ledger

    dead = {"name": "dead", "type": "webhook", "url": "http://127.0.0.1:9/hook",
            "events": ["preempted"]}  # fmt: skip
    routes = [slack().model_dump(by_alias=True, exclude_defaults=True), dead]
    objects = gitops({"h100": {"maxGPUs": 16}}, {"nlp": {}}, {("nlp", "h100"): 8},
                     {"notifications": {"routes": routes}})  # fmt: skip
    objects[-2]["spec"]["expiresAt"] = (T0 + timedelta(days=3)).isoformat()
    fleet = fleet_from_objects(objects).fleet
    db = str(tmp_path / "ledger.db")
    NOON = T0 + timedelta(hours=3)  # not the digests' hour

    def start() -> tuple[Any, Any, Any, threading.Event]:
        stop = threading.Event()
        sink = LedgerSink(db, stop).start()
        sender = notifications.Dispatcher(secrets({"hook": receiver.url}), stop, retries=1,
                                          backoff_s=0.05)  # fmt: skip
        sender.journal = sink.record_delivery
        sender.start()
        return sink, sender, Alerts(sender, sink), stop

    def cycle(alerts: Any, allocated: float, at: datetime) -> None:
        status = {
            ("GPUPool", "h100"): {"healthyGPUs": 16, "allocatedGPUs": allocated},
            ("Reservation", "nlp-h100"): {"reservedGPUs": 8, "usedGPUs": 8},
        }
        alerts(CycleOutcome(at, fleet, {}, None, None, [], status, [], []))  # type: ignore[arg-type]

    def settle(sink: Any, sender: Any) -> None:
        assert sender.drain(10) and sink.drain(10)

    sink, sender, alerts, stop = start()
    cycle(alerts, 15, NOON)  # the first cycle reads the memory back: nothing checked yet
    assert alerts.restored.wait(10)
    cycle(alerts, 15, NOON + timedelta(seconds=1))
    sender.lifecycle([preempted()])
    settle(sink, sender)
    told = sorted(m["text"].split(":")[0] for m in receiver.json())
    assert told == ["ml/sweep preempted in h100", "pool h100 is 94% allocated",
                    "reservation nlp-h100 expires in 2.9 days"]  # fmt: skip
    stop.set()

    sink, sender, alerts, stop = start()  # the controller restarted
    cycle(alerts, 15, NOON + timedelta(minutes=1))
    assert alerts.restored.wait(10)
    cycle(alerts, 16, NOON + timedelta(minutes=2))  # the same episodes
    sender.lifecycle([preempted()])  # replayed after the restart
    settle(sink, sender)
    assert len(receiver.received) == 3  # nothing again
    cycle(alerts, 2, NOON + timedelta(minutes=3))  # the pool's episode ends ...
    cycle(alerts, 15, NOON + timedelta(minutes=4))  # ... and a new one begins
    settle(sink, sender)
    assert len(receiver.received) == 4
    stop.set()

    ledger = open_ledger(db)
    log = ledger.deliveries(T0 - timedelta(days=1), datetime.now(UTC) + timedelta(days=1))
    ledger.close()
    sent = sorted(r["kind"] for r in log if r["outcome"] == "sent")
    assert sent == ["pool-nearly-full", "pool-nearly-full", "preempted", "reservation-expiring"]
    # the dead route: tried twice, then given up on; what failed is tried again after a restart
    failed = [r for r in log if r["outcome"] == "failed"]
    assert [(r["route"], r["kind"], r["attempts"]) for r in failed] == [
        ("dead", "preempted", 2)
    ] * 2
    assert all("cannot reach the receiver" in r["error"] for r in failed)


def test_bad_notification_settings_are_located_errors(tmp_path: Path) -> None:
    objects = gitops({"h100": {}}, {"nlp": {}})
    objects.append(
        {
            "apiVersion": "gpufleet.io/v1alpha1",
            "kind": "FleetPolicy",
            "metadata": {"name": "notify"},
            "spec": {
                "notifications": {
                    "routes": [
                        {
                            "name": "chat",
                            "type": "slack",
                            "teams": ["nlpp"],
                            "urlSecretRef": {"name": "hook", "key": "url"},
                        },
                        {"name": "chat", "type": "slack", "url": "https://hooks.example"},
                    ]
                }
            },
        }
    )
    (tmp_path / "fleet.yaml").write_text(yaml.safe_dump_all(objects))
    done = CliRunner().invoke(app, ["validate", str(tmp_path)])
    assert done.exit_code == 1 and "Traceback" not in done.output
    assert "fleet.yaml:" in done.output
    assert "a slack route needs urlSecretRef" in done.output
    objects[-1]["spec"]["notifications"]["routes"].pop()
    (tmp_path / "fleet.yaml").write_text(yaml.safe_dump_all(objects))
    done = CliRunner().invoke(app, ["validate", str(tmp_path)])
    assert done.exit_code == 1
    assert "names team 'nlpp', which does not exist (did you mean 'nlp'?)" in done.output


def test_cli_notify_test_sends_over_the_declared_route(tmp_path: Path, receiver: Receiver) -> None:
    objects = gitops({"h100": {}}, {"nlp": {}})
    objects.append(
        {
            "apiVersion": "gpufleet.io/v1alpha1",
            "kind": "FleetPolicy",
            "metadata": {"name": "notify"},
            "spec": {"notifications": {"routes": [slack().model_dump(by_alias=True,
                                                                     exclude_unset=True)]}},
        }
    )  # fmt: skip
    (tmp_path / "fleet.yaml").write_text(yaml.safe_dump_all(objects))
    runner = CliRunner()
    done = runner.invoke(
        app,
        ["notify", "test", "slack", "-g", str(tmp_path), "--secret", f"hook/url={receiver.url}"],
    )
    assert done.exit_code == 0, done.output
    assert receiver.json()[0]["text"].startswith("gpufleet test message for route slack")
    unknown = runner.invoke(app, ["notify", "test", "teams", "-g", str(tmp_path)])
    assert unknown.exit_code == 1 and "no notification route 'teams'" in unknown.output


def test_digests_are_due_once_a_day_and_read_the_ledger(tmp_path: Path) -> None:
    from gpufleet.notify.digest import DigestClock, Wait

    clock = DigestClock()
    monday_9 = datetime(2026, 11, 30, 9, 5, tzinfo=UTC)
    assert clock.due(monday_9 - timedelta(hours=1), 9) == []
    assert clock.due(monday_9, 9) == ["daily-digest", "weekly-digest"]
    assert clock.due(monday_9 + timedelta(minutes=30), 9) == []  # sent already today
    assert clock.due(monday_9 + timedelta(days=1), 9) == ["daily-digest"]

    from gpufleet.controllers import ledger as sink_module

    stop = threading.Event()
    sink = sink_module.LedgerSink(str(tmp_path / "ledger.db"), stop).start()
    run = preempted()
    admitted = LifecycleEvent(
        **{
            **run.__dict__,
            "transition": Transition.ADMITTED,
            "at": monday_9 - timedelta(hours=2),
            "price_per_gpu_hour": 2.5,
        }
    )
    done = LifecycleEvent(**{**admitted.__dict__, "transition": Transition.COMPLETED,
                             "at": monday_9 - timedelta(hours=1)})  # fmt: skip
    # the day before: 8 GPUs for 4 hours at $2.50, $80
    before = LifecycleEvent(**{**admitted.__dict__, "uid": "yesterday",
                               "at": monday_9 - timedelta(hours=30)})  # fmt: skip
    before_done = LifecycleEvent(**{**before.__dict__, "transition": Transition.COMPLETED,
                                    "at": monday_9 - timedelta(hours=26)})  # fmt: skip
    sink.publish([before, before_done, admitted, done])
    got: list[Any] = []
    waits = [Wait("ml/big", "nlp", 64, 7200), Wait("cv/small", "cv", 1, 60)]
    sink.digest("daily-digest", waits, monday_9, got.extend, teams=["nlp", "cv"])
    assert sink.drain(10)
    stop.set()
    note, cv, nlp = got
    assert note.title == "gpufleet daily digest: $20.00 over 24 hours"  # 8 GPUs x 1 h x $2.50
    assert "  nlp: $20.00, 8.0 GPU-hours, efficiency 100%" in note.text
    assert "Against the day before: cost down 75% from $80.00, GPU-hours down 75% from 32.0." in (
        note.text
    )
    assert note.text.index("ml/big (nlp, 64 GPUs): 2.0 h") < note.text.index("cv/small")
    assert nlp.team == "nlp" and nlp.title == "gpufleet daily digest for team nlp: $20.00"
    assert "cost down 75% from $80.00 the day before" in nlp.text and "ml/big" in nlp.text
    assert "cv/small" not in nlp.text and cv.fields["cost"] == "$0.00"
    own = slack(teams=["nlp"])
    assert route_matches(own, nlp) and not route_matches(own, cv) and route_matches(own, note)
    assert not route_matches(slack(), nlp)  # a team's digest only where the team is named


def test_teams_and_pagerduty_get_their_own_formats(receiver: Receiver) -> None:
    """A Teams workflow gets an Adaptive Card; PagerDuty's Events API v2 a trigger with the
    routing key from its Secret and the notification's dedup key (the same news twice is one
    incident). Both to real HTTP receivers."""
    teams = NotificationRoute.model_validate(
        {"name": "teams", "type": "teams", "urlSecretRef": {"name": "flow", "key": "url"}}
    )
    pager = NotificationRoute.model_validate(
        {"name": "pager", "type": "pagerduty", "url": receiver.url,
         "routingKeySecretRef": {"name": "pd", "key": "routingKey"}}
    )  # fmt: skip
    sender, stop = dispatcher({"flow": receiver.url, "pd": "R0UT1NGKEY"}, teams, pager)
    try:
        sender.lifecycle([preempted()])
        assert sender.drain(5)
    finally:
        stop.set()
    card, event = sorted(receiver.json(), key=lambda m: "routing_key" in m)
    (attachment,) = card["attachments"]
    assert attachment["contentType"] == "application/vnd.microsoft.card.adaptive"
    blocks = attachment["content"]["body"]
    assert blocks[0]["text"] == "ml/sweep preempted in h100"
    assert "taken back by ml/pretrain" in blocks[1]["text"]
    assert {"title": "preempted by", "value": "ml/pretrain"} in blocks[2]["facts"]
    assert event["routing_key"] == "R0UT1NGKEY" and event["event_action"] == "trigger"
    note = from_lifecycle(preempted()) or pytest.fail("no note")
    assert event["dedup_key"] == note.dedup_key
    assert event["payload"]["severity"] == "warning" and event["payload"]["group"] == "nlp"
    assert event["payload"]["component"] == "ml/sweep" and event["payload"]["class"] == "preempted"
    assert sender.route_status()["pager"][0] is True


@pytest.mark.parametrize(
    ("route", "message"),
    [
        ({"type": "teams"}, "a teams route needs urlSecretRef"),
        ({"type": "pagerduty"}, "a pagerduty route needs routingKeySecretRef"),
        ({"type": "slack", "urlSecretRef": {"name": "h", "key": "url"},
          "routingKeySecretRef": {"name": "k", "key": "k"}},
         "routingKeySecretRef is for pagerduty routes"),
    ],
)  # fmt: skip
def test_a_teams_or_pagerduty_route_without_its_secret_is_refused(
    route: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        NotificationRoute.model_validate({"name": "r", **route})


def test_queue_news_is_told_once_per_wait_and_not_again_after_a_restart() -> None:
    from gpufleet.notify.alerts import QueuedWork, QueueWatch

    def work(position: int | None, since: datetime | None = T0, preempted: bool = False) -> Any:
        eta = T0 + timedelta(hours=2) if position else None
        return QueuedWork("ml/sweep", "nlp", "alice@example.com", 16, T0, since, preempted,
                          position, eta, "PoolFull", "h100")  # fmt: skip

    watch = QueueWatch()
    (submitted,) = watch.check([work(None)], T0 + timedelta(seconds=1))
    assert (submitted.kind, submitted.user, submitted.namespace) == (
        "submitted", "alice@example.com", "ml")  # fmt: skip
    (queued,) = watch.check([work(3)], T0 + timedelta(seconds=2))  # decided: it waits
    assert queued.kind == "queued" and queued.title == "ml/sweep is number 3 in team nlp's queue"
    assert queued.fields["ETA"] == "2026-12-02T11:00+00:00"
    assert watch.check([work(2)], T0 + timedelta(seconds=3)) == []  # its place moved: no news
    assert watch.check([work(None, None)], T0 + timedelta(seconds=4)) == []  # admitted
    saved = json.loads(json.dumps(watch.state()))
    restarted = QueueWatch()
    restarted.restore(saved)
    assert restarted.check([work(None, None)], T0 + timedelta(minutes=2)) == []  # told before
    later = T0 + timedelta(minutes=5)
    again = restarted.check([work(1, later, preempted=True)], later + timedelta(seconds=1))
    assert [n.kind for n in again] == ["queued"]  # preempted: waits again, not submitted again
    # admitted at its first decision, never seen waiting: submitted all the same
    other = QueuedWork("ml/quick", "nlp", None, 1, later, None, False, None, None, None, None)
    assert [n.kind for n in restarted.check([other], later + timedelta(seconds=2))] == ["submitted"]


def test_queue_news_and_user_routes_are_heard_only_where_asked() -> None:
    from gpufleet.notify.alerts import QueuedWork, _submitted

    work = QueuedWork("ml/x", "nlp", "alice@example.com", 8, T0, T0, False, None, None, None, None)
    note = _submitted(work, "ml/x@t")
    assert not route_matches(slack(), note)  # every run's news: not by default
    assert route_matches(slack(events=["submitted"]), note)
    assert route_matches(slack(events=["submitted"], users=["alice@example.com"]), note)
    assert not route_matches(slack(events=["submitted"], users=["bob@example.com"]), note)
    started = from_lifecycle(
        LifecycleEvent(**{**preempted().__dict__, "transition": Transition.RUNNING})
    )
    assert started is not None and started.kind == "started"


def test_a_slack_direct_message_goes_to_the_users_member_id() -> None:
    slack_api = Receiver(answer=b'{"ok": true, "channel": "D1"}')
    refusing = Receiver(answer=b'{"ok": false, "error": "channel_not_found"}')
    try:
        route = NotificationRoute.model_validate(
            {"name": "dm", "type": "slack-dm", "url": slack_api.url,
             "tokenSecretRef": {"name": "bot", "key": "token"},
             "slackUsers": {"alice@example.com": "U0ALICE"}, "events": ["preempted"]}
        )  # fmt: skip
        event = LifecycleEvent(**{**preempted().__dict__, "submitter": "alice@example.com"})
        note = from_lifecycle(event)
        assert note is not None and route_matches(route, note)
        anonymous = from_lifecycle(preempted())
        assert anonymous is not None and not route_matches(route, anonymous)  # nobody to tell
        send(route, note, secrets({"bot": "xoxb-123"}))
        ((headers, body),) = slack_api.received
        assert headers["Authorization"] == "Bearer xoxb-123"
        message = json.loads(body)
        assert message["channel"] == "U0ALICE" and message["text"].startswith("ml/sweep preempted")
        wrong = route.model_copy(update={"url": refusing.url})
        with pytest.raises(DeliveryError, match="channel_not_found") as refused:
            send(wrong, note, secrets({"bot": "xoxb-123"}))
        assert "xoxb-123" not in str(refused.value)
    finally:
        slack_api.server.shutdown()
        refusing.server.shutdown()
    with pytest.raises(ValueError, match="slackUsers"):
        NotificationRoute.model_validate(
            {"name": "dm", "type": "slack-dm", "tokenSecretRef": {"name": "b", "key": "t"}}
        )
