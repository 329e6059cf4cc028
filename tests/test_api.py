"""The REST API's views, routes and access rules, and the SDK against a real uvicorn server.

The cache is the controller's `ClusterCache`, filled here as its watches would fill it. Who may
do what is decided by `Rules` below, a stand-in for the cluster's RBAC; the cluster test
(tests/cluster/test_server.py) checks the same routes with real tokens, TokenReview and
SubjectAccessReview."""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
import uvicorn
import yaml
from conftest import EXAMPLE
from fastapi import FastAPI
from test_report_browser import run_browser
from typer.testing import CliRunner

from gpufleet.api import views
from gpufleet.api.access import Caller, KubernetesAccess, LocalAccess, Permission
from gpufleet.api.app import Conflict, create_app
from gpufleet.api.context import Refused
from gpufleet.api.limits import Limits
from gpufleet.api.prices import canonical_type, list_price
from gpufleet.api.source import CacheSource, new_cache
from gpufleet.cli.main import app as app_cli
from gpufleet.client import (
    ApiError,
    AsyncClient,
    Client,
    Forbidden,
    Invalid,
    NotFound,
    Timeout,
    Unauthorized,
    Unavailable,
)
from gpufleet.ledger.reports import window_report
from gpufleet.ledger.store import open_ledger
from gpufleet.model import validate_paths
from gpufleet.model.keys import WRITE_HEADER
from gpufleet.sim import synthetic
from gpufleet.sim.recorder import Recorder
from gpufleet.sim.simulator import simulate
from gpufleet.testing.cluster import free_port

NOW = datetime(2026, 12, 1, 12, tzinfo=UTC)


def stamp(hours_ago: float) -> str:
    return (NOW - timedelta(hours=hours_ago)).isoformat().replace("+00:00", "Z")


def gwl(
    namespace: str, name: str, team: str, state: str, gpus: float = 8, **status: Any
) -> dict[str, Any]:
    return {
        "metadata": {"namespace": namespace, "name": name, "resourceVersion": "1"},
        "spec": {
            "team": team,
            "class": status.pop("cls", "elastic"),
            "priority": 50,
            "gpus": gpus,
            "pods": status.pop("pods", 1),
            **({"topology": status.pop("topology")} if "topology" in status else {}),
            "workloadRef": {"apiVersion": "batch/v1", "kind": "Job", "name": name},
        },
        "status": {"state": state, **status},
    }


def gpu_node(name: str, pool: str | None, gpus: int, product: str = "NVIDIA-H100-80GB-HBM3",
             quarantined: bool = False) -> dict[str, Any]:  # fmt: skip
    labels = {"nvidia.com/gpu.product": product, **({"gpufleet.io/pool": pool} if pool else {})}
    return {
        "metadata": {
            "name": name,
            "labels": labels,
            "annotations": {"gpufleet.io/quarantine-reason": "Xid 79"} if quarantined else {},
        },
        "spec": {"taints": [{"key": "gpufleet.io/gpu-unhealthy", "effect": "NoSchedule"}]}
        if quarantined
        else {},
        "status": {
            "allocatable": {"nvidia.com/gpu": str(gpus)},
            "conditions": [
                {"type": "Ready", "status": "True"},
                {
                    "type": "GPUHealthy",
                    "status": "False" if quarantined else "True",
                    "reason": "XidFatal" if quarantined else "Healthy",
                },
            ],
        },
    }


def gpu_pod(node: str, gpus: int) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "x", "name": f"p-{node}-{gpus}"},
        "spec": {
            "nodeName": node,
            "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}],
        },
        "status": {"phase": "Running"},
    }


def declared() -> dict[str, list[dict[str, Any]]]:
    return {
        "gpupools": [
            {
                "metadata": {"name": "h100"},
                "spec": {"gpuType": "H100", "pricePerGPUHour": {"onDemand": 4.0}},
                "status": {"totalGPUs": 32, "healthyGPUs": 24, "allocatedGPUs": 18, "idleGPUs": 6},
            },
            {
                "metadata": {"name": "l4"},
                "spec": {"gpuType": "L4"},
                "status": {"totalGPUs": 8, "healthyGPUs": 8, "allocatedGPUs": 0, "idleGPUs": 8},
            },
        ],
        "teams": [
            {
                "metadata": {"name": "nlp"},
                "spec": {"burstLimit": "50%", "namespaces": ["nlp"]},
                "status": {"reservedGPUs": 16, "usedGPUs": 16},
            },
            {
                "metadata": {"name": "vision"},
                "spec": {},
                "status": {"reservedGPUs": 0, "usedGPUs": 2, "borrowedGPUs": 2},
            },
        ],
        "reservations": [
            {
                "metadata": {"name": "nlp-h100"},
                "spec": {"team": "nlp", "pool": "h100", "gpus": 16},
                "status": {"usedGPUs": 16},
            },
            {
                "metadata": {"name": "old"},
                "spec": {"team": "nlp", "pool": "h100", "gpus": 4},
                "status": {"expired": True},
            },
        ],
        "gpuworkloads": [
            gwl(
                "nlp",
                "train",
                "nlp",
                "Running",
                8,
                pods=2,
                cls="reserved",
                pool="h100",
                topology="block",
                nodes=["n1", "n2"],
                startedAt=stamp(3),
            ),
            gwl(
                "nlp",
                "sweep",
                "nlp",
                "Pending",
                8,
                reason="PoolFull",
                position=2,
                message="needs 8 GPUs",
                eta=stamp(-1),
            ),
            gwl(
                "nlp",
                "first",
                "nlp",
                "Preempted",
                8,
                reason="Preempted",
                position=1,
                preemptions=1,
                preemptedBy="nlp/train",
            ),
            gwl("vision", "eval", "vision", "Running", 2, pool="h100"),
            gwl("vision", "old", "vision", "Completed", 1, finishedAt=stamp(72)),
            gwl(
                "vision",
                "fresh",
                "vision",
                "Failed",
                1,
                finishedAt=stamp(2),
                diagnosis={"pattern": "oom", "summary": "CUDA out of memory"},
            ),
        ],
        "nodes": [
            gpu_node("n1", "h100", 8),
            gpu_node("n2", "h100", 8, quarantined=True),
            gpu_node("cpu-0", None, 0),
        ],
        "pods": [gpu_pod("n1", 6)],
    }


def source_of(objects: dict[str, list[dict[str, Any]]]) -> CacheSource:
    cache = new_cache()
    for kind in cache.stores:
        cache.replace(kind, objects.get(kind, []))
    return CacheSource(cache)


class Rules:
    """Tokens and permissions for the unit tests: token -> user, user -> allowed permissions
    (a namespace of None in a rule allows every namespace, as a ClusterRoleBinding does)."""

    insecure_local = False

    def __init__(self, grants: dict[str, set[tuple[str, str, str | None]]]) -> None:
        self.grants = grants
        self.asked: list[Permission] = []

    def authenticate(self, token: str | None) -> Caller | None:
        return Caller(token[len("token-") :]) if token and token.startswith("token-") else None

    def known(self, token: str | None) -> Caller | None:
        return self.authenticate(token)

    def allows(self, caller: Caller, permission: Permission) -> bool:
        self.asked.append(permission)
        for verb, resource, namespace in self.grants.get(caller.user, set()):
            if (verb, resource) == (permission.verb, permission.resource) and namespace in (
                None,
                permission.namespace,
            ):
                return True
        return False


class RecordingActions:
    def __init__(self) -> None:
        self.cancelled: list[str] = []
        self.created: list[tuple[dict[str, Any], str, Caller | None, bool]] = []

    def create(
        self, obj: dict[str, Any], namespace: str, caller: Caller | None, dry_run: bool
    ) -> dict[str, Any]:
        if namespace == "locked":  # what the API server answers a caller without the right
            raise Refused(403, f'jobs.batch is forbidden: User "{caller and caller.user}"')
        self.created.append((obj, namespace, caller, dry_run))
        return {**obj, "metadata": {**obj["metadata"], "uid": "uid-1"}}

    def cancel(self, workload: dict[str, Any]) -> str:
        name = f"{workload['metadata']['namespace']}/{workload['metadata']['name']}"
        self.cancelled.append(name)
        return f"cancelled {name}"

    def release(self, node: str, by: str) -> str:
        raise Conflict(f"node {node} is not quarantined")


Grant = tuple[str, str, str | None]
READ_ALL: set[Grant] = {
    ("list", r, None) for r in ("gpupools", "teams", "reservations", "gpuworkloads", "nodes")
}


@contextmanager
def serve(app: FastAPI) -> Iterator[str]:
    """`app` on a real uvicorn server in a thread; yields its URL."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    assert server.started, "uvicorn did not start"
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@contextmanager
def client_of(app: FastAPI) -> Iterator[httpx.Client]:
    with serve(app) as url, httpx.Client(base_url=url) as client:
        yield client


@pytest.fixture
def api() -> Iterator[tuple[httpx.Client, Rules, RecordingActions]]:
    rules = Rules(
        {
            "admin": READ_ALL
            | {("get", "gpuworkloads", None), ("delete", "gpuworkloads", None)}
            | {("delete", "jobs", None)},
            "nlp-lead": {("list", "gpuworkloads", "nlp"), ("get", "gpuworkloads", "nlp")},
            "nobody": set(),
        }
    )
    actions = RecordingActions()
    app = create_app(source_of(declared()), rules, actions, clock=lambda: NOW)
    with client_of(app) as client:
        yield client, rules, actions


def as_user(user: str) -> dict[str, str]:
    return {"Authorization": f"Bearer token-{user}", WRITE_HEADER: "test"}


def test_a_submission_names_a_cluster_on_the_hubs_server_only(
    api: tuple[httpx.Client, Rules, RecordingActions],
) -> None:
    """The hub's server (`--fleet`) creates a Job as the hub takes it, for a cluster it has;
    another server refuses a cluster; neither creates anything it refuses; the hub's cancels
    nothing in its clusters."""
    client, rules, _ = api
    short = {"namespace": "nlp", "name": "sweep", "team": "nlp", "gpus": 8, "image": "t:1"}
    here = client.post("/api/v1/workloads", json={**short, "cluster": "auto"},
                       headers=as_user("nlp-lead"))  # fmt: skip
    assert here.status_code == 422 and "gpufleet server --fleet" in here.text, here.text
    objects = declared()
    objects["clusters"] = [{"metadata": {"name": n}, "status": {"state": "Ready"}}
                           for n in ("east", "west")]  # fmt: skip
    actions = RecordingActions()
    app = create_app(source_of(objects), rules, actions, clock=lambda: NOW, hub=True)
    with client_of(app) as hub:
        made = hub.post("/api/v1/workloads", json={**short, "cluster": "west"},
                        headers=as_user("nlp-lead"))  # fmt: skip
        assert made.status_code == 201, made.text
        ((job, namespace, caller, _),) = actions.created
        assert namespace == "nlp" and caller is not None and caller.user == "nlp-lead"
        assert job["spec"]["managedBy"] == "gpufleet.io/hub"
        assert job["metadata"]["labels"]["gpufleet.io/cluster"] == "west"
        deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"},
                      "spec": {}}  # fmt: skip
        for body, said in (
            (short, "cluster: needed on the hub's server"),
            ({**short, "cluster": "wset"}, "no such Cluster in the hub (did you mean 'west'?)"),
            ({**short, "cluster": "Bad_Name"}, "use auto or one of east, west"),
            ({"namespace": "nlp", "team": "nlp", "cluster": "auto", "manifest": deployment},
             "the hub sends batch/v1 Jobs only"),
        ):  # fmt: skip
            refused = hub.post("/api/v1/workloads", json=body, headers=as_user("nlp-lead"))
            assert refused.status_code == 422 and said in refused.text, (body, refused.text)
        assert len(actions.created) == 1
        cancel = hub.post("/api/v1/workloads/nlp/train/cancel", headers=as_user("admin"))
        assert cancel.status_code == 405 and "changes nothing in its clusters" in cancel.text


def test_status_and_capacity_count_pools_reservations_and_idle_cost(
    api: tuple[httpx.Client, Rules, RecordingActions],
) -> None:
    client = api[0]
    status = client.get("/api/v1/status", headers=as_user("admin")).json()
    assert status["observeMode"] is False
    assert status["totals"] == {"totalGPUs": 40, "healthyGPUs": 32, "allocatedGPUs": 18.0,
                                "idleGPUs": 14.0, "utilisationPercent": 56.2,
                                "idleCostPerHour": 30.4}  # fmt: skip
    assert status["queueDepth"] == {"nlp": 2}
    assert status["topTeams"] == [{"team": "nlp", "usedGPUs": 16.0}, {"team": "vision",
                                  "usedGPUs": 2.0}]  # fmt: skip
    capacity = client.get("/api/v1/capacity", headers=as_user("admin")).json()
    h100 = capacity["pools"][0]
    # the expired reservation holds nothing; the pool's own price wins over the list price
    assert (h100["reservedGPUs"], h100["unhealthyGPUs"], h100["pricePerGPUHour"]) == (16, 8, 4.0)
    assert h100["idleCostPerHour"] == 24.0
    assert capacity["pools"][1]["pricePerGPUHour"] == list_price("L4")
    assert [u["gpuType"] for u in capacity["unusedByType"]] == ["H100", "L4"]
    assert capacity["unusedByType"][0]["idlePercent"] == 25.0


def test_observe_mode_shows_gpus_by_product_at_list_prices() -> None:
    objects = {"nodes": [gpu_node("a", None, 8), gpu_node("b", None, 8),
                         gpu_node("c", None, 4, product="NVIDIA-L4")],
               "pods": [gpu_pod("a", 8), gpu_pod("c", 1)]}  # fmt: skip
    observed = source_of(objects).objects()
    capacity = views.capacity(observed)
    assert capacity.observe_mode
    # the nodes panel shows every GPU node, in the pool of its product
    nodes = [(n.node, n.pool, n.allocated_gpus) for n in views.nodes(observed, NOW)]
    h100 = "observed-nvidia-h100-80gb-hbm3"
    assert nodes == [("a", h100, 8), ("b", h100, 0), ("c", "observed-nvidia-l4", 1)]
    by_type = {u.gpu_type: u for u in capacity.unused_by_type}
    unused = by_type["NVIDIA-H100-80GB-HBM3"]
    assert (unused.idle_gpus, unused.healthy_gpus, unused.idle_percent) == (8, 16, 50.0)
    assert unused.idle_cost_per_hour == pytest.approx(8 * list_price("H100"))  # type: ignore[operator]
    assert by_type["NVIDIA-L4"].idle_gpus == 3
    assert canonical_type("NVIDIA-A100-SXM4-80GB") == "A100"
    assert canonical_type("Tesla-T4") is None and list_price("Tesla-T4") is None


def test_teams_reservations_and_nodes(api: tuple[httpx.Client, Rules, RecordingActions]) -> None:
    client = api[0]
    teams = client.get("/api/v1/teams", headers=as_user("admin")).json()
    nlp, vision = teams
    assert (nlp["burstCeilingGPUs"], nlp["running"], nlp["waiting"]) == (24, 1, 2)
    assert vision["burstCeilingGPUs"] is None and vision["borrowedGPUs"] == 2
    reservations = client.get("/api/v1/reservations", headers=as_user("admin")).json()
    assert [(r["name"], r["expired"]) for r in reservations] == [("nlp-h100", False),
                                                                 ("old", True)]  # fmt: skip
    nodes = client.get("/api/v1/nodes", headers=as_user("admin")).json()
    assert [n["node"] for n in nodes] == ["n1", "n2"]  # the CPU node is no GPU node of a pool
    assert nodes[0]["allocatedGPUs"] == 6 and nodes[0]["gpuHealthy"] == "True"
    assert nodes[1]["quarantined"] and nodes[1]["why"] == "Xid 79"
    assert nodes[1]["gpuHealthy"] == "False"


def test_workloads_are_filtered_paged_and_queue_first(
    api: tuple[httpx.Client, Rules, RecordingActions],
) -> None:
    client = api[0]

    def names(**params: Any) -> list[str]:
        page = client.get("/api/v1/workloads", params=params, headers=as_user("admin")).json()
        return [w["name"] for w in page["items"]]

    assert names()[:2] == ["first", "sweep"]  # waiting ones first, by queue position
    assert names(team="vision") == ["eval", "fresh", "old"]
    assert names(**{"class": "reserved"}) == ["train"]
    assert names(state="Pending,Preempted") == ["first", "sweep"]
    assert "old" not in names(since="48h") and "fresh" in names(since="48h")
    page = client.get("/api/v1/workloads", params={"limit": 2, "offset": 2},
                      headers=as_user("admin")).json()  # fmt: skip
    assert page["total"] == 6 and len(page["items"]) == 2 and page["offset"] == 2
    bad = client.get("/api/v1/workloads", params={"since": "two days"}, headers=as_user("admin"))
    assert bad.status_code == 422 and "since='two days'" in bad.json()["detail"]
    one = client.get("/api/v1/workloads/vision/fresh", headers=as_user("admin")).json()
    assert one["diagnosis"] == "CUDA out of memory" and one["kind"] == "Job"
    train = client.get("/api/v1/workloads/nlp/train", headers=as_user("admin")).json()
    assert train["topology"] == "block" and one["topology"] is None
    text = client.get("/api/v1/workloads/nlp/sweep/explain", headers=as_user("admin")).json()
    assert "is Pending, waiting: PoolFull" in text["text"] and "2nd in team nlp" in text["text"]
    missing = client.get("/api/v1/workloads/nlp/nope", headers=as_user("admin"))
    assert missing.status_code == 404 and "nlp/nope" in missing.json()["detail"]


def test_no_token_is_401_and_a_missing_permission_is_403_naming_it(
    api: tuple[httpx.Client, Rules, RecordingActions],
) -> None:
    client = api[0]
    anonymous = client.get("/api/v1/status")
    assert anonymous.status_code == 401 and anonymous.headers["www-authenticate"] == "Bearer"
    assert (
        client.get("/api/v1/status", headers={"Authorization": "Bearer bogus"}).status_code == 401
    )
    denied = client.get("/api/v1/status", headers=as_user("nobody"))
    assert denied.status_code == 403
    missing = {"verb": "list", "group": "gpufleet.io", "resource": "gpupools", "namespace": None}
    assert denied.json()["detail"]["missing"] == missing
    assert "nobody may not list gpupools.gpufleet.io (cluster-wide)" in denied.text
    nodes = client.get("/api/v1/nodes", headers=as_user("nobody")).json()["detail"]["missing"]
    assert nodes["group"] == "" and nodes["resource"] == "nodes"
    # whoami needs no permission: the dashboard says who is signed in
    assert client.get("/api/v1/whoami", headers=as_user("nobody")).json()["user"] == "nobody"


def test_a_team_lead_sees_only_the_namespaces_they_may_list(
    api: tuple[httpx.Client, Rules, RecordingActions],
) -> None:
    client = api[0]
    page = client.get("/api/v1/workloads", headers=as_user("nlp-lead")).json()
    assert {w["namespace"] for w in page["items"]} == {"nlp"} and page["total"] == 3
    other = client.get("/api/v1/workloads", params={"namespace": "vision"},
                       headers=as_user("nlp-lead"))  # fmt: skip
    assert other.status_code == 403
    assert other.json()["detail"]["missing"]["namespace"] == "vision"
    assert (
        client.get("/api/v1/workloads/vision/eval", headers=as_user("nlp-lead")).status_code == 403
    )
    assert client.get("/api/v1/workloads/nlp/train", headers=as_user("nlp-lead")).status_code == 200
    assert client.get("/api/v1/workloads", headers=as_user("nobody")).status_code == 403


def test_cancel_needs_delete_and_release_conflicts_are_409(
    api: tuple[httpx.Client, Rules, RecordingActions],
) -> None:
    client, _, actions = api
    refused = client.post("/api/v1/workloads/nlp/train/cancel", headers=as_user("nlp-lead"))
    assert refused.status_code == 403 and refused.json()["detail"]["missing"]["verb"] == "delete"
    assert actions.cancelled == []
    done = client.post("/api/v1/workloads/nlp/train/cancel", headers=as_user("admin"))
    assert done.status_code == 200 and actions.cancelled == ["nlp/train"]
    assert client.post("/api/v1/nodes/n1/release", headers=as_user("admin")).status_code == 403


def test_submit_creates_as_the_caller_from_the_short_form_or_a_manifest(
    api: tuple[httpx.Client, Rules, RecordingActions],
) -> None:
    client, _, actions = api
    short = {
        "namespace": "nlp",
        "name": "sweep-1",
        "team": "nlp",
        "class": "reserved",
        "gpus": 4,
        "pods": 2,
        "image": "pytorch:2",
        "command": ["python", "train.py"],
        "env": {"LR": "0.1"},
        "externalId": "run-42",
        "gpuTypes": ["H100", "A100"],
    }
    made = client.post("/api/v1/workloads", json=short, headers=as_user("nlp-lead"))
    assert made.status_code == 201, made.text
    answer = made.json()
    assert (answer["kind"], answer["name"], answer["uid"]) == ("Job", "sweep-1", "uid-1")
    assert answer["createdBy"] == "nlp-lead" and answer["workload"] == "sweep-1"
    ((job, namespace, caller, dry_run),) = actions.created
    # created as the caller the token names, not as the server
    assert namespace == "nlp" and caller is not None and caller.user == "nlp-lead"
    assert not dry_run
    labels = job["metadata"]["labels"]
    assert (labels["gpufleet.io/team"], labels["gpufleet.io/class"]) == ("nlp", "reserved")
    assert job["metadata"]["annotations"]["gpufleet.io/external-id"] == "run-42"
    assert job["metadata"]["annotations"]["gpufleet.io/gpu-types"] == "H100,A100"
    assert job["spec"]["parallelism"] == 2
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert container["env"] == [{"name": "LR", "value": "0.1"}]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "4"
    assert container["command"] == ["python", "train.py"]

    # a manifest of its own: gpufleet's labels added where it has none, its own kept
    own: dict[str, Any] = {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": "big", "labels": {"gpufleet.io/team": "vision"}},
        "spec": {"replicatedJobs": []},
    }
    body = {"namespace": "nlp", "manifest": own, "class": "elastic", "dryRun": True}
    made = client.post("/api/v1/workloads", json=body, headers=as_user("nlp-lead"))
    assert made.status_code == 201, made.text
    assert made.json()["workload"] == "jobset-big" and made.json()["uid"] is None
    sent = actions.created[-1][0]
    assert sent["metadata"]["labels"]["gpufleet.io/team"] == "vision"
    assert sent["metadata"]["namespace"] == "nlp" and actions.created[-1][3] is True

    # what is wrong is named; nothing is created
    count = len(actions.created)
    for wrong, said in (
        ({**short, "team": None}, "team: needed by the short form"),
        ({**short, "priority": "soon"}, "priority 'soon'"),
        ({"namespace": "nlp", "manifest": own, "gpus": 2}, "gpus: not with a manifest"),
        ({"namespace": "nlp", "manifest": {**own, "kind": "CronJob"}}, "not of a kind"),
        ({**short, "template": "small"}, "template 'small' does not exist"),
        ({**short, "gpus": 0}, "gpus"),
    ):
        refused = client.post("/api/v1/workloads", json=wrong, headers=as_user("nlp-lead"))
        assert refused.status_code == 422 and said in refused.text, (wrong, refused.text)
    other = {"namespace": "nlp", "manifest": {**own, "metadata": {**own["metadata"],
             "namespace": "vision"}}}  # fmt: skip
    refused = client.post("/api/v1/workloads", json=other, headers=as_user("nlp-lead"))
    assert refused.status_code == 422 and "namespace vision" in refused.text
    assert len(actions.created) == count
    # the API server's refusal comes back with its status and reason
    locked = client.post(
        "/api/v1/workloads", json={**short, "namespace": "locked"}, headers=as_user("nobody")
    )
    assert locked.status_code == 403 and 'User \\"nobody\\"' in locked.text
    # no token: 401 before anything is built
    assert (
        client.post("/api/v1/workloads", json=short, headers={WRITE_HEADER: "x"}).status_code == 401
    )


def test_a_submission_starts_from_a_template_and_sets_what_it_wants() -> None:
    templates: list[dict[str, Any]] = [
        {"metadata": {"name": "finetune"},
         "spec": {"image": "train:1", "command": ["torchrun", "t.py"], "env": {"A": "1"},
                  "class": "reserved", "gpus": 8, "pods": 2, "kind": "jobset", "cpu": "64",
                  "memory": "512Gi"}},
        {"metadata": {"name": "eval"}, "spec": {"image": "eval:1", "team": "vision"}},
    ]  # fmt: skip
    actions = RecordingActions()
    rules = Rules({"admin": READ_ALL | {("list", "workloadtemplates", None)}, "nobody": set()})
    app = create_app(source_of({**declared(), "workloadtemplates": templates}), rules, actions)
    with serve(app) as url, Client(url, token="token-admin") as fleet:
        listed = fleet.templates()
        assert [t.name for t in listed] == ["eval", "finetune"]
        assert (listed[1].workload_class, listed[1].gpus, listed[1].kind) == (
            "reserved",
            8,
            "jobset",
        )
        made = fleet.submit_job("nlp", name="ft-1", team="nlp", template="finetune", gpus=4)
        assert made.kind == "JobSet"
        sent = actions.created[-1][0]
        (replicated,) = sent["spec"]["replicatedJobs"]
        (container,) = replicated["template"]["spec"]["template"]["spec"]["containers"]
        # the template's, but the GPUs given
        assert container["image"] == "train:1" and container["command"] == ["torchrun", "t.py"]
        assert container["resources"]["limits"] == {"nvidia.com/gpu": "4"}
        assert container["resources"]["requests"] == {"cpu": "64", "memory": "512Gi",
                                                      "nvidia.com/gpu": "4"}  # fmt: skip
        assert container["env"] == [{"name": "A", "value": "1"}]
        assert sent["metadata"]["labels"]["gpufleet.io/class"] == "reserved"
        assert replicated["template"]["spec"]["parallelism"] == 2
        # a template of one team gives its team, and is refused to another
        fleet.submit_job("vision", name="e-1", template="eval")
        assert actions.created[-1][0]["metadata"]["labels"]["gpufleet.io/team"] == "vision"
        for chosen, said in (
            ("eval", "template eval is team vision's"),
            ("finetun", "did you mean 'finetune'"),
        ):
            with pytest.raises(Invalid) as refused:
                fleet.submit_job("nlp", name="x", team="nlp", template=chosen)
            assert said in refused.value.message
        with pytest.raises(Invalid) as both:
            fleet.submit_job("nlp", manifest={"kind": "Job"}, template="eval")
        assert "template: not with a manifest" in both.value.message
    with serve(app) as url, Client(url, token="token-nobody") as stranger:
        with pytest.raises(Forbidden) as denied:
            stranger.templates()
        assert denied.value.missing is not None
        assert denied.value.missing["resource"] == "workloadtemplates"


def test_openapi_document_and_dashboard_are_served() -> None:
    app = create_app(source_of({}), LocalAccess())
    with client_of(app) as client:
        paths = client.get("/api/v1/openapi.json").json()["paths"]
        one = "/api/v1/workloads/{namespace}/{name}"
        expected = {"/api/v1/capacity", "/api/v1/workloads", one, f"{one}/cancel", "/api/v1/nodes"}
        assert expected <= set(paths)
        page = client.get("/").text
        assert "<title>gpufleet</title>" in page
        assert "http://" not in page and "https://" not in page  # nothing loaded from elsewhere
        # insecure-local asks no token; this server has no actions: writes say so
        assert client.get("/api/v1/whoami").json()["insecureLocal"] is True
        written = client.post("/api/v1/workloads/a/b/cancel", headers={WRITE_HEADER: "test"})
        assert written.status_code == 404
        assert client.get("/api/v1/capacity").json()["observeMode"] is True


def test_views_are_rebuilt_when_the_cache_changes() -> None:
    source = source_of(declared())
    app = create_app(source, LocalAccess(), clock=lambda: NOW)
    with client_of(app) as client:
        assert client.get("/api/v1/workloads").json()["total"] == 6
        source.cache.apply_event("gpuworkloads", "ADDED", gwl("nlp", "new", "nlp", "Pending"))
        assert client.get("/api/v1/workloads").json()["total"] == 7


@pytest.fixture
def served() -> Iterator[str]:
    rules = Rules({"admin": READ_ALL | {("get", "gpuworkloads", None),
                                        ("delete", "gpuworkloads", None),
                                        ("delete", "jobs", None)}})  # fmt: skip
    app = create_app(source_of(declared()), rules, RecordingActions(), clock=lambda: NOW)
    with serve(app) as url:
        yield url


def test_sdk_submits_waits_and_raises_typed_errors(served: str) -> None:
    seen: list[str] = []
    with Client(served, token="token-admin") as fleet:
        made = fleet.submit_job("nlp", name="n1", team="nlp", image="busybox", gpus=2,
                                env={"A": "1"}, external_id="x-1")  # fmt: skip
        assert (made.name, made.kind, made.created_by, made.uid) == ("n1", "Job", "admin", "uid-1")
        assert made.manifest["metadata"]["annotations"] == {"gpufleet.io/external-id": "x-1"}
        with pytest.raises(Invalid) as wrong:
            fleet.submit_job("nlp", name="n2", team="nlp", image="busybox", priority="soon")
        assert wrong.value.status == 422 and "priority 'soon'" in wrong.value.message
        with pytest.raises(Invalid) as field_wrong:  # the API's own validation, one line
            fleet.submit_job("nlp", name="n2", team="nlp", image="busybox", gpus=0)
        assert field_wrong.value.message.startswith("gpus: ")
        # a finished workload: returned at once, its state told once
        done = fleet.wait_for_completion("vision", "old", timeout=5, progress=lambda w:
                                         seen.append(w.state))  # fmt: skip
        assert done.state == "Completed" and seen == ["Completed"]
        with pytest.raises(Timeout) as late:
            fleet.wait_for_completion("nlp", "train", timeout=0.3)
        assert late.value.workload is not None and late.value.workload.state == "Running"
        with pytest.raises(Timeout) as unseen:
            fleet.wait_for_completion("nlp", "not-yet", timeout=0.2)
        assert "not recorded by the controller yet" in unseen.value.message

    async def follow() -> tuple[str, str]:
        async with AsyncClient(served, token="token-admin") as fleet:
            made = await fleet.submit_job("nlp", name="a1", team="nlp", image="busybox")
            done = await fleet.wait_for_completion("vision", "old", timeout=5)
            return made.name, done.state

    loop = asyncio.new_event_loop()
    try:
        assert loop.run_until_complete(follow()) == ("a1", "Completed")
    finally:
        loop.close()


def test_cursor_pages_return_each_matching_workload_once_while_states_change() -> None:
    """2,000 workloads of two teams; the SDK pages through one team's Running and Pending ones
    by cursor while, between pages, others change state, and new ones come: every workload
    that matched throughout is returned exactly once, and none that never matched."""
    rng = random.Random(7)
    items = [
        gwl(f"ns-{i % 5}", f"w-{i:04d}", "nlp" if i % 2 else "vision",
            rng.choice(["Running", "Pending", "Completed"]))
        for i in range(2_000)
    ]  # fmt: skip
    source = source_of({**declared(), "gpuworkloads": items})
    rules = Rules({"admin": READ_ALL})
    app = create_app(source, rules, RecordingActions(), clock=lambda: NOW)
    wanted = {"Running", "Pending"}

    def key(obj: dict[str, Any]) -> tuple[str, str]:
        return obj["metadata"]["namespace"], obj["metadata"]["name"]

    stable = {
        key(o) for o in items if o["spec"]["team"] == "nlp" and o["status"]["state"] in wanted
    }
    flipping = {key(o) for o in items[:200]}  # their state changes between pages
    seen: list[tuple[str, str]] = []
    with serve(app) as url, Client(url, token="token-admin") as fleet:
        pages = 0
        for w in fleet.iter_workloads(team="nlp", state="Running,Pending", page_size=97):
            seen.append((w.namespace, w.name))
            if len(seen) % 97 == 0:  # a page ended: the cluster changes before the next
                pages += 1
                for obj in rng.sample(items[:200], 20):
                    obj["status"] = {"state": rng.choice(["Running", "Pending", "Failed"])}
                    obj["metadata"]["resourceVersion"] = str(pages * 1000 + rng.randrange(999))
                    source.cache.apply_event("gpuworkloads", "MODIFIED", obj)
                source.cache.apply_event(
                    "gpuworkloads", "ADDED", gwl("ns-0", f"new-{pages}", "nlp", "Running")
                )
        assert pages >= 5
        # each at most once, in name order, and every one that matched throughout is there
        assert len(seen) == len(set(seen)) and seen == sorted(seen)
        assert stable - flipping <= set(seen)
        assert all(n in stable or n in flipping or n[1].startswith("new-") for n in seen)
        # the filters alone, on one page: exactly the matching ones
        page = fleet.workloads(namespace="ns-3", workload_class="elastic", state="Completed",
                               search="W-00", limit=10_000, order="name")  # fmt: skip
        expected = sorted(
            o["metadata"]["name"] for o in items
            if key(o)[0] == "ns-3" and o["status"].get("state") == "Completed"
            and o["metadata"]["name"].startswith("w-00")
        )  # fmt: skip
        assert [w.name for w in page.items] == expected and page.next is None
        assert page.total == len(expected)
        stats = fleet.workload_stats(team="nlp")
        assert stats.total == sum(1 for w in fleet.iter_workloads(team="nlp"))
        assert sum(c.workloads for c in stats.by_state) == stats.total
        with pytest.raises(Invalid) as bad:
            fleet.workloads(cursor="not-a-cursor")
        assert "cursor" in bad.value.message


def test_wait_for_completion_follows_the_watch_as_the_workload_changes() -> None:
    source = source_of(declared())
    rules = Rules({"admin": READ_ALL | {("get", "gpuworkloads", None)}, "nobody": set()})
    app = create_app(source, rules, RecordingActions(), clock=lambda: NOW)
    states: list[str] = []

    def change(state: str, version: str, delay: float) -> None:
        time.sleep(delay)
        obj = gwl("nlp", "later", "nlp", state)
        obj["metadata"]["resourceVersion"] = version
        source.cache.apply_event("gpuworkloads", "MODIFIED", obj)

    with serve(app) as url, Client(url, token="token-admin") as fleet:
        # recorded a moment after the wait began, then running, then done
        order = ["Pending", "Running", "Completed"]
        steps = [
            threading.Thread(target=change, args=(state, str(n), 0.4 * n))
            for n, state in enumerate(order, start=1)
        ]
        for step in steps:
            step.start()
        started = time.monotonic()
        done = fleet.wait_for_completion("nlp", "later", timeout=30, progress=lambda w:
                                         states.append(w.state))  # fmt: skip
        assert done.state == "Completed" and states == ["Pending", "Running", "Completed"]
        assert time.monotonic() - started < 5  # followed as it changed, not polled slowly
        for step in steps:
            step.join()
        with pytest.raises(Timeout):
            fleet.wait_for_completion("nlp", "train", timeout=0.5)  # Running throughout
    with (
        serve(app) as url,
        Client(url, token="token-nobody") as stranger,
        pytest.raises(Forbidden),
    ):
        stranger.wait_for_completion("nlp", "train", timeout=5)


def test_health_team_and_the_briefs_names(served: str) -> None:
    with Client(served, token="token-admin") as fleet:
        health = fleet.health()
        assert health.nodes == len(fleet.nodes())
        assert health.problems == [n for n in fleet.nodes() if not n.ready
                                   or n.gpu_healthy != "True" or n.quarantined]  # fmt: skip
        assert fleet.get_team("nlp").name == "nlp" == fleet.team("nlp").name
        assert fleet.list_teams() == fleet.teams()
        assert fleet.list_reservations() == fleet.reservations()
        assert fleet.get_capacity() == fleet.capacity()
        with pytest.raises(NotFound) as missing:
            fleet.team("nope")
        assert "teams: nlp, vision" in missing.value.message


def test_sdk_sync_and_async_return_typed_answers(served: str) -> None:
    with Client(served, token="token-admin") as fleet:
        assert fleet.whoami().user == "admin"
        capacity = fleet.capacity()
        assert capacity.totals.idle_gpus == 14 and capacity.pools[0].pool == "h100"
        waiting = fleet.workloads(team="nlp", state="Pending,Preempted")
        assert [w.name for w in waiting.items] == ["first", "sweep"]
        assert waiting.items[1].eta == NOW + timedelta(hours=1)
        assert "PoolFull" in fleet.explain("nlp", "sweep").text
        assert fleet.cancel("nlp", "train").message == "cancelled nlp/train"
        with pytest.raises(ApiError) as missing:
            fleet.workload("nlp", "nope")
        assert missing.value.status == 404
    with Client(served, token="token-nobody") as stranger, pytest.raises(ApiError) as denied:
        stranger.teams()
    assert denied.value.status == 403 and denied.value.missing is not None
    assert denied.value.missing["resource"] == "teams"

    async def read() -> tuple[int, list[str]]:
        async with AsyncClient(served, token="token-admin") as fleet:
            nodes = await fleet.nodes()
            return (await fleet.status()).totals.total_gpus, [n.node for n in nodes]

    loop = asyncio.new_event_loop()  # a loop of its own: see test_controller_logic
    try:
        assert loop.run_until_complete(read()) == (40, ["n1", "n2"])
    finally:
        loop.close()
    with pytest.raises(Unavailable) as down:  # no server: one of the SDK's errors, status 0
        Client("http://127.0.0.1:1", token="x").status()
    assert down.value.status == 0 and "did not answer" in down.value.message


def test_the_sdk_example_runs() -> None:
    example = Path(__file__).resolve().parents[1] / "examples" / "sdk" / "notebook.py"
    app = create_app(source_of(declared()), LocalAccess(), RecordingActions(), clock=lambda: NOW)
    with serve(app) as url:
        ran = subprocess.run(
            [sys.executable, str(example)],
            env={**os.environ, "GPUFLEET_URL": url},
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert ran.returncode == 0, ran.stderr
    assert "H100: 6 of 24 idle, $24.00/h" in ran.stdout
    assert "nlp/first: Preempted (#1 of team nlp)" in ran.stdout
    assert "signed in as local" in ran.stdout


@pytest.fixture(scope="module")
def ledger_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A usage ledger written from two simulated hours of the bundled example fleet."""
    fleet, problems = validate_paths([EXAMPLE])
    assert not problems
    start = datetime(2026, 11, 2, tzinfo=UTC)
    recorder = Recorder(fleet, start)
    simulate(fleet, synthetic.generate(fleet, seed=7, hours=2), start=start, recorder=recorder)
    path = tmp_path_factory.mktemp("ledger") / "sim.db"
    store = open_ledger(str(path))
    store.write_recorded(recorder.events, recorder.capacity, recorder.reservations)
    store.close()
    return path


def test_cost_and_usage_come_from_the_ledger(ledger_file: Path) -> None:
    store = open_ledger(str(ledger_file), create=False)
    rules = Rules({"finance": {("list", "teams", None)}, "nobody": set()})
    app = create_app(source_of({}), rules, clock=lambda: NOW, ledger=store)
    try:
        with serve(app) as url:
            with Client(url, token="token-finance") as finance:
                cost = finance.cost(by=["team", "pool"], share_idle=True)
                usage = finance.usage(since="2026-11-02T01:00")
            expected = window_report(store, None, None, ["team", "pool"], True, "5m", True, NOW)
            expected.pop("ledger")  # where the database is stays with the server
            assert cost == json.loads(json.dumps(expected, default=str))
            assert cost["totals"]["capacityCost"] > cost["totals"]["gpuCost"] > 0
            assert usage["by"] == ["pool"] and usage["window"]["since"].startswith("2026-11-02T01")
            with Client(url, token="token-finance") as finance, pytest.raises(ApiError) as bad:
                finance.usage(by=["colour"])
            assert bad.value.status == 422 and "colour" in bad.value.message
            with Client(url, token="token-nobody") as nobody, pytest.raises(ApiError) as denied:
                nobody.cost()
            assert denied.value.status == 403
    finally:
        store.close()
    no_ledger = create_app(source_of({}), LocalAccess())
    with serve(no_ledger) as url, Client(url) as anyone, pytest.raises(ApiError) as missing:
        anyone.cost()
    assert missing.value.status == 404 and "--ledger" in missing.value.message


class CountingReviews:
    """The two review APIs of the Kubernetes client, answering from a table and counting."""

    def __init__(self) -> None:
        self.calls = 0
        self.token_reviews = 0
        self.down = False

    def create_token_review(self, body: dict[str, Any]) -> Any:
        self.calls += 1
        self.token_reviews += 1
        if self.down:
            raise ConnectionError("connection refused")
        ok = body["spec"]["token"] == "good"
        user = SimpleNamespace(username="alice", groups=["team"], uid="u1", extra={})
        return SimpleNamespace(status=SimpleNamespace(authenticated=ok, user=user if ok else None))

    def create_subject_access_review(self, body: dict[str, Any]) -> Any:
        self.calls += 1
        spec = body["spec"]
        assert (spec["user"], spec["groups"], spec["uid"]) == ("alice", ["team"], "u1")
        allowed = spec["resourceAttributes"].get("namespace") == "nlp"
        return SimpleNamespace(status=SimpleNamespace(allowed=allowed))


def test_kubernetes_access_caches_reviews_for_their_ttl() -> None:
    reviews, now = CountingReviews(), [0.0]
    access = KubernetesAccess(reviews, reviews, ttl=10, clock=lambda: now[0])
    alice = access.authenticate("good")
    assert alice == Caller("alice", ("team",), "u1")
    assert access.authenticate("bad") is None and access.authenticate(None) is None
    in_nlp = Permission("list", "gpuworkloads", namespace="nlp")
    assert access.allows(alice, in_nlp)
    assert not access.allows(alice, Permission("list", "gpuworkloads"))
    asked = reviews.calls
    assert access.authenticate("good") == alice and access.allows(alice, in_nlp)
    assert reviews.calls == asked  # answered from the cache
    now[0] = 11.0
    assert access.allows(alice, in_nlp) and reviews.calls == asked + 1


def test_an_unreachable_api_server_is_503_not_a_traceback() -> None:
    reviews = CountingReviews()
    reviews.down = True
    app = create_app(source_of(declared()), KubernetesAccess(reviews, reviews))
    with client_of(app) as client:
        answer = client.get("/api/v1/status", headers={"Authorization": "Bearer good"})
    assert answer.status_code == 503
    assert "cannot review the token" in answer.json()["detail"]


def test_the_dashboard_shows_the_ledger_cost(ledger_file: Path, tmp_path: Path) -> None:
    """The cost panels in Chromium: the month's forecast, the trend chart (a point per day of
    the ledger, at each day's cost), the budgets, recommendations and cost events."""
    store = open_ledger(str(ledger_file), create=False)
    objects = declared()
    objects["teams"][0]["spec"]["budget"] = {"gpuHoursPerMonth": 500}
    app = create_app(source_of(objects), LocalAccess(), clock=lambda: NOW, ledger=store)
    try:
        with serve(app) as url:
            report = httpx.get(f"{url}/api/v1/cost").json()
            runs = httpx.get(f"{url}/api/v1/cost/events", params={"since": "7d"}).json()
            dom = run_browser(["--dump-dom", "--virtual-time-budget=8000"], url + "/", tmp_path)
    finally:
        store.close()
    assert dom.returncode == 0, dom.stderr[-2000:]
    html = dom.stdout
    assert 'data-panels-ok="14"' in html and "data-error=" not in html
    shown = re.search(r'id="cost-forecast">\$([0-9,]+)<', html)
    assert shown is not None, html[:2000]
    assert abs(float(shown.group(1).replace(",", "")) - report["forecast"]["forecast"]) <= 1
    assert 'id="total-gpus">40<' in html  # the declared pools, beside the ledger's cost
    daily = report["daily"]
    assert f'data-points="{len(daily)}"' in html
    costs = [float(c) for c in re.findall(r'<circle [^>]*data-cost="([0-9.]+)"', html)]
    assert costs == [d["gpuCost"] for d in daily] and sum(costs) > 0
    assert 'data-budget-team="nlp"' in html and 'data-budget-team="vision"' not in html
    assert len(re.findall(r'<tr data-event="[^"$]', html)) == min(len(runs["items"]), 100)
    assert "Nothing to recommend" in html or 'class="recommendation"' in html


# --- what every request passes before a route (guard.py) ---------------------------------------


def test_every_answer_carries_the_security_headers(
    api: tuple[httpx.Client, Rules, RecordingActions],
) -> None:
    client, _, _ = api
    for path in ("/", "/api/v1/status", "/api/v1/openapi.json"):
        headers = client.get(path, headers=as_user("admin")).headers
        assert headers["X-Content-Type-Options"] == "nosniff", path
        assert headers["X-Frame-Options"] == "DENY", path
        assert "frame-ancestors 'none'" in headers["Content-Security-Policy"], path
        assert "Strict-Transport-Security" not in headers  # plain HTTP: no HSTS
    page = client.get("/").text
    assert "connect-src 'self'" in client.get("/").headers["Content-Security-Policy"]
    assert "<script" in page  # the inline script the policy allows


def test_a_write_without_the_client_header_is_refused(
    api: tuple[httpx.Client, Rules, RecordingActions],
) -> None:
    """A page of another site can POST a form to the server with the browser's cookies or
    a token it put in the page; it cannot add a custom header without a preflight."""
    client, _, actions = api
    bare = client.post(
        "/api/v1/workloads/nlp/train/cancel", headers={"Authorization": "Bearer token-admin"}
    )
    assert bare.status_code == 403 and WRITE_HEADER in bare.json()["detail"]
    assert actions.cancelled == []


def test_insecure_local_refuses_other_hosts_and_origins() -> None:
    """`--insecure-local` asks no token: a rebound DNS name (its Host) or another site's page
    (its Origin) must not reach it through a browser on this machine."""
    app = create_app(source_of(declared()), LocalAccess(), RecordingActions())
    with client_of(app) as client:
        assert client.get("/api/v1/status").status_code == 200
        assert client.get("/api/v1/status", headers={"Host": "localhost:8090"}).status_code == 200
        rebound = client.get("/api/v1/status", headers={"Host": "attacker.example:8090"})
        assert rebound.status_code == 403 and "Host attacker.example" in rebound.text
        cross = client.post(
            "/api/v1/workloads/nlp/train/cancel",
            headers={"Origin": "https://attacker.example", WRITE_HEADER: "x"},
        )
        assert cross.status_code == 403 and "Origin https://attacker.example" in cross.text
        same = client.post(
            "/api/v1/workloads/nlp/train/cancel",
            headers={"Origin": f"{client.base_url}".rstrip("/"), WRITE_HEADER: "x"},
        )
        assert same.status_code == 200
        assert client.get("/healthz", headers={"Host": "attacker.example"}).status_code == 200


def test_the_insecure_local_server_refuses_a_non_loopback_address() -> None:
    done = CliRunner().invoke(
        app_cli, ["server", "--insecure-local", "--host", "0.0.0.0", "--kubeconfig", "/none"]
    )
    assert done.exit_code == 1
    assert "refused on 0.0.0.0" in done.output and "Traceback" not in done.output


def test_each_client_is_rate_limited_and_told_when_to_retry() -> None:
    limits = Limits(rate=1.0, burst=5)
    rules = Rules({"admin": READ_ALL})
    app = create_app(source_of(declared()), rules, limits=limits)
    with client_of(app) as client:
        codes = [client.get("/api/v1/status", headers=as_user("admin")).status_code
                 for _ in range(8)]  # fmt: skip
        assert codes[:5] == [200] * 5 and 429 in codes[5:], codes
        limited = client.get("/api/v1/status", headers=as_user("admin"))
        assert limited.status_code == 429 and int(limited.headers["Retry-After"]) >= 1
        assert client.get("/healthz").status_code == 200  # probes are never limited


def test_a_flood_of_bad_tokens_costs_few_token_reviews() -> None:
    """Each rejected token costs at most one TokenReview, a client that keeps sending them is
    stopped (429), and the good caller's answer stays cached through the flood."""
    reviews = CountingReviews()
    access = KubernetesAccess(reviews, reviews, ttl=60)
    limits = Limits(failed_tokens_per_minute=10)
    app = create_app(source_of(declared()), access, limits=limits)
    with client_of(app) as client:
        good = {"Authorization": "Bearer good"}
        assert client.get("/api/v1/whoami", headers=good).status_code == 200
        codes = [
            client.get("/api/v1/whoami", headers={"Authorization": f"Bearer bad-{i}"}).status_code
            for i in range(30)
        ]
        assert codes[:10] == [401] * 10 and set(codes[10:]) == {429}, codes
        assert reviews.token_reviews == 11  # the good one and ten bad ones, no more
        assert client.get("/api/v1/whoami", headers=good).status_code == 200
        assert reviews.token_reviews == 11


def test_the_token_cache_keeps_good_callers_when_full() -> None:
    reviews = CountingReviews()
    access = KubernetesAccess(reviews, reviews, ttl=60)
    access.callers.limit = access.rejected.limit = 100
    assert access.authenticate("good") is not None
    for i in range(1_000):
        assert access.authenticate(f"bad-{i}") is None
    assert access.authenticate("good") is not None
    assert reviews.token_reviews == 1_001  # the good one was asked once


def test_a_cost_window_is_bounded_and_the_ledger_url_not_shown(ledger_file: Path) -> None:
    store = open_ledger(str(ledger_file))
    rules = Rules({"admin": READ_ALL})
    app = create_app(source_of(declared()), rules, clock=lambda: NOW, ledger=store)
    with client_of(app) as client:
        cost = client.get("/api/v1/cost", headers=as_user("admin"))
        assert cost.status_code == 200 and "ledger" not in cost.json()
        assert str(ledger_file) not in cost.text
        years = client.get("/api/v1/usage", params={"since": "3000d"}, headers=as_user("admin"))
        assert years.status_code == 422 and "longer than 400 days" in years.text
        events = client.get("/api/v1/cost/events", headers=as_user("admin"))
        assert events.status_code == 200 and "ledger" not in events.json()
        assert events.json()["totals"]["runs"] == len(events.json()["items"]) > 0
        old = client.get("/api/v1/cost/events", params={"since": "3000d"},
                         headers=as_user("admin"))  # fmt: skip
        assert old.status_code == 422 and "longer than 400 days" in old.text
    store.close()


def test_a_fleets_views_keep_each_clusters_work_apart() -> None:
    """`views.of_fleet`: each worker's objects marked with its cluster, its own pools (with
    the status its controller wrote) in place of the hub's; nodes of one name in two clusters
    are two nodes, each with its own pods' GPUs; `in_cluster` keeps one cluster."""

    def pool(name: str, cluster: str, allocated: float = 0) -> dict[str, Any]:
        numbers = {"totalGPUs": 8, "healthyGPUs": 8, "allocatedGPUs": allocated}
        return {
            "metadata": {"name": name},
            "spec": {"gpuType": "H100", "cluster": cluster},
            "status": {**numbers, "idleGPUs": 8 - allocated},
        }

    hub = views.Objects(
        pools=[
            {"metadata": {"name": n}, "spec": {"gpuType": "H100", "cluster": c}}
            for n, c in (("east-h100", "east"), ("west-h100", "west"), ("south-h100", "south"))
        ],
        reservations=[
            {"metadata": {"name": "r"}, "spec": {"team": "nlp", "pool": "west-h100", "gpus": 8}}
        ],
    )
    workers = {
        name: views.Objects(
            pools=[
                pool("east-h100", "east", 8 if name == "east" else 0),
                pool("west-h100", "west", 2 if name == "west" else 0),
            ],
            workloads=[gwl("nlp", "train", "nlp", "Running", pool=f"{name}-h100")],
            nodes=[gpu_node("gpu-0", f"{name}-h100", 8)],
            pods=[gpu_pod("gpu-0", 8 if name == "east" else 2)],
        )
        for name in ("east", "west")
    }
    fleet = views.of_fleet(hub, workers)
    assert {p.pool: (p.cluster, p.allocated_gpus) for p in views.pools(fleet)} == {
        "east-h100": ("east", 8),
        "west-h100": ("west", 2),
        "south-h100": ("south", 0),  # no worker shows it: the hub's, without numbers
    }
    assert [(n.cluster, n.node, n.allocated_gpus) for n in views.nodes(fleet, NOW)] == [
        ("east", "gpu-0", 8),
        ("west", "gpu-0", 2),
    ]
    assert sorted((w.cluster, w.name) for w in views.workloads(fleet.workloads)) == [
        ("east", "train"),
        ("west", "train"),
    ]
    west = views.in_cluster(fleet, "west")
    assert [p.pool for p in views.pools(west)] == ["west-h100"]
    assert [w.cluster for w in views.workloads(west.workloads)] == ["west"]
    assert views.capacity(west).totals.allocated_gpus == 2
    assert [r["metadata"]["name"] for r in west.reservations] == ["r"]
    assert views.in_cluster(fleet, "east").reservations == []
    only = views.WorkloadFilter(cluster="east")
    assert [w.cluster for w in views.workloads(fleet.workloads) if only.keeps(w, NOW)] == ["east"]


def test_login_keeps_a_profile_that_the_sdk_and_logout_use(
    served: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "gpufleet" / "config.yaml"
    monkeypatch.setenv("GPUFLEET_CONFIG", str(config))
    for name in ("GPUFLEET_SERVER", "GPUFLEET_TOKEN", "GPUFLEET_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    runner = CliRunner()

    refused = runner.invoke(app_cli, ["login", served, "--token", "wrong", "-p", "lab"])
    assert refused.exit_code == 1 and f"cannot log in to {served}" in refused.output
    assert not config.exists()  # nothing saved for a token the server refused
    with pytest.raises(ValueError, match="gpufleet login URL"):
        Client.from_config()

    done = runner.invoke(app_cli, ["login", served, "--token", "token-admin", "-p", "lab"])
    assert done.exit_code == 0, done.output
    assert f"logged in to {served} as admin (profile lab" in done.output
    assert config.stat().st_mode & 0o777 == 0o600  # it holds a token
    with Client.from_config() as fleet:  # the current profile: the one logged in to
        assert fleet.whoami().user == "admin"
    listed = json.loads(runner.invoke(app_cli, ["config", "list", "-o", "json"]).output)
    assert listed == [{"name": "lab", "current": True, "server": served, "auth": "token",
                       "team": None, "namespace": None, "registry": None}]  # fmt: skip
    shown = runner.invoke(app_cli, ["config", "view"]).output
    assert "token-admin" not in shown and "REDACTED" in shown
    assert runner.invoke(app_cli, ["config", "set", "team", "nlp"]).exit_code == 0
    assert runner.invoke(app_cli, ["config", "set", "server", "ftp://x"]).exit_code == 1
    wrong_key = runner.invoke(app_cli, ["config", "set", "colour", "red"])
    assert wrong_key.exit_code == 1 and "the fields are: registry" in wrong_key.output
    unknown = runner.invoke(app_cli, ["config", "use", "prod"])
    assert unknown.exit_code == 1 and "no profile 'prod'" in unknown.output

    assert runner.invoke(app_cli, ["logout"]).exit_code == 0
    with Client.from_config() as fleet, pytest.raises(Unauthorized):
        fleet.whoami()  # the server is kept, the token is not
    kept = yaml.safe_load(config.read_text())["profiles"]["lab"]
    assert kept == {"team": "nlp", "server": served}
    # the environment names a server over any profile
    monkeypatch.setenv("GPUFLEET_SERVER", served)
    monkeypatch.setenv("GPUFLEET_TOKEN", "token-admin")
    with Client.from_config(profile="nope") as fleet:
        assert fleet.whoami().user == "admin"


def test_writes_to_fleet_objects_say_they_are_declared_in_git(served: str) -> None:
    headers = {"Authorization": "Bearer token-admin", WRITE_HEADER: "test"}
    with httpx.Client(base_url=served, headers=headers) as http:
        for method, path, kind in (
            ("PUT", "/api/v1/teams/nlp", "Teams"),
            ("POST", "/api/v1/reservations", "Reservations"),
            ("DELETE", "/api/v1/pools/a100", "GPUPools"),
            ("PATCH", "/api/v1/templates/small", "WorkloadTemplates"),
        ):
            answer = http.request(method, path)
            assert answer.status_code == 405, (method, path, answer.text)
            assert answer.headers["allow"] == "GET"
            assert f"{kind} are declared in git" in answer.json()["detail"]
            assert "by pull request" in answer.json()["detail"]
        assert http.get("/api/v1/teams").status_code == 200  # reads are the routes' own


def test_a_workloads_metrics_plan_reads_its_nodes_over_its_run() -> None:
    started = NOW - timedelta(hours=2)
    obj = gwl("nlp", "big", "nlp", "Running", gpus=8, pods=2, nodes=["b.x", "a-1"],
              startedAt=started.isoformat())  # fmt: skip
    view = views.workload(obj)  # 16 GPUs: 8 a pod
    plan = views.metrics_plan(view, {"a-1": 8, "b.x": 8}, NOW)
    assert plan is not None
    assert plan.nodes == ("a-1", "b.x") and plan.exact
    assert (plan.start, plan.end, plan.step_s) == (started, NOW, 30.0)  # 2 h in 240 points
    assert plan.queries["utilization"] == (
        'avg(gpufleet_gpu_utilization_ratio{node=~"a\\\\-1|b\\\\.x"})'
    )
    shared = views.metrics_plan(view, {"a-1": 8, "b.x": 16}, NOW)  # half of b.x's GPUs
    assert shared is not None and not shared.exact
    waiting = views.workload(gwl("nlp", "w", "nlp", "Pending"))
    assert views.metrics_plan(waiting, {}, NOW) is None
    answer = views.workload_metrics(view, plan, {"utilization": [(NOW.timestamp(), 0.5)]})
    assert answer.mean_utilization == 0.5 and answer.note is None


def test_metrics_need_a_prometheus(served: str) -> None:
    with Client(served, token="token-admin") as fleet, pytest.raises(NotFound) as missing:
        fleet.workload_metrics("nlp", "train")
    assert "--prometheus" in missing.value.message


def test_fleet_metrics_read_the_controllers_series_over_a_window() -> None:
    queries = views.fleet_metric_queries(7 * 86400)  # a week: a point every 604 s
    assert queries["idle"] == (
        'sum_over_time(gpufleet_pool_gpus{state="idle"}[604800s:604s]) * 604 / 3600'
    )
    assert views.fleet_metric_queries(600)["queuePeak"].endswith("[600s:15s])")
    a100 = {"pool": "a100", "gpu_type": "A100"}
    found = views.fleet_metrics("7d", {
        "total": [(a100, 16.0), ({"pool": "empty"}, 0.0)],
        "allocated": [(a100, 12.0)],
        "idle": [(a100, 30.5)],
        "queuePeak": [({"team": "nlp"}, 3.0)],
        "queueMean": [({"team": "nlp"}, 0.5)],
        "waitP95": [({"team": "nlp"}, float("nan")), ({"team": "cv"}, 42.0)],
        "admissions": [({"team": "cv"}, 7.0)],
    })  # fmt: skip
    assert [(p.pool, p.gpu_type, p.allocation, p.idle_gpu_hours) for p in found.pools] == [
        ("a100", "A100", 0.75, 30.5),
        ("empty", None, None, 0.0),  # no GPUs: no share to give
    ]
    teams = {t.team: t for t in found.teams}
    assert teams["nlp"].wait_p95_seconds is None  # no wait observed: NaN is no figure
    assert (teams["cv"].wait_p95_seconds, teams["cv"].admissions) == (42.0, 7)
    assert teams["nlp"].peak_queue_depth == 3.0


def test_forecast_budgets_recommendations_and_the_delivery_log(ledger_file: Path) -> None:
    """The FinOps routes through the SDK on a real server: each answers what the ledger's
    function gives; the delivery log needs `list fleetpolicies`."""
    from gpufleet.ledger.reports import window_forecast

    store = open_ledger(str(ledger_file), create=False)
    objects = declared()
    objects["teams"][0]["spec"]["budget"] = {"gpuHoursPerMonth": 1000}
    rules = Rules({"finance": READ_ALL | {("list", "fleetpolicies", None)}, "viewer": READ_ALL})
    app = create_app(source_of(objects), rules, clock=lambda: NOW, ledger=store)
    try:
        with serve(app) as url:
            with Client(url, token="token-finance") as finance:
                forecast = finance.cost_forecast("2027-01-31", by="team")
                budgets = finance.budgets()
                recommended = finance.recommendations(since="60d")
                finance_log = finance.deliveries(outcome="failed")
            with Client(url, token="token-viewer") as viewer, pytest.raises(ApiError) as refused:
                viewer.deliveries()
            with httpx.Client(base_url=url) as raw:
                far = raw.get("/api/v1/cost/forecast", params={"until": "2099-01-01"},
                              headers=as_user("finance"))  # fmt: skip
        expected = window_forecast(store, "2027-01-31", "team", now=NOW)
        expected.pop("ledger")
        assert forecast == json.loads(json.dumps(expected))
        assert forecast["groups"] and forecast["basis"]["completeDays"] > 0
        (budget,) = budgets["items"]  # vision has none
        assert (budget["team"], budget["budgetGPUHours"], budget["month"]) == (
            "nlp",
            1000,
            "2026-12",
        )
        assert {"window", "items"} <= set(recommended) and "ledger" not in recommended
        assert finance_log["items"] == []
        assert refused.value.status == 403 and "fleetpolicies" in str(refused.value)
        assert far.status_code == 422 and "a year ahead at most" in far.text
    finally:
        store.close()
