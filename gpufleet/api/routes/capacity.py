"""GPU capacity: the status numbers, capacity by pool and type, the pools."""

from __future__ import annotations

from typing import cast

from fastapi import APIRouter

from gpufleet.api import models, views
from gpufleet.api.context import PREFIX, ApiContext, InCluster, Who


def router(ctx: ApiContext) -> APIRouter:
    routes = APIRouter(prefix=PREFIX, tags=["capacity"])

    @routes.get("/status", response_model=models.Status)
    def status(who: Who, cluster: InCluster = None) -> models.Status:
        """The numbers of `gpufleet status`. Needs: list gpupools."""
        return cast(models.Status, ctx.read(who, views.status, "gpupools", cluster=cluster))

    @routes.get("/capacity", response_model=models.Capacity)
    def capacity(who: Who, cluster: InCluster = None) -> models.Capacity:
        """GPUs by pool and unused GPUs by type with their idle cost. Needs: list gpupools."""
        return cast(models.Capacity, ctx.read(who, views.capacity, "gpupools", cluster=cluster))

    @routes.get("/pools", response_model=list[models.Pool])
    def pools(who: Who, cluster: InCluster = None) -> list[models.Pool]:
        """GPU pools (or, in observe mode, GPU nodes by product). Needs: list gpupools."""
        return cast(list[models.Pool], ctx.read(who, views.pools, "gpupools", cluster=cluster))

    @routes.get("/clusters", response_model=models.Clusters)
    def clusters(who: Who) -> models.Clusters:
        """The clusters of a fleet of clusters, as the hub saw each, with totals (served by the
        hub's server; none in a fleet of one cluster). Needs: list clusters (gpufleet.io)."""
        return cast(models.Clusters, ctx.read(who, views.clusters, "clusters"))

    return routes
