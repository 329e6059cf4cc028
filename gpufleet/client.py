"""The Python SDK of `gpufleet server`: typed answers (the server's own pydantic models), sync
(`Client`) and async (`AsyncClient`).

    from gpufleet.client import Client

    fleet = Client("http://127.0.0.1:8090", token=TOKEN)   # or Client.from_kubeconfig(URL)
    for pool in fleet.capacity().pools:
        print(pool.pool, pool.idle_gpus, pool.idle_cost_per_hour)
    for w in fleet.workloads(team="nlp", state="Pending,Preempted").items:
        print(w.name, w.reason, w.position, w.eta)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

import httpx
from pydantic import TypeAdapter

from gpufleet.api import models

T = TypeVar("T")
PREFIX = "/api/v1"


class ApiError(Exception):
    """An answer other than 2xx: `status` (401, 403, 404, 409, ...), the server's message, and
    for 403 the permission that is missing."""

    def __init__(self, status: int, message: str, missing: dict[str, Any] | None = None) -> None:
        super().__init__(f"{status}: {message}")
        self.status, self.message, self.missing = status, message, missing


@dataclass(frozen=True)
class _Call(Generic[T]):
    method: str
    path: str
    answer: TypeAdapter[T]
    params: dict[str, Any] = field(default_factory=dict)

    def read(self, response: httpx.Response) -> T:
        if response.is_success:
            return self.answer.validate_python(response.json())
        try:
            detail = response.json().get("detail")
        except ValueError:
            detail = response.text
        if isinstance(detail, dict):
            raise ApiError(response.status_code, str(detail.get("message")), detail.get("missing"))
        raise ApiError(response.status_code, str(detail))


_CAPACITY: TypeAdapter[models.Capacity] = TypeAdapter(models.Capacity)
_STATUS: TypeAdapter[models.Status] = TypeAdapter(models.Status)
_POOLS: TypeAdapter[list[models.Pool]] = TypeAdapter(list[models.Pool])
_TEAMS: TypeAdapter[list[models.Team]] = TypeAdapter(list[models.Team])
_RESERVATIONS: TypeAdapter[list[models.Reservation]] = TypeAdapter(list[models.Reservation])
_NODES: TypeAdapter[list[models.Node]] = TypeAdapter(list[models.Node])
_WORKLOADS: TypeAdapter[models.Page[models.Workload]] = TypeAdapter(models.Page[models.Workload])
_WORKLOAD: TypeAdapter[models.Workload] = TypeAdapter(models.Workload)
_EXPLANATION: TypeAdapter[models.Explanation] = TypeAdapter(models.Explanation)
_DONE: TypeAdapter[models.Done] = TypeAdapter(models.Done)
_IDENTITY: TypeAdapter[models.Identity] = TypeAdapter(models.Identity)
_REPORT: TypeAdapter[dict[str, Any]] = TypeAdapter(dict[str, Any])


def _workloads_call(
    namespace: str | None,
    team: str | None,
    workload_class: str | None,
    state: str | None,
    since: str | None,
    limit: int,
    offset: int,
) -> _Call[models.Page[models.Workload]]:
    asked = {"namespace": namespace, "team": team, "class": workload_class, "state": state,
             "since": since, "limit": limit, "offset": offset}  # fmt: skip
    params = {k: v for k, v in asked.items() if v is not None}
    return _Call("GET", f"{PREFIX}/workloads", _WORKLOADS, params)


def _report_call(
    path: str, since: str | None, until: str | None, by: list[str] | None, **flags: Any
) -> _Call[dict[str, Any]]:
    params = {"since": since, "until": until, "by": by, **flags}
    return _Call("GET", f"{PREFIX}/{path}", _REPORT, {k: v for k, v in params.items() if v})


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


class _Base:
    def __init__(self, url: str, token: str | None, timeout: float) -> None:
        self.url = url.rstrip("/")
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.timeout = timeout


class Client(_Base):
    """Blocking client; `with Client(...) as fleet:` closes its connections."""

    def __init__(self, url: str, token: str | None = None, timeout: float = 30.0) -> None:
        super().__init__(url, token, timeout)
        self.http = httpx.Client(base_url=self.url, headers=self.headers, timeout=timeout)

    @classmethod
    def from_kubeconfig(
        cls, url: str, kubeconfig: Path | str | None = None, context: str | None = None
    ) -> Client:
        return cls(url, token_from_kubeconfig(kubeconfig, context))

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        self.http.close()

    def _run(self, call: _Call[T]) -> T:
        return call.read(self.http.request(call.method, call.path, params=call.params))

    def whoami(self) -> models.Identity:
        return self._run(_Call("GET", f"{PREFIX}/whoami", _IDENTITY))

    def status(self) -> models.Status:
        return self._run(_Call("GET", f"{PREFIX}/status", _STATUS))

    def capacity(self) -> models.Capacity:
        return self._run(_Call("GET", f"{PREFIX}/capacity", _CAPACITY))

    def pools(self) -> list[models.Pool]:
        return self._run(_Call("GET", f"{PREFIX}/pools", _POOLS))

    def teams(self) -> list[models.Team]:
        return self._run(_Call("GET", f"{PREFIX}/teams", _TEAMS))

    def reservations(self) -> list[models.Reservation]:
        return self._run(_Call("GET", f"{PREFIX}/reservations", _RESERVATIONS))

    def nodes(self) -> list[models.Node]:
        return self._run(_Call("GET", f"{PREFIX}/nodes", _NODES))

    def workloads(
        self,
        namespace: str | None = None,
        team: str | None = None,
        workload_class: str | None = None,
        state: str | None = None,
        since: str | None = None,
        limit: int = 500,
        offset: int = 0,
    ) -> models.Page[models.Workload]:
        return self._run(
            _workloads_call(namespace, team, workload_class, state, since, limit, offset)
        )

    def workload(self, namespace: str, name: str) -> models.Workload:
        return self._run(_Call("GET", f"{PREFIX}/workloads/{namespace}/{name}", _WORKLOAD))

    def explain(self, namespace: str, name: str) -> models.Explanation:
        path = f"{PREFIX}/workloads/{namespace}/{name}/explain"
        return self._run(_Call("GET", path, _EXPLANATION))

    def cancel(self, namespace: str, name: str) -> models.Done:
        return self._run(_Call("POST", f"{PREFIX}/workloads/{namespace}/{name}/cancel", _DONE))

    def release_node(self, name: str) -> models.Done:
        return self._run(_Call("POST", f"{PREFIX}/nodes/{name}/release", _DONE))

    def cost(
        self,
        since: str | None = None,
        until: str | None = None,
        by: list[str] | None = None,
        share_idle: bool = False,
    ) -> dict[str, Any]:
        """As `gpufleet cost -o json` (the server needs --ledger)."""
        return self._run(_report_call("cost", since, until, by, shareIdle=share_idle))

    def usage(
        self, since: str | None = None, until: str | None = None, by: list[str] | None = None
    ) -> dict[str, Any]:
        """As `gpufleet usage -o json` (the server needs --ledger)."""
        return self._run(_report_call("usage", since, until, by))


class AsyncClient(_Base):
    """The same calls for asyncio code (notebooks, services): `await fleet.capacity()`."""

    def __init__(self, url: str, token: str | None = None, timeout: float = 30.0) -> None:
        super().__init__(url, token, timeout)
        self.http = httpx.AsyncClient(base_url=self.url, headers=self.headers, timeout=timeout)

    @classmethod
    def from_kubeconfig(
        cls, url: str, kubeconfig: Path | str | None = None, context: str | None = None
    ) -> AsyncClient:
        return cls(url, token_from_kubeconfig(kubeconfig, context))

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self.http.aclose()

    async def _run(self, call: _Call[T]) -> T:
        return call.read(await self.http.request(call.method, call.path, params=call.params))

    async def whoami(self) -> models.Identity:
        return await self._run(_Call("GET", f"{PREFIX}/whoami", _IDENTITY))

    async def status(self) -> models.Status:
        return await self._run(_Call("GET", f"{PREFIX}/status", _STATUS))

    async def capacity(self) -> models.Capacity:
        return await self._run(_Call("GET", f"{PREFIX}/capacity", _CAPACITY))

    async def pools(self) -> list[models.Pool]:
        return await self._run(_Call("GET", f"{PREFIX}/pools", _POOLS))

    async def teams(self) -> list[models.Team]:
        return await self._run(_Call("GET", f"{PREFIX}/teams", _TEAMS))

    async def reservations(self) -> list[models.Reservation]:
        return await self._run(_Call("GET", f"{PREFIX}/reservations", _RESERVATIONS))

    async def nodes(self) -> list[models.Node]:
        return await self._run(_Call("GET", f"{PREFIX}/nodes", _NODES))

    async def workloads(
        self,
        namespace: str | None = None,
        team: str | None = None,
        workload_class: str | None = None,
        state: str | None = None,
        since: str | None = None,
        limit: int = 500,
        offset: int = 0,
    ) -> models.Page[models.Workload]:
        return await self._run(
            _workloads_call(namespace, team, workload_class, state, since, limit, offset)
        )

    async def workload(self, namespace: str, name: str) -> models.Workload:
        return await self._run(_Call("GET", f"{PREFIX}/workloads/{namespace}/{name}", _WORKLOAD))

    async def explain(self, namespace: str, name: str) -> models.Explanation:
        path = f"{PREFIX}/workloads/{namespace}/{name}/explain"
        return await self._run(_Call("GET", path, _EXPLANATION))

    async def cancel(self, namespace: str, name: str) -> models.Done:
        path = f"{PREFIX}/workloads/{namespace}/{name}/cancel"
        return await self._run(_Call("POST", path, _DONE))

    async def release_node(self, name: str) -> models.Done:
        return await self._run(_Call("POST", f"{PREFIX}/nodes/{name}/release", _DONE))

    async def cost(
        self,
        since: str | None = None,
        until: str | None = None,
        by: list[str] | None = None,
        share_idle: bool = False,
    ) -> dict[str, Any]:
        return await self._run(_report_call("cost", since, until, by, shareIdle=share_idle))

    async def usage(
        self, since: str | None = None, until: str | None = None, by: list[str] | None = None
    ) -> dict[str, Any]:
        return await self._run(_report_call("usage", since, until, by))
