"""What every route of the API shares: the caches it answers from (`Source`), the writes it may
make (`Actions`), the caller (`Who`) and the checks of what they may do (`ApiContext`). The views
of all workloads are rebuilt only when the caches changed, so a list or get of 10,000 workloads
costs a filter and a page, not a rebuild."""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any, Protocol

from fastapi import Depends, Header, HTTPException, Query, Request

from gpufleet.api import models, views
from gpufleet.api.access import Access, Caller, Permission
from gpufleet.api.guard import Buckets, client_key, too_many
from gpufleet.api.prometheus import Prometheus
from gpufleet.hosts.status import Applied, Report
from gpufleet.ledger.store import Ledger
from gpufleet.model.api import GROUP

PREFIX = "/api/v1"
NODES_FRESH_S = 5
SAR_PARALLEL = 8  # access reviews in flight at once for one request


class Source(Protocol):
    """The cluster as the watch caches hold it."""

    def objects(self) -> views.Objects: ...

    def version(self) -> Hashable:
        """Changes whenever any object changes."""
        ...

    def workload_object(
        self, namespace: str, name: str, cluster: str | None = None
    ) -> dict[str, Any] | None:
        """The GPUWorkload (in `cluster`, of a fleet); LookupError when a fleet has one of
        that name in several clusters and none was named."""
        ...

    def events(self, namespace: str, cluster: str | None = None) -> list[dict[str, Any]]:
        """The Events of `namespace` (in `cluster`, of a fleet), read now: they are not
        cached, as only one workload's page asks for them."""
        ...

    def hosts(self) -> list[dict[str, Any]]:
        """The GPUHosts. Apart from `version`: each host reports every few seconds, and that
        must not make every other view be built again."""
        ...


class Actions(Protocol):
    """The writes: both are carried out by the server's own service account, after the
    caller's permission was checked."""

    def cancel(self, workload: dict[str, Any]) -> str: ...

    def release(self, node: str, by: str) -> str: ...

    def create(
        self, obj: dict[str, Any], namespace: str, caller: Caller | None, dry_run: bool
    ) -> dict[str, Any]:
        """Create a workload's object as `caller` (None: as the server itself, for
        --insecure-local), not as the server: raises `Refused` with the API server's answer."""
        ...


class HostReports(Protocol):
    """Where standalone agents' reports go (`hosts.KubernetesHosts`)."""

    def take(
        self, name: str, reports: Sequence[Report], agent_version: str | None, now: datetime
    ) -> Applied: ...

    def latest(self, name: str) -> tuple[datetime, str] | None:
        """When the newest report this server took of `name` was taken, and its metrics."""
        ...


class Conflict(Exception):
    """A write that cannot be done as asked (e.g. releasing a node that is not quarantined)."""


class Refused(Exception):
    """The API server refused a write made as the caller: its status and its reason."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class _Derived:
    """Answers computed from the caches, kept until the caches change: a dashboard's poll and
    a list of 10,000 workloads cost a filter and a page, not a rebuild. Workload views are
    rebuilt one by one, only for objects whose resourceVersion changed."""

    def __init__(self, source: Source) -> None:
        self.source = source
        self.lock = threading.Lock()
        self.version: Hashable = object()
        self.workloads: list[models.Workload] = []
        # (cluster, namespace, name) -> (resourceVersion, view)
        self.by_key: dict[tuple[str, str, str], tuple[str, models.Workload]] = {}
        self.answers: dict[str, tuple[Hashable, Any]] = {}

    def all_workloads(self) -> list[models.Workload]:
        version = self.source.version()
        with self.lock:
            if version != self.version:
                self._rebuild()
                self.version = version
            return self.workloads

    def _rebuild(self) -> None:
        fresh: dict[tuple[str, str, str], tuple[str, models.Workload]] = {}
        for obj in self.source.objects().workloads:
            meta = obj["metadata"]
            key = (views.cluster_of(obj) or "", meta["namespace"], meta["name"])
            seen = str(meta.get("resourceVersion", ""))
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
    # a client that keeps sending bad tokens is stopped before each costs a TokenReview;
    # callers already known still pass (others behind the same address)
    failed: Buckets = request.app.state.failed_tokens
    client = client_key(request)
    wait = failed.exhausted(client)
    if wait > 0:
        cached = access.known(token)
        if cached is not None:
            return cached
        said, retry = too_many(wait, "rejected tokens")
        raise HTTPException(429, said, headers=retry)
    found: Caller | None = _ask(lambda: access.authenticate(token), "review the token")
    if found is None:
        failed.take(client)
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
InCluster = Annotated[
    str | None,
    Query(description="Only this cluster of a fleet (a hub's server, or a shared ledger)."),
]


@dataclass
class ApiContext:
    """What the routes of one server share: its caches, access checks, writes, clock,
    ledger and the Prometheus its workloads' GPU metrics are read from."""

    source: Source
    access: Access
    actions: Actions | None
    clock: Callable[[], datetime]
    ledger: Ledger | None
    prometheus: Prometheus | None = None
    hosts: HostReports | None = None  # None: this server takes no reports of hosts
    # the hub's server (--fleet): what it shows is its clusters'; it creates only what the
    # hub sends on (submissions naming a cluster), and cancels or releases nothing
    hub: bool = False

    def __post_init__(self) -> None:
        self.derived = _Derived(self.source)
        # the access reviews of one request asked side by side (threads made once, not per
        # request: a dashboard polls every few seconds)
        self.reviews = ThreadPoolExecutor(SAR_PARALLEL, thread_name_prefix="gpufleet-access")

    def allows(self, who: Caller, permission: Permission) -> bool:
        return bool(_ask(lambda: self.access.allows(who, permission), f"check {permission}"))

    def allowed_namespaces(
        self, who: Caller, verb: str, resource: str, namespaces: set[str]
    ) -> frozenset[str]:
        """The namespaces of `namespaces` where `who` may `verb` `resource`: asked side by
        side (a caller without a cluster-wide right is asked about each namespace once per
        cache period, not in a row of round trips on every poll)."""
        asked = sorted(namespaces)
        answers = self.reviews.map(
            lambda ns: self.allows(who, Permission(verb, resource, namespace=ns)), asked
        )
        return frozenset(ns for ns, allowed in zip(asked, answers, strict=True) if allowed)

    def require(self, who: Caller, permission: Permission) -> None:
        if not self.allows(who, permission):
            raise HTTPException(
                403,
                {
                    "message": f"{who.user} may not {permission}",
                    "missing": permission.as_dict(),
                },
            )

    def write(self, change: Callable[[Actions], str]) -> models.Done:
        """One of the writes, once the caller's permission was checked: 405 on a read-only
        server, 409 when it cannot be done as asked, 404 when its object is gone."""
        if self.actions is None or self.hub:
            raise HTTPException(
                405,
                "the hub's server changes nothing in its clusters: cancel or release through "
                "the server of the workload's or node's cluster"
                if self.hub
                else "this server is read-only",
            )
        try:
            return models.Done(message=change(self.actions))
        except Conflict as err:
            raise HTTPException(409, str(err)) from None
        except LookupError as err:
            raise HTTPException(404, str(err)) from None

    def read(
        self,
        who: Caller,
        build: Callable[[views.Objects], Any],
        resource: str,
        group: str = GROUP,
        extra: Hashable = None,
        cluster: str | None = None,
    ) -> Any:
        """`build`'s answer, once the caller may list `resource`; with `cluster`, over what
        the views see of that cluster of a fleet."""
        self.require(who, Permission("list", resource, group))
        if cluster is None:
            return self.derived.answer(build.__name__, build, extra)

        def of_cluster(objects: views.Objects) -> Any:
            return build(views.in_cluster(objects, cluster))

        return self.derived.answer(f"{build.__name__}@{cluster}", of_cluster, extra)
