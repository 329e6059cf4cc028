"""Notification delivery in the controller: a queue and a thread of their own, so that no
slow receiver ever holds up the control loop. Per route: de-duplication within its
dedupWindow, a rate limit (rateLimitPerHour), retries with back-off, and a status (its Secrets
found, its last delivery worked) that the loop writes to the FleetPolicy. With a ledger, each
delivery (or the giving up on one) goes to its delivery log, and what was delivered before a
restart is not sent again within its window (`seed`)."""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

from gpufleet.lifecycle import LifecycleEvent
from gpufleet.model.api import NotificationPolicy, NotificationRoute
from gpufleet.model.durations import parse_duration
from gpufleet.notify.delivery import SecretReader, secret_refs, send
from gpufleet.notify.messages import Notification, from_lifecycle, in_cluster, route_matches

from . import metrics

log = logging.getLogger("gpufleet.notifications")
VERIFY_EVERY_S = 300.0


class Dispatcher:
    def __init__(
        self,
        secrets: SecretReader,
        stop: threading.Event,
        retries: int = 4,
        backoff_s: float = 2.0,
    ) -> None:
        self.secrets, self.stop = secrets, stop
        self.retries, self.backoff_s = retries, backoff_s
        self.routes: dict[str, NotificationRoute] = {}
        self.lock = threading.Condition()
        self.due: list[tuple[float, int, str, Notification, int]] = []  # a heap
        self.seq = itertools.count()
        self.in_flight = 0  # taken from `due`, being delivered
        self.sent: dict[tuple[str, str], float] = {}  # (route, dedup key) -> when queued
        self.recent: dict[str, deque[float]] = {}  # route -> send times in the last hour
        self.status: dict[str, tuple[bool, str]] = {}  # route -> (ready, message)
        self.verified_at: float | None = None
        self.cluster: str | None = None  # a worker of a fleet says which cluster it is
        # where each delivery (or the giving up on one) is recorded: the ledger's delivery log
        self.journal: Callable[[dict[str, Any]], None] | None = None
        self.thread = threading.Thread(target=self.run, name="gpufleet-notify", daemon=True)

    def start(self) -> Dispatcher:
        self.thread.start()
        return self

    def configure(self, policy: NotificationPolicy) -> None:
        routes = {r.name: r for r in policy.routes}
        with self.lock:
            if routes != self.routes:
                self.routes = routes
                self.status = {n: s for n, s in self.status.items() if n in routes}
                self.verified_at = None  # check the new routes' Secrets now
                self.lock.notify()

    # --- what others hand over (never blocks) ----------------------------------------------

    def lifecycle(self, events: Sequence[LifecycleEvent]) -> None:
        self.notify([n for n in map(from_lifecycle, events) if n is not None])

    def notify(self, notes: Sequence[Notification]) -> None:
        if not notes:
            return
        now = time.monotonic()
        with self.lock:
            for note in notes:
                note = in_cluster(note, self.cluster)
                for route in self.routes.values():
                    if route_matches(route, note):
                        self._queue(route, note, now)
            self.lock.notify()

    def _queue(self, route: NotificationRoute, note: Notification, now: float) -> None:
        window = parse_duration(route.dedup_window).total_seconds()
        key = (route.name, note.dedup_key)
        if now - self.sent.get(key, -1e18) < window:
            metrics.NOTIFICATIONS_DROPPED.labels(route.name, "duplicate").inc()
            return
        recent = self.recent.setdefault(route.name, deque())
        while recent and now - recent[0] > 3600:
            recent.popleft()
        if len(recent) >= route.rate_limit_per_hour:
            metrics.NOTIFICATIONS_DROPPED.labels(route.name, "rate-limited").inc()
            return
        recent.append(now)
        self.sent[key] = now
        if len(self.sent) > 10_000:  # forget what is long past its window
            self.sent = {k: t for k, t in self.sent.items() if now - t < 86_400}
        heapq.heappush(self.due, (now, next(self.seq), route.name, note, 0))

    def seed(self, delivered: Sequence[tuple[str, str, datetime]]) -> None:
        """What was delivered before a restart (route, dedup key, when): not sent again
        within its route's dedupWindow."""
        mono, wall = time.monotonic(), datetime.now(UTC)
        with self.lock:
            for route, key, at in delivered:
                queued = mono - (wall - at).total_seconds()
                self.sent[(route, key)] = max(self.sent.get((route, key), -1e18), queued)

    def teams_named(self) -> set[str]:
        """The teams some route names: those that get digests of their own."""
        with self.lock:
            return {team for route in self.routes.values() for team in route.teams}

    def route_status(self) -> dict[str, tuple[bool, str]]:
        with self.lock:
            return dict(self.status)

    # --- the delivery thread -------------------------------------------------------------

    def run(self) -> None:
        while not self.stop.is_set():
            self._verify_if_due()
            with self.lock:
                wait = VERIFY_EVERY_S
                if self.due:
                    wait = max(self.due[0][0] - time.monotonic(), 0.0)
                if wait > 0:
                    self.lock.wait(min(wait, 1.0))
                    continue
                _, _, name, note, attempt = heapq.heappop(self.due)
                route = self.routes.get(name)
                self.in_flight += 1
            try:
                if route is not None:
                    self._deliver(route, note, attempt)
            finally:
                with self.lock:
                    self.in_flight -= 1

    def _deliver(self, route: NotificationRoute, note: Notification, attempt: int) -> None:
        try:
            send(route, note, self.secrets)
        except Exception as err:  # a receiver or the API server down: retried, never fatal
            metrics.NOTIFICATION_FAILURES.labels(route.name).inc()
            self._set_status(route.name, False, f"delivery failed: {err}")
            if attempt < self.retries:
                due = time.monotonic() + self.backoff_s * 2**attempt
                with self.lock:
                    heapq.heappush(self.due, (due, next(self.seq), route.name, note, attempt + 1))
            else:
                metrics.NOTIFICATIONS_DROPPED.labels(route.name, "failed").inc()
                log.warning("route %s: %s dropped after %d tries: %s", route.name, note.kind,
                            attempt + 1, err)  # fmt: skip
                self._record(route, note, "failed", attempt + 1, str(err))
            return
        metrics.NOTIFICATIONS_SENT.labels(route.name, note.kind).inc()
        self._set_status(route.name, True, f"last {note.kind} message delivered")
        self._record(route, note, "sent", attempt + 1, None)

    def _record(
        self,
        route: NotificationRoute,
        note: Notification,
        outcome: str,
        attempts: int,
        error: str | None,
    ) -> None:
        if self.journal is None:
            return
        self.journal(
            {
                "at": datetime.now(UTC),
                "happened_at": note.at,
                "route": route.name,
                "kind": note.kind,
                "dedup_key": note.dedup_key,
                "team": note.team,
                "severity": note.severity,
                "title": note.title,
                "outcome": outcome,
                "attempts": attempts,
                "error": error[:1000] if error else None,
            }
        )

    def _verify_if_due(self) -> None:
        """Read every route's Secrets: a missing one shows on the FleetPolicy before the first
        message would have failed."""
        if self.verified_at is not None and time.monotonic() - self.verified_at < VERIFY_EVERY_S:
            return
        self.verified_at = time.monotonic()
        with self.lock:
            routes = list(self.routes.values())
        for route in routes:
            try:
                for ref in secret_refs(route):
                    self.secrets(ref)
            except Exception as err:  # DeliveryError says which Secret; others what failed
                self._set_status(route.name, False, str(err))
                continue
            with self.lock:
                if route.name not in self.status or not self.status[route.name][0]:
                    self.status[route.name] = (True, "Secrets found")

    def _set_status(self, name: str, ready: bool, message: str) -> None:
        with self.lock:
            self.status[name] = (ready, message[:300])

    def drain(self, timeout: float) -> bool:
        """Wait until nothing is due (tests, a clean shutdown)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                if not self.due and not self.in_flight:
                    return True
            time.sleep(0.05)
        return False
