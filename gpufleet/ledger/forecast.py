"""Cost forecasts to any date: the daily cost of the days the ledger recorded, projected
forward with a trend (a least-squares line, from TREND_MIN_DAYS complete days) or their mean
(from two), each with a 95 % band; with less, the rate of the hours recorded, and no band.
Every forecast says what it rests on. Pure.

The band is the prediction interval of a sum of future days under the fitted model: the days'
own spread around the line (or mean) plus the uncertainty of the line itself, so a forecast
from few days is wide and one far ahead is wider still.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from .cost import GROUP_KEYS, Interval, Segment, _iso, _round, daily_cost

TREND_MIN_DAYS = 7  # fewer complete days: their mean, no trend
HISTORY_DAYS = 90  # the days a forecast reads back, at most
MAX_AHEAD = timedelta(days=366)
Z95 = 1.96
FORECAST_KEYS = ("team", "gpu-type")


def project(daily: Sequence[float], ahead_days: float, rate_per_day: float) -> dict[str, Any]:
    """The cost of the next `ahead_days` after the complete days `daily` (oldest first):
    by their trend, their mean, or (fewer than two) `rate_per_day`."""
    n = len(daily)
    steps = _steps(ahead_days)
    if n >= TREND_MIN_DAYS:
        ts = range(n)
        mean_t, mean_y = statistics.fmean(ts), statistics.fmean(daily)
        sxx = sum((t - mean_t) ** 2 for t in ts)
        slope = sum((t - mean_t) * (y - mean_y) for t, y in zip(ts, daily, strict=True)) / sxx
        level = mean_y - slope * mean_t
        residual = math.sqrt(
            sum((y - level - slope * t) ** 2 for t, y in zip(ts, daily, strict=True)) / (n - 2)
        )
        projected = sum(w * max(level + slope * (n + t), 0.0) for t, w in steps)
        leverage = sum(w * (n + t - mean_t) for t, w in steps) ** 2 / sxx
        spread = residual * math.sqrt(ahead_days + ahead_days**2 / n + leverage)
        return _out(projected, spread, "trend", level + slope * n, slope)
    if n >= 2:
        mean = statistics.fmean(daily)
        spread = statistics.stdev(daily) * math.sqrt(ahead_days + ahead_days**2 / n)
        return _out(mean * ahead_days, spread, "mean", mean, None)
    return {
        "projected": _round(rate_per_day * ahead_days, 2),
        "low": None,
        "high": None,
        "method": "rate",
        "perDay": _round(rate_per_day, 2),
        "trendPerDay": None,
    }


def _steps(ahead_days: float) -> list[tuple[float, float]]:
    """(midpoint, weight) of each future day, the last in part."""
    whole = int(ahead_days)
    out = [(i + 0.5, 1.0) for i in range(whole)]
    if ahead_days > whole:
        part = ahead_days - whole
        out.append((whole + part / 2, part))
    return out


def _out(
    projected: float, spread: float, method: str, per_day: float, slope: float | None
) -> dict[str, Any]:
    return {
        "projected": _round(projected, 2),
        "low": _round(max(projected - Z95 * spread, 0.0), 2),
        "high": _round(projected + Z95 * spread, 2),
        "method": method,
        "perDay": _round(max(per_day, 0.0), 2),
        "trendPerDay": _round(slope, 4) if slope is not None else None,
    }


def month_start(now: datetime) -> datetime:
    return now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)


def next_month(now: datetime) -> datetime:
    """The start of the month after the month of `now`."""
    return (month_start(now) + timedelta(days=32)).replace(day=1)


def complete_days(begin: datetime, now: datetime) -> list[datetime]:
    """The starts of the whole UTC days recorded from `begin` until today: a forecast's
    samples. A first day recorded only in part is not one, nor is today."""
    first = begin.replace(hour=0, minute=0, second=0, microsecond=0)
    if first < begin:
        first += timedelta(days=1)
    today = now.replace(hour=0, minute=0, second=0, microsecond=0)
    return [first + timedelta(days=i) for i in range(max((today - first).days, 0))]


def forecast(
    segments: Sequence[Segment],
    capacity: Sequence[Interval],
    now: datetime,
    recorded_since: datetime | None = None,
) -> dict[str, Any]:
    """Cost of the month of `now`: spent so far and a month-end forecast, from the mean of the
    month's complete days, with a 95 % band from their spread (the band needs two of them).
    Days before `recorded_since` (the ledger's first record) are not counted as days that cost
    nothing; with no complete day yet, the rate of the hours recorded so far is used."""
    first = month_start(now)
    begin = max(first, recorded_since or first)
    days = complete_days(begin, now)  # the first day, recorded in part, is spent but no sample
    complete = daily_cost(segments, capacity, days)
    spent = sum(daily_cost(segments, capacity, [first], span=now - first))
    remaining_days = (next_month(now) - now).total_seconds() / 86400
    recorded_hours = max((now - begin).total_seconds() / 3600, 0.0)
    if complete:
        mean = statistics.fmean(complete)
    elif recorded_hours > 0:
        mean = spent / recorded_hours * 24
    else:
        mean = 0.0
    projected = spent + mean * remaining_days
    out: dict[str, Any] = {
        "month": first.strftime("%Y-%m"),
        "spentSoFar": _round(spent, 2),
        "forecast": _round(projected, 2),
        "completeDays": len(complete),
        "dailyMean": _round(mean, 2),
        "basis": basis(len(complete), recorded_hours, begin),
    }
    if len(complete) >= 2:
        spread = 1.96 * statistics.stdev(complete) * math.sqrt(remaining_days)
        out["low"] = _round(max(projected - spread, spent), 2)
        out["high"] = _round(projected + spread, 2)
    else:
        out["low"] = out["high"] = None
    return out


def forecast_until(
    segments: Sequence[Segment],
    capacity: Sequence[Interval],
    now: datetime,
    until: datetime,
    recorded_since: datetime | None,
    by: str | None = None,
) -> dict[str, Any]:
    """The cost from `now` to `until` (within a year): in all (what the pools cost, where
    their capacity was recorded, else what the work cost) and, with `by` (team or gpu-type),
    what each group's work will cost. `segments` and `capacity` cover the HISTORY_DAYS before
    `now`; `recorded_since` is the ledger's first record (days before it are not days that
    cost nothing)."""
    if until <= now:
        raise ValueError(f"--until {until.isoformat()} is not after now ({now.isoformat()})")
    if until - now > MAX_AHEAD:
        raise ValueError(f"--until {until.isoformat()}: forecasts reach a year ahead at most")
    if by is not None and by not in FORECAST_KEYS:
        raise ValueError(f"--by {by}: forecasts group by {' or '.join(FORECAST_KEYS)}")
    begin = max(now - timedelta(days=HISTORY_DAYS), recorded_since or now)
    days = complete_days(begin, now)
    recorded_hours = max((now - begin).total_seconds() / 3600, 0.0)
    ahead = (until - now).total_seconds() / 86400

    def projected(segs: Sequence[Segment], pools: Sequence[Interval]) -> dict[str, Any]:
        daily = daily_cost(segs, pools, days)
        so_far = sum(daily_cost(segs, pools, [begin], span=now - begin)) if now > begin else 0.0
        rate = so_far / recorded_hours * 24 if recorded_hours else 0.0
        return project(daily, ahead, rate)

    out: dict[str, Any] = {
        "from": _iso(now),
        "until": _iso(until),
        "days": _round(ahead, 2),
        "basis": basis(len(days), recorded_hours, begin),
        "totals": projected(segments, capacity),
    }
    if by is not None:
        assert by in GROUP_KEYS
        names = sorted({s.group(by) for s in segments})
        rows = [
            {by: name, **projected([s for s in segments if s.group(by) == name], [])}
            for name in names
        ]
        out["by"] = by
        out["groups"] = sorted(rows, key=lambda r: (-r["projected"], r[by]))
    return out


def basis(complete_days: int, recorded_hours: float, since: datetime) -> dict[str, Any]:
    """What a forecast rests on, and in words how far to trust it."""
    if complete_days >= TREND_MIN_DAYS:
        note = f"a trend over {complete_days} complete days" + (
            "" if complete_days >= 28 else ": fewer than four weeks, so weekly cycles skew it"
        )
    elif complete_days >= 2:
        note = f"the mean of only {complete_days} complete days, no trend: read it as a rough guess"
    else:
        note = (
            f"{recorded_hours:,.1f} hours of records and no two complete days: the rate so "
            "far, without a band; read it as a rough guess"
        )
    return {
        "since": _iso(since),
        "completeDays": complete_days,
        "recordedHours": _round(recorded_hours, 1),
        "note": note,
    }
