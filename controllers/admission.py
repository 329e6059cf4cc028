"""The admission webhook for Jobs: one mutating webhook that refuses a malformed GPU Job of a
team with the reason and suspends a valid one on creation (the workload loop admits it when the
engine says). It reads the fleet from the watch caches: no API call on the admission path.

One webhook, not a validating and a mutating one: a mutating webhook may refuse, and every Job
create waits on each webhook in turn. The handler is a coroutine so that kopf answers it on its
event loop instead of handing it to a thread pool (one GIL hand-off less per create).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Protocol

import kopf

from gpufleet.model.api import NAMED_PRIORITIES
from gpufleet.model.fleet import Fleet
from gpufleet.render.kai import queue_name_for_team
from gpufleet.render.priorityclasses import RESERVED_CLASS, elastic_class_name

from .jobs import Request, RequestError, creation_patch, request_of

FLEET_GRACE_S = 1.0  # how long admission waits for a GitOps object it has not seen yet


class FleetSource(Protocol):
    fleet_version: int

    def load_fleet(self) -> Fleet: ...


class Admission:
    """What the webhook needs from the running controller; set by the operator at startup."""

    source: FleetSource | None = None
    scheduler_name: str | None = None


def priority_class_for(request: Request) -> str:
    if request.workload_class == "reserved":
        return RESERVED_CLASS
    closest = min(
        NAMED_PRIORITIES,
        key=lambda n: (abs(NAMED_PRIORITIES[n] - request.priority), -NAMED_PRIORITIES[n]),
    )
    return elastic_class_name(closest)


async def request_with_grace(job: dict[str, Any]) -> tuple[Request | None, Fleet]:
    """The Job's request against the cached fleet. A Job may arrive a moment before the watch
    event of the Team or pool it names: a request the fleet refuses is asked again once the
    fleet's caches change, for up to a second, before the refusal stands."""
    source = Admission.source
    if source is None:
        return request_of(job, Fleet()), Fleet()
    deadline = time.monotonic() + FLEET_GRACE_S
    while True:
        version = source.fleet_version
        fleet = source.load_fleet()
        try:
            return request_of(job, fleet), fleet
        except RequestError:
            if time.monotonic() >= deadline:
                raise
            while source.fleet_version == version and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
                source.load_fleet()


@kopf.on.mutate("batch", "v1", "jobs", id="admit-jobs", operation="CREATE")
async def admit_job(body: kopf.Body, patch: kopf.Patch, **_: Any) -> None:
    job = dict(body)
    try:
        request, fleet = await request_with_grace(job)
    except RequestError as err:
        raise kopf.AdmissionError(str(err), code=422) from None
    if request is None:
        return
    change = creation_patch(
        job,
        request,
        priority_class_for(request),
        Admission.scheduler_name,
        queue_name_for_team(fleet, request.team),
    )
    patch.metadata["annotations"] = change["metadata"]["annotations"]
    patch.metadata["labels"] = change["metadata"]["labels"]
    patch.spec["suspend"] = True
    patch.spec["template"] = change["spec"]["template"]
