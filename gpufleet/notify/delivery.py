"""Sending one notification over one route: Slack incoming webhooks, Slack direct messages
from an app's bot token, Microsoft Teams workflow
webhooks, PagerDuty's Events API v2, generic webhooks signed with HMAC-SHA256, and e-mail over
SMTP with STARTTLS. Secrets (URLs, signing keys, passwords)
come from a reader the caller gives: Kubernetes Secrets in the controller."""

from __future__ import annotations

import json
import smtplib
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Callable

from gpufleet.model.api import NotificationRoute, SecretKeyRef
from gpufleet.redact import scrub

from .messages import (
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    Notification,
    email_message,
    pagerduty_event,
    signature,
    slack_payload,
    teams_payload,
    webhook_body,
)

TIMEOUT_S = 10.0
PAGERDUTY_EVENTS_URL = "https://events.pagerduty.com/v2/enqueue"  # the EU's: events.eu.
SLACK_POST_URL = "https://slack.com/api/chat.postMessage"  # a bot token's direct messages


class DeliveryError(Exception):
    """A message could not be sent; the text says where and why."""


SecretReader = Callable[[SecretKeyRef], str]  # raises DeliveryError when it cannot


def secret_refs(route: NotificationRoute) -> list[SecretKeyRef]:
    refs = (route.url_secret_ref, route.signing_secret_ref, route.password_secret_ref,
            route.routing_key_secret_ref, route.token_secret_ref)  # fmt: skip
    return [r for r in refs if r is not None]


def send(route: NotificationRoute, note: Notification, secret: SecretReader) -> None:
    """Send `note` over `route`. Whatever fails is a DeliveryError whose text holds no secret
    the route read (it goes to the FleetPolicy's status and to logs)."""
    read: list[str] = []

    def remembered(ref: SecretKeyRef) -> str:
        value = secret(ref)
        read.append(value)
        return value

    try:
        _send(route, note, remembered)
    except Exception as err:
        text = str(err) if isinstance(err, DeliveryError) else f"{type(err).__name__}: {err}"
        raise DeliveryError(scrub(text, read)) from None


def _send(route: NotificationRoute, note: Notification, secret: SecretReader) -> None:
    if route.type == "slack":
        assert route.url_secret_ref is not None  # the model requires it
        body = json.dumps(slack_payload(note)).encode()
        _post(secret(route.url_secret_ref), body, {})
    elif route.type == "webhook":
        url = route.url or secret(route.url_secret_ref)  # type: ignore[arg-type]
        body = webhook_body(note)
        headers = {}
        if route.signing_secret_ref is not None:
            key = secret(route.signing_secret_ref).encode()
            stamp = str(int(time.time()))
            headers = {TIMESTAMP_HEADER: stamp, SIGNATURE_HEADER: signature(body, key, stamp)}
        _post(url, body, headers)
    elif route.type == "teams":
        assert route.url_secret_ref is not None  # the model requires it
        _post(secret(route.url_secret_ref), json.dumps(teams_payload(note)).encode(), {})
    elif route.type == "slack-dm":
        assert route.token_secret_ref is not None and note.user is not None  # route_matches
        message = {"channel": route.slack_users[note.user], **slack_payload(note)}
        token = secret(route.token_secret_ref)
        answer = _post(route.url or SLACK_POST_URL, json.dumps(message).encode(),
                       {"Authorization": f"Bearer {token}"})  # fmt: skip
        if not json.loads(answer or b"{}").get("ok"):
            raise DeliveryError(
                f"Slack refused the message: {answer[:200].decode(errors='replace')}"
            )
    elif route.type == "pagerduty":
        assert route.routing_key_secret_ref is not None  # the model requires it
        event = pagerduty_event(note, secret(route.routing_key_secret_ref))
        _post(route.url or PAGERDUTY_EVENTS_URL, json.dumps(event).encode(), {})
    else:
        _email(route, note, secret)


def _post(url: str, body: bytes, headers: dict[str, str]) -> bytes:
    if not url.startswith(("https://", "http://")):
        raise DeliveryError("the URL must start with https:// (or http://)")
    request = urllib.request.Request(
        url,
        data=body,
        headers={"Content-Type": "application/json", "User-Agent": "gpufleet", **headers},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
            return bytes(response.read())
    except urllib.error.HTTPError as err:
        detail = err.read()[:200].decode(errors="replace")
        raise DeliveryError(f"HTTP {err.code} from the receiver: {detail}") from err
    except (urllib.error.URLError, OSError) as err:
        reason = getattr(err, "reason", err)
        raise DeliveryError(f"cannot reach the receiver: {reason}") from err


def _email(route: NotificationRoute, note: Notification, secret: SecretReader) -> None:
    settings = route.email
    assert settings is not None  # the model requires it
    password = secret(route.password_secret_ref) if route.password_secret_ref else None
    message = email_message(note, settings.sender, settings.to)
    try:
        with smtplib.SMTP(settings.host, settings.port, timeout=TIMEOUT_S) as smtp:
            smtp.ehlo()
            if settings.starttls:
                smtp.starttls(context=ssl.create_default_context())
                smtp.ehlo()
            if settings.username:
                if password is None:
                    raise DeliveryError("username is set but no passwordSecretRef")
                smtp.login(settings.username, password)
            smtp.send_message(message)
    except (smtplib.SMTPException, OSError, ssl.SSLError) as err:
        raise DeliveryError(f"SMTP {settings.host}:{settings.port}: {err}") from err
