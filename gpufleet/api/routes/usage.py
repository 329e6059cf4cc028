"""GPU cost and usage from the usage ledger."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query

from gpufleet.api import views
from gpufleet.api.access import Caller, Permission
from gpufleet.api.context import PREFIX, ApiContext, InCluster, Short, Since, Until, Who
from gpufleet.ledger.reports import (
    delivery_log,
    window_budgets,
    window_events,
    window_forecast,
    window_recommendations,
    window_report,
)
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

    @routes.get("/cost/forecast", response_model=dict[str, Any])
    def cost_forecast(
        who: Who,
        until: Annotated[str, Query(description="The date the forecast runs to (within a year).")],
        by: Annotated[str | None, Query(description="team or gpu-type")] = None,
        cluster: InCluster = None,
    ) -> dict[str, Any]:
        """The cost from now to `until`, as `gpufleet cost forecast -o json`: projected with
        its 95 % band, per team or GPU type with `by`, and what it rests on. Needs: list teams."""
        return from_ledger(who, lambda ledger: window_forecast(
            ledger, until, by, now=ctx.clock(), cluster=cluster
        ))  # fmt: skip

    @routes.get("/budgets", response_model=dict[str, Any])
    def budgets(who: Who) -> dict[str, Any]:
        """Each team's monthly GPU-hour budget (Team spec.budget) against the month's use and
        forecast, as `gpufleet budgets -o json`. Needs: list teams."""
        fleet = ctx.read(who, views.fleet_of, "teams")
        return from_ledger(who, lambda ledger: window_budgets(ledger, fleet, now=ctx.clock()))

    @routes.get("/recommendations", response_model=dict[str, Any])
    def recommendations(who: Who, since: Since = None, cluster: InCluster = None) -> dict[str, Any]:
        """What to change, with the figures behind it, as `gpufleet recommendations -o json`:
        elastic work that spot capacity would have run for less, teams whose runs fail too
        often, reservations mostly idle (since `since`, default 7 days), and large work kept
        waiting by scattered free GPUs (the queue now). Needs: list teams, and list
        gpuworkloads and nodes for the queue (without, it is left out)."""
        fleet = ctx.read(who, views.fleet_of, "teams")
        waiting: list[Any] = []
        free = None
        if ctx.allows(who, Permission("list", "gpuworkloads")) and ctx.allows(
            who, Permission("list", "nodes", "")
        ):
            waiting, free = views.queue_shape(ctx.source.objects(), ctx.clock())
        return from_ledger(who, lambda ledger: window_recommendations(
            ledger, fleet, since, now=ctx.clock(), cluster=cluster, waiting=waiting,
            free_by_node=free,
        ))  # fmt: skip

    @routes.get("/notifications/deliveries", response_model=dict[str, Any])
    def deliveries(
        who: Who,
        since: Since = None,
        route: Annotated[str | None, Query(description="Only this route's.")] = None,
        kind: Annotated[str | None, Query(description="Only this kind (preempted, ...).")] = None,
        team: Annotated[str | None, Query(description="Only this team's.")] = None,
        outcome: Annotated[str | None, Query(description="sent or failed.")] = None,
        limit: Annotated[int, Query(ge=1, le=5000)] = 500,
    ) -> dict[str, Any]:
        """The notifications' delivery log, newest first (default: the last day): each
        message a route delivered or gave up on, its tries and error, as `gpufleet notify log
        -o json`. Needs: list fleetpolicies (where the routes are declared)."""
        ctx.require(who, Permission("list", "fleetpolicies"))
        return from_ledger(who, lambda ledger: delivery_log(
            ledger, since, now=ctx.clock(), limit=limit, route=route, kind=kind, team=team,
            outcome=outcome,
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
