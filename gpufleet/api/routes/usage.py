"""GPU cost and usage from the usage ledger."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query

from gpufleet.api.access import Caller, Permission
from gpufleet.api.context import PREFIX, ApiContext, InCluster, Short, Since, Until, Who
from gpufleet.ledger.reports import window_events, window_report
from gpufleet.ledger.store import Ledger

# a report reads every segment of its window: one request must not read years of them
MAX_WINDOW = timedelta(days=400)


def router(ctx: ApiContext) -> APIRouter:
    routes = APIRouter(prefix=PREFIX, tags=["usage"])

    def from_ledger(who: Caller, read: Callable[[Ledger], dict[str, Any]]) -> dict[str, Any]:
        """`read` of the server's ledger, once the caller may list teams (a report covers
        every team): 404 without a ledger, 422 for a bad window or option."""
        ctx.require(who, Permission("list", "teams"))
        if ctx.ledger is None:
            raise HTTPException(
                404, "this server has no usage ledger: start gpufleet server with --ledger URL"
            )
        try:
            data = read(ctx.ledger)
        except ValueError as err:
            raise HTTPException(422, str(err).replace("--", "")) from None
        data.pop("ledger", None)  # where the database is stays with the server
        return data

    def ledger_report(
        who: Caller,
        since: str | None,
        until: str | None,
        by: list[str],
        share_idle: bool,
        short: str,
        with_forecast: bool,
        cluster: str | None,
    ) -> dict[str, Any]:
        return from_ledger(who, lambda ledger: window_report(
            ledger, since, until, by, share_idle, short, with_forecast, now=ctx.clock(),
            max_window=MAX_WINDOW, cluster=cluster,
        ))  # fmt: skip

    @routes.get("/cost/events", response_model=dict[str, Any])
    def cost_events(
        who: Who,
        since: Since = None,
        until: Until = None,
        short: Short = "5m",
        cluster: InCluster = None,
        team: Annotated[str | None, Query(description="Only this team's runs.")] = None,
        user: Annotated[str | None, Query(description="Only this user's (the submitter).")] = None,
    ) -> dict[str, Any]:
        """One row per run in the window, as `gpufleet cost events -o json`: workload, team,
        user, cluster, pool, start and end, GPUs, GPU-hours, rate, cost, outcome and the
        waste with its reason. Needs: list teams."""
        return from_ledger(who, lambda ledger: window_events(
            ledger, since, until, short, now=ctx.clock(), max_window=MAX_WINDOW,
            cluster=cluster, team=team, user=user,
        ))  # fmt: skip

    @routes.get("/cost", response_model=dict[str, Any])
    def cost(
        who: Who,
        since: Since = None,
        until: Until = None,
        by: Annotated[list[str] | None, Query(description="team, pool, gpuType, ...")] = None,
        share_idle: Annotated[bool, Query(alias="shareIdle")] = False,
        short: Short = "5m",
        cluster: InCluster = None,
    ) -> dict[str, Any]:
        """GPU cost by team (or other groups) from the usage ledger, as `gpufleet cost -o json`:
        work, idle and waste cost, efficiency, a leaderboard and the month's forecast.
        Needs: list teams (it covers every team)."""
        return ledger_report(who, since, until, by or ["team"], share_idle, short, True, cluster)

    @routes.get("/usage", response_model=dict[str, Any])
    def usage(
        who: Who,
        since: Since = None,
        until: Until = None,
        by: Annotated[list[str] | None, Query(description="pool, team, gpuType, ...")] = None,
        short: Short = "5m",
        cluster: InCluster = None,
    ) -> dict[str, Any]:
        """GPU-hours by pool (or other groups) from the usage ledger, as `gpufleet usage -o
        json`: runs and outcomes, capacity, idle and unhealthy GPU-hours, reservation use.
        Needs: list teams."""
        return ledger_report(who, since, until, by or ["pool"], False, short, False, cluster)

    return routes
