"""Latency of `gpufleet server`'s API with 10,000 workloads in its watch caches. Prints JSON;
not a timed test.

    python benchmarks/api_latency.py             # 10,000 workloads, 1,250 nodes, 300 requests each
    python benchmarks/api_latency.py --quick     # 1,000 workloads, 50 requests each (CI smoke)

The server is the real one (`create_app` on uvicorn, over HTTP on loopback), its cache the
controller's `ClusterCache` filled as its watches would fill it. Callers are authenticated
with a token and every request is authorised through `KubernetesAccess`, whose TokenReview and
SubjectAccessReview answers come from an in-process stand-in that answers at once: the figures
are the server's own cost with warm access caches, not the API server's review latency.

Measured per endpoint, one client, keep-alive: p50/p90/p99/max milliseconds of
- list: `/workloads` (first page of 500), `?team=` (one team's 100), `?limit=10000` (all),
  `?state=Pending,Preempted` (the queue), and as a team lead allowed in one namespace only;
- get and explain of one workload; status, capacity, teams, nodes;
- list right after a change of the cache (the views of all workloads are rebuilt);
- submit: `POST /workloads` of the short form, as a caller (the server's own cost: the
  create is answered at once by an in-process stand-in, not an API server);
and the list p99 with 8 concurrent clients.

`cold_access` measures what the stand-in hides: a caller allowed in one namespace of `--teams`,
with nothing cached for them yet, costs one SubjectAccessReview per namespace. With each review
taking `--review-ms` (a real API server answers in a few milliseconds), the list is timed with
the reviews asked side by side (`SAR_PARALLEL`, as served) and one after another.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import httpx
import uvicorn

from gpufleet.api.access import KubernetesAccess
from gpufleet.api.app import create_app
from gpufleet.api.limits import Limits
from gpufleet.api.source import CacheSource, new_cache
from gpufleet.testing.cluster import free_port

NOW = datetime(2026, 12, 1, 12, tzinfo=UTC)
STATES = ["Running"] * 6 + ["Pending", "Preempted", "Completed", "Failed"]


class InstantReviews:
    """TokenReview and SubjectAccessReview answered at once: token `admin` may do anything,
    `lead-N` may read GPU workloads in namespace team-N only."""

    def create_token_review(self, body: dict[str, Any]) -> Any:
        token = body["spec"]["token"]
        user = SimpleNamespace(username=token, groups=[], uid="", extra={})
        return SimpleNamespace(status=SimpleNamespace(authenticated=True, user=user))

    def create_subject_access_review(self, body: dict[str, Any]) -> Any:
        spec = body["spec"]
        user, namespace = spec["user"], spec["resourceAttributes"].get("namespace")
        allowed = user == "admin" or (
            user.startswith("lead-") and namespace == f"team-{user[len('lead-') :]}"
        )
        return SimpleNamespace(status=SimpleNamespace(allowed=allowed))


class SlowReviews(InstantReviews):
    """The same answers, each after `delay_s`; `lead-N~K` is lead N under a new name, so that
    no access cache holds its answers."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s

    def create_token_review(self, body: dict[str, Any]) -> Any:
        time.sleep(self.delay_s)
        return super().create_token_review(body)

    def create_subject_access_review(self, body: dict[str, Any]) -> Any:
        time.sleep(self.delay_s)
        spec = body["spec"]
        named = {**spec, "user": spec["user"].split("~")[0]}
        return super().create_subject_access_review({**body, "spec": named})


class InstantCreates:
    """The server's writes answered at once: a create returns its object with a uid."""

    def __init__(self) -> None:
        self.made = 0

    def create(
        self, obj: dict[str, Any], namespace: str, caller: Any, dry_run: bool
    ) -> dict[str, Any]:
        self.made += 1
        return {**obj, "metadata": {**obj["metadata"], "uid": f"uid-{self.made}"}}

    def cancel(self, workload: dict[str, Any]) -> str:
        raise NotImplementedError

    def release(self, node: str, by: str) -> str:
        raise NotImplementedError


def fill(cache: Any, workloads: int, nodes: int, teams: int, rng: random.Random) -> None:
    pools = [f"pool-{i}" for i in range(4)]
    cache.replace("gpupools", [
        {"metadata": {"name": p}, "spec": {"gpuType": "H100"},
         "status": {"totalGPUs": nodes * 2, "healthyGPUs": nodes * 2,
                    "allocatedGPUs": nodes * 1.5, "idleGPUs": nodes * 0.5}}
        for p in pools
    ])  # fmt: skip
    cache.replace("teams", [
        {"metadata": {"name": f"team-{t}"}, "spec": {"burstLimit": "50%"},
         "status": {"reservedGPUs": 40, "usedGPUs": 40}}
        for t in range(teams)
    ])  # fmt: skip
    cache.replace("reservations", [
        {"metadata": {"name": f"team-{t}"}, "spec": {"team": f"team-{t}", "pool": pools[t % 4],
                                                     "gpus": 40}}
        for t in range(teams)
    ])  # fmt: skip
    node_names = [f"node-{n}" for n in range(nodes)]
    cache.replace("nodes", [
        {"metadata": {"name": n, "labels": {"gpufleet.io/pool": pools[i % 4]},
                      "resourceVersion": "1"},
         "spec": {}, "status": {"allocatable": {"nvidia.com/gpu": "8"},
                                "conditions": [{"type": "Ready", "status": "True"},
                                               {"type": "GPUHealthy", "status": "True"}]}}
        for i, n in enumerate(node_names)
    ])  # fmt: skip
    items, pods = [], []
    position: dict[str, int] = {}
    for i in range(workloads):
        team = f"team-{i % teams}"
        state = rng.choice(STATES)
        submitted = NOW - timedelta(hours=rng.uniform(0, 60))
        status: dict[str, Any] = {"state": state, "submittedAt": submitted.isoformat()}
        if state in ("Pending", "Preempted"):
            position[team] = position.get(team, 0) + 1
            status.update(reason="PoolFull", message="needs 8 GPUs", position=position[team])
        elif state == "Running":
            node = rng.choice(node_names)
            status.update(pool=pools[i % 4], nodes=[node], startedAt=NOW.isoformat())
            pods.append({"metadata": {"namespace": team, "name": f"w-{i}-0"},
                         "spec": {"nodeName": node, "containers": [
                             {"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
                         "status": {"phase": "Running"}})  # fmt: skip
        else:
            status["finishedAt"] = (NOW - timedelta(hours=rng.uniform(0, 72))).isoformat()
        items.append({
            "metadata": {"namespace": team, "name": f"w-{i}", "resourceVersion": str(i + 1)},
            "spec": {"team": team, "class": rng.choice(["reserved", "elastic"]), "priority": 50,
                     "gpus": 1, "pods": 1,
                     "workloadRef": {"apiVersion": "batch/v1", "kind": "Job", "name": f"w-{i}"}},
            "status": status,
        })  # fmt: skip
    cache.replace("gpuworkloads", items)
    cache.replace("pods", pods)


def quantiles(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)

    def at(q: float) -> float:
        return round(1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))], 2)

    return {"p50": at(0.5), "p90": at(0.9), "p99": at(0.99), "max": round(1000 * ordered[-1], 2)}


def timed(client: httpx.Client, path: str, token: str, requests: int) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {token}"}
    first = client.get(path, headers=headers)
    assert first.status_code == 200, (path, first.status_code, first.text[:300])
    samples = []
    for _ in range(requests):
        started = time.perf_counter()
        response = client.get(path, headers=headers)
        samples.append(time.perf_counter() - started)
        assert response.status_code == 200
    body = first.json()
    items = len(body["items"]) if isinstance(body, dict) and "items" in body else None
    return {"path": path, "bytes": len(first.content), "items": items, "ms": quantiles(samples)}


def serve(app: Any) -> tuple[uvicorn.Server, threading.Thread, int]:
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    return server, thread, port


def cold_access(source: Any, review_ms: float, requests: int) -> dict[str, Any]:
    """`/workloads` as a new team lead each time (every review asked), the reviews asked side
    by side as served, then one at a time."""
    from gpufleet.api import context

    reviews = SlowReviews(review_ms / 1000)
    unlimited = Limits(rate=1e9, burst=10**9)
    figures: dict[str, Any] = {"review_ms": review_ms}
    served = context.SAR_PARALLEL
    for label, parallel in (("side_by_side", served), ("one_at_a_time", 1)):
        context.SAR_PARALLEL = parallel
        try:
            app = create_app(source, KubernetesAccess(reviews, reviews), None,
                             clock=lambda: NOW, limits=unlimited)  # fmt: skip
        finally:
            context.SAR_PARALLEL = served
        server, thread, port = serve(app)
        samples = []
        with httpx.Client(base_url=f"http://127.0.0.1:{port}/api/v1", timeout=60) as client:
            for i in range(requests):
                started = time.perf_counter()
                answer = client.get("/workloads", headers={"Authorization": f"Bearer lead-7~{i}"})
                samples.append(time.perf_counter() - started)
                assert answer.status_code == 200, answer.text[:300]
                teams = {w["team"] for w in answer.json()["items"]}
                assert teams == {"team-7"}, teams
        server.should_exit = True
        thread.join(timeout=10)
        figures[label] = {"parallel": parallel, "ms": quantiles(samples)}
    figures["speedup_p50"] = round(
        figures["one_at_a_time"]["ms"]["p50"] / figures["side_by_side"]["ms"]["p50"], 2
    )
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="1,000 workloads, 50 requests")
    parser.add_argument("--workloads", type=int, default=10_000)
    parser.add_argument("--nodes", type=int, default=1_250)
    parser.add_argument("--teams", type=int, default=100)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--review-ms", type=float, default=2.0,
                        help="each access review's latency in the cold_access figures")  # fmt: skip
    args = parser.parse_args()
    if args.quick:
        args.workloads, args.nodes, args.teams, args.requests = 1_000, 125, 10, 50
    cache = new_cache()
    fill(cache, args.workloads, args.nodes, args.teams, random.Random(42))
    source = CacheSource(cache)
    reviews = InstantReviews()
    # every request still passes the guard (its cost is in the figures), but one caller
    # asking thousands of times must not be rate limited: the answers are what is measured
    unlimited = Limits(rate=1e9, burst=10**9)
    creates = InstantCreates()
    app = create_app(
        source, KubernetesAccess(reviews, reviews), creates, clock=lambda: NOW, limits=unlimited
    )
    server, thread, port = serve(app)
    n = args.requests
    results = []
    with httpx.Client(base_url=f"http://127.0.0.1:{port}/api/v1", timeout=60) as client:
        for path in ("/workloads", "/workloads?team=team-7", "/workloads?limit=10000",
                     "/workloads?state=Pending,Preempted",
                     "/workloads?team=team-7&class=reserved&state=Running,Completed&since=48h",
                     "/workloads/team-7/w-7",
                     "/workloads/team-7/w-7/explain", "/status", "/capacity", "/teams",
                     "/nodes"):  # fmt: skip
            results.append(timed(client, path, "admin", n))
        lead = timed(client, "/workloads", "lead-7", n)
        results.append({**lead, "path": "/workloads (team lead, one namespace allowed)"})
        # a change in the cache before each request: all workload views are rebuilt
        rebuilt = []
        headers = {"Authorization": "Bearer admin"}
        for i in range(max(n // 10, 5)):
            cache.apply_event("gpuworkloads", "MODIFIED", {
                "metadata": {"namespace": "team-1", "name": "w-1",
                             "resourceVersion": str(10 * args.workloads + i)},
                "spec": {"team": "team-1", "class": "elastic", "priority": 50, "gpus": 1,
                         "pods": 1}, "status": {"state": "Running"}})  # fmt: skip
            started = time.perf_counter()
            assert client.get("/workloads", headers=headers).status_code == 200
            rebuilt.append(time.perf_counter() - started)
        results.append({"path": "/workloads after a cache change", "ms": quantiles(rebuilt)})
        submits = []
        for i in range(n):
            body = {"namespace": "team-7", "name": f"new-{i}", "team": "team-7", "gpus": 8,
                    "pods": 2, "image": "ghcr.io/me/train:1", "command": ["python", "t.py"],
                    "env": {"LR": "0.1"}}  # fmt: skip
            started = time.perf_counter()
            made = client.post("/workloads", json=body,
                               headers={**headers, "X-Gpufleet-Client": "bench"})  # fmt: skip
            submits.append(time.perf_counter() - started)
            assert made.status_code == 201, made.text[:300]
        results.append({"path": "POST /workloads (short form)", "ms": quantiles(submits)})

    def one(_: int) -> float:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}/api/v1") as own:
            started = time.perf_counter()
            assert own.get("/workloads", headers={"Authorization": "Bearer admin"}).is_success
            return time.perf_counter() - started

    with ThreadPoolExecutor(8) as pool:
        concurrent = list(pool.map(one, range(n)))
    server.should_exit = True
    thread.join(timeout=10)
    cold = cold_access(source, args.review_ms, max(n // 10, 5))
    list_get = [r for r in results if r["path"] in ("/workloads", "/workloads/team-7/w-7")]
    filtered = next(r for r in results if "&since=" in r["path"])
    submitted = next(r for r in results if r["path"].startswith("POST"))
    print(json.dumps({
        "workloads": args.workloads, "nodes": args.nodes, "teams": args.teams,
        "requests_per_endpoint": n,
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
        "results": results,
        "concurrent_8_clients_list_ms": quantiles(concurrent),
        "list_and_get_p99_ms": max(r["ms"]["p99"] for r in list_get),
        "list_with_filters_ms": filtered["ms"],
        "submit_ms": submitted["ms"],
        "cold_access": cold,
        "median_of_p50_ms": statistics.median(r["ms"]["p50"] for r in results),
    }, indent=2))  # fmt: skip


if __name__ == "__main__":
    main()
