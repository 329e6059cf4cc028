"""GPU hosts outside Kubernetes: their standalone agents' reports in (each host with a token
that may update its own GPUHost), and the hosts out, with their newest report's series."""

from __future__ import annotations

import json
import re
import zlib
from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, Request
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool

from gpufleet.api import models, views
from gpufleet.api.access import Permission
from gpufleet.api.context import PREFIX, ApiContext, Refused, Who
from gpufleet.hosts.status import Report
from gpufleet.model.api import NAME_PATTERN

MAX_BODY = 64 * 1024 * 1024  # a report batch, once unzipped: 100 reports of a busy host


def body_of(raw: bytes, encoding: str | None) -> bytes:
    """The request's body, unzipped when sent with gzip (bounded: a small zip must not unpack
    into gigabytes)."""
    if (encoding or "").lower() != "gzip":
        return raw
    unzip = zlib.decompressobj(wbits=31)
    try:
        body = unzip.decompress(raw, MAX_BODY)
    except zlib.error as err:
        raise HTTPException(400, f"the body is not gzip: {err}") from None
    if unzip.unconsumed_tail:
        raise HTTPException(413, f"the unzipped body is over {MAX_BODY // 2**20} MiB")
    return body


def router(ctx: ApiContext) -> APIRouter:
    routes = APIRouter(prefix=PREFIX, tags=["hosts"])

    @routes.get("/hosts", response_model=list[models.Host])
    def hosts(who: Who) -> list[models.Host]:
        """GPU hosts outside Kubernetes, as their standalone agents last reported them.
        Needs: list gpuhosts."""
        ctx.require(who, Permission("list", "gpuhosts"))
        # built at each call (a host reports every few seconds; there are few hosts)
        return views.hosts(views.Objects(hosts=ctx.source.hosts()), ctx.clock())

    @routes.get("/hosts/{name}", response_model=models.Host)
    def host(name: str, who: Who) -> models.Host:
        """One GPU host: its GPUs, processes, services and GPU-hours. Needs: list gpuhosts."""
        for found in hosts(who):
            if found.name == name:
                return found
        raise HTTPException(404, f"no GPU host {name}: has its agent reported to this server?")

    @routes.get("/hosts/{name}/metrics", response_model=models.HostMetrics)
    def host_metrics(
        name: str,
        who: Who,
        service: Annotated[str | None, Query(description="Only this service_name's.")] = None,
        prefix: Annotated[str | None, Query(description="Only names starting so.")] = None,
    ) -> models.HostMetrics:
        """The series of the host's newest report this server took: the agent's GPU, process
        and host metrics and its programs' OTLP metrics (labelled service_name). Needs: get
        gpuhosts."""
        ctx.require(who, Permission("get", "gpuhosts", name=name))
        held = ctx.hosts.latest(name) if ctx.hosts is not None else None
        if held is None:
            raise HTTPException(
                404, f"no report of host {name} reached this server since it started"
            )
        return views.host_metrics(name, held[0], held[1], service, prefix)

    @routes.post("/hosts/{name}/reports", response_model=models.HostReportsTaken)
    async def reports(name: str, request: Request, who: Who) -> models.HostReportsTaken:
        """A standalone agent's reports (`gpufleet agent standalone --server`): its buffer's id
        and its oldest reports, each the agent's /metrics text with its sequence. Each is taken
        once; the GPUHost is made on the first. Body: JSON, gzip or not. Needs: update
        gpuhosts of that name (`gpufleet hosts token NAME` makes such a token)."""
        if not re.fullmatch(NAME_PATTERN, name) or len(name) > 253:
            raise HTTPException(
                422,
                f"host name {name!r}: use lower-case letters, digits, '-' and '.' "
                "(a Kubernetes object name); set --host-name on the agent",
            )
        # the right first: a caller that may not report reads no body of megabytes
        await run_in_threadpool(ctx.require, who, Permission("update", "gpuhosts", name=name))
        raw = await request.body()
        body = body_of(raw, request.headers.get("content-encoding"))
        try:
            batch = models.HostReports.model_validate(json.loads(body))
        except (ValueError, ValidationError) as err:
            raise HTTPException(422, f"not a batch of reports: {err}") from None
        return await run_in_threadpool(take, name, batch)

    def take(name: str, batch: models.HostReports) -> models.HostReportsTaken:
        if ctx.hosts is None:
            raise HTTPException(405, "this server takes no reports of hosts (read-only)")
        reports = [
            Report(batch.agent, r.sequence, _aware(r.time), r.interval, r.metrics)
            for r in batch.reports
        ]
        try:
            applied = ctx.hosts.take(name, reports, batch.agent_version, ctx.clock())
        except Refused as err:
            raise HTTPException(err.status, str(err)) from None
        return models.HostReportsTaken(
            accepted=applied.accepted,
            duplicates=applied.duplicates,
            last_sequence=applied.status.get("lastSequence", 0),
            drain=applied.drain,
        )

    return routes


def _aware(at: datetime) -> datetime:
    return at if at.tzinfo else at.replace(tzinfo=UTC)
