"""Daily and weekly digests: what the fleet cost and did, and who waited longest. Pure; the
figures come from the usage ledger's report (`gpufleet.ledger.cost.report`, by team)."""

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


def digest(kind: str, figures: dict[str, Any], waits: list[Wait], now: datetime) -> Notification:
    totals = figures["totals"]
    span = "24 hours" if kind == "daily-digest" else "7 days"
    lines = [
        f"Work ran {totals['gpuHours']:,.1f} GPU-hours for ${totals['gpuCost']:,.2f}; the pools "
        f"cost ${totals['capacityCost']:,.2f}, of which ${totals['idleCost']:,.2f} idle"
        + (f" ({100 * totals['allocation']:.0f}% allocated)." if totals["allocation"] else "."),
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
