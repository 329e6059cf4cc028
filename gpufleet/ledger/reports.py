"""The cost and usage reports of a ledger over a window, as `gpufleet cost` / `usage` and the
API's /cost and /usage give them. A bad window or option raises ValueError with the message to
show."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from gpufleet.ledger.budgets import budgets
from gpufleet.ledger.cost import (
    GROUP_KEYS,
    Interval,
    Segment,
    cost_events,
    daily_series,
    leaderboard,
    report,
)
from gpufleet.ledger.forecast import HISTORY_DAYS, forecast, forecast_until, month_start
from gpufleet.ledger.hosts import host_report
from gpufleet.ledger.recommendations import Waiting, recommendations
from gpufleet.ledger.store import Ledger
from gpufleet.model.durations import parse_duration
from gpufleet.model.fleet import Fleet

Row = TypeVar("Row", Segment, Interval)


def moment(value: str | None, option: str, end: datetime | None) -> datetime | None:
    """A date, time, or (with `end`) a duration back from `end` such as 7d or 12h."""
    if not value:
        return None
    if end is not None and value[-1:] == "d" and value[:-1].isdigit():
        return end - timedelta(days=int(value[:-1]))
    if end is not None and value[-1:] in "hms" and value[:1].isdigit():
        try:
            return end - parse_duration(value)
        except ValueError:
            pass
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(
            f"{option} {value!r}: not a date, time or duration (write 2026-12-01, "
            "2026-12-01T09:00, or for --since 7d or 12h)"
        ) from None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def window_report(
    store: Ledger,
    since: str | None,
    until: str | None,
    by: list[str],
    share_idle: bool,
    short: str,
    with_forecast: bool,
    now: datetime | None = None,
    max_window: timedelta | None = None,
    cluster: str | None = None,
) -> dict[str, Any]:
    """The report over the window [since, until) (default: all the ledger holds), grouped by
    `by`; with the month's forecast and a team leaderboard when `with_forecast`. A window
    longer than `max_window` is refused (the API's bound on one request's work). With
    `cluster`, only that cluster's rows of a ledger the clusters of a fleet share."""
    by = [key.strip() for given in by for key in given.split(",") if key.strip()]  # a,b
    for key in by:
        if key not in GROUP_KEYS:
            raise ValueError(f"--by {key}: not a grouping; use one of {', '.join(GROUP_KEYS)}")
    short_s = _short(short)
    now = now or datetime.now(UTC)
    span = store.span(now)
    start, end = _window(span, since, until, now, max_window)
    segments = _of(cluster, store.segments(start, end))
    pools = _of(cluster, store.capacity(start, end))
    data = report(
        segments,
        pools,
        _of(cluster, store.reservations(start, end)),
        start,
        end,
        now,
        by=by,
        share_idle=share_idle,
        short_s=short_s,
    )
    if with_forecast:
        month_of = end  # the month the window ends in (now, by default, while work runs)
        first = month_start(month_of)
        data["forecast"] = forecast(
            _of(cluster, store.segments(first, month_of)),
            _of(cluster, store.capacity(first, month_of)),
            month_of,
            span[0] if span else None,
        )
        if "team" in by:
            data["leaderboard"] = leaderboard(
                report(segments, pools, [], start, end, now, by=["team"])["groups"]
            )
    data["daily"] = daily_series(segments, pools, start, end, now)  # the trend charts
    hosts = [h for h in store.host_usage(start, end) if cluster is None or h.cluster == cluster]
    data["hosts"] = host_report(hosts)  # GPU hosts outside Kubernetes (GPUHosts)
    data["ledger"] = store.url
    if cluster is not None:
        data["cluster"] = cluster
    return data


def window_events(
    store: Ledger,
    since: str | None,
    until: str | None,
    short: str,
    now: datetime | None = None,
    max_window: timedelta | None = None,
    cluster: str | None = None,
    team: str | None = None,
    user: str | None = None,
) -> dict[str, Any]:
    """The cost events (one per run) of the window, as `window_report` takes its window; of
    one `team` or `user` where given."""
    short_s = _short(short)
    now = now or datetime.now(UTC)
    start, end = _window(store.span(now), since, until, now, max_window)
    segments = [
        s
        for s in _of(cluster, store.segments(start, end))
        if (team is None or s.team == team) and (user is None or s.submitter == user)
    ]
    rows = cost_events(segments, start, end, now, short_s)
    return {
        "window": {"since": start.isoformat(), "until": end.isoformat()},
        "items": rows,
        "totals": {
            "runs": len(rows),
            "gpuHours": round(sum(r["gpuHours"] for r in rows), 4),
            "cost": round(sum(r["cost"] or 0.0 for r in rows), 2),
            "wasteCost": round(sum(r["wasteCost"] or 0.0 for r in rows), 2),
        },
        "ledger": store.url,
    }


def window_forecast(
    store: Ledger,
    until: str,
    by: str | None,
    now: datetime | None = None,
    cluster: str | None = None,
) -> dict[str, Any]:
    """The cost from now to `until` (a date or time within a year), from the last
    HISTORY_DAYS the ledger recorded; per team or GPU type with `by`."""
    now, span = _now(store, now)
    end = moment(until, "--until", None)
    assert end is not None  # `until` is required
    since = now - timedelta(days=HISTORY_DAYS)
    data = forecast_until(
        _of(cluster, store.segments(since, now)),
        _of(cluster, store.capacity(since, now)),
        now,
        end,
        span[0] if span else None,
        by,
    )
    data["ledger"] = store.url
    return data


def window_budgets(store: Ledger, fleet: Fleet, now: datetime | None = None) -> dict[str, Any]:
    """Each team's budget for the month of `now`, against every cluster's work."""
    now, span = _now(store, now)
    rows = budgets(fleet, store.segments(month_start(now), now), now, span[0] if span else None)
    return {"month": month_start(now).strftime("%Y-%m"), "items": rows, "ledger": store.url}


def window_recommendations(
    store: Ledger,
    fleet: Fleet | None,
    since: str | None,
    now: datetime | None = None,
    cluster: str | None = None,
    waiting: Sequence[Waiting] = (),
    free_by_node: dict[str, dict[str, float]] | None = None,
) -> dict[str, Any]:
    """The recommendations of the window from `since` (default 7d) to now."""
    now, _ = _now(store, now)
    start = moment(since or "7d", "--since", now) or now
    if start >= now:
        raise ValueError(f"--since {start.isoformat()} is not before now")
    items = recommendations(
        fleet,
        _of(cluster, store.segments(start, now)),
        _of(cluster, store.reservations(start, now)),
        start,
        now,
        waiting,
        free_by_node,
    )
    return {
        "window": {"since": start.isoformat(), "until": now.isoformat()},
        "items": items,
        "ledger": store.url,
    }


def delivery_log(
    store: Ledger,
    since: str | None,
    now: datetime | None = None,
    limit: int = 500,
    **match: str | None,
) -> dict[str, Any]:
    """The notifications delivered or given up on since `since` (default 1d), newest first;
    `match`: route, kind, team, outcome or cluster."""
    now = now or datetime.now(UTC)
    start = moment(since or "1d", "--since", now) or now
    rows = store.deliveries(start, now, limit, **match)
    for row in rows:
        row.pop("id", None)
        row["at"], row["happened_at"] = row["at"].isoformat(), row["happened_at"].isoformat()
        row["happenedAt"] = row.pop("happened_at")
        row["dedupKey"] = row.pop("dedup_key")
    return {"since": start.isoformat(), "items": rows, "ledger": store.url}


def _now(store: Ledger, now: datetime | None) -> tuple[datetime, tuple[datetime, datetime] | None]:
    """Now, and the ledger's span: a simulation's ledger may run ahead of the clock, and then
    its last record is its now."""
    now = now or datetime.now(UTC)
    span = store.span(now)
    return (max(now, span[1]) if span else now), span


def _short(short: str) -> float:
    try:
        return parse_duration(short).total_seconds()
    except ValueError as err:
        raise ValueError(f"--short: {err}") from None


def _window(
    span: tuple[datetime, datetime] | None,
    since: str | None,
    until: str | None,
    now: datetime,
    max_window: timedelta | None,
) -> tuple[datetime, datetime]:
    """[start, end) of --since and --until (default: all the ledger holds, `span`), checked."""
    end = moment(until, "--until", None) or (span[1] if span else now)
    start = moment(since, "--since", end) or (span[0] if span else end - timedelta(days=1))
    if start >= end:
        raise ValueError(f"--since {start.isoformat()} is not before --until {end.isoformat()}")
    if max_window is not None and since is None:
        start = max(start, end - max_window)  # all the ledger holds, up to the bound
    if max_window is not None and end - start > max_window:
        raise ValueError(
            f"the window {start.isoformat()} to {end.isoformat()} is longer than "
            f"{max_window.days} days: ask for a shorter one (--since, --until)"
        )
    return start, end


def _of(cluster: str | None, rows: list[Row]) -> list[Row]:
    return rows if cluster is None else [r for r in rows if r.cluster == cluster]
