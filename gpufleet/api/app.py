"""The HTTP layer: routes under /api/v1, the dashboard at /, the OpenAPI document at
/api/v1/openapi.json. Every answer is built from the watch caches (`Source`); the views of all
workloads are rebuilt only when the caches changed, so a list or get of 10,000 workloads costs
a filter and a page, not a rebuild."""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from datetime import UTC, datetime
from importlib import resources
from typing import Annotated, Any, Protocol, cast

from fastapi import Depends, FastAPI, Header, HTTPException, Query, Request
from fastapi.responses import HTMLResponse

from gpufleet import __version__
from gpufleet.api import models, views
from gpufleet.api.access import Access, Caller, Permission
from gpufleet.ledger.reports import window_report
from gpufleet.ledger.store import Ledger
from gpufleet.model.api import GROUP
from gpufleet.model.durations import parse_duration

PREFIX = "/api/v1"
NODES_FRESH_S = 5


class Source(Protocol):
    """The cluster as the watch caches hold it."""

    def objects(self) -> views.Objects: ...

    def version(self) -> Hashable:
        """Changes whenever any object changes."""
        ...

    def workload_object(self, namespace: str, name: str) -> dict[str, Any] | None: ...


class Actions(Protocol):
    """The writes: both are carried out by the server's own service account, after the
    caller's permission was checked."""

    def cancel(self, workload: dict[str, Any]) -> str: ...

    def release(self, node: str, by: str) -> str: ...


class Conflict(Exception):
    """A write that cannot be done as asked (e.g. releasing a node that is not quarantined)."""


class _Derived:
    """Answers computed from the caches, kept until the caches change: a dashboard's poll and
    a list of 10,000 workloads cost a filter and a page, not a rebuild. Workload views are
    rebuilt one by one, only for objects whose resourceVersion changed."""

    def __init__(self, source: Source) -> None:
        self.source = source
        self.lock = threading.Lock()
        self.version: Hashable = object()
        self.workloads: list[models.Workload] = []
        self.by_key: dict[tuple[str, str], tuple[str, models.Workload]] = {}
        self.answers: dict[str, tuple[Hashable, Any]] = {}

    def all_workloads(self) -> list[models.Workload]:
        version = self.source.version()
        with self.lock:
            if version != self.version:
                self._rebuild()
                self.version = version
            return self.workloads

    def _rebuild(self) -> None:
        fresh: dict[tuple[str, str], tuple[str, models.Workload]] = {}
        for obj in self.source.objects().workloads:
            meta = obj["metadata"]
            key, seen = (meta["namespace"], meta["name"]), str(meta.get("resourceVersion", ""))
            held = self.by_key.get(key)
            view = held[1] if held is not None and held[0] == seen and seen else None
            fresh[key] = (seen, view or views.workload(obj))
        self.by_key = fresh
        self.workloads = views.in_queue_order(view for _, view in fresh.values())

    def answer(
        self, name: str, build: Callable[[views.Objects], Any], extra: Hashable = None
    ) -> Any:
        """`build(objects)`, reused while the caches (and `extra`) stay the same."""
        version = (self.source.version(), extra)
        with self.lock:
            held = self.answers.get(name)
            if held is not None and held[0] == version:
                return held[1]
        built = build(self.source.objects())
        with self.lock:
            self.answers[name] = (version, built)
        return built


def _bearer(authorization: str | None) -> str | None:
    if not authorization:
        return None
    scheme, _, token = authorization.partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


def _caller(
    request: Request,
    authorization: Annotated[str | None, Header(include_in_schema=False)] = None,
) -> Caller:
    """The caller, as the cluster knows them (401 when there is no token or a bad one)."""
    access: Access = request.app.state.access
    token = _bearer(authorization)
    if token is None and not access.insecure_local:
        raise HTTPException(
            401,
            "no bearer token: send 'Authorization: Bearer TOKEN' (a user's or service "
            "account's token, e.g. from kubectl create token NAME)",
            headers={"WWW-Authenticate": "Bearer"},
        )
    found: Caller | None = _ask(lambda: access.authenticate(token), "review the token")
    if found is None:
        raise HTTPException(
            401,
            "the token was not accepted by the cluster (TokenReview)",
            headers={"WWW-Authenticate": "Bearer"},
        )
    return found


def _ask(question: Callable[[], Any], what: str) -> Any:
    """An access question to the API server; 503 when it cannot answer (it is down or slow),
    never a traceback."""
    try:
        return question()
    except Exception as err:  # the kubernetes client raises several types for one outage
        raise HTTPException(
            503, f"cannot {what}: the Kubernetes API did not answer ({type(err).__name__})"
        ) from None


Who = Annotated[Caller, Depends(_caller)]
Since = Annotated[
    str | None, Query(description="A date or time, or a duration back from until: 7d, 24h.")
]
Until = Annotated[str | None, Query(description="A date or time; default: the last record.")]
Short = Annotated[str, Query(description="Preempted or cancelled runs shorter are waste.")]


def create_app(
    source: Source,
    access: Access,
    actions: Actions | None = None,
    clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ledger: Ledger | None = None,
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
    derived = _Derived(source)

    def allows(who: Caller, permission: Permission) -> bool:
        return bool(_ask(lambda: access.allows(who, permission), f"check {permission}"))

    def require(who: Caller, permission: Permission) -> None:
        if not allows(who, permission):
            raise HTTPException(
                403,
                {
                    "message": f"{who.user} may not {permission}",
                    "missing": permission.as_dict(),
                },
            )

    def write(change: Callable[[Actions], str]) -> models.Done:
        """One of the writes, once the caller's permission was checked: 405 on a read-only
        server, 409 when it cannot be done as asked, 404 when its object is gone."""
        if actions is None:
            raise HTTPException(405, "this server is read-only")
        try:
            return models.Done(message=change(actions))
        except Conflict as err:
            raise HTTPException(409, str(err)) from None
        except LookupError as err:
            raise HTTPException(404, str(err)) from None

    def read(
        who: Caller,
        build: Callable[[views.Objects], Any],
        resource: str,
        group: str = GROUP,
        extra: Hashable = None,
    ) -> Any:
        """`build`'s answer, once the caller may list `resource`."""
        require(who, Permission("list", resource, group))
        return derived.answer(build.__name__, build, extra)

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    def dashboard() -> str:
        return resources.files("gpufleet.api").joinpath("dashboard.html").read_text()

    @app.get("/healthz", include_in_schema=False)
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get(f"{PREFIX}/whoami", response_model=models.Identity, tags=["access"])
    def whoami(who: Who) -> models.Identity:
        """The caller as the cluster knows them (needs no permission)."""
        return models.Identity(
            user=who.user, groups=list(who.groups), insecure_local=access.insecure_local
        )

    @app.get(f"{PREFIX}/status", response_model=models.Status, tags=["capacity"])
    def status(who: Who) -> models.Status:
        """The numbers of `gpufleet status`. Needs: list gpupools."""
        return cast(models.Status, read(who, views.status, "gpupools"))

    @app.get(f"{PREFIX}/capacity", response_model=models.Capacity, tags=["capacity"])
    def capacity(who: Who) -> models.Capacity:
        """GPUs by pool and unused GPUs by type with their idle cost. Needs: list gpupools."""
        return cast(models.Capacity, read(who, views.capacity, "gpupools"))

    @app.get(f"{PREFIX}/pools", response_model=list[models.Pool], tags=["capacity"])
    def pools(who: Who) -> list[models.Pool]:
        """GPU pools (or, in observe mode, GPU nodes by product). Needs: list gpupools."""
        return cast(list[models.Pool], read(who, views.pools, "gpupools"))

    @app.get(f"{PREFIX}/teams", response_model=list[models.Team], tags=["teams"])
    def teams(who: Who) -> list[models.Team]:
        """Teams against their reservations and burst ceilings. Needs: list teams."""
        return cast(list[models.Team], read(who, views.teams, "teams"))

    @app.get(f"{PREFIX}/reservations", response_model=list[models.Reservation], tags=["teams"])
    def reservations(who: Who) -> list[models.Reservation]:
        """Reservations with what their team uses of them. Needs: list reservations."""
        return cast(list[models.Reservation], read(who, views.reservations, "reservations"))

    @app.get(f"{PREFIX}/nodes", response_model=list[models.Node], tags=["nodes"])
    def nodes(who: Who) -> list[models.Node]:
        """GPU nodes with health and quarantine. Needs: list nodes (core)."""
        now = clock()

        def nodes_now(objects: views.Objects) -> list[models.Node]:
            return views.nodes(objects, now)

        # readiness and agent silence depend on the time too: rebuilt at least every few seconds
        bucket = int(now.timestamp() // NODES_FRESH_S)
        return cast(list[models.Node], read(who, nodes_now, "nodes", "", bucket))

    @app.post(f"{PREFIX}/nodes/{{name}}/release", response_model=models.Done, tags=["nodes"])
    def release(name: str, who: Who) -> models.Done:
        """Take a quarantined node out of quarantine (as `gpufleet nodes release`).
        Needs: patch nodes (core)."""
        require(who, Permission("patch", "nodes", ""))
        return write(lambda writes: writes.release(name, who.user))

    def visible(
        namespace: str | None, who: Caller, every: list[models.Workload]
    ) -> frozenset[str] | None:
        """The namespaces a workload list may show the caller (None: all)."""
        if namespace:
            require(who, Permission("list", "gpuworkloads", namespace=namespace))
            return frozenset([namespace])
        cluster_wide = Permission("list", "gpuworkloads")
        if allows(who, cluster_wide):
            return None
        allowed = frozenset(
            ns
            for ns in {w.namespace for w in every}
            if allows(who, Permission("list", "gpuworkloads", namespace=ns))
        )
        if not allowed:
            require(who, cluster_wide)  # raises 403 naming the permission
        return allowed

    @app.get(f"{PREFIX}/workloads", response_model=models.Page[models.Workload], tags=["workloads"])
    def workloads(
        who: Who,
        namespace: str | None = None,
        team: str | None = None,
        workload_class: Annotated[str | None, Query(alias="class")] = None,
        state: Annotated[
            str | None, Query(description="One or more states, comma-separated.")
        ] = None,
        since: Annotated[
            str | None,
            Query(description="Finished workloads only if they ended within this, e.g. 48h."),
        ] = None,
        limit: Annotated[int, Query(ge=1, le=10_000)] = 500,
        offset: Annotated[int, Query(ge=0)] = 0,
    ) -> models.Page[models.Workload]:
        """Workloads, waiting ones first in queue order. Needs: list gpuworkloads, in the
        namespace asked for, or cluster-wide; without either, only the namespaces where the
        caller may list them are shown."""
        try:
            within = parse_duration(since) if since else None
        except ValueError as err:
            raise HTTPException(422, f"since={since!r}: {err}") from None
        every = derived.all_workloads()
        chosen = views.WorkloadFilter(
            namespaces=visible(namespace, who, every),
            team=team,
            workload_class=workload_class,
            states=frozenset(s.strip() for s in state.split(",")) if state else None,
            finished_within=within,
        )
        now = clock()
        matched = [w for w in every if chosen.keeps(w, now)]
        return models.Page[models.Workload](
            items=matched[offset : offset + limit], total=len(matched), offset=offset
        )

    def one(namespace: str, name: str, who: Caller, verb: str = "get") -> dict[str, Any]:
        require(who, Permission(verb, "gpuworkloads", namespace=namespace))
        found = source.workload_object(namespace, name)
        if found is None:
            raise HTTPException(404, f"no GPU workload {namespace}/{name}")
        return found

    @app.get(
        f"{PREFIX}/workloads/{{namespace}}/{{name}}",
        response_model=models.Workload,
        tags=["workloads"],
    )
    def workload(namespace: str, name: str, who: Who) -> models.Workload:
        """One workload. Needs: get gpuworkloads in its namespace."""
        return views.workload(one(namespace, name, who))

    @app.get(
        f"{PREFIX}/workloads/{{namespace}}/{{name}}/explain",
        response_model=models.Explanation,
        tags=["workloads"],
    )
    def explain(namespace: str, name: str, who: Who) -> models.Explanation:
        """Where a workload is and why, in plain words (as `gpufleet workloads explain`).
        Needs: get gpuworkloads in its namespace."""
        found = views.workload(one(namespace, name, who))
        return models.Explanation(workload=found, text=views.explain(found))

    @app.post(
        f"{PREFIX}/workloads/{{namespace}}/{{name}}/cancel",
        response_model=models.Done,
        tags=["workloads"],
    )
    def cancel(namespace: str, name: str, who: Who) -> models.Done:
        """Cancel a workload: its Job (or other owner) is deleted, its pods stop.
        Needs: delete gpuworkloads in its namespace."""
        found = one(namespace, name, who, "delete")
        return write(lambda writes: writes.cancel(found))

    def ledger_report(
        who: Caller,
        since: str | None,
        until: str | None,
        by: list[str],
        share_idle: bool,
        short: str,
        with_forecast: bool,
    ) -> dict[str, Any]:
        require(who, Permission("list", "teams"))
        if ledger is None:
            raise HTTPException(
                404, "this server has no usage ledger: start gpufleet server with --ledger URL"
            )
        try:
            return window_report(
                ledger, since, until, by, share_idle, short, with_forecast, now=clock()
            )
        except ValueError as err:
            raise HTTPException(422, str(err).replace("--", "")) from None

    @app.get(f"{PREFIX}/cost", response_model=dict[str, Any], tags=["usage"])
    def cost(
        who: Who,
        since: Since = None,
        until: Until = None,
        by: Annotated[list[str] | None, Query(description="team, pool, gpuType, ...")] = None,
        share_idle: Annotated[bool, Query(alias="shareIdle")] = False,
        short: Short = "5m",
    ) -> dict[str, Any]:
        """GPU cost by team (or other groups) from the usage ledger, as `gpufleet cost -o json`:
        work, idle and waste cost, efficiency, a leaderboard and the month's forecast.
        Needs: list teams (it covers every team)."""
        return ledger_report(who, since, until, by or ["team"], share_idle, short, True)

    @app.get(f"{PREFIX}/usage", response_model=dict[str, Any], tags=["usage"])
    def usage(
        who: Who,
        since: Since = None,
        until: Until = None,
        by: Annotated[list[str] | None, Query(description="pool, team, gpuType, ...")] = None,
        short: Short = "5m",
    ) -> dict[str, Any]:
        """GPU-hours by pool (or other groups) from the usage ledger, as `gpufleet usage -o
        json`: runs and outcomes, capacity, idle and unhealthy GPU-hours, reservation use.
        Needs: list teams."""
        return ledger_report(who, since, until, by or ["pool"], False, short, False)

    return app
