"""Fleet objects are declared in git: a write to one through the API answers 405, saying where
to change it, instead of a bare "Method Not Allowed"."""

from __future__ import annotations

from collections.abc import Callable
from typing import NoReturn

from fastapi import APIRouter, HTTPException

from gpufleet.api.context import PREFIX

# the API's paths of the fleet's objects, and their kinds
IN_GIT = {
    "pools": "GPUPool",
    "teams": "Team",
    "reservations": "Reservation",
    "templates": "WorkloadTemplate",
    "clusters": "Cluster",
}
WRITES = ["POST", "PUT", "PATCH", "DELETE"]


def _refusal(kind: str) -> Callable[[], NoReturn]:
    def refuse() -> NoReturn:
        raise HTTPException(
            405,
            f"{kind}s are declared in git, not written through this API: change the fleet's "
            "GitOps repository by pull request (gpufleet validate and gpufleet plan check a "
            "change; the controller applies what is merged)",
            headers={"Allow": "GET"},
        )

    return refuse


def router() -> APIRouter:
    routes = APIRouter(prefix=PREFIX, include_in_schema=False)
    for path, kind in IN_GIT.items():
        for route in (f"/{path}", f"/{path}/{{name}}"):
            routes.add_api_route(route, _refusal(kind), methods=WRITES, response_model=None)
    return routes
