"""Capacity and health alerts from what each cycle observes: a pool nearly full, a reservation
mostly idle for a long time or about to expire, a node quarantined, the health breaker open,
a host outside Kubernetes unhealthy, lost or mostly idle, a team's budget crossed; and the
queue's news (work submitted, work queued with its place and ETA). Pure. Alerts are
edge-triggered: one when the condition starts, again only after it ended."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from gpufleet.hosts.status import IDLE_UTILIZATION, state_now
from gpufleet.model.api import CapacityAlerts
from gpufleet.model.durations import parse_duration
from gpufleet.model.fleet import Fleet

from .messages import Notification


class CapacityWatch:
    def __init__(self) -> None:
        self.full: set[str] = set()  # pools reported nearly full, until they are not
        self.idle_since: dict[str, datetime] = {}  # reservations mostly idle since
        self.idle_told: set[str] = set()
        self.expiry_told: set[tuple[str, str]] = set()  # (reservation, day) reported

    def state(self) -> dict[str, Any]:
        """What the watch remembers, as JSON: kept in the ledger, so that a restarted
        controller neither tells an episode again nor starts an idle reservation's clock anew."""
        return {
            "full": sorted(self.full),
            "idleSince": {k: v.isoformat() for k, v in sorted(self.idle_since.items())},
            "idleTold": sorted(self.idle_told),
            "expiryTold": sorted([name, day] for name, day in self.expiry_told),
        }

    def restore(self, state: dict[str, Any]) -> None:
        self.full = set(state.get("full") or [])
        self.idle_since = _times(state.get("idleSince"))
        self.idle_told = set(state.get("idleTold") or [])
        self.expiry_told = {(name, day) for name, day in state.get("expiryTold") or []}

    def check(
        self, fleet: Fleet, status: dict[tuple[str, str], dict[str, Any]], now: datetime
    ) -> list[Notification]:
        alerts = fleet.policy.notifications.alerts
        out: list[Notification] = []
        for name in sorted(fleet.pools):
            fields = status.get(("GPUPool", name))
            if fields is None:
                continue
            healthy, allocated = float(fields["healthyGPUs"]), float(fields["allocatedGPUs"])
            share = allocated / healthy if healthy else 0.0
            if share * 100 < alerts.pool_nearly_full_percent:
                self.full.discard(name)
                continue
            if name in self.full:
                continue
            self.full.add(name)
            out.append(
                Notification(
                    kind="pool-nearly-full",
                    subject=f"{name}@{now.isoformat()}",
                    title=f"pool {name} is {100 * share:.0f}% allocated",
                    text=f"{allocated:g} of its {healthy:g} healthy GPUs are allocated: new "
                    "elastic work waits, and reserved work may preempt elastic work to run.",
                    at=now,
                    severity="warning",
                    pool=name,
                    fields={
                        "pool": name,
                        "allocated GPUs": f"{allocated:g}",
                        "healthy GPUs": f"{healthy:g}",
                    },
                )
            )
        idle_for = parse_duration(alerts.reservation_idle_for)
        within = parse_duration(alerts.reservation_expiring_within)
        for name in sorted(fleet.reservations):
            spec = fleet.reservations[name].spec
            fields = status.get(("Reservation", name)) or {}
            reserved = float(fields.get("reservedGPUs", 0))
            used = float(fields.get("usedGPUs", 0))
            idle = 1 - used / reserved if reserved else 0.0
            if reserved and idle * 100 >= alerts.reservation_idle_percent:
                since = self.idle_since.setdefault(name, now)
                if now - since >= idle_for and name not in self.idle_told:
                    self.idle_told.add(name)
                    out.append(self._idle(name, spec.team, spec.pool, reserved, used, since, now))
            else:
                self.idle_since.pop(name, None)
                self.idle_told.discard(name)
            expires = spec.expires_utc
            day = now.date().isoformat()
            # told on an earlier day is forgotten: that day's subject is not sent again anyway
            self.expiry_told = {t for t in self.expiry_told if t[1] >= day}
            if expires and now < expires <= now + within and (name, day) not in self.expiry_told:
                self.expiry_told.add((name, day))
                left = expires - now
                out.append(
                    Notification(
                        kind="reservation-expiring",
                        subject=f"{name}@{day}",
                        title=f"reservation {name} expires in {_days(left)}",
                        text=f"Team {spec.team}'s {spec.gpus} reserved GPUs in {spec.pool} "
                        f"stop being guaranteed at {expires.isoformat()}; renew it by pull "
                        "request if the team still needs them.",
                        at=now,
                        team=spec.team,
                        severity="warning",
                        pool=spec.pool,
                        fields={"team": spec.team, "pool": spec.pool, "GPUs": str(spec.gpus)},
                    )
                )
        return out

    @staticmethod
    def _idle(
        name: str,
        team: str,
        pool: str,
        reserved: float,
        used: float,
        since: datetime,
        now: datetime,
    ) -> Notification:
        return Notification(
            kind="reservation-idle",
            subject=f"{name}@{since.isoformat()}",
            title=f"reservation {name} has been mostly idle for {_days(now - since)}",
            text=f"Team {team} uses {used:g} of its {reserved:g} reserved GPUs in {pool}. Idle "
            "reserved GPUs are lent to elastic work, but the team pays for them: consider a "
            "smaller reservation.",
            at=now,
            team=team,
            severity="info",
            pool=pool,
            fields={
                "team": team,
                "pool": pool,
                "reserved GPUs": f"{reserved:g}",
                "used GPUs": f"{used:g}",
            },
        )


class HostWatch:
    """Hosts outside Kubernetes (GPUHosts): unhealthy (a GPU with a fatal finding), lost (no
    report for its lostAfter), or mostly idle (at least reservationIdlePercent of its GPUs
    under 5 % busy, for reservationIdleFor: the same thresholds as reservations)."""

    def __init__(self) -> None:
        self.told: dict[str, str] = {}  # host -> the state it was told in (Unhealthy, Lost)
        self.idle_since: dict[str, datetime] = {}
        self.idle_told: set[str] = set()

    def state(self) -> dict[str, Any]:
        """As CapacityWatch.state."""
        return {
            "told": dict(sorted(self.told.items())),
            "idleSince": {k: v.isoformat() for k, v in sorted(self.idle_since.items())},
            "idleTold": sorted(self.idle_told),
        }

    def restore(self, state: dict[str, Any]) -> None:
        self.told = dict(state.get("told") or {})
        self.idle_since = _times(state.get("idleSince"))
        self.idle_told = set(state.get("idleTold") or [])

    def check(
        self, hosts: list[dict[str, Any]], alerts: CapacityAlerts, now: datetime
    ) -> list[Notification]:
        out: list[Notification] = []
        idle_for = parse_duration(alerts.reservation_idle_for)
        names = set()
        for obj in sorted(hosts, key=lambda o: o["metadata"]["name"]):
            name = obj["metadata"]["name"]
            names.add(name)
            status = obj.get("status") or {}
            state, message = state_now(obj, now)
            if state in ("Unhealthy", "Lost") and self.told.get(name) != state:
                self.told[name] = state
                out.append(_host_alert(name, state, message or "", status, now))
            elif state == "Ready":
                self.told.pop(name, None)
            busy = [d.get("utilization") for d in status.get("devices") or []]
            idle = sum(1 for u in busy if u is not None and u < IDLE_UTILIZATION)
            mostly_idle = bool(busy) and idle * 100 >= alerts.reservation_idle_percent * len(busy)
            if state != "Lost" and mostly_idle:
                since = self.idle_since.setdefault(name, now)
                if now - since >= idle_for and name not in self.idle_told:
                    self.idle_told.add(name)
                    out.append(_host_idle(name, idle, len(busy), since, now))
            else:
                self.idle_since.pop(name, None)
                self.idle_told.discard(name)
        for gone in set(self.told) - names:  # a host deleted: told again if it comes back
            self.told.pop(gone)
        return out


class BudgetWatch:
    """Teams' GPU-hour budgets (rows of `ledger.budgets.budgets`): told once per team, month
    and threshold crossed; where several are crossed at once, the highest is told."""

    def __init__(self) -> None:
        self.told: set[tuple[str, str, int]] = set()  # (team, month, percent)

    def state(self) -> dict[str, Any]:
        return {"told": sorted([t, m, p] for t, m, p in self.told)}

    def restore(self, state: dict[str, Any]) -> None:
        self.told = {(t, m, int(p)) for t, m, p in state.get("told") or []}

    def check(self, rows: list[dict[str, Any]], now: datetime) -> list[Notification]:
        out = []
        month = now.strftime("%Y-%m")
        self.told = {t for t in self.told if t[1] >= month}  # past months are done with
        for row in rows:
            new = [p for p in row["crossed"] if (row["team"], row["month"], p) not in self.told]
            if not new:
                continue
            self.told.update((row["team"], row["month"], p) for p in new)
            out.append(_budget_alert(row, max(new), now))
        return out


def _budget_alert(row: dict[str, Any], percent: int, now: datetime) -> Notification:
    team, used, limit = row["team"], row["usedGPUHours"], row["budgetGPUHours"]
    heading = (
        f" At this pace it runs out on {row['runsOutAt'][:10]}." if row.get("runsOutAt") else ""
    )
    return Notification(
        kind="budget-threshold",
        subject=f"{team}/{row['month']}/{percent}",
        title=f"team {team} has used {row['usedPercent']:g}% of its {row['month']} GPU-hour budget",
        text=f"{used:,.1f} of {limit:,.0f} GPU-hours used; the month's forecast is "
        f"{row['forecastGPUHours']:,.0f} ({row['forecastPercent']:g}%).{heading} A budget limits "
        "nothing: work still runs.",
        at=now,
        team=team,
        severity="critical" if percent >= 100 else "warning",
        fields={
            "team": team,
            "month": row["month"],
            "used GPU-hours": f"{used:,.1f}",
            "budget GPU-hours": f"{limit:,.0f}",
            "threshold": f"{percent}%",
        },
    )


FIRST_LOOK = timedelta(minutes=1)


@dataclass(frozen=True)
class QueuedWork:
    """A workload as the cycle saw its GPUWorkload: when it was submitted, and whether (since
    when, where in its team's queue) it waits for GPUs now."""

    workload: str  # namespace/name
    team: str
    submitter: str | None
    gpus: float  # all its pods
    submitted: datetime
    waiting_since: datetime | None  # submitted or preempted; None: not waiting
    preempted: bool
    position: int | None  # in its team's queue, once decided
    eta: datetime | None
    reason: str | None
    pool: str | None


class QueueWatch:
    """Work submitted (once per workload), and work queued (waiting after a decision), once
    per wait. What the controller saw before a restart is not told again: it keeps in the
    ledger when it last looked (to the minute), and what began before is not news; the last
    minute's is held back by the delivery log."""

    def __init__(self) -> None:
        self.checked: datetime | None = None  # the last check
        self.before: datetime | None = None  # the last check before a restart
        self.told: set[tuple[str, str]] = set()  # (kind, workload@since), while it is seen

    def state(self) -> dict[str, Any]:
        mark = self.checked.replace(second=0, microsecond=0) if self.checked else None
        return {"checked": mark.isoformat() if mark else None}

    def restore(self, state: dict[str, Any]) -> None:
        found = state.get("checked")
        self.before = datetime.fromisoformat(found) if found else None

    def check(self, seen: list[QueuedWork], now: datetime) -> list[Notification]:
        out = []
        current = set()
        if self.before is None and self.checked is None:
            self.before = now - FIRST_LOOK  # a first start: old work is no news
        for w in seen:
            news = [("submitted", w.submitted, _submitted)]
            if w.waiting_since is not None and w.position is not None:
                news.append(("queued", w.waiting_since, _queued))
            for kind, since, tell in news:
                if self.before is not None and since <= self.before:
                    continue
                key = (kind, f"{w.workload}@{since.isoformat()}")
                current.add(key)
                if key not in self.told:
                    out.append(tell(w, key[1]))
        self.told = current  # what is no longer seen is forgotten
        self.checked = now
        return out


def _submitted(w: QueuedWork, subject: str) -> Notification:
    return Notification(
        kind="submitted",
        subject=subject,
        title=f"{w.workload} submitted: {w.gpus:g} GPU{'s' * (w.gpus != 1)}",
        text=f"Team {w.team}'s work" + (f", by {w.submitter}" if w.submitter else "") + ".",
        at=w.submitted,
        team=w.team,
        fields={
            "team": w.team,
            "GPUs": f"{w.gpus:g}",
            **({"by": w.submitter} if w.submitter else {}),
        },
        namespace=w.workload.split("/", 1)[0],
        pool=w.pool,
        user=w.submitter,
    )


def _queued(w: QueuedWork, subject: str) -> Notification:
    eta = f"; expected to start about {w.eta.isoformat(timespec='minutes')}" if w.eta else ""
    return Notification(
        kind="queued",
        subject=subject,
        title=f"{w.workload} is number {w.position} in team {w.team}'s queue",
        text=f"It waits for {w.gpus:g} GPUs ({w.reason or 'no room yet'}){eta}."
        + (" It was preempted and resumes when there is room." if w.preempted else ""),
        at=w.waiting_since or w.submitted,
        team=w.team,
        fields={
            "team": w.team,
            "position": str(w.position),
            "GPUs": f"{w.gpus:g}",
            **({"ETA": w.eta.isoformat(timespec="minutes")} if w.eta else {}),
            **({"reason": w.reason} if w.reason else {}),
        },
        namespace=w.workload.split("/", 1)[0],
        pool=w.pool,
        user=w.submitter,
    )


def _host_alert(
    name: str, state: str, message: str, status: dict[str, Any], now: datetime
) -> Notification:
    lost = state == "Lost"
    return Notification(
        kind="host-lost" if lost else "host-unhealthy",
        subject=f"{name}@{now.isoformat()}",
        title=f"host {name} is {'lost' if lost else 'unhealthy'}",
        text=message
        + (
            ""
            if lost
            else ". Its GPUs are checked by its agent; drain what runs there (a Slurm node is "
            "drained by the agent where it may) and look at the GPU named."
        ),
        at=now,
        severity="critical" if not lost else "warning",
        fields={
            "host": name,
            "GPUs": str(status.get("gpus", 0)),
            "healthy GPUs": str(status.get("healthyGPUs", 0)),
        },
    )


def _host_idle(name: str, idle: int, gpus: int, since: datetime, now: datetime) -> Notification:
    return Notification(
        kind="host-idle",
        subject=f"{name}@{since.isoformat()}",
        title=f"host {name} has been mostly idle for {_days(now - since)}",
        text=f"{idle} of its {gpus} GPUs are under {100 * IDLE_UTILIZATION:.0f}% busy. An idle "
        "GPU host still costs: give its work elsewhere a place here, or release it.",
        at=now,
        severity="info",
        fields={"host": name, "idle GPUs": str(idle), "GPUs": str(gpus)},
    )


def node_quarantined(node: str, reason: str, message: str, at: datetime) -> Notification:
    return Notification(
        kind="node-quarantined",
        subject=f"{node}@{at.isoformat()}",
        title=f"node {node} {reason.lower() if reason else 'quarantined'}",
        text=message,
        at=at,
        severity="critical" if reason == "QuarantineEscalated" else "warning",
        fields={"node": node, "action": reason},
    )


def breaker_open(nodes: list[str], at: datetime) -> Notification:
    return Notification(
        kind="circuit-breaker-open",
        subject=f"breaker@{at.isoformat()}",
        title="GPU health circuit breaker open: quarantining stopped",
        text=f"Fatal GPU findings on {len(nodes)} nodes at once ({', '.join(nodes[:10])}"
        f"{', ...' if len(nodes) > 10 else ''}) look like a fleet-wide cause (driver, agent, "
        "firmware) rather than bad GPUs. No node is quarantined until someone resets the "
        "breaker: gpufleet nodes reset-breaker.",
        at=at,
        severity="critical",
        fields={"nodes": str(len(nodes))},
    )


def _times(values: dict[str, str] | None) -> dict[str, datetime]:
    return {k: datetime.fromisoformat(v) for k, v in (values or {}).items()}


def _days(span: timedelta) -> str:
    hours = span.total_seconds() / 3600
    return f"{hours / 24:.1f} days" if hours >= 48 else f"{hours:.0f} h"
