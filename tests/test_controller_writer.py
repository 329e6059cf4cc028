"""The writer's contract, without an API server: assumed outcomes, per-object order, and what a
failed write leaves behind. (Its API calls are exercised by the cluster tests.)"""

from __future__ import annotations

import importlib
import threading
import time
from typing import Any

from kubernetes.client.exceptions import ApiException

cache_module = importlib.import_module("gpufleet.controllers.cache")
writer_module = importlib.import_module("gpufleet.controllers.writer")


def job(name: str, version: str, suspend: bool) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "ns", "resourceVersion": version},
        "spec": {"suspend": suspend},
    }


def make() -> tuple[Any, Any]:
    cache = cache_module.ClusterCache([cache_module.Store("jobs")])
    cache.replace("jobs", [job("a", "1", True)])
    writer = writer_module.Writer(cache, None, None, threading.Event(), workers=4)
    return cache, writer


def test_merge_patch_follows_rfc_7386() -> None:
    target = {"spec": {"suspend": True, "template": {"spec": {"affinity": {"x": 1}}}}}
    patched = writer_module.merge_patch(
        target, {"spec": {"suspend": False, "template": {"spec": {"affinity": None}}}}
    )
    assert patched == {"spec": {"suspend": False, "template": {"spec": {}}}}
    assert target["spec"]["suspend"] is True  # the cached object is never changed in place


def test_readers_see_the_assumed_outcome_until_the_write_returns() -> None:
    cache, writer = make()
    release = threading.Event()

    def work() -> None:
        release.wait(5)
        cache.store("jobs", job("a", "2", False))  # what the API answered

    writer.submit("ns/a", [("jobs", job("a", "1", False))], work)
    assert cache.items("jobs")[0]["spec"]["suspend"] is False  # assumed, not yet written
    assert writer.busy() == {"ns/a"}
    release.set()
    assert writer.wait_idle(5)
    (held,) = cache.items("jobs")
    assert held["metadata"]["resourceVersion"] == "2" and not held["spec"]["suspend"]


def test_a_failed_write_shows_the_object_as_it_was() -> None:
    cache, writer = make()

    def work() -> None:
        raise ApiException(status=409, reason="Conflict")

    writer.submit("ns/a", [("jobs", job("a", "1", False))], work)
    assert writer.wait_idle(5)
    assert cache.items("jobs")[0]["spec"]["suspend"] is True
    assert writer.written.is_set()  # the loop is woken to decide again


def test_writes_to_one_object_run_in_the_order_handed_over() -> None:
    cache, writer = make()
    done: list[int] = []

    def work(step: int) -> Any:
        def run() -> None:
            time.sleep(0.05 if step == 0 else 0)  # the first is the slowest
            done.append(step)

        return run

    first, second = job("a", "1", False), job("a", "1", True)
    writer.submit("ns/a", [("jobs", first)], work(0))
    writer.submit("ns/a", [("jobs", second)], work(1))
    # the later assumption wins at once, and the first write's end does not drop it
    assert cache.items("jobs")[0] is second
    assert writer.wait_idle(5)
    assert done == [0, 1]
    assert cache.items("jobs")[0]["spec"]["suspend"] is True  # the stored object again


def test_a_node_heartbeat_is_stored_but_starts_no_cycle() -> None:
    """On a large cluster heartbeats arrive many times a second: only a change that can change
    a decision wakes the loop."""

    def node(version: str, heartbeat: str, taints: list[dict[str, str]]) -> dict[str, Any]:
        return {
            "metadata": {"name": "n1", "resourceVersion": version, "labels": {"p": "x"}},
            "spec": {"taints": taints},
            "status": {
                "allocatable": {"nvidia.com/gpu": "8"},
                "images": [{"names": ["a" * 100]}] * 50,
                "conditions": [
                    {"type": "Ready", "status": "True", "lastHeartbeatTime": heartbeat},
                    {"type": "GPUHealthy", "status": "True", "lastHeartbeatTime": heartbeat},
                ],
            },
        }

    cache = cache_module.ClusterCache(
        [cache_module.Store("nodes", cache_module.trim_node, cache_module.node_matters)]
    )
    cache.replace("nodes", [node("1", "10:00", [])])
    assert "images" not in cache.items("nodes")[0]["status"]  # trimmed
    cache.changed.clear()
    cache.apply_event("nodes", "MODIFIED", node("2", "10:01", []))
    assert not cache.changed.is_set()
    assert cache.items("nodes")[0]["metadata"]["resourceVersion"] == "2"  # stored all the same
    tainted = node("3", "10:01", [{"key": "gpufleet.io/gpu-unhealthy", "effect": "NoSchedule"}])
    cache.apply_event("nodes", "MODIFIED", tainted)
    assert cache.changed.is_set()


def test_a_deleted_pod_shows_as_deleting_until_the_watch_says_more() -> None:
    """After a delete of ours returns, the pod shows as being deleted (not as the watch last
    saw it, running) until the watch catches up; a delete the watch has seen stays gone."""

    def pod(version: str, uid: str = "u1", **metadata: Any) -> dict[str, Any]:
        return {
            "metadata": {
                "name": "p",
                "namespace": "ns",
                "uid": uid,
                "resourceVersion": version,
                **metadata,
            },
            "spec": {"nodeName": "n1", "containers": []},
            "status": {"phase": "Running"},
        }

    cache = cache_module.ClusterCache([cache_module.Store("pods", cache_module.trim_pod)])
    cache.replace("pods", [pod("5")])
    cache.store_deleting("pods", pod("6", deletionTimestamp="2026-01-01T00:00:00Z"))
    assert cache.items("pods")[0]["metadata"]["deletionTimestamp"] == "2026-01-01T00:00:00Z"
    cache.replace("pods", [pod("5")])
    cache.store_deleting("pods", pod("5"))  # deleted at once: the answer is the pod as it was
    assert cache.items("pods")[0]["metadata"].get("deletionTimestamp")
    cache.apply_event("pods", "DELETED", pod("7"))
    cache.store_deleting("pods", pod("6"))  # answered after the watch removed it
    assert cache.items("pods") == []
    cache.replace("pods", [pod("8", uid="u2")])  # made again under its name
    cache.store_deleting("pods", pod("6"))
    assert not cache.items("pods")[0]["metadata"].get("deletionTimestamp")
    cache.replace("pods", [pod("9")])
    cache.store_deleting("pods", pod("6"))  # the watch has seen more since
    assert not cache.items("pods")[0]["metadata"].get("deletionTimestamp")
