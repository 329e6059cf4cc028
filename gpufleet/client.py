"""The Python SDK of `gpufleet server`: typed answers (the server's own pydantic models), sync
(`Client`) and async (`AsyncClient`).

    from gpufleet.client import Client

    fleet = Client("http://127.0.0.1:8090", token=TOKEN)   # or Client.from_kubeconfig(URL)
    for pool in fleet.capacity().pools:
        print(pool.pool, pool.idle_gpus, pool.idle_cost_per_hour)
    for w in fleet.workloads(team="nlp", state="Pending,Preempted").items:
        print(w.name, w.reason, w.position, w.eta)

    job = fleet.submit_job("nlp", name="sweep-1", team="nlp", image="ghcr.io/me/train:1",
                           gpus=8, command=["python", "train.py"])   # created as you
    done = fleet.wait_for_completion("nlp", job.workload, timeout=3600)
    print(done.state)                                   # Completed, Failed or Cancelled
    fleet.run("./my-project", team="nlp", registry="ghcr.io/me")   # as `gpufleet run`

Errors are `ApiError`s, one subclass per kind: Unauthorized, Forbidden, NotFound, Conflict,
Invalid, Unavailable, Timeout.
"""

from __future__ import annotations

import asyncio
import functools
import os
import ssl
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Generic, Self, TypeVar

import httpx
from pydantic import TypeAdapter

from gpufleet import __version__
from gpufleet.api import models
from gpufleet.model.keys import WRITE_HEADER

T = TypeVar("T")
PREFIX = "/api/v1"


class ApiError(Exception):
    """An answer other than 2xx: `status` (401, 403, 404, 409, ...), the server's message, and
    for 403 the permission that is missing. Each status has its subclass below."""

    def __init__(self, status: int, message: str, missing: dict[str, Any] | None = None) -> None:
        super().__init__(f"{status}: {message}")
        self.status, self.message, self.missing = status, message, missing


class Unauthorized(ApiError):
    """401: no token, or one the cluster did not accept."""


class Forbidden(ApiError):
    """403: the caller may not (`missing` names the permission where the server checked it;
    else the message is the API server's reason)."""


class NotFound(ApiError):
    """404: no such workload, node, namespace or kind."""


class Conflict(ApiError):
    """409: it exists already, or cannot be done as asked."""


class Invalid(ApiError):
    """400 or 422: the request is wrong; the message says which field and why."""


class Unavailable(ApiError):
    """The server, or the cluster behind it, did not answer (5xx, or no connection: status 0)."""


class Timeout(ApiError):
    """A wait ran out (`wait_for_completion`); status 0. `workload`: how it was last seen."""

    def __init__(self, message: str, workload: models.Workload | None = None) -> None:
        super().__init__(0, message)
        self.workload = workload


_ERRORS: dict[int, type[ApiError]] = {401: Unauthorized, 403: Forbidden, 404: NotFound,
                                      409: Conflict, 400: Invalid, 422: Invalid}  # fmt: skip
FINISHED = frozenset({"Completed", "Failed", "Cancelled"})
WATCH_KEEPALIVE_S = 5.0  # the server's (routes/workloads.py KEEPALIVE_S)


def _error(status: int, message: str, missing: dict[str, Any] | None = None) -> ApiError:
    kind = _ERRORS.get(status, Unavailable if status >= 500 else ApiError)
    return kind(status, message, missing)


@dataclass(frozen=True)
class _Call(Generic[T]):
    method: str
    path: str
    answer: TypeAdapter[T]
    params: dict[str, Any] = field(default_factory=dict)
    body: dict[str, Any] | None = None

    def read(self, response: httpx.Response) -> T:
        if response.is_success:
            return self.answer.validate_python(response.json())
        try:
            detail = response.json().get("detail")
        except ValueError:
            detail = response.text
        status = response.status_code
        if isinstance(detail, dict):
            raise _error(status, str(detail.get("message")), detail.get("missing"))
        if isinstance(detail, list):  # the API's own validation: each field and what is wrong
            detail = "; ".join(
                f"{'.'.join(str(p) for p in d.get('loc', ())[1:])}: {d.get('msg')}"
                for d in detail
                if isinstance(d, dict)
            )
        raise _error(status, str(detail))


def _unavailable(err: httpx.HTTPError, url: str) -> Unavailable:
    return Unavailable(0, f"{url} did not answer: {err}")


@functools.cache
def _adapter(answer: Any) -> TypeAdapter[Any]:
    """One validator per answer type (building one costs far more than a call)."""
    return TypeAdapter(answer)


def _get(path: str, answer: Any, **params: Any) -> _Call[Any]:
    """A GET of `path` under /api/v1; parameters left unset are not sent."""
    sent = {k: v for k, v in params.items() if v is not None and v is not False}
    return _Call("GET", f"{PREFIX}/{path}", _adapter(answer), sent)


def _post(path: str) -> _Call[models.Done]:
    return _Call("POST", f"{PREFIX}/{path}", _adapter(models.Done))


def _submission(namespace: str, manifest: dict[str, Any] | None, **fields: Any) -> dict[str, Any]:
    """The body of POST /workloads: the fields given (None, False or empty: not sent)."""
    body: dict[str, Any] = {"namespace": namespace}
    if manifest is not None:
        body["manifest"] = manifest
    names = {"workload_class": "class", "external_id": "externalId", "run_for": "runFor",
             "dry_run": "dryRun", "gpu_types": "gpuTypes"}  # fmt: skip
    body.update({names.get(k, k): v for k, v in fields.items() if v is not None and v is not False
                 and v != [] and v != {}})  # fmt: skip
    return body


def _filters(given: dict[str, Any]) -> dict[str, Any]:
    """The list filters as the API names them."""
    return {("class" if k == "workload_class" else k): v for k, v in given.items()}


class _Waiting:
    """One wait for a workload to finish: what each look at it means."""

    def __init__(
        self,
        namespace: str,
        name: str,
        timeout: float | None,
        progress: Callable[[models.Workload], None] | None,
    ) -> None:
        self.what = f"{namespace}/{name}"
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self.progress = progress
        self.last: models.Workload | None = None

    def seen(self, workload: models.Workload | None) -> models.Workload | None:
        """The workload once finished; None: watch on. Timeout when the time is up. A
        workload not there yet is one the controller has not recorded yet."""
        if workload is not None:
            if self.progress and (self.last is None or workload.state != self.last.state):
                self.progress(workload)
            self.last = workload
            if workload.state in FINISHED:
                return workload
        if self.deadline is not None and time.monotonic() >= self.deadline:
            state = self.last.state if self.last else "not recorded by the controller yet"
            raise Timeout(f"{self.what} did not finish in time (last seen: {state})", self.last)
        return None

    def read_timeout(self) -> float:
        """How long one read of the watch may wait: past the deadline, or past twice the
        server's keep-alive (a connection that went quiet), it is given up and looked at."""
        longest = 2 * WATCH_KEEPALIVE_S
        if self.deadline is None:
            return longest
        return max(0.05, min(longest, self.deadline - time.monotonic()))

    def event(self, line: str) -> models.Workload | None:
        """One line of the watch's server-sent events: the workload of a `data:` line of a
        `workload` event (the only data the watch sends but `{}` after `finished`)."""
        if line.startswith("data:") and line != "data: {}":
            found: models.Workload = _adapter(models.Workload).validate_json(
                line.removeprefix("data:").strip()
            )
            return found
        if line.startswith("event: error"):
            raise Conflict(409, f"{self.what}: in several clusters of the fleet: name one")
        return None

    def path(self) -> str:
        return f"{PREFIX}/workloads/{self.what}/watch"


@dataclass(frozen=True)
class RunOutcome:
    """What `run` did: the image it pushed (by digest) and the workload it submitted."""

    image: str
    built: bool  # False: an image of the same inputs was pushed before, and is used
    bytes_pushed: int
    submitted: models.Submitted


@dataclass(frozen=True)
class _Run:
    """A project's run, prepared: settings merged, plan made, files listed."""

    root: Path
    config: Any  # RunConfig
    plan: Any  # RunPlan
    files: list[str]
    target: Any  # Reference

    @classmethod
    def of(cls, path: Path | str, profile: str | None, given: dict[str, Any]) -> _Run:
        from gpufleet.image.layers import project_files
        from gpufleet.image.reference import repository_in
        from gpufleet.project.config import (
            load_project_config,
            load_user_config,
            merged,
            profile_of,
        )
        from gpufleet.project.detect import ProjectError, detect
        from gpufleet.project.plan import plan

        root = Path(path).resolve()
        config = merged(load_project_config(root), profile_of(load_user_config(), profile), given)
        if not config.team:
            raise ProjectError("no team: pass team=..., or set team: in .gpufleet.yaml")
        if not config.registry:
            raise ProjectError("no registry: pass registry=..., or set registry: in the config")
        chosen = plan(detect(root, config.entrypoint), config)
        files = project_files(root, config.ignore)
        if not files:
            raise ProjectError(f"{root}: no files to put in the image (all ignored?)")
        return cls(root, config, chosen, files, repository_in(config.registry, chosen.name))

    def namespaced(self, teams: list[models.Team]) -> _Run:
        """With the team's first namespace (as `gpufleet run` chooses where none is given)."""
        found = [t.namespaces for t in teams if t.name == self.config.team]
        namespace = found[0][0] if found and found[0] else "default"
        return replace(self, config=self.config.model_copy(update={"namespace": namespace}))

    def workload(self, image: str) -> dict[str, Any]:
        from gpufleet.kube.manifests import run_workload

        return run_workload(self.plan, self.config, image, os.environ)[0]

    def push(self, progress: Any, no_cache: bool, platform: str) -> Any:
        from gpufleet.image.build import build_and_push

        report = progress or (lambda *_: None)
        return build_and_push(
            self.plan, self.root, self.files, self.target, report, no_cache, platform
        )

    def outcome(self, pushed: Any, submitted: models.Submitted) -> RunOutcome:
        return RunOutcome(str(pushed.reference), not pushed.skipped, pushed.bytes_sent, submitted)


class _Routes:
    """Every call of the API, once: the clients below only send them."""

    whoami: _Call[models.Identity] = _get("whoami", models.Identity)
    status: _Call[models.Status] = _get("status", models.Status)
    capacity: _Call[models.Capacity] = _get("capacity", models.Capacity)
    pools: _Call[list[models.Pool]] = _get("pools", list[models.Pool])
    teams: _Call[list[models.Team]] = _get("teams", list[models.Team])
    reservations: _Call[list[models.Reservation]] = _get("reservations", list[models.Reservation])
    nodes: _Call[list[models.Node]] = _get("nodes", list[models.Node])

    health: _Call[models.Health] = _get("health", models.Health)
    clusters: _Call[models.Clusters] = _get("clusters", models.Clusters)
    templates: _Call[list[models.Template]] = _get("templates", list[models.Template])
    hosts: _Call[list[models.Host]] = _get("hosts", list[models.Host])

    @staticmethod
    def host(name: str) -> _Call[models.Host]:
        return _get(f"hosts/{name}", models.Host)

    @staticmethod
    def host_metrics(
        name: str, service: str | None, prefix: str | None
    ) -> _Call[models.HostMetrics]:
        return _get(f"hosts/{name}/metrics", models.HostMetrics, service=service, prefix=prefix)

    @staticmethod
    def workloads(
        limit: int, offset: int, order: str | None, cursor: str | None, filters: dict[str, Any]
    ) -> _Call[models.Page[models.Workload]]:
        return _get("workloads", models.Page[models.Workload], limit=limit, offset=offset,
                    order=order, cursor=cursor, **_filters(filters))  # fmt: skip

    @staticmethod
    def stats(filters: dict[str, Any]) -> _Call[models.WorkloadStats]:
        return _get("workloads/stats", models.WorkloadStats, **_filters(filters))

    @staticmethod
    def team(name: str) -> _Call[models.Team]:
        return _get(f"teams/{name}", models.Team)

    @staticmethod
    def workload(namespace: str, name: str) -> _Call[models.Workload]:
        return _get(f"workloads/{namespace}/{name}", models.Workload)

    @staticmethod
    def explain(namespace: str, name: str) -> _Call[models.Explanation]:
        return _get(f"workloads/{namespace}/{name}/explain", models.Explanation)

    @staticmethod
    def events(namespace: str, name: str) -> _Call[list[models.Event]]:
        return _get(f"workloads/{namespace}/{name}/events", list[models.Event])

    @staticmethod
    def metrics(namespace: str, name: str, points: int) -> _Call[models.WorkloadMetrics]:
        return _get(f"workloads/{namespace}/{name}/metrics", models.WorkloadMetrics,
                    points=points)  # fmt: skip

    @staticmethod
    def cancel(namespace: str, name: str) -> _Call[models.Done]:
        return _post(f"workloads/{namespace}/{name}/cancel")

    @staticmethod
    def release_node(name: str) -> _Call[models.Done]:
        return _post(f"nodes/{name}/release")

    @staticmethod
    def submit(body: dict[str, Any]) -> _Call[models.Submitted]:
        return _Call("POST", f"{PREFIX}/workloads", _adapter(models.Submitted), body=body)

    @staticmethod
    def report(
        path: str, since: str | None, until: str | None, by: list[str] | None, **flags: Any
    ) -> _Call[dict[str, Any]]:
        return _get(path, dict[str, Any], since=since, until=until, by=by or None, **flags)


def token_from_kubeconfig(kubeconfig: Path | str | None = None, context: str | None = None) -> str:
    """The bearer token of the kubeconfig's user (a token or an exec plugin's)."""
    from kubernetes import client, config

    configuration = client.Configuration()
    config.load_kube_config(
        str(kubeconfig) if kubeconfig else None, context, client_configuration=configuration
    )
    header = str((configuration.api_key or {}).get("authorization", ""))
    token = header.removeprefix("Bearer ").strip()
    if not token:
        raise ValueError(
            "the kubeconfig's user has no bearer token (client certificates cannot be passed "
            "on): give token=..., e.g. from `kubectl create token NAME`"
        )
    return token


SERVER_ENV, TOKEN_ENV, CA_ENV = "GPUFLEET_SERVER", "GPUFLEET_TOKEN", "GPUFLEET_CA_CERT"


def _verify(ca_cert: str | Path | None) -> ssl.SSLContext | bool:
    """What httpx checks the server's certificate with: the system's CAs, or `ca_cert`'s."""
    return ssl.create_default_context(cafile=str(ca_cert)) if ca_cert else True


class _Base:
    def __init__(
        self, url: str, token: str | None, timeout: float, ca_cert: str | Path | None = None
    ) -> None:
        self.url = url.rstrip("/")
        self.headers = {WRITE_HEADER: f"gpufleet-sdk/{__version__}"}
        if token:
            self.headers["Authorization"] = f"Bearer {token}"
        self.timeout = timeout
        self.verify = _verify(ca_cert)

    @classmethod
    def from_kubeconfig(
        cls, url: str, kubeconfig: Path | str | None = None, context: str | None = None
    ) -> Self:
        """A client with the bearer token of the kubeconfig's user."""
        return cls(url, token_from_kubeconfig(kubeconfig, context), 30.0)

    @classmethod
    def from_config(cls, profile: str | None = None, timeout: float = 30.0) -> Self:
        """A client of the server $GPUFLEET_SERVER names (with $GPUFLEET_TOKEN and
        $GPUFLEET_CA_CERT), else of the profile `gpufleet login` saved (`profile`, else
        $GPUFLEET_PROFILE, else the current one): its token, else its kubeconfig's user's.
        ValueError saying what to do when there is neither."""
        from gpufleet.project.config import load_user_config, profile_of

        url = os.environ.get(SERVER_ENV)
        if url:
            return cls(url, os.environ.get(TOKEN_ENV), timeout, os.environ.get(CA_ENV))
        chosen = profile_of(load_user_config(), profile)
        if not chosen.server:
            raise ValueError(
                f"no gpufleet server: run `gpufleet login URL`, or set {SERVER_ENV} (and "
                f"{TOKEN_ENV})"
            )
        token = chosen.token
        if token is None and chosen.kubeconfig:
            token = token_from_kubeconfig(chosen.kubeconfig)
        return cls(chosen.server, token, timeout, chosen.ca_cert)


class Client(_Base):
    """Blocking client; `with Client(...) as fleet:` closes its connections."""

    def __init__(
        self,
        url: str,
        token: str | None = None,
        timeout: float = 30.0,
        ca_cert: str | Path | None = None,
    ) -> None:
        super().__init__(url, token, timeout, ca_cert)
        self.http = httpx.Client(
            base_url=self.url, headers=self.headers, timeout=timeout, verify=self.verify
        )

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        self.http.close()

    def _run(self, call: _Call[T]) -> T:
        try:
            sent = self.http.request(call.method, call.path, params=call.params, json=call.body)
        except httpx.HTTPError as err:
            raise _unavailable(err, self.url) from None
        return call.read(sent)

    def whoami(self) -> models.Identity:
        return self._run(_Routes.whoami)

    def status(self) -> models.Status:
        return self._run(_Routes.status)

    def capacity(self) -> models.Capacity:
        return self._run(_Routes.capacity)

    def pools(self) -> list[models.Pool]:
        return self._run(_Routes.pools)

    def teams(self) -> list[models.Team]:
        return self._run(_Routes.teams)

    def reservations(self) -> list[models.Reservation]:
        return self._run(_Routes.reservations)

    def nodes(self) -> list[models.Node]:
        return self._run(_Routes.nodes)

    def hosts(self) -> list[models.Host]:
        """GPU hosts outside Kubernetes, as their standalone agents last reported them."""
        return self._run(_Routes.hosts)

    def host(self, name: str) -> models.Host:
        return self._run(_Routes.host(name))

    def host_metrics(
        self, name: str, service: str | None = None, prefix: str | None = None
    ) -> models.HostMetrics:
        """The series of the host's newest report (of one OTLP `service`, or names starting
        with `prefix`)."""
        return self._run(_Routes.host_metrics(name, service, prefix))

    def workloads(
        self,
        namespace: str | None = None,
        team: str | None = None,
        workload_class: str | None = None,
        state: str | None = None,
        since: str | None = None,
        limit: int = 500,
        offset: int = 0,
        *,
        search: str | None = None,
        cluster: str | None = None,
        submitter: str | None = None,
        order: str | None = None,
        cursor: str | None = None,
    ) -> models.Page[models.Workload]:
        """One page: waiting ones first in queue order (offset paging), or with
        order="name" by namespace and name, `next` the cursor of the page after."""
        filters = dict(namespace=namespace, team=team, workload_class=workload_class,
                       state=state, since=since, search=search, cluster=cluster,
                       submitter=submitter)  # fmt: skip
        return self._run(_Routes.workloads(limit, offset, order, cursor, filters))

    def iter_workloads(
        self,
        namespace: str | None = None,
        team: str | None = None,
        workload_class: str | None = None,
        state: str | None = None,
        since: str | None = None,
        *,
        search: str | None = None,
        cluster: str | None = None,
        submitter: str | None = None,
        page_size: int = 500,
    ) -> Iterator[models.Workload]:
        """Every matching workload, by namespace and name, a page at a time: one there from
        the first page to the last comes exactly once, however states change meanwhile."""
        filters = dict(namespace=namespace, team=team, workload_class=workload_class,
                       state=state, since=since, search=search, cluster=cluster,
                       submitter=submitter)  # fmt: skip
        cursor = None
        while True:
            page = self._run(_Routes.workloads(page_size, 0, "name", cursor, filters))
            yield from page.items
            if page.next is None:
                return
            cursor = page.next

    def search_workloads(self, text: str, **filters: Any) -> list[models.Workload]:
        """The workloads whose name holds `text` (any case), with `iter_workloads`' filters."""
        return list(self.iter_workloads(search=text, **filters))

    def workload_stats(
        self,
        namespace: str | None = None,
        team: str | None = None,
        workload_class: str | None = None,
        state: str | None = None,
        since: str | None = None,
        *,
        search: str | None = None,
        cluster: str | None = None,
        submitter: str | None = None,
    ) -> models.WorkloadStats:
        """Counts by state, team and class, and GPU-hours, of the matching workloads."""
        filters = dict(namespace=namespace, team=team, workload_class=workload_class,
                       state=state, since=since, search=search, cluster=cluster,
                       submitter=submitter)  # fmt: skip
        return self._run(_Routes.stats(filters))

    def team(self, name: str) -> models.Team:
        return self._run(_Routes.team(name))

    def health(self) -> models.Health:
        return self._run(_Routes.health)

    def clusters(self) -> models.Clusters:
        """The clusters of a fleet, as its hub saw each (a hub's server; else none)."""
        return self._run(_Routes.clusters)

    def templates(self) -> list[models.Template]:
        """The WorkloadTemplates `submit_job(template=...)` may start from."""
        return self._run(_Routes.templates)

    # the names of the product brief
    list_teams = teams
    get_team = team
    list_reservations = reservations
    get_capacity = capacity

    def workload(self, namespace: str, name: str) -> models.Workload:
        return self._run(_Routes.workload(namespace, name))

    def explain(self, namespace: str, name: str) -> models.Explanation:
        return self._run(_Routes.explain(namespace, name))

    def workload_events(self, namespace: str, name: str) -> list[models.Event]:
        """The workload's Kubernetes Events, oldest first (its own, its object's, its pods')."""
        return self._run(_Routes.events(namespace, name))

    def workload_metrics(
        self, namespace: str, name: str, points: int = 240
    ) -> models.WorkloadMetrics:
        """Its GPUs over its current or last run: utilisation, GPU Usage and memory (the
        server needs --prometheus)."""
        return self._run(_Routes.metrics(namespace, name, points))

    def cancel(self, namespace: str, name: str) -> models.Done:
        return self._run(_Routes.cancel(namespace, name))

    def release_node(self, name: str) -> models.Done:
        return self._run(_Routes.release_node(name))

    def submit_job(
        self,
        namespace: str,
        manifest: dict[str, Any] | None = None,
        *,
        name: str | None = None,
        template: str | None = None,
        team: str | None = None,
        workload_class: str | None = None,
        priority: str | None = None,
        gpus: int | None = None,
        pods: int | None = None,
        pool: str | None = None,
        gpu_types: list[str] | None = None,
        image: str | None = None,
        command: list[str] | None = None,
        env: dict[str, str] | None = None,
        external_id: str | None = None,
        run_for: str | None = None,
        dry_run: bool = False,
        cluster: str | None = None,
    ) -> models.Submitted:
        """Create a workload in `namespace` as the caller (their RBAC, quotas and admission
        apply): a manifest of a kind gpufleet manages (team and class labels added where it
        has none), or a Job built from the short form (name, team, image, gpus, pods, ...),
        starting from a WorkloadTemplate where `template` names one; `gpu_types`: the GPU
        types it accepts, the most preferred first. On the hub of a fleet of clusters,
        `cluster` is `auto` or a Cluster's name: the hub sends the Job there.
        Follow it with `wait_for_completion(namespace, submitted.workload)`."""
        body = _submission(namespace, manifest, name=name, template=template, team=team,
                           workload_class=workload_class, priority=priority, gpus=gpus,
                           pods=pods, pool=pool, gpu_types=gpu_types, image=image,
                           command=command, env=env,
                           external_id=external_id, run_for=run_for, dry_run=dry_run,
                           cluster=cluster)  # fmt: skip
        return self._run(_Routes.submit(body))

    def wait_for_completion(
        self,
        namespace: str,
        name: str,
        timeout: float | None = None,
        progress: Callable[[models.Workload], None] | None = None,
    ) -> models.Workload:
        """The workload once Completed, Failed or Cancelled (see its `state`), followed
        through the server's watch (server-sent events, no polling); `progress` is called with
        it at each change of state; Timeout when `timeout` seconds pass first."""
        waiting = _Waiting(namespace, name, timeout, progress)
        while True:  # a watch the server ended or that went quiet is opened again
            timeouts = httpx.Timeout(self.timeout, read=waiting.read_timeout())
            try:
                with self.http.stream("GET", waiting.path(), timeout=timeouts) as answer:
                    if not answer.is_success:
                        answer.read()
                        _Routes.workload(namespace, name).read(answer)  # raises its error
                    for line in answer.iter_lines():
                        done = waiting.seen(waiting.event(line))
                        if done is not None:
                            return done
            except httpx.ReadTimeout:
                pass
            except httpx.HTTPError as err:
                raise _unavailable(err, self.url) from None
            waiting.seen(None)  # Timeout once the time is up

    def run(
        self,
        path: Path | str = ".",
        *,
        team: str | None = None,
        namespace: str | None = None,
        registry: str | None = None,
        gpus: int | None = None,
        nodes: int | None = None,
        workload_class: str | None = None,
        pool: str | None = None,
        gpu_type: str | None = None,
        priority: str | None = None,
        name: str | None = None,
        entrypoint: str | None = None,
        env: dict[str, str] | None = None,
        base_image: str | None = None,
        profile: str | None = None,
        no_cache: bool = False,
        platform: str = "linux/amd64",
        progress: Callable[[str, str, int, int], None] | None = None,
    ) -> RunOutcome:
        """`gpufleet run` from code: build the project at `path` into an image (settings from
        its .gpufleet.yaml, the profile, then these arguments), push it to the registry, and
        submit it as the caller. The API server checks the workload (a dry run) before
        anything is pushed. `progress(step, name, done, total)` follows the upload. Raises
        ProjectError (a ValueError) for a project or setting it cannot run, and the image
        module's BuildError, RegistryError or NoCredentials for the build and push."""
        given = dict(team=team, namespace=namespace, registry=registry, gpus=gpus, nodes=nodes,
                     workload_class=workload_class, pool=pool, gpu_type=gpu_type,
                     priority=priority, name=name,
                     entrypoint=entrypoint, env=env, base_image=base_image)  # fmt: skip
        prepared = _Run.of(path, profile, given)
        if not prepared.config.namespace:
            prepared = prepared.namespaced(self.teams())
        where = prepared.config.namespace
        self.submit_job(where, prepared.workload("placeholder.invalid/image:check"), dry_run=True)
        pushed = prepared.push(progress, no_cache, platform)
        submitted = self.submit_job(where, prepared.workload(str(pushed.reference)))
        return prepared.outcome(pushed, submitted)

    def cost(
        self,
        since: str | None = None,
        until: str | None = None,
        by: list[str] | None = None,
        share_idle: bool = False,
    ) -> dict[str, Any]:
        """As `gpufleet cost -o json` (the server needs --ledger)."""
        return self._run(_Routes.report("cost", since, until, by, shareIdle=share_idle))

    def usage(
        self, since: str | None = None, until: str | None = None, by: list[str] | None = None
    ) -> dict[str, Any]:
        """As `gpufleet usage -o json` (the server needs --ledger)."""
        return self._run(_Routes.report("usage", since, until, by))

    def cost_events(
        self,
        since: str | None = None,
        until: str | None = None,
        team: str | None = None,
        user: str | None = None,
    ) -> dict[str, Any]:
        """One row per run, as `gpufleet cost events -o json` (the server needs --ledger)."""
        return self._run(_Routes.report("cost/events", since, until, None, team=team, user=user))

    def cost_forecast(self, until: str, by: str | None = None) -> dict[str, Any]:
        """The cost from now to `until`, per team or gpu-type with `by`, as `gpufleet cost
        forecast -o json` (the server needs --ledger)."""
        return self._run(_get("cost/forecast", dict[str, Any], until=until, by=by))

    def budgets(self) -> dict[str, Any]:
        """The teams' monthly GPU-hour budgets, as `gpufleet budgets -o json`."""
        return self._run(_get("budgets", dict[str, Any]))

    def recommendations(self, since: str | None = None) -> dict[str, Any]:
        """What to change and why, as `gpufleet recommendations -o json`."""
        return self._run(_get("recommendations", dict[str, Any], since=since))

    def deliveries(self, since: str | None = None, **match: str | None) -> dict[str, Any]:
        """The notifications' delivery log (match: route, kind, team, outcome), as
        `gpufleet notify log -o json`."""
        return self._run(_get("notifications/deliveries", dict[str, Any], since=since, **match))


class AsyncClient(_Base):
    """The same calls for asyncio code (notebooks, services): `await fleet.capacity()`."""

    def __init__(
        self,
        url: str,
        token: str | None = None,
        timeout: float = 30.0,
        ca_cert: str | Path | None = None,
    ) -> None:
        super().__init__(url, token, timeout, ca_cert)
        self.http = httpx.AsyncClient(
            base_url=self.url, headers=self.headers, timeout=timeout, verify=self.verify
        )

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self.http.aclose()

    async def _run(self, call: _Call[T]) -> T:
        try:
            sent = await self.http.request(
                call.method, call.path, params=call.params, json=call.body
            )
        except httpx.HTTPError as err:
            raise _unavailable(err, self.url) from None
        return call.read(sent)

    async def whoami(self) -> models.Identity:
        return await self._run(_Routes.whoami)

    async def status(self) -> models.Status:
        return await self._run(_Routes.status)

    async def capacity(self) -> models.Capacity:
        return await self._run(_Routes.capacity)

    async def pools(self) -> list[models.Pool]:
        return await self._run(_Routes.pools)

    async def teams(self) -> list[models.Team]:
        return await self._run(_Routes.teams)

    async def reservations(self) -> list[models.Reservation]:
        return await self._run(_Routes.reservations)

    async def nodes(self) -> list[models.Node]:
        return await self._run(_Routes.nodes)

    async def hosts(self) -> list[models.Host]:
        """GPU hosts outside Kubernetes, as their standalone agents last reported them."""
        return await self._run(_Routes.hosts)

    async def host(self, name: str) -> models.Host:
        return await self._run(_Routes.host(name))

    async def host_metrics(
        self, name: str, service: str | None = None, prefix: str | None = None
    ) -> models.HostMetrics:
        """The series of the host's newest report (of one OTLP `service`, or names starting
        with `prefix`)."""
        return await self._run(_Routes.host_metrics(name, service, prefix))

    async def workloads(
        self,
        namespace: str | None = None,
        team: str | None = None,
        workload_class: str | None = None,
        state: str | None = None,
        since: str | None = None,
        limit: int = 500,
        offset: int = 0,
        *,
        search: str | None = None,
        cluster: str | None = None,
        submitter: str | None = None,
        order: str | None = None,
        cursor: str | None = None,
    ) -> models.Page[models.Workload]:
        filters = dict(namespace=namespace, team=team, workload_class=workload_class,
                       state=state, since=since, search=search, cluster=cluster,
                       submitter=submitter)  # fmt: skip
        return await self._run(_Routes.workloads(limit, offset, order, cursor, filters))

    async def iter_workloads(
        self,
        namespace: str | None = None,
        team: str | None = None,
        workload_class: str | None = None,
        state: str | None = None,
        since: str | None = None,
        *,
        search: str | None = None,
        cluster: str | None = None,
        submitter: str | None = None,
        page_size: int = 500,
    ) -> AsyncIterator[models.Workload]:
        filters = dict(namespace=namespace, team=team, workload_class=workload_class,
                       state=state, since=since, search=search, cluster=cluster,
                       submitter=submitter)  # fmt: skip
        cursor = None
        while True:
            page = await self._run(_Routes.workloads(page_size, 0, "name", cursor, filters))
            for item in page.items:
                yield item
            if page.next is None:
                return
            cursor = page.next

    async def search_workloads(self, text: str, **filters: Any) -> list[models.Workload]:
        return [w async for w in self.iter_workloads(search=text, **filters)]

    async def workload_stats(
        self,
        namespace: str | None = None,
        team: str | None = None,
        workload_class: str | None = None,
        state: str | None = None,
        since: str | None = None,
        *,
        search: str | None = None,
        cluster: str | None = None,
        submitter: str | None = None,
    ) -> models.WorkloadStats:
        filters = dict(namespace=namespace, team=team, workload_class=workload_class,
                       state=state, since=since, search=search, cluster=cluster,
                       submitter=submitter)  # fmt: skip
        return await self._run(_Routes.stats(filters))

    async def team(self, name: str) -> models.Team:
        return await self._run(_Routes.team(name))

    async def health(self) -> models.Health:
        return await self._run(_Routes.health)

    async def clusters(self) -> models.Clusters:
        return await self._run(_Routes.clusters)

    async def templates(self) -> list[models.Template]:
        return await self._run(_Routes.templates)

    list_teams = teams
    get_team = team
    list_reservations = reservations
    get_capacity = capacity

    async def workload(self, namespace: str, name: str) -> models.Workload:
        return await self._run(_Routes.workload(namespace, name))

    async def explain(self, namespace: str, name: str) -> models.Explanation:
        return await self._run(_Routes.explain(namespace, name))

    async def workload_events(self, namespace: str, name: str) -> list[models.Event]:
        """The workload's Kubernetes Events, oldest first (its own, its object's, its pods')."""
        return await self._run(_Routes.events(namespace, name))

    async def workload_metrics(
        self, namespace: str, name: str, points: int = 240
    ) -> models.WorkloadMetrics:
        """Its GPUs over its current or last run: utilisation, GPU Usage and memory (the
        server needs --prometheus)."""
        return await self._run(_Routes.metrics(namespace, name, points))

    async def cancel(self, namespace: str, name: str) -> models.Done:
        return await self._run(_Routes.cancel(namespace, name))

    async def release_node(self, name: str) -> models.Done:
        return await self._run(_Routes.release_node(name))

    async def submit_job(
        self,
        namespace: str,
        manifest: dict[str, Any] | None = None,
        *,
        name: str | None = None,
        template: str | None = None,
        team: str | None = None,
        workload_class: str | None = None,
        priority: str | None = None,
        gpus: int | None = None,
        pods: int | None = None,
        pool: str | None = None,
        gpu_types: list[str] | None = None,
        image: str | None = None,
        command: list[str] | None = None,
        env: dict[str, str] | None = None,
        external_id: str | None = None,
        run_for: str | None = None,
        dry_run: bool = False,
        cluster: str | None = None,
    ) -> models.Submitted:
        body = _submission(namespace, manifest, name=name, template=template, team=team,
                           workload_class=workload_class, priority=priority, gpus=gpus,
                           pods=pods, pool=pool, gpu_types=gpu_types, image=image,
                           command=command, env=env,
                           external_id=external_id, run_for=run_for, dry_run=dry_run,
                           cluster=cluster)  # fmt: skip
        return await self._run(_Routes.submit(body))

    async def wait_for_completion(
        self,
        namespace: str,
        name: str,
        timeout: float | None = None,
        progress: Callable[[models.Workload], None] | None = None,
    ) -> models.Workload:
        waiting = _Waiting(namespace, name, timeout, progress)
        while True:
            timeouts = httpx.Timeout(self.timeout, read=waiting.read_timeout())
            try:
                async with self.http.stream("GET", waiting.path(), timeout=timeouts) as answer:
                    if not answer.is_success:
                        await answer.aread()
                        _Routes.workload(namespace, name).read(answer)
                    async for line in answer.aiter_lines():
                        done = waiting.seen(waiting.event(line))
                        if done is not None:
                            return done
            except httpx.ReadTimeout:
                pass
            except httpx.HTTPError as err:
                raise _unavailable(err, self.url) from None
            waiting.seen(None)

    async def run(
        self,
        path: Path | str = ".",
        *,
        team: str | None = None,
        namespace: str | None = None,
        registry: str | None = None,
        gpus: int | None = None,
        nodes: int | None = None,
        workload_class: str | None = None,
        pool: str | None = None,
        gpu_type: str | None = None,
        priority: str | None = None,
        name: str | None = None,
        entrypoint: str | None = None,
        env: dict[str, str] | None = None,
        base_image: str | None = None,
        profile: str | None = None,
        no_cache: bool = False,
        platform: str = "linux/amd64",
        progress: Callable[[str, str, int, int], None] | None = None,
    ) -> RunOutcome:
        """As `Client.run`; the build and push run in a thread."""
        given = dict(team=team, namespace=namespace, registry=registry, gpus=gpus, nodes=nodes,
                     workload_class=workload_class, pool=pool, gpu_type=gpu_type,
                     priority=priority, name=name,
                     entrypoint=entrypoint, env=env, base_image=base_image)  # fmt: skip
        prepared = await asyncio.to_thread(_Run.of, path, profile, given)
        if not prepared.config.namespace:
            prepared = prepared.namespaced(await self.teams())
        where = prepared.config.namespace
        placeholder = prepared.workload("placeholder.invalid/image:check")
        await self.submit_job(where, placeholder, dry_run=True)
        pushed = await asyncio.to_thread(prepared.push, progress, no_cache, platform)
        submitted = await self.submit_job(where, prepared.workload(str(pushed.reference)))
        return prepared.outcome(pushed, submitted)

    async def cost(
        self,
        since: str | None = None,
        until: str | None = None,
        by: list[str] | None = None,
        share_idle: bool = False,
    ) -> dict[str, Any]:
        return await self._run(_Routes.report("cost", since, until, by, shareIdle=share_idle))

    async def usage(
        self, since: str | None = None, until: str | None = None, by: list[str] | None = None
    ) -> dict[str, Any]:
        return await self._run(_Routes.report("usage", since, until, by))

    async def cost_events(
        self,
        since: str | None = None,
        until: str | None = None,
        team: str | None = None,
        user: str | None = None,
    ) -> dict[str, Any]:
        """One row per run, as `gpufleet cost events -o json` (the server needs --ledger)."""
        return await self._run(
            _Routes.report("cost/events", since, until, None, team=team, user=user)
        )

    async def cost_forecast(self, until: str, by: str | None = None) -> dict[str, Any]:
        return await self._run(_get("cost/forecast", dict[str, Any], until=until, by=by))

    async def budgets(self) -> dict[str, Any]:
        return await self._run(_get("budgets", dict[str, Any]))

    async def recommendations(self, since: str | None = None) -> dict[str, Any]:
        return await self._run(_get("recommendations", dict[str, Any], since=since))

    async def deliveries(self, since: str | None = None, **match: str | None) -> dict[str, Any]:
        return await self._run(
            _get("notifications/deliveries", dict[str, Any], since=since, **match)
        )
