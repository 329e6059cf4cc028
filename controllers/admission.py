"""The admission webhook for workloads (every kind in `kinds`): one mutating webhook that
refuses a malformed GPU workload of a team with the reason and suspends a valid one on creation
(the workload loop admits it when the engine says); a kind that cannot be suspended (a
Deployment, a LeaderWorkerSet) has its pods held by a scheduling gate as they are created, and
a bare pod of a team is held by the gate as a workload of its own. Jobs are held by the API
server itself (gpufleet/kube/holding.py): only those it could not vouch for reach this webhook,
marked `gpufleet.io/check`, and are refused with the reason or passed with the mark taken off.
It reads the fleet the controller's watch caches hold: no API call on the admission path.

One webhook, not a validating and a mutating one: a mutating webhook may refuse, and every Job
create waits on each webhook in turn. It is served by a small aiohttp server of our own
(`AdmissionServer`, in the controller's webhook process: `admission_process`) rather than by
kopf's admission machinery, which diffs the whole Job to build each JSON patch: in a burst of
creates that diff cost more of the interpreter than everything else the answer needs. The patch
is written directly instead (`json_patch`).
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import ssl
import threading
import time
from pathlib import Path
from typing import Any, Protocol

from aiohttp import web

from gpufleet.kube.holding import CHECK_ANNOTATION, closest_priority_name, pointer_key
from gpufleet.kube.kinds.base import merge_patch, owner_kind
from gpufleet.kube.request import Request, RequestError, creation_patch, request_of
from gpufleet.model.fleet import Fleet
from gpufleet.model.keys import ADMISSION_GATE, WORKLOAD_LABEL
from gpufleet.render.kai import queue_name_for_team
from gpufleet.render.priorityclasses import RESERVED_CLASS, elastic_class_name

log = logging.getLogger("gpufleet.admission")
PATH = "/admit-jobs"  # the webhook configurations (dev and chart) call this path (every kind)
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
    return elastic_class_name(closest_priority_name(request.priority))


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


def json_patch(job: dict[str, Any], change: dict[str, Any]) -> list[dict[str, Any]]:
    """The JSON patch (RFC 6902) that applies the merge patch `change` to `job`, one `add` per
    changed top-level field of metadata and spec. `add` on an existing member replaces it, so
    each op carries the field's whole merged value and works whether the field exists or not."""
    ops: list[dict[str, Any]] = []
    for section in ("metadata", "spec"):
        current = job.get(section) or {}
        for field, value in (change.get(section) or {}).items():
            before = current.get(field)
            if isinstance(value, dict):
                after: Any = merge_patch(before if isinstance(before, dict) else {}, value)
            else:
                after = value
            if after != before:
                ops.append({"op": "add", "path": f"/{section}/{field}", "value": after})
    return ops


def gate_patch(pod: dict[str, Any]) -> list[dict[str, Any]]:
    """The JSON patch that holds a new pod of a gated kind (its workload label says which) with
    gpufleet's scheduling gate until the engine admits it; [] for any other pod."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    owners = (pod.get("metadata") or {}).get("ownerReferences") or []
    if WORKLOAD_LABEL not in labels or not any(o.get("controller") for o in owners):
        return []
    gates = (pod.get("spec") or {}).get("schedulingGates")
    if gates is None:
        return [{"op": "add", "path": "/spec/schedulingGates", "value": [{"name": ADMISSION_GATE}]}]
    if any(g.get("name") == ADMISSION_GATE for g in gates):
        return []
    return [{"op": "add", "path": "/spec/schedulingGates/-", "value": {"name": ADMISSION_GATE}}]


async def review(body: dict[str, Any]) -> dict[str, Any]:
    """The answer to one AdmissionReview of a workload's create: of any kind's object, a
    bare pod included, or of a pod of a gated kind's."""
    request = body.get("request") or {}
    response: dict[str, Any] = {"uid": request.get("uid", ""), "allowed": True}
    job = request.get("object") or {}
    is_pod = (request.get("kind") or {}).get("kind") == "Pod" or job.get("kind") == "Pod"
    if is_pod and owner_kind(job) is not None:
        ops = gate_patch(job)  # a pod of a gated kind
    else:
        if is_pod:  # a bare pod is a workload of its own (the review leaves out its kind)
            job = {**job, "apiVersion": "v1", "kind": "Pod"}
        user = (request.get("userInfo") or {}).get("username", "")
        ops = await _workload_ops(job, response, str(user))
    if ops:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(json.dumps(ops).encode()).decode()
    return {
        "apiVersion": body.get("apiVersion", "admission.k8s.io/v1"),
        "kind": "AdmissionReview",
        "response": response,
    }


async def _workload_ops(
    obj: dict[str, Any], response: dict[str, Any], user: str
) -> list[dict[str, Any]]:
    """The JSON patch of a workload's create by `user`; a refusal goes into `response`."""
    try:
        wanted, fleet = await request_with_grace(obj)
    except RequestError as err:
        log.info("refused: %s", err)
        response["allowed"] = False
        response["status"] = {"code": 422, "message": str(err)}
        return []
    if wanted is None:
        return []
    change = creation_patch(
        obj,
        wanted,
        priority_class_for(wanted),
        Admission.scheduler_name,
        queue_name_for_team(fleet, wanted.team),
        user,
    )
    ops = json_patch(obj, change)
    if CHECK_ANNOTATION in ((obj.get("metadata") or {}).get("annotations") or {}):
        # the holding policy's mark: checked now (after json_patch, which may rewrite the map)
        path = "/metadata/annotations/" + pointer_key(CHECK_ANNOTATION)
        ops.append({"op": "remove", "path": path})
    return ops


async def _handle(http: web.Request) -> web.Response:
    try:
        body = await http.json()
    except ValueError:
        return web.Response(status=400, text="the body is not an AdmissionReview (JSON)")
    return web.json_response(await review(body))


class AdmissionServer:
    """HTTPS server for the webhook on a thread and event loop of its own."""

    def __init__(self, host: str, port: int, certfile: Path, keyfile: Path) -> None:
        self.host, self.port = host, port
        self.tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.tls.load_cert_chain(str(certfile), str(keyfile))
        self.loop = asyncio.new_event_loop()
        self.runner: web.AppRunner | None = None
        self.thread = threading.Thread(
            target=self.loop.run_forever, name="gpufleet-webhook", daemon=True
        )

    def start(self, timeout: float = 30) -> None:
        """Serve; returns once the server listens (the webhook may then be registered)."""
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self._serve(), self.loop).result(timeout)
        log.info("webhook serving on %s:%d%s", self.host, self.port, PATH)

    async def _serve(self) -> None:
        app = web.Application()
        app.router.add_post(PATH, _handle)
        # no access log: a line per Job create costs more than the answer in a burst
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, self.host, self.port, ssl_context=self.tls)
        await site.start()

    def stop(self, timeout: float = 5) -> None:
        if self.runner is not None:
            asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(timeout)
        self.loop.call_soon_threadsafe(self.loop.stop)
