"""Notifications: what is worth telling people, and how it reads on Slack, Microsoft Teams,
PagerDuty, a webhook and in e-mail. Pure: built from lifecycle events and capacity
observations, routed by team and kind."""

from __future__ import annotations

import hashlib
import hmac
import json
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from email.message import EmailMessage
from typing import Any

from gpufleet.lifecycle import LifecycleEvent, Transition
from gpufleet.model.api import DIGEST_NOTIFICATIONS, QUEUE_NOTIFICATIONS, NotificationRoute

SIGNATURE_HEADER = "X-Gpufleet-Signature"
TIMESTAMP_HEADER = "X-Gpufleet-Timestamp"
SEVERITY_EMOJI = {
    "info": ":information_source:",
    "warning": ":warning:",
    "critical": ":rotating_light:",
}


@dataclass(frozen=True)
class Notification:
    kind: str  # a NotificationKind: preempted, pool-nearly-full, ...
    subject: str  # what it is about: a workload (namespace/name), a pool, a node, a reservation
    title: str
    text: str
    at: datetime
    team: str | None = None  # None: for everybody (capacity and health alerts)
    severity: str = "info"  # info | warning | critical
    fields: dict[str, str] = field(default_factory=dict)
    cluster: str | None = None  # the cluster of a fleet it happened in; None: one cluster
    namespace: str | None = None  # of the workload it is about
    user: str | None = None  # who submitted the workload it is about (per-user routes)
    pool: str | None = None  # the pool it is about, or its workload's

    @property
    def dedup_key(self) -> str:
        """Two notifications with one key are the same news."""
        where = f"{self.cluster}/" if self.cluster else ""
        return f"{self.kind}:{where}{self.subject}"


def in_cluster(note: Notification, cluster: str | None) -> Notification:
    """`note` as told by the controller of `cluster` of a fleet: it says which cluster, in
    its title, its fields and each payload."""
    if cluster is None or note.cluster is not None:
        return note
    return replace(
        note,
        cluster=cluster,
        title=f"[{cluster}] {note.title}",
        fields={"cluster": cluster, **note.fields},
    )


# which lifecycle transitions people hear about, under which kind, and how loud
_WORKLOAD_KINDS: dict[Transition, tuple[str, str]] = {
    Transition.ADMITTED: ("admitted", "info"),
    Transition.RUNNING: ("started", "info"),
    Transition.RESUMED: ("resumed", "info"),
    Transition.PREEMPTED: ("preempted", "warning"),
    Transition.REQUEUED: ("preempted", "warning"),
    Transition.COMPLETED: ("completed", "info"),
    # a failure is told once it is diagnosed, with why (controllers/diagnosis.py)
    Transition.CANCELLED: ("cancelled", "info"),
}


def from_lifecycle(event: LifecycleEvent) -> Notification | None:
    """The notification of a workload's transition."""
    kind_severity = _WORKLOAD_KINDS.get(event.transition)
    if kind_severity is None:
        return None
    kind, severity = kind_severity
    gpus = f"{event.gpus:g} GPU{'s' * (event.gpus != 1)}"
    where = f" in {event.pool}" if event.pool else ""
    titles = {
        "admitted": f"{event.workload} admitted: {gpus}{where}",
        "resumed": f"{event.workload} resumed: {gpus}{where}",
        "started": f"{event.workload} started: all its pods run",
        "preempted": f"{event.workload} preempted{where}",
        "completed": f"{event.workload} completed",
        "failed": f"{event.workload} failed",
        "cancelled": f"{event.workload} cancelled",
    }
    detail = event.message or event.reason or ""
    if kind == "preempted":
        by = f" by {event.by}" if event.by else ""
        detail = (
            f"Its {gpus} were taken back{by} ({event.reason or 'preempted'}). It waits and "
            f"resumes automatically when capacity returns. {event.message}".strip()
        )
    fields = {"team": event.team, "class": event.workload_class, "GPUs": f"{event.gpus:g}"}
    if event.pool:
        fields["pool"] = event.pool
    if event.by:
        fields["preempted by"] = event.by
    if event.reason:
        fields["reason"] = event.reason
    return Notification(
        kind=kind,
        # each run is news once: its segment (start) or its end, not the workload forever
        subject=f"{event.workload}@{event.at.isoformat()}",
        title=titles[kind],
        text=detail,
        at=event.at,
        team=event.team,
        severity=severity,
        fields=fields,
        namespace=event.namespace or None,
        pool=event.pool,
        user=event.submitter,
    )


def route_matches(route: NotificationRoute, note: Notification) -> bool:
    """Whether `route` takes `note`: its kind is one of the route's events, and its team,
    namespace, pool and cluster each one the route names (where it names any). What is not
    about a team, namespace, pool or cluster (a node quarantined, a digest) passes that filter:
    news for everybody reaches every route."""
    if route.events and note.kind not in route.events:
        return False
    if not route.events and note.kind in QUEUE_NOTIFICATIONS:
        return False  # every run's news: only where asked for
    if route.type == "slack-dm" and note.user not in route.slack_users:
        return False  # a direct message needs someone to send it to
    if route.users and note.user not in route.users:
        return False
    if note.kind in DIGEST_NOTIFICATIONS and note.team is not None and note.team not in route.teams:
        return False  # a team's digest goes only where the team is named
    return all(
        not wanted or value is None or value in wanted
        for wanted, value in (
            (route.teams, note.team),
            (route.namespaces, note.namespace),
            (route.pools, note.pool),
            (route.clusters, note.cluster),
        )
    )


def slack_payload(note: Notification) -> dict[str, Any]:
    """An incoming-webhook message: a plain `text` for notifications and clients without
    blocks, and blocks that read well in the channel."""
    lead = f"{SEVERITY_EMOJI.get(note.severity, '')} *{note.title}*".strip()
    blocks: list[dict[str, Any]] = [
        {"type": "section", "text": {"type": "mrkdwn", "text": f"{lead}\n{note.text}".strip()}}
    ]
    if note.fields:
        blocks.append(
            {
                "type": "section",
                "fields": [
                    {"type": "mrkdwn", "text": f"*{name}*\n{value}"}
                    for name, value in list(note.fields.items())[:10]  # Slack's limit
                ],
            }
        )
    blocks.append(
        {
            "type": "context",
            "elements": [{"type": "mrkdwn", "text": f"gpufleet · {note.kind} · {_iso(note.at)}"}],
        }
    )
    return {"text": f"{note.title}: {note.text}".strip(": "), "blocks": blocks}


def webhook_payload(note: Notification) -> dict[str, Any]:
    return {
        "kind": note.kind,
        "subject": note.subject,
        "team": note.team,
        "severity": note.severity,
        "title": note.title,
        "text": note.text,
        "at": _iso(note.at),
        "fields": note.fields,
        "cluster": note.cluster,
    }


# PagerDuty's severities; a notification's info, warning and critical map onto three of them
PAGERDUTY_SEVERITY = {"info": "info", "warning": "warning", "critical": "critical"}


def pagerduty_event(note: Notification, routing_key: str) -> dict[str, Any]:
    """A PagerDuty Events API v2 `trigger`. Its dedup_key is the notification's: the same
    news sent twice (a restart, a retry) is one incident there."""
    return {
        "routing_key": routing_key,
        "event_action": "trigger",
        "dedup_key": note.dedup_key[:255],
        "payload": {
            "summary": note.title[:1024],
            "source": f"gpufleet/{note.cluster}" if note.cluster else "gpufleet",
            "severity": PAGERDUTY_SEVERITY.get(note.severity, "info"),
            "timestamp": _iso(note.at),
            "component": note.subject.split("@", 1)[0],
            "group": note.team or "",
            "class": note.kind,
            "custom_details": {"text": note.text, **note.fields},
        },
    }


def teams_payload(note: Notification) -> dict[str, Any]:
    """A message for a Microsoft Teams workflow ("When a Teams webhook request is received"):
    one Adaptive Card with the title, what happened and the fields."""
    body: list[dict[str, Any]] = [
        {"type": "TextBlock", "text": note.title, "weight": "Bolder", "size": "Medium",
         "wrap": True, "color": "Attention" if note.severity == "critical" else "Default"},
    ]  # fmt: skip
    if note.text:
        body.append({"type": "TextBlock", "text": note.text, "wrap": True})
    if note.fields:
        facts = [{"title": k, "value": v} for k, v in note.fields.items()]
        body.append({"type": "FactSet", "facts": facts})
    body.append(
        {"type": "TextBlock", "text": f"gpufleet · {note.kind} · {_iso(note.at)}",
         "isSubtle": True, "size": "Small", "wrap": True}
    )  # fmt: skip
    card = {
        "$schema": "http://adaptivecards.io/schemas/adaptive-card.json",
        "type": "AdaptiveCard",
        "version": "1.4",
        "body": body,
    }
    return {
        "type": "message",
        "attachments": [
            {"contentType": "application/vnd.microsoft.card.adaptive", "contentUrl": None,
             "content": card}
        ],
    }  # fmt: skip


def webhook_body(note: Notification) -> bytes:
    return json.dumps(webhook_payload(note), sort_keys=True).encode()


def signature(body: bytes, key: bytes, timestamp: str) -> str:
    """The X-Gpufleet-Signature header: HMAC-SHA256 over "<timestamp>.<body>", so a receiver
    can reject a replayed old message as well as a forged one."""
    digest = hmac.new(key, timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()
    return f"sha256={digest}"


def verify(body: bytes, key: bytes, timestamp: str, header: str) -> bool:
    return hmac.compare_digest(signature(body, key, timestamp), header)


def email_message(note: Notification, sender: str, to: list[str]) -> EmailMessage:
    message = EmailMessage()
    message["Subject"] = f"[gpufleet] {note.title}"
    message["From"] = sender
    message["To"] = ", ".join(to)
    lines = [note.text, ""] + [f"{name}: {value}" for name, value in note.fields.items()]
    lines += ["", f"{note.kind} at {_iso(note.at)}"]
    message.set_content("\n".join(lines).strip() + "\n")
    return message


def probe_notification(route: str, now: datetime) -> Notification:
    return Notification(
        kind="test",
        subject=f"test@{now.isoformat()}",
        title=f"gpufleet test message for route {route}",
        text="If you read this, the route works.",
        at=now,
        fields={"route": route},
    )


def _iso(at: datetime) -> str:
    return at.astimezone(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
