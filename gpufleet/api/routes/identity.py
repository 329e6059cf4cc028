"""Who the caller is."""

from __future__ import annotations

from fastapi import APIRouter

from gpufleet.api import models
from gpufleet.api.context import PREFIX, ApiContext, Who


def router(ctx: ApiContext) -> APIRouter:
    routes = APIRouter(prefix=PREFIX, tags=["access"])

    @routes.get("/whoami", response_model=models.Identity)
    def whoami(who: Who) -> models.Identity:
        """The caller as the cluster knows them (needs no permission)."""
        return models.Identity(
            user=who.user, groups=list(who.groups), insecure_local=ctx.access.insecure_local
        )

    return routes
