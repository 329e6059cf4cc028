"""GPU nodes, their health (each, and in numbers), and the release of a quarantined one."""

from __future__ import annotations

from typing import cast

from fastapi import APIRouter

from gpufleet.api import models, views
from gpufleet.api.access import Permission
from gpufleet.api.context import NODES_FRESH_S, PREFIX, ApiContext, InCluster, Who


def router(ctx: ApiContext) -> APIRouter:
    routes = APIRouter(prefix=PREFIX, tags=["nodes"])

    @routes.get("/nodes", response_model=list[models.Node])
    def nodes(who: Who, cluster: InCluster = None) -> list[models.Node]:
        """GPU nodes with health and quarantine. Needs: list nodes (core)."""
        now = ctx.clock()

        def nodes_now(objects: views.Objects) -> list[models.Node]:
            return views.nodes(objects, now)

        # readiness and agent silence depend on the time too: rebuilt at least every few seconds
        bucket = int(now.timestamp() // NODES_FRESH_S)
        return cast(
            list[models.Node], ctx.read(who, nodes_now, "nodes", "", bucket, cluster=cluster)
        )

    @routes.get("/health", response_model=models.Health)
    def health(who: Who, cluster: InCluster = None) -> models.Health:
        """The GPU nodes' health in numbers, with the nodes that need a look (not ready, not
        healthy, or quarantined). Needs: list nodes (core)."""
        return views.health(nodes(who, cluster))

    @routes.post("/nodes/{name}/release", response_model=models.Done)
    def release(name: str, who: Who) -> models.Done:
        """Take a quarantined node out of quarantine (as `gpufleet nodes release`).
        Needs: patch nodes (core)."""
        ctx.require(who, Permission("patch", "nodes", ""))
        return ctx.write(lambda writes: writes.release(name, who.user))

    return routes
