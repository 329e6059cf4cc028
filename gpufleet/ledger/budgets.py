"""Teams' monthly GPU-hour budgets against the ledger: what the month used so far, where it
is heading by the month's end (with a 95 % band), which alert thresholds it crossed and when
it will run out at its pace. A team's budget covers its sub-teams' work. Pure.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from gpufleet.model.fleet import Fleet

from .cost import Segment, _hours, _iso, _round
from .forecast import basis, complete_days, month_start, next_month, project


def budgets(
    fleet: Fleet, segments: Sequence[Segment], now: datetime, recorded_since: datetime | None
) -> list[dict[str, Any]]:
    """One row per team with a budget, for the month of `now` (`segments`: the month's)."""
    first = month_start(now)
    begin = max(first, recorded_since or first)
    days = complete_days(begin, now)
    recorded_hours = max((now - begin).total_seconds() / 3600, 0.0)
    remaining = (next_month(now) - now).total_seconds() / 86400
    rows = []
    for name in sorted(fleet.teams):
        budget = fleet.teams[name].spec.budget
        if budget is None:
            continue
        members = set(fleet.subtree(name))
        mine = [s for s in segments if s.team in members]
        used = sum(_hours(s.start, s.end, first, now) * s.gpus for s in mine)
        daily = [sum(_hours(s.start, s.end, d, d + timedelta(days=1)) * s.gpus for s in mine)
                 for d in days]  # fmt: skip
        so_far = sum(_hours(s.start, s.end, begin, now) * s.gpus for s in mine)
        rate = so_far / recorded_hours * 24 if recorded_hours else 0.0
        ahead = project(daily, remaining, rate)
        limit = budget.gpu_hours_per_month
        forecast = used + ahead["projected"]
        crossed = [p for p in budget.alert_at_percent if used * 100 >= p * limit]
        row: dict[str, Any] = {
            "team": name,
            "month": first.strftime("%Y-%m"),
            "budgetGPUHours": limit,
            "usedGPUHours": _round(used, 2),
            "usedPercent": _round(100 * used / limit, 1),
            "forecastGPUHours": _round(forecast, 2),
            "forecastPercent": _round(100 * forecast / limit, 1),
            "low": _round(used + ahead["low"], 2) if ahead["low"] is not None else None,
            "high": _round(used + ahead["high"], 2) if ahead["high"] is not None else None,
            "alertAtPercent": budget.alert_at_percent,
            "crossed": crossed,
            "state": "over" if used >= limit else "warning" if crossed else "ok",
            "runsOutAt": None,
            "teams": sorted(members),
            "basis": basis(len(days), recorded_hours, begin)["note"],
        }
        per_day = ahead["perDay"]
        if used < limit < forecast and per_day > 0:
            row["runsOutAt"] = _iso(now + timedelta(days=(limit - used) / per_day))
        rows.append(row)
    return rows
