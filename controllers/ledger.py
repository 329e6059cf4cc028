"""The usage ledger's writer in the controller: lifecycle events, pool capacity and
reservations go to the database from a thread of their own, so a slow or unreachable database
never holds up scheduling. Writes wait in a bounded queue (`gpufleet_ledger_backlog`) and are
retried with back-off until the database takes them; every write is idempotent, so a retry or a
restart neither loses nor duplicates a segment. After a restart (and every few minutes) the
open segments are reconciled with what the cluster shows.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from functools import partial
from typing import Any

from gpufleet import redact
from gpufleet.kube.observe import Observed, parse_time
from gpufleet.ledger.budgets import budgets
from gpufleet.ledger.cost import report
from gpufleet.ledger.forecast import month_start
from gpufleet.ledger.hosts import Totals, grown, host_report
from gpufleet.ledger.store import Ledger, LedgerError, LiveWorkload, open_ledger
from gpufleet.lifecycle import LifecycleEvent, PoolFacts, Transition
from gpufleet.model.fleet import Fleet
from gpufleet.model.states import ADMITTED_STATES
from gpufleet.notify.digest import DIGESTS, Wait, digest, team_digest
from gpufleet.notify.messages import Notification

from . import metrics
from .actions import lifecycle_event, lost_admission_record

log = logging.getLogger("gpufleet.ledger")
HEARTBEAT_S = 60.0  # an unchanged pool or reservation is re-observed this often
RECONCILE_S = 300.0
HOSTS_EVERY_S = 300.0  # hosts' GPU time is recorded this often (it grows every report)
MAX_BACKLOG = 20_000  # about an hour of a busy cluster's events; each is small
Write = Callable[[Ledger], Any]


class LedgerSink:
    """The writer thread and its queue. The queue is bounded (`max_backlog`): a database down
    for hours must not grow the controller until it is OOM-killed. Past half full, pool and
    reservation observations wait (they are made again from the cluster); when full, a write
    is dropped, counted (`gpufleet_ledger_writes_dropped_total`), and the next write the
    database takes is followed by a reconciliation with the cluster, which closes and opens
    the segments the dropped events would have."""

    def __init__(
        self,
        target: str,
        stop: threading.Event,
        max_backoff: float = 30.0,
        max_backlog: int = MAX_BACKLOG,
        hosts_every_s: float = HOSTS_EVERY_S,
    ) -> None:
        self.target, self.stop, self.max_backoff = target, stop, max_backoff
        self.max_backlog = max_backlog
        self.hosts_every_s = hosts_every_s
        self.writes: queue.Queue[Write] = queue.Queue(max_backlog)
        self.dropping = False  # writes were dropped since the database last took one
        self.ledger: Ledger | None = None
        # the cluster whose rows this controller writes, when the clusters of a fleet share
        # the ledger (set as the fleet is loaded); None: a ledger of one cluster
        self.cluster: str | None = None
        self._seen: dict[tuple[str, str], tuple[Any, float]] = {}  # what was last enqueued
        self._keys: dict[str, frozenset[str]] = {}
        self._reconciled_at: float | None = None
        self._hosts_at: float | None = None
        self._host_totals: Totals | None = None  # as recorded; read from the ledger at first
        self.thread = threading.Thread(target=self.run, name="gpufleet-ledger", daemon=True)

    def start(self) -> LedgerSink:
        self.thread.start()
        return self

    # --- what the loop hands over (never blocks) -------------------------------------------

    def publish(self, events: Sequence[LifecycleEvent]) -> None:
        if events:
            self._put(lambda ledger: ledger.apply(events))

    def observe(
        self,
        fleet: Fleet,
        facts_by_pool: dict[str, PoolFacts],
        status: dict[tuple[str, str], dict[str, Any]],
        now: datetime,
    ) -> None:
        """Each pool's GPUs and each reservation in force, as this cycle found them."""
        if self.congested():
            return  # back-pressure: nothing is marked seen, so a later cycle observes it
        pools: set[str] = set()
        for name, facts in facts_by_pool.items():
            fields = status.get(("GPUPool", name))
            if fields is None:
                continue
            pools.add(name)
            total = float(fields["totalGPUs"])
            capacity = (
                facts.gpu_type,
                facts.price_per_gpu_hour,
                total,
                float(fields["allocatedGPUs"]),
                total - float(fields["healthyGPUs"]),
            )
            if self._changed(("capacity", name), capacity):
                self._put(partial(Ledger.observe_capacity, pool=name, at=now,
                                  gpu_type=capacity[0], price=capacity[1], gpus=capacity[2],
                                  allocated=capacity[3], unhealthy=capacity[4]))  # fmt: skip
        active: set[str] = set()
        for name, reservation in fleet.reservations.items():
            if (status.get(("Reservation", name)) or {}).get("expired"):
                continue
            active.add(name)
            spec = reservation.spec
            if self._changed(("reservation", name), (spec.team, spec.pool, spec.gpus)):
                self._put(partial(Ledger.observe_reservation, name=name, team=spec.team,
                                  pool=spec.pool, gpus=float(spec.gpus), at=now))  # fmt: skip
        for table, keys in (("capacity", frozenset(pools)), ("reservations", frozenset(active))):
            if self._keys.get(table) != keys:
                self._keys[table] = keys
                self._put(partial(Ledger.close_intervals, table_name=table, keep=keys, at=now))

    def observe_hosts(self, hosts: list[dict[str, Any]], now: datetime) -> None:
        """What the GPUHosts' GPU-hours grew by since last recorded (every hosts_every_s)."""
        mono = time.monotonic()
        recent = self._hosts_at is not None and mono - self._hosts_at < self.hosts_every_s
        if self.congested() or recent:
            return
        self._hosts_at = mono

        def write(ledger: Ledger) -> None:  # in the writer's thread: a retry computes the same
            seen = self._host_totals
            if seen is None:
                seen = ledger.host_usage_totals()
            rows, totals = grown(hosts, seen, now)
            ledger.record_host_usage(rows)
            self._host_totals = totals

        self._put(write)

    def digest(
        self,
        kind: str,
        waits: list[Wait],
        now: datetime,
        deliver: Callable[[list[Notification]], None],
        teams: Iterable[str] = (),
    ) -> None:
        """Build the fleet's digest and one per team of `teams` from the ledger in the
        writer's thread (a report reads the database) and hand them to `deliver`."""

        def read(ledger: Ledger) -> None:
            span = DIGESTS[kind]
            figures, previous = (
                report(
                    ledger.segments(until - span, until),
                    ledger.capacity(until - span, until),
                    ledger.reservations(until - span, until),
                    until - span,
                    until,
                    now,
                    by=["team"],
                )
                for until in (now, now - span)
            )
            figures["hosts"] = host_report(ledger.host_usage(now - span, now))
            recorded = ledger.span(now)
            before = previous if recorded and recorded[0] <= now - span else None
            notes = [digest(kind, figures, waits, now, before)]
            rows = {r["team"]: r for r in figures["groups"]}
            old = {r["team"]: r for r in (before or {}).get("groups", [])}
            for team in sorted(teams):
                notes.append(team_digest(kind, team, rows.get(team), old.get(team), waits, now))
            deliver(notes)

        self._put(read)

    def budgets(
        self, fleet: Fleet, now: datetime, done: Callable[[list[dict[str, Any]]], None]
    ) -> None:
        """The teams' budgets for the month of `now`, read in the writer's thread, to `done`."""

        def read(ledger: Ledger) -> None:
            span = ledger.span(now)
            month = ledger.segments(month_start(now), now)
            done(budgets(fleet, month, now, span[0] if span else None))

        self._put(read)

    def record_delivery(self, row: dict[str, Any]) -> None:
        """A notification delivered or given up on, to the delivery log."""
        self._put(partial(Ledger.record_delivery, row=row))

    def save_alert_state(self, name: str, state: dict[str, Any], now: datetime) -> None:
        self._put(partial(Ledger.save_alert_state, name=name, state=state, at=now))

    def restore_alerts(
        self,
        names: Sequence[str],
        since: datetime,
        done: Callable[[dict[str, dict[str, Any]], list[tuple[str, str, datetime]]], None],
    ) -> None:
        """Read what the alerts `names` remembered and what was delivered since `since`, in
        the writer's thread, and hand them to `done`."""

        def read(ledger: Ledger) -> None:
            states = {n: ledger.alert_state(n) for n in names}
            done({n: s for n, s in states.items() if s is not None}, ledger.delivered(since))

        self._put(read)

    def reconcile_due(self) -> bool:
        return self._reconciled_at is None or time.monotonic() - self._reconciled_at > RECONCILE_S

    def reconcile(self, live: list[LiveWorkload], now: datetime) -> None:
        self._reconciled_at = time.monotonic()

        def write(ledger: Ledger) -> None:
            closed, opened = ledger.reconcile(live, now)
            if closed or opened:
                log.info(
                    "ledger reconciled with the cluster: %d segments closed, %d opened",
                    closed,
                    opened,
                )

        self._put(write)

    def _changed(self, key: tuple[str, str], values: Any) -> bool:
        last = self._seen.get(key)
        mono = time.monotonic()
        if last is not None and last[0] == values and mono - last[1] < HEARTBEAT_S:
            return False
        self._seen[key] = (values, mono)
        return True

    def _put(self, write: Write) -> None:
        try:
            self.writes.put_nowait(write)
        except queue.Full:
            metrics.LEDGER_DROPPED.inc()
            if not self.dropping:
                log.warning(
                    "ledger backlog full (%d writes): dropping writes until the database "
                    "takes them again, then reconciling with the cluster",
                    self.max_backlog,
                )
            self.dropping = True
            self._seen.clear()  # what was dropped is observed again
            self._keys.clear()
        metrics.LEDGER_BACKLOG.set(self.writes.qsize())

    def congested(self) -> bool:
        """Whether the backlog is past half full: observations wait, events still go in."""
        return self.writes.qsize() * 2 >= self.max_backlog

    # --- the writer thread ---------------------------------------------------------------

    def run(self) -> None:
        backoff = 1.0
        while not self.stop.is_set():
            try:
                write = self.writes.get(timeout=0.5)
            except queue.Empty:
                continue
            while not self.stop.is_set():
                try:
                    if self.ledger is None:
                        self.ledger = open_ledger(self.target, cluster=self.cluster)
                        log.info("ledger open: %s", self.ledger.url)
                    self.ledger.cluster = self.cluster
                    write(self.ledger)
                    backoff = 1.0
                    if self.dropping:
                        self.dropping = False
                        self._reconciled_at = None  # reconcile_due(): at the next cycle
                    break
                except Exception as err:  # the database is down, full, restarting
                    metrics.LEDGER_FAILURES.inc()
                    reason = err if isinstance(err, LedgerError) else f"{type(err).__name__}: {err}"
                    shown = (
                        redact.url(str(reason))
                        if self.ledger is None
                        else self.ledger.redacted(str(reason))  # its password too
                    )
                    log.warning("ledger write failed (%s); retrying in %.0fs", shown[:300], backoff)
                    self.stop.wait(backoff)
                    backoff = min(backoff * 2, self.max_backoff)
            self.writes.task_done()
            metrics.LEDGER_BACKLOG.set(self.writes.qsize())

    def drain(self, timeout: float) -> bool:
        """Wait until every write handed over is done (a clean shutdown, tests)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.writes.unfinished_tasks == 0:
                return True
            time.sleep(0.05)
        return False


def live_workloads(observed: Iterable[Observed], pools: dict[str, PoolFacts]) -> list[LiveWorkload]:
    """The managed workloads as the cluster shows them, for `Ledger.reconcile`."""
    out = []
    for item in observed:
        status = item.workload.get("status") or {}
        # a record a stopped controller held back
        status = {**status, **lost_admission_record(item, status)}
        admitted_at = parse_time(status.get("admittedAt"))
        admission = None
        if item.state in ADMITTED_STATES and admitted_at is not None:
            admission = lifecycle_event(
                Transition.ADMITTED, item, admitted_at, pools, status.get("pool")
            )
        if item.state in ("Completed", "Failed"):
            ended = parse_time(status.get("finishedAt")) or _finished_at(item.obj)
        else:
            ended = parse_time(status.get("preemptedAt"))
        out.append(
            LiveWorkload(
                uid=item.obj["metadata"].get("uid") or item.key,
                state=item.state,
                admitted_at=admitted_at,
                ended_at=ended,
                admission=admission,
            )
        )
    return out


def _finished_at(obj: dict[str, Any]) -> datetime | None:
    """When a finished workload's object says it finished (a Job's completionTime, else the
    condition that says so)."""
    status = obj.get("status") or {}
    if status.get("completionTime"):
        return parse_time(status["completionTime"])
    for condition in status.get("conditions") or []:
        if (
            condition.get("type") in ("Complete", "Completed", "Failed")
            and condition.get("status") == "True"
        ):
            return parse_time(condition.get("lastTransitionTime"))
    return None
