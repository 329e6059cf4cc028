"""Teams, their reservations, and the templates their submissions start from."""

from __future__ import annotations

from typing import cast

from fastapi import APIRouter, HTTPException

from gpufleet.api import models, views
from gpufleet.api.context import PREFIX, ApiContext, Who


def router(ctx: ApiContext) -> APIRouter:
    routes = APIRouter(prefix=PREFIX, tags=["teams"])

    @routes.get("/teams", response_model=list[models.Team])
    def teams(who: Who) -> list[models.Team]:
        """Teams against their reservations and burst ceilings. Needs: list teams."""
        return cast(list[models.Team], ctx.read(who, views.teams, "teams"))

    @routes.get("/teams/{name}", response_model=models.Team)
    def team(name: str, who: Who) -> models.Team:
        """One team. Needs: list teams."""
        every = cast(list[models.Team], ctx.read(who, views.teams, "teams"))
        found = next((t for t in every if t.name == name), None)
        if found is None:
            known = ", ".join(t.name for t in every) or "none"
            raise HTTPException(404, f"no team {name}; teams: {known}")
        return found

    @routes.get("/templates", response_model=list[models.Template])
    def templates(who: Who) -> list[models.Template]:
        """The WorkloadTemplates submissions may start from. Needs: list workloadtemplates."""
        return cast(list[models.Template], ctx.read(who, views.templates, "workloadtemplates"))

    @routes.get("/reservations", response_model=list[models.Reservation])
    def reservations(who: Who) -> list[models.Reservation]:
        """Reservations with what their team uses of them. Needs: list reservations."""
        return cast(list[models.Reservation], ctx.read(who, views.reservations, "reservations"))

    return routes
