"""What follows a cycle: each part of the controller that reads what a cycle saw and decided
subscribes to its outcome, instead of being called from inside the cycle.

The workload loop's cycle is observe → decide → plan → publish → apply; `publish` hands one
`CycleOutcome` to every subscriber in turn: metrics, the objects derived from the fleet,
diagnosis of failed work, capacity alerts and digests, the usage ledger. Lifecycle transitions
(admitted, preempted, finished, ...) reach the ledger and notifications through
`lifecycle.Publisher` once their writes succeeded; a subscriber here sees the cycle as a whole.
A subscriber must not raise for what it cannot do: it logs and tries again next cycle.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, cast

from gpufleet.engine import Decisions, Snapshot
from gpufleet.kube.observe import Observed, discovered_pools, parse_time
from gpufleet.lifecycle import PoolFacts
from gpufleet.model.fleet import Fleet
from gpufleet.model.states import WAITING_STATES
from gpufleet.notify.alerts import BudgetWatch, CapacityWatch, HostWatch, QueuedWork, QueueWatch
from gpufleet.notify.digest import DigestClock, Wait

from . import metrics
from .derived import DerivedSync
from .diagnosis import Diagnoser
from .ledger import LedgerSink, live_workloads
from .notifications import Dispatcher

log = logging.getLogger("gpufleet.alerts")
RESTORE_WAIT_S = 60.0
BUDGETS_EVERY_S = 300.0  # the teams' budgets are read from the ledger this often


@dataclass(frozen=True)
class CycleOutcome:
    """What one cycle saw and decided."""

    now: datetime
    fleet: Fleet
    facts: dict[str, PoolFacts]
    cluster: Snapshot  # the engine's input
    decisions: Decisions
    observed: list[Observed]  # every managed workload, as the cycle saw it
    status: dict[tuple[str, str], dict[str, Any]]  # the fleet objects' status, as written
    nodes: list[dict[str, Any]]
    pods: list[dict[str, Any]]


Subscriber = Callable[[CycleOutcome], None]
Watch = CapacityWatch | HostWatch | DigestClock | BudgetWatch | QueueWatch


def record_metrics(outcome: CycleOutcome) -> None:
    if outcome.fleet.pools:
        metrics.record_state(outcome.cluster, outcome.status)
    else:
        metrics.record_discovered(discovered_pools(outcome.nodes, outcome.pods))
    workloads = {o.key: o.workload for o in outcome.observed}
    metrics.record_decisions(outcome.decisions, outcome.cluster, workloads, outcome.now)


def sync_derived(derived: DerivedSync) -> Subscriber:
    """Render the objects derived from the fleet again when they are due."""
    return lambda outcome: derived.sync_if_due(outcome.fleet)


def diagnose(diagnoser: Diagnoser) -> Subscriber:
    """Hand failed work to diagnosis (its own thread)."""
    return lambda outcome: diagnoser.submit(outcome.observed)


Hosts = Callable[[], list[dict[str, Any]]]  # the GPUHosts, as the watch holds them now


class Alerts:
    """Capacity and host alerts and the daily and weekly digests, from the cycle's fleet
    status and the GPUHosts. With a ledger, what the watches remember is kept there and read
    back at the first cycle (up to RESTORE_WAIT_S, the ledger being slow or down), with what
    was delivered in the last day: a restart tells no episode again."""

    def __init__(
        self, notifier: Dispatcher, ledger: LedgerSink | None, hosts: Hosts = lambda: []
    ) -> None:
        self.notifier, self.ledger, self.hosts = notifier, ledger, hosts
        self.watches: dict[str, Watch] = {
            "capacity": CapacityWatch(),
            "hosts": HostWatch(),
            "digests": DigestClock(),
            "budgets": BudgetWatch(),
            "queue": QueueWatch(),
        }
        self.budgets_every_s = BUDGETS_EVERY_S
        self.budgets_at: float | None = None
        self.budget_rows: list[dict[str, Any]] | None = None  # read, not yet checked
        self.saved: dict[str, dict[str, Any]] = {}
        self.restored = threading.Event()
        self.restore_lock = threading.Lock()
        self.restore_asked: float | None = None

    @property
    def capacity_watch(self) -> CapacityWatch:
        return cast(CapacityWatch, self.watches["capacity"])

    @property
    def host_watch(self) -> HostWatch:
        return cast(HostWatch, self.watches["hosts"])

    @property
    def digests(self) -> DigestClock:
        return cast(DigestClock, self.watches["digests"])

    @property
    def budget_watch(self) -> BudgetWatch:
        return cast(BudgetWatch, self.watches["budgets"])

    @property
    def queue_watch(self) -> QueueWatch:
        return cast(QueueWatch, self.watches["queue"])

    def __call__(self, outcome: CycleOutcome) -> None:
        policy = outcome.fleet.policy.notifications
        self.notifier.configure(policy)
        if not self._restored(outcome.now):
            return
        self.notifier.notify(self.capacity_watch.check(outcome.fleet, outcome.status, outcome.now))
        self.notifier.notify(self.host_watch.check(self.hosts(), policy.alerts, outcome.now))
        self.notifier.notify(self.queue_watch.check(queued(outcome.observed), outcome.now))
        if self.ledger is None:
            return  # a digest summarises the ledger
        for kind in self.digests.due(outcome.now, policy.alerts.digest_hour_utc):
            waiting = waits(outcome.observed, outcome.now)
            teams = self.notifier.teams_named()  # a team's digest goes to its own routes
            self.ledger.digest(kind, waiting, outcome.now, self.notifier.notify, teams)
        self._check_budgets(outcome)
        for name, watch in self.watches.items():
            state = watch.state()
            if self.saved.get(name) != state:
                self.saved[name] = state
                self.ledger.save_alert_state(name, state, outcome.now)

    def _check_budgets(self, outcome: CycleOutcome) -> None:
        """Tell the budget thresholds the last reading crossed; read again when due."""
        assert self.ledger is not None
        rows, self.budget_rows = self.budget_rows, None
        if rows is not None:
            self.notifier.notify(self.budget_watch.check(rows, outcome.now))
        if not any(t.spec.budget for t in outcome.fleet.teams.values()):
            return
        if not tells_budgets(outcome.fleet):
            return  # a budget counts every cluster's work: one worker of a fleet tells it
        mono = time.monotonic()
        if self.budgets_at is None or mono - self.budgets_at >= self.budgets_every_s:
            self.budgets_at = mono
            self.ledger.budgets(outcome.fleet, outcome.now, self._budgets_read)

    def _budgets_read(self, rows: list[dict[str, Any]]) -> None:  # in the ledger's thread
        self.budget_rows = rows

    def _restored(self, now: datetime) -> bool:
        """Whether the watches may check: what they remembered is read back, or there is
        nothing to read, or the ledger took too long (then they start afresh)."""
        if self.ledger is None or self.restored.is_set():
            return True
        if self.restore_asked is None:
            self.restore_asked = time.monotonic()
            self.ledger.restore_alerts(list(self.watches), now - timedelta(days=1), self._restore)
            return False
        if time.monotonic() - self.restore_asked < RESTORE_WAIT_S:
            return False
        with self.restore_lock:  # not while _restore is under way
            if not self.restored.is_set():
                log.warning("the ledger did not give the alerts' memory back: they start afresh")
                self.restored.set()
        return True

    def _restore(
        self, states: dict[str, dict[str, Any]], delivered: list[tuple[str, str, datetime]]
    ) -> None:  # in the ledger's thread
        with self.restore_lock:
            if self.restored.is_set():
                return  # too late: the watches started afresh
            for name, state in states.items():
                self.watches[name].restore(state)
                self.saved[name] = state
            self.notifier.seed(delivered)
            self.restored.set()


def tells_budgets(fleet: Fleet) -> bool:
    """Whether this controller tells the teams' budget alerts: a cluster of one does; in a
    fleet whose clusters share the ledger, the worker of the first cluster (by name) of those
    the fleet declares, so that each threshold is told once."""
    if not fleet.clusters:
        return True
    every = fleet.fleet_clusters or tuple(sorted(fleet.clusters))
    return every[0] in fleet.clusters


def record_usage(ledger: LedgerSink, hosts: Hosts = lambda: []) -> Subscriber:
    """Pool capacity, reservations and the hosts' GPU time to the usage ledger; now and then,
    its open segments checked against the workloads that hold GPUs."""

    def record(outcome: CycleOutcome) -> None:
        ledger.observe(outcome.fleet, outcome.facts, outcome.status, outcome.now)
        ledger.observe_hosts(hosts(), outcome.now)
        if ledger.reconcile_due():
            ledger.reconcile(live_workloads(outcome.observed, outcome.facts), outcome.now)

    return record


def queued(observed: list[Observed]) -> list[QueuedWork]:
    """Each workload's submission, and whether it waits: the queue's news."""
    out = []
    for item in observed:
        status, spec = item.workload.get("status") or {}, item.workload.get("spec") or {}
        submitted = parse_time(
            status.get("submittedAt") or item.workload["metadata"].get("creationTimestamp")
        )
        if submitted is None:
            continue
        preempted = parse_time(status.get("preemptedAt"))
        waiting = item.state in WAITING_STATES
        out.append(
            QueuedWork(
                workload=item.key,
                team=spec.get("team", ""),
                submitter=spec.get("submitter") or None,
                gpus=float(spec.get("gpus", 0)) * int(spec.get("pods", 1)),
                submitted=submitted,
                waiting_since=(preempted or submitted) if waiting else None,
                preempted=waiting and preempted is not None,
                position=status.get("position"),
                eta=parse_time(status.get("eta")),
                reason=status.get("reason"),
                pool=spec.get("pool") or status.get("pool"),
            )
        )
    return out


def waits(observed: list[Observed], now: datetime) -> list[Wait]:
    """Workloads waiting for GPUs now and for how long (since submitted or preempted)."""
    out = []
    for item in observed:
        if item.state not in WAITING_STATES:
            continue
        status, spec = item.workload.get("status") or {}, item.workload.get("spec") or {}
        since = parse_time(status.get("preemptedAt") or status.get("submittedAt"))
        if since is None:
            continue
        gpus = float(spec.get("gpus", 0)) * int(spec.get("pods", 1))
        out.append(Wait(item.key, spec.get("team", ""), gpus, (now - since).total_seconds()))
    return out
