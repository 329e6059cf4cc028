"""Every route of the API has an SDK method (sync and async) and a CLI verb, or a recorded
reason why not; every SDK method that calls the API names its route; docs/server.md names
every route of the OpenAPI document."""

from __future__ import annotations

import inspect
import re
from pathlib import Path
from typing import Any

from typer.main import get_command

from gpufleet.api.access import LocalAccess
from gpufleet.api.app import create_app
from gpufleet.api.source import CacheSource, new_cache
from gpufleet.cli.main import app as cli_app
from gpufleet.client import AsyncClient, Client

DOCS = Path(__file__).resolve().parents[1] / "docs" / "server.md"

# (method, path under /api/v1): (SDK methods, CLI verb or "" with the reason after it)
PARITY: dict[tuple[str, str], tuple[tuple[str, ...], str]] = {
    ("GET", "/whoami"): (("whoami",), "whoami"),
    ("GET", "/status"): (("status",), "status"),
    ("GET", "/capacity"): (("capacity", "get_capacity"), "capacity"),
    ("GET", "/pools"): (("pools",), "status"),
    ("GET", "/clusters"): (("clusters",), "clusters list"),
    ("GET", "/teams"): (("teams", "list_teams"), "teams"),
    ("GET", "/teams/{name}"): (("team", "get_team"), "teams"),
    ("GET", "/reservations"): (("reservations", "list_reservations"), "reservations"),
    ("GET", "/templates"): (("templates",), "templates"),
    ("GET", "/nodes"): (("nodes",), "nodes list"),
    ("GET", "/health"): (("health",), "health"),
    ("POST", "/nodes/{name}/release"): (("release_node",), "nodes release"),
    ("GET", "/hosts"): (("hosts",), "hosts list"),
    ("GET", "/hosts/{name}"): (("host",), "hosts get"),
    ("GET", "/hosts/{name}/metrics"): (("host_metrics",), "hosts metrics"),
    # the standalone agent's upload: not a call for people or programs
    ("POST", "/hosts/{name}/reports"): ((), "agent standalone"),
    ("GET", "/workloads"): (("workloads", "iter_workloads", "search_workloads"), "workloads list"),
    ("POST", "/workloads"): (("submit_job",), "submit"),
    ("GET", "/workloads/stats"): (("workload_stats",), "workloads stats"),
    ("GET", "/workloads/{namespace}/{name}"): (("workload",), "workloads get"),
    ("GET", "/workloads/{namespace}/{name}/explain"): (("explain",), "workloads explain"),
    ("GET", "/workloads/{namespace}/{name}/events"): (("workload_events",), "workloads events"),
    ("GET", "/workloads/{namespace}/{name}/metrics"): (
        ("workload_metrics",),
        "workloads metrics",
    ),
    ("POST", "/workloads/{namespace}/{name}/cancel"): (("cancel",), "workloads cancel"),
    ("GET", "/workloads/{namespace}/{name}/watch"): (("wait_for_completion",), "workloads wait"),
    ("GET", "/cost"): (("cost",), "cost"),
    ("GET", "/cost/events"): (("cost_events",), "cost events"),
    ("GET", "/usage"): (("usage",), "usage"),
    ("GET", "/cost/forecast"): (("cost_forecast",), "cost forecast"),
    ("GET", "/budgets"): (("budgets",), "budgets"),
    ("GET", "/recommendations"): (("recommendations",), "recommendations"),
    ("GET", "/notifications/deliveries"): (("deliveries",), "notify log"),
}
# SDK methods that are not one route: built on the routes above, or local
NOT_A_ROUTE = {
    "close": "closes the connections",
    "from_kubeconfig": "builds a client",
    "run": "builds and pushes here, then POST /workloads (a dry run first)",
    "from_config": "builds a client (the environment, or a profile of gpufleet login)",
}


def routes() -> set[tuple[str, str]]:
    document = create_app(CacheSource(new_cache()), LocalAccess()).openapi()
    return {
        (method.upper(), path.removeprefix("/api/v1"))
        for path, operations in document["paths"].items()
        for method in operations
    }


def cli_verbs() -> set[str]:
    found: set[str] = set()

    def walk(command: Any, prefix: str) -> None:
        for name, sub in (getattr(command, "commands", None) or {}).items():  # a group's
            found.add(f"{prefix}{name}")
            walk(sub, f"{prefix}{name} ")

    walk(get_command(cli_app), "")
    return found


def test_every_route_has_an_sdk_method_and_a_cli_verb() -> None:
    assert routes() == set(PARITY), "a route was added or removed: record it in PARITY"
    verbs = cli_verbs()
    for route, (methods, verb) in PARITY.items():
        for name in methods:
            assert callable(getattr(Client, name, None)), (route, name)
            assert inspect.iscoroutinefunction(getattr(AsyncClient, name, None)) or (
                inspect.isasyncgenfunction(getattr(AsyncClient, name, None))
            ), (route, name)
        assert verb in verbs, (route, verb)


def test_every_public_sdk_method_is_a_route_or_says_what_it_is() -> None:
    mapped = {name for methods, _ in PARITY.values() for name in methods}
    public = {n for n, _ in inspect.getmembers(Client, callable) if not n.startswith("_")}
    assert public - mapped - set(NOT_A_ROUTE) == set()
    assert {n for n in NOT_A_ROUTE if n not in public} == set()


def test_the_docs_name_every_route() -> None:
    text = DOCS.read_text()
    missing = [
        f"{method} {path}"
        for method, path in sorted(routes())
        if f"/api/v1{path}" not in text and f"`{path}" not in text and f" {path}" not in text
    ]
    assert not missing, f"docs/server.md does not name: {missing}"


def test_every_route_the_docs_name_is_served() -> None:
    """The other way round: a route the docs name (`/api/v1/...`) that the OpenAPI document
    does not hold is a doc gone stale."""
    paths = {path for _, path in routes()} | {"/openapi.json", "/"}
    pages = [DOCS.parent.parent / "README.md", *sorted(DOCS.parent.glob("*.md"))]
    stale = [
        f"{page.name}: /api/v1{named}"
        for page in pages
        for named in re.findall(r"/api/v1(/[A-Za-z0-9_{}/.-]*)", page.read_text())
        if named.rstrip(".") not in paths
    ]
    assert not stale, f"docs name routes the API does not serve: {stale}"
