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

import functools
from dataclasses import dataclass, field
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


class _Routes:
    """Every call of the API, once: the clients below only send them."""

    whoami: _Call[models.Identity] = _get("whoami", models.Identity)
    status: _Call[models.Status] = _get("status", models.Status)
    capacity: _Call[models.Capacity] = _get("capacity", models.Capacity)
    pools: _Call[list[models.Pool]] = _get("pools", list[models.Pool])
    teams: _Call[list[models.Team]] = _get("teams", list[models.Team])
    reservations: _Call[list[models.Reservation]] = _get("reservations", list[models.Reservation])
    nodes: _Call[list[models.Node]] = _get("nodes", list[models.Node])

    @staticmethod
    def workloads(
        namespace: str | None,
        team: str | None,
        workload_class: str | None,
        state: str | None,
        since: str | None,
        limit: int,
        offset: int,
    ) -> _Call[models.Page[models.Workload]]:
        return _get("workloads", models.Page[models.Workload], namespace=namespace, team=team,
                    state=state, since=since, limit=limit, offset=offset,
                    **{"class": workload_class})  # fmt: skip

    @staticmethod
    def workload(namespace: str, name: str) -> _Call[models.Workload]:
        return _get(f"workloads/{namespace}/{name}", models.Workload)

    @staticmethod
    def explain(namespace: str, name: str) -> _Call[models.Explanation]:
        return _get(f"workloads/{namespace}/{name}/explain", models.Explanation)

    @staticmethod
    def cancel(namespace: str, name: str) -> _Call[models.Done]:
        return _post(f"workloads/{namespace}/{name}/cancel")

    @staticmethod
    def release_node(name: str) -> _Call[models.Done]:
        return _post(f"nodes/{name}/release")

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


class _Base:
    def __init__(self, url: str, token: str | None, timeout: float) -> None:
        self.url = url.rstrip("/")
        self.headers = {WRITE_HEADER: f"gpufleet-sdk/{__version__}"}
        if token:
            self.headers["Authorization"] = f"Bearer {token}"
        self.timeout = timeout

    @classmethod
    def from_kubeconfig(
        cls, url: str, kubeconfig: Path | str | None = None, context: str | None = None
    ) -> Self:
        """A client with the bearer token of the kubeconfig's user."""
        return cls(url, token_from_kubeconfig(kubeconfig, context), 30.0)


class Client(_Base):
    """Blocking client; `with Client(...) as fleet:` closes its connections."""

    def __init__(self, url: str, token: str | None = None, timeout: float = 30.0) -> None:
        super().__init__(url, token, timeout)
        self.http = httpx.Client(base_url=self.url, headers=self.headers, timeout=timeout)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        self.http.close()

    def _run(self, call: _Call[T]) -> T:
        return call.read(self.http.request(call.method, call.path, params=call.params))

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
            _Routes.workloads(namespace, team, workload_class, state, since, limit, offset)
        )

    def workload(self, namespace: str, name: str) -> models.Workload:
        return self._run(_Routes.workload(namespace, name))

    def explain(self, namespace: str, name: str) -> models.Explanation:
        return self._run(_Routes.explain(namespace, name))

    def cancel(self, namespace: str, name: str) -> models.Done:
        return self._run(_Routes.cancel(namespace, name))

    def release_node(self, name: str) -> models.Done:
        return self._run(_Routes.release_node(name))

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


class AsyncClient(_Base):
    """The same calls for asyncio code (notebooks, services): `await fleet.capacity()`."""

    def __init__(self, url: str, token: str | None = None, timeout: float = 30.0) -> None:
        super().__init__(url, token, timeout)
        self.http = httpx.AsyncClient(base_url=self.url, headers=self.headers, timeout=timeout)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self.http.aclose()

    async def _run(self, call: _Call[T]) -> T:
        return call.read(await self.http.request(call.method, call.path, params=call.params))

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
            _Routes.workloads(namespace, team, workload_class, state, since, limit, offset)
        )

    async def workload(self, namespace: str, name: str) -> models.Workload:
        return await self._run(_Routes.workload(namespace, name))

    async def explain(self, namespace: str, name: str) -> models.Explanation:
        return await self._run(_Routes.explain(namespace, name))

    async def cancel(self, namespace: str, name: str) -> models.Done:
        return await self._run(_Routes.cancel(namespace, name))

    async def release_node(self, name: str) -> models.Done:
        return await self._run(_Routes.release_node(name))

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
