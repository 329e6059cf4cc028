"""The HTTP layer: routes under /api/v1 (one router per resource, `routes/`), the dashboard at
/, the OpenAPI document at /api/v1/openapi.json. Every answer is built from the watch caches
(`Source`, `context.py`)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from importlib import resources

from fastapi import FastAPI
from fastapi.responses import HTMLResponse

from gpufleet import __version__
from gpufleet.api import guard
from gpufleet.api.access import Access
from gpufleet.api.context import PREFIX, Actions, ApiContext, Conflict, HostReports, Source
from gpufleet.api.limits import Limits
from gpufleet.api.prometheus import Prometheus
from gpufleet.api.routes import (
    capacity,
    gitops,
    hosts,
    identity,
    nodes,
    teams,
    usage,
    workloads,
)
from gpufleet.ledger.store import Ledger

ROUTERS = (identity, capacity, teams, nodes, hosts, workloads, usage)


def create_app(
    source: Source,
    access: Access,
    actions: Actions | None = None,
    clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ledger: Ledger | None = None,
    limits: Limits | None = None,
    tls: bool = False,
    prometheus: Prometheus | None = None,
    host_reports: HostReports | None = None,
    hub: bool = False,
) -> FastAPI:
    app = FastAPI(
        title="gpufleet API",
        version=__version__,
        description="GPU capacity, teams, reservations, workloads and nodes of a gpufleet "
        "cluster. Authenticate with a Kubernetes bearer token; each route needs the RBAC "
        "permission it names.",
        openapi_url=f"{PREFIX}/openapi.json",
        docs_url=None,  # the Swagger UI loads from a CDN; the dashboard must work offline
        redoc_url=None,
    )
    app.state.access = access
    guard.install(app, limits or Limits(), access.insecure_local, tls)
    context = ApiContext(source, access, actions, clock, ledger, prometheus, host_reports, hub)

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    def dashboard() -> str:
        return resources.files("gpufleet.api").joinpath("dashboard.html").read_text()

    @app.get("/healthz", include_in_schema=False)
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    for module in ROUTERS:
        app.include_router(module.router(context))
    app.include_router(gitops.router())  # after them: a GET of the same path is theirs
    return app


__all__ = ["Actions", "Conflict", "Limits", "Source", "create_app"]
