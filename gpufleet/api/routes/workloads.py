"""Workloads: the list (filtered, paged, only what the caller may see), one, why it is where it
is, their submission (as the caller) and cancellation."""

from __future__ import annotations

import asyncio
import base64
import bisect
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, HTTPException, Query, Request
from fastapi.responses import StreamingResponse

from gpufleet.api import models, views
from gpufleet.api.access import Caller, Permission
from gpufleet.api.context import PREFIX, ApiContext, InCluster, Refused, Who
from gpufleet.api.prometheus import MetricsUnavailable
from gpufleet.api.submission import manifest_of
from gpufleet.kube.kinds import kind_of, referred_to
from gpufleet.model.states import FINISHED_STATES
from gpufleet.model.suggest import did_you_mean

# a watch looks at the watch cache (in memory) this often, and says it is alive this often
WATCH_POLL_S = 0.25
KEEPALIVE_S = 5.0
States = Annotated[str | None, Query(description="One or more states, comma-separated.")]
Since = Annotated[
    str | None, Query(description="Finished workloads only if they ended within this, e.g. 48h.")
]
Search = Annotated[str | None, Query(description="A part of the name, in any case.")]


@dataclass(frozen=True)
class Filters:
    """The list's filters; the stats take the same."""

    namespace: str | None = None
    team: str | None = None
    submitter: Annotated[
        str | None, Query(description="Who created it, as the API server named them.")
    ] = None
    workload_class: Annotated[str | None, Query(alias="class")] = None
    state: States = None
    since: Since = None
    search: Search = None
    cluster: InCluster = None


Filtered = Annotated[Filters, Depends()]


def _name_key(w: models.Workload) -> tuple[str, str, str]:
    return (w.namespace, w.name, w.cluster or "")


def _encoded(key: tuple[str, str, str]) -> str:
    return base64.urlsafe_b64encode(json.dumps(key).encode()).decode().rstrip("=")


def _decoded(cursor: str) -> tuple[str, str, str]:
    try:
        key = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
        namespace, name, cluster = (str(part) for part in key)
    except (ValueError, TypeError):
        raise HTTPException(
            422, "cursor: not one this server gave; start again without it"
        ) from None
    return namespace, name, cluster


def _check_cluster(cluster: str | None, hub: bool, objects: views.Objects) -> None:
    """A submission names a cluster exactly where this is the hub's server, and one the hub
    has: 422 saying which, before anything is made."""
    if cluster is None:
        if hub:
            raise HTTPException(
                422,
                "cluster: needed on the hub's server: auto (the cluster that admits it "
                "soonest) or the name of one of its Clusters",
            )
        return
    if not hub:
        raise HTTPException(
            422,
            "cluster: only the hub's server (gpufleet server --fleet) sends work to a cluster; "
            "this one creates it here: leave cluster out, or ask the hub's server",
        )
    names = sorted(c["metadata"]["name"] for c in objects.clusters)
    if cluster != "auto" and cluster not in names:
        raise HTTPException(
            422,
            f"cluster {cluster}: no such Cluster in the hub{did_you_mean(cluster, names)}; use "
            f"auto or one of {', '.join(names) or '(none)'}",
        )


def router(ctx: ApiContext) -> APIRouter:
    routes = APIRouter(prefix=f"{PREFIX}/workloads", tags=["workloads"])

    def visible(
        namespace: str | None, who: Caller, every: list[models.Workload]
    ) -> frozenset[str] | None:
        """The namespaces a workload list may show the caller (None: all)."""
        if namespace:
            ctx.require(who, Permission("list", "gpuworkloads", namespace=namespace))
            return frozenset([namespace])
        cluster_wide = Permission("list", "gpuworkloads")
        if ctx.allows(who, cluster_wide):
            return None
        allowed = ctx.allowed_namespaces(who, "list", "gpuworkloads", {w.namespace for w in every})
        if not allowed:
            ctx.require(who, cluster_wide)  # raises 403 naming the permission
        return allowed

    def matching(who: Caller, asked: Filters) -> list[models.Workload]:
        every = ctx.derived.all_workloads()
        try:
            chosen = views.WorkloadFilter.parsed(
                visible(asked.namespace, who, every), asked.team, asked.workload_class,
                asked.state, asked.since, asked.search, asked.cluster, asked.submitter,
            )  # fmt: skip
        except ValueError as err:
            raise HTTPException(422, str(err)) from None
        now = ctx.clock()
        return [w for w in every if chosen.keeps(w, now)]

    @routes.get("", response_model=models.Page[models.Workload])
    def workloads(
        who: Who,
        asked: Filtered,
        order: Annotated[
            Literal["queue", "name"],
            Query(
                description="queue: waiting ones first, in queue order (offset paging); "
                "name: by namespace and name, with a cursor to each next page."
            ),
        ] = "queue",
        cursor: Annotated[
            str | None,
            Query(
                description="The `next` of the page before (implies order=name): a workload "
                "there from the first page to the last is listed exactly once, however "
                "states change meanwhile."
            ),
        ] = None,
        limit: Annotated[int, Query(ge=1, le=10_000)] = 500,
        offset: Annotated[int, Query(ge=0)] = 0,
    ) -> models.Page[models.Workload]:
        """Workloads, waiting ones first in queue order (or by name, page by page with a
        cursor). Needs: list gpuworkloads, in the namespace asked for, or cluster-wide; without
        either, only the namespaces where the caller may list them are shown."""
        matched = matching(who, asked)
        if cursor is None and order == "queue":
            return models.Page[models.Workload](
                items=matched[offset : offset + limit], total=len(matched), offset=offset
            )
        matched.sort(key=_name_key)
        after = _decoded(cursor) if cursor else None
        start = bisect.bisect_right(matched, after, key=_name_key) if after else offset
        page = matched[start : start + limit]
        more = start + limit < len(matched)
        return models.Page[models.Workload](
            items=page,
            total=len(matched),
            offset=start,
            next=_encoded(_name_key(page[-1])) if more and page else None,
        )

    @routes.get("/stats", response_model=models.WorkloadStats)
    def stats(who: Who, asked: Filtered) -> models.WorkloadStats:
        """Counts by state, team and class, and GPU-hours, of the workloads the same filters as
        the list keep. Needs: as the list."""
        matched = matching(who, asked)
        return views.stats(matched, ctx.clock())

    @routes.post("", status_code=201, response_model=models.Submitted)
    def submit(body: models.Submission, who: Who) -> models.Submitted:
        """Create a workload in `namespace` as the caller: the API server's impersonation, so
        the cluster's RBAC, quotas and admission judge the caller, not this server, and its
        audit log names them. Send a full manifest, or the short form (a batch/v1 Job built from
        name, team, class, gpus, pods, image, command, env, as `gpufleet submit` builds it).
        Needs: create on the kind in that namespace (e.g. jobs.batch), checked by the API
        server; a refusal answers with its status and reason. 201 with what was created; its
        GPU workload appears once the controller has decided about it."""
        if ctx.actions is None:
            raise HTTPException(405, "this server is read-only")
        objects = ctx.source.objects()
        _check_cluster(body.cluster, ctx.hub, objects)
        templates = {t.name: t for t in views.templates(objects)}
        try:
            obj = manifest_of(body, templates)
        except ValueError as err:
            raise HTTPException(422, str(err)) from None
        kind = kind_of(obj)
        assert kind is not None
        namespace = body.namespace
        caller = None if ctx.access.insecure_local else who
        try:
            created = ctx.actions.create(obj, namespace, caller, body.dry_run)
        except Refused as err:
            raise HTTPException(err.status, err.message) from None
        meta = created.get("metadata") or {}
        name = meta.get("name") or obj["metadata"].get("name", "")
        return models.Submitted(
            namespace=namespace,
            name=name,
            kind=kind.kind,
            uid=None if body.dry_run else meta.get("uid"),
            workload=kind.workload_name(name),
            created_by=who.user if caller else f"this server (--insecure-local; {who.user})",
            dry_run=body.dry_run,
            manifest=obj,
        )

    def one(
        namespace: str, name: str, who: Caller, cluster: str | None, verb: str = "get"
    ) -> dict[str, Any]:
        ctx.require(who, Permission(verb, "gpuworkloads", namespace=namespace))
        try:
            found = ctx.source.workload_object(namespace, name, cluster)
        except LookupError as err:  # a fleet's workload of one name in several clusters
            raise HTTPException(409, str(err)) from None
        if found is None:
            where = f" in cluster {cluster}" if cluster else ""
            raise HTTPException(404, f"no GPU workload {namespace}/{name}{where}")
        return found

    @routes.get("/{namespace}/{name}", response_model=models.Workload)
    def workload(namespace: str, name: str, who: Who, cluster: InCluster = None) -> models.Workload:
        """One workload. Needs: get gpuworkloads in its namespace."""
        return views.workload(one(namespace, name, who, cluster))

    @routes.get("/{namespace}/{name}/explain", response_model=models.Explanation)
    def explain(
        namespace: str, name: str, who: Who, cluster: InCluster = None
    ) -> models.Explanation:
        """Where a workload is and why, in plain words (as `gpufleet workloads explain`).
        Needs: get gpuworkloads in its namespace."""
        found = views.workload(one(namespace, name, who, cluster))
        return models.Explanation(workload=found, text=views.explain(found))

    @routes.get("/{namespace}/{name}/events", response_model=list[models.Event])
    def workload_events(
        namespace: str, name: str, who: Who, cluster: InCluster = None
    ) -> list[models.Event]:
        """The Kubernetes Events of a workload, oldest first: of its GPUWorkload (admitted,
        preempted, requeued...), of the object it stands for and of its pods that still exist
        (scheduled, pulled, evicted...). Events last an hour in most clusters. Needs: get
        gpuworkloads and list events in its namespace."""
        found = one(namespace, name, who, cluster)
        ctx.require(who, Permission("list", "events", "", namespace))
        about = views.involved(found, ctx.source.objects().pods)
        return views.events(ctx.source.events(namespace, views.cluster_of(found)), about)

    @routes.get("/{namespace}/{name}/metrics", response_model=models.WorkloadMetrics)
    def workload_metrics(
        namespace: str,
        name: str,
        who: Who,
        cluster: InCluster = None,
        points: Annotated[int, Query(ge=2, le=2_000, description="About this many.")] = 240,
    ) -> models.WorkloadMetrics:
        """Its GPUs over its current or last run: utilisation and GPU Usage (0-1, the mean of
        its GPUs), memory used and in all, from the gpufleet agents' metrics in the Prometheus
        of --prometheus. `exact` is false where its pods shared their nodes: the figures are
        then of every GPU of its nodes. Needs: get gpuworkloads in its namespace."""
        found = one(namespace, name, who, cluster)
        if ctx.prometheus is None:
            raise HTTPException(
                404,
                "this server reads no metrics: start gpufleet server with --prometheus URL "
                "(a Prometheus that scrapes the gpufleet agents)",
            )
        view = views.workload(found)
        where = views.cluster_of(found)
        node_gpus = views.node_gpus(
            n for n in ctx.source.objects().nodes if views.cluster_of(n) == where
        )
        plan = views.metrics_plan(view, node_gpus, ctx.clock(), points)
        if plan is None:
            raise HTTPException(
                409, f"{namespace}/{name} has not run yet ({view.state}): it has no GPU metrics"
            )
        try:
            series = ctx.prometheus.each_series(plan.queries, plan.start, plan.end, plan.step_s)
        except MetricsUnavailable as err:
            raise HTTPException(503, str(err)) from None
        return views.workload_metrics(view, plan, series)

    @routes.get(
        "/{namespace}/{name}/watch",
        response_class=StreamingResponse,
        responses={200: {"content": {"text/event-stream": {}}}},
    )
    def watch(
        namespace: str, name: str, who: Who, request: Request, cluster: InCluster = None
    ) -> StreamingResponse:
        """One workload as it changes, as server-sent events: `event: workload` with the
        workload (as GET gives it) at once and at each change, `event: finished` once it is
        Completed, Failed or Cancelled, after which the stream ends; a comment every
        KEEPALIVE_S seconds meanwhile. A workload the controller has not recorded yet is
        waited for. Needs: get gpuworkloads in its namespace."""
        ctx.require(who, Permission("get", "gpuworkloads", namespace=namespace))

        async def changes() -> AsyncIterator[str]:
            last: str | None = None
            quiet = 0.0
            while not await request.is_disconnected():
                try:
                    found = ctx.source.workload_object(namespace, name, cluster)
                except LookupError as err:  # one name in several clusters of a fleet
                    yield f"event: error\ndata: {json.dumps(str(err))}\n\n"
                    return
                seen = (found or {}).get("metadata", {}).get("resourceVersion")
                if found is not None and seen != last:
                    last, quiet = seen, 0.0
                    view = views.workload(found)
                    yield f"event: workload\ndata: {view.model_dump_json(by_alias=True)}\n\n"
                    if view.state in FINISHED_STATES:
                        yield "event: finished\ndata: {}\n\n"
                        return
                elif quiet >= KEEPALIVE_S:
                    quiet = 0.0
                    yield ": still waiting\n\n"
                await asyncio.sleep(WATCH_POLL_S)
                quiet += WATCH_POLL_S

        return StreamingResponse(changes(), media_type="text/event-stream")

    @routes.post("/{namespace}/{name}/cancel", response_model=models.Done)
    def cancel(namespace: str, name: str, who: Who) -> models.Done:
        """Cancel a workload: its Job (or other owner) is deleted, its pods stop.
        Needs: delete gpuworkloads in its namespace, and delete on the kind it stands for
        (jobs.batch, pods, ...) there: the server deletes nothing its caller could not."""
        found = one(namespace, name, who, None, "delete")
        target = referred_to(found)
        if target is not None:
            kind = target[0]
            ctx.require(who, Permission("delete", kind.plural, kind.group, namespace))
        return ctx.write(lambda writes: writes.cancel(found))

    return routes
