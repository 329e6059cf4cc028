"""Daily and weekly digests: what the fleet cost and did against the period before, and who
waited longest; and each team's own. Pure; the figures come from the usage ledger's report
(`gpufleet.ledger.cost.report`, by team) of this period and the one before."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from .messages import Notification

DIGESTS = {"daily-digest": timedelta(days=1), "weekly-digest": timedelta(days=7)}


@dataclass(frozen=True)
class Wait:
    workload: str
    team: str
    gpus: float
    waited_s: float


@dataclass
class DigestClock:
    """Which digests are due: the daily one once a day at `hour` (UTC), the weekly one on
    Mondays at that hour."""

    sent: dict[str, str] = field(default_factory=dict)  # kind -> the day it was sent

    def due(self, now: datetime, hour: int) -> list[str]:
        if now.hour != hour:
            return []
        day = now.date().isoformat()
        kinds = ["daily-digest"] + (["weekly-digest"] if now.weekday() == 0 else [])
        out = [k for k in kinds if self.sent.get(k) != day]
        for kind in out:
            self.sent[kind] = day
        return out

    def state(self) -> dict[str, Any]:
        """As CapacityWatch.state: a restart within the digest hour sends none again."""
        return {"sent": dict(sorted(self.sent.items()))}

    def restore(self, state: dict[str, Any]) -> None:
        self.sent = dict(state.get("sent") or {})


def trend(now: float, before: float | None, unit: str = "") -> str:
    """How a figure moved since the period before, in words: "up 12% from $1,000.00"."""
    if before is None:
        return "no period before to compare"
    shown = f"${before:,.2f}" if unit == "$" else f"{before:,.1f}{unit}"
    if before == 0:
        return f"from {shown}" if now else "unchanged at 0"
    change = 100 * (now - before) / before
    if abs(change) < 0.5:
        return f"unchanged from {shown}"
    return f"{'up' if change > 0 else 'down'} {abs(change):.0f}% from {shown}"


def digest(
    kind: str,
    figures: dict[str, Any],
    waits: list[Wait],
    now: datetime,
    previous: dict[str, Any] | None = None,
) -> Notification:
    """The fleet's digest; with `previous` (the report of the period before), its trend."""
    totals = figures["totals"]
    span = "24 hours" if kind == "daily-digest" else "7 days"
    before = previous["totals"] if previous else None
    period = "day" if kind == "daily-digest" else "week"
    lines = [
        f"Work ran {totals['gpuHours']:,.1f} GPU-hours for ${totals['gpuCost']:,.2f}; the pools "
        f"cost ${totals['capacityCost']:,.2f}, of which ${totals['idleCost']:,.2f} idle"
        + (f" ({100 * totals['allocation']:.0f}% allocated)." if totals["allocation"] else "."),
        f"Against the {period} before: cost "
        + trend(totals["gpuCost"], before["gpuCost"] if before else None, "$")
        + ", GPU-hours "
        + trend(totals["gpuHours"], before["gpuHours"] if before else None)
        + ".",
    ]
    if totals["wasteGPUHours"]:
        lines.append(
            f"Wasted: {totals['wasteGPUHours']:,.1f} GPU-hours (${totals['wasteCost']:,.2f}) "
            "in failed runs and work lost to preemption."
        )
    teams = figures["groups"][:5]
    if teams:
        lines.append("Teams by cost:")
        lines += [
            f"  {t['team']}: ${t['gpuCost']:,.2f}, {t['gpuHours']:,.1f} GPU-hours"
            + (f", efficiency {100 * t['efficiency']:.0f}%" if t["efficiency"] is not None else "")
            for t in teams
        ]
    hosts = [h for h in figures.get("hosts") or [] if "workload" not in h]
    if hosts:
        gpu, idle = sum(h["gpuHours"] for h in hosts), sum(h["idleGPUHours"] for h in hosts)
        lines.append(
            f"Hosts outside Kubernetes: {len(hosts)} reported {gpu:,.1f} GPU-hours, "
            f"{idle:,.1f} of them idle."
        )
        lines += [
            f"  {h['host']}: {h['gpuHours']:,.1f} GPU-hours, {h['idleGPUHours']:,.1f} idle"
            for h in sorted(hosts, key=lambda h: -h["idleGPUHours"])[:5]
        ]
    longest = sorted(waits, key=lambda w: -w.waited_s)[:5]
    if longest:
        lines.append("Waiting longest now:")
        lines += [
            f"  {w.workload} ({w.team}, {w.gpus:g} GPUs): {w.waited_s / 3600:.1f} h"
            for w in longest
        ]
    return Notification(
        kind=kind,
        subject=f"{kind}@{now.date().isoformat()}",
        title=f"gpufleet {kind.split('-')[0]} digest: ${totals['gpuCost']:,.2f} over {span}",
        text="\n".join(lines),
        at=now,
        fields={
            "GPU-hours": f"{totals['gpuHours']:,.1f}",
            "cost": f"${totals['gpuCost']:,.2f}",
            "idle cost": f"${totals['idleCost']:,.2f}",
            "waiting": str(len(waits)),
        },
    )


def team_digest(
    kind: str,
    team: str,
    row: dict[str, Any] | None,
    before: dict[str, Any] | None,
    waits: list[Wait],
    now: datetime,
) -> Notification:
    """One team's digest (`row`, `before`: its rows of the report of this period and the one
    before): what its work ran and cost, the trend, its waste, and its work waiting longest.
    Sent to the routes that name the team."""
    period = "day" if kind == "daily-digest" else "week"
    hours, cost = (row["gpuHours"], row["gpuCost"]) if row else (0.0, 0.0)
    lines = [
        f"Team {team}'s work ran {hours:,.1f} GPU-hours for ${cost:,.2f}: cost "
        + trend(cost, before["gpuCost"] if before else 0.0, "$")
        + f" the {period} before.",
    ]
    if row and row["wasteGPUHours"]:
        lines.append(
            f"Wasted: {row['wasteGPUHours']:,.1f} GPU-hours (${row['wasteCost']:,.2f}) in "
            f"failed runs and work lost to preemption; efficiency {100 * row['efficiency']:.0f}%."
        )
    mine = sorted((w for w in waits if w.team == team), key=lambda w: -w.waited_s)[:5]
    if mine:
        lines.append("Waiting longest now:")
        lines += [f"  {w.workload} ({w.gpus:g} GPUs): {w.waited_s / 3600:.1f} h" for w in mine]
    return Notification(
        kind=kind,
        subject=f"{kind}/{team}@{now.date().isoformat()}",
        title=f"gpufleet {kind.split('-')[0]} digest for team {team}: ${cost:,.2f}",
        text="\n".join(lines),
        at=now,
        team=team,
        fields={"team": team, "GPU-hours": f"{hours:,.1f}", "cost": f"${cost:,.2f}",
                "waiting": str(len([w for w in waits if w.team == team]))},
    )  # fmt: skip
