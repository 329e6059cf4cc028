"""The writer's contract, without an API server: assumed outcomes, per-object order, and what a
failed write leaves behind. (Its API calls are exercised by the cluster tests.)"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

from kubernetes.client.exceptions import ApiException

from gpufleet.controllers import actions as actions_module
from gpufleet.controllers import writer as writer_module
from gpufleet.kube import cache as cache_module
from gpufleet.kube.kinds import JOB
from gpufleet.kube.kinds.base import merge_patch


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
    patched = merge_patch(
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


def test_an_urgent_write_takes_the_writes_before_it_on_its_object_ahead() -> None:
    """A reserved Job's release waits for its GPUWorkload's create (writes to one object run in
    order): the create goes ahead of the other objects' writes with it, and only once."""
    cache = cache_module.ClusterCache([cache_module.Store("jobs")])
    writer = writer_module.Writer(cache, None, None, threading.Event(), workers=1)
    started, busy, done = threading.Event(), threading.Event(), []

    def work(name: str) -> Any:
        def run() -> None:
            if name == "x":
                started.set()
                busy.wait(5)  # the one worker is busy while the rest are handed over
            done.append(name)

        return run

    writer.submit("ns/x", [], work("x"))
    assert started.wait(5)
    for other in ("b1", "b2", "b3"):
        writer.submit(f"ns/{other}", [], work(other))
    writer.submit("ns/a", [], work("a-create"))
    writer.submit("ns/a", [], work("a-release"), urgent=True)
    busy.set()
    assert writer.wait_idle(5)
    assert done == ["x", "a-create", "a-release", "b1", "b2", "b3"]


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


class RecordingApi:
    """Answers the writer's custom-object calls as an API server would, and records them;
    `fail_status` makes the next status patches raise (an API server restarting)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, dict[str, Any]]] = []
        self.fail_status: list[Exception] = []
        self.version = 10

    def _answer(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        self.version += 1
        metadata = {"name": name, "namespace": "ns", "resourceVersion": str(self.version)}
        return {**body, "metadata": metadata}

    def patch_namespaced_custom_object(self, *args: Any, **_: Any) -> Any:
        _group, _version, _namespace, plural, name, body = args
        if plural == "gpuworkloads":  # no status subresource: its status is patched here
            self.calls.append(("status", plural, body))
            if self.fail_status:
                raise self.fail_status.pop(0)
            return self._answer(name, {"spec": {}, "status": body["status"]})
        self.calls.append(("patch", plural, body))
        answer = self._answer(name, {"spec": {"suspend": False}})
        return type("Response", (), {"data": json.dumps(answer).encode()})()

    def create_namespaced_custom_object(self, *args: Any, **_: Any) -> Any:
        _group, _version, _namespace, plural, body = args
        self.calls.append(("create", plural, body))
        if self.fail_status:
            raise self.fail_status.pop(0)
        return self._answer(body["metadata"]["name"], body)

    def statuses(self) -> list[dict[str, Any]]:
        """The GPUWorkload statuses written, by patch or with a create."""
        return [body["status"] for verb, _, body in self.calls if verb in ("status", "create")]


def make_with_api(*stores: Any) -> tuple[Any, Any, RecordingApi]:
    api = RecordingApi()
    cache = cache_module.ClusterCache(
        [cache_module.Store("jobs"), cache_module.Store("gpuworkloads"), *stores]
    )
    cache.replace("jobs", [job("a", "1", True)])
    gpu_workload = {"metadata": {"name": "a", "namespace": "ns", "resourceVersion": "1"}}
    cache.replace("gpuworkloads", [gpu_workload])
    writer = writer_module.Writer(cache, api, None, threading.Event(), workers=4)
    return cache, writer, api


def settle(writer: Any) -> None:
    """Wait until no write is queued or in flight (held statuses may stay held)."""
    deadline = time.monotonic() + 5
    while writer.queued and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not writer.queued


def workload_change(status: dict[str, Any], wait: float = 0.0, resume: bool = False) -> Any:
    patches = ({"spec": {"suspend": False}},) if resume else ()
    return actions_module.Change("ns", "a", patches=patches, status=status, status_may_wait=wait)


ADMITTED = {"state": "Queued", "pool": "h100", "admittedAt": "2026-01-01T12:00:00Z"}


def test_an_admission_record_is_held_and_written_with_running_in_one_request() -> None:
    cache, writer, api = make_with_api()
    job_a, workload_a = cache.get("jobs", ("ns", "a")), cache.get("gpuworkloads", ("ns", "a"))
    writer.workload(job_a, workload_a, workload_change(ADMITTED, wait=30, resume=True), False)
    settle(writer)
    assert [verb for verb, _, _ in api.calls] == ["patch"]  # the Job only
    # readers see the admission recorded while it is held back
    assert cache.get("gpuworkloads", ("ns", "a"))["status"] == ADMITTED
    assert writer.busy() == {"ns/a"}
    running = {"state": "Running", "startedAt": "2026-01-01T12:00:02Z"}
    held_workload = cache.get("gpuworkloads", ("ns", "a"))
    writer.workload(job_a, held_workload, workload_change(running), False)
    settle(writer)
    assert api.statuses() == [{**ADMITTED, **running}]  # one request carries both
    assert cache.get("gpuworkloads", ("ns", "a"))["status"] == {**ADMITTED, **running}
    assert writer.busy() == set()
    writer.shutdown(1)


def new_workload() -> dict[str, Any]:
    """The GPUWorkload a cycle makes of a new Job (`loop._workload_body`): not yet created."""
    return {"metadata": {"name": "b", "namespace": "ns"}, "spec": {"team": "ml"}}


def test_a_new_workload_admitted_at_once_costs_one_create_carrying_admission_and_running() -> None:
    cache, writer, api = make_with_api()
    job_b = job("b", "1", False)
    job_b["metadata"]["creationTimestamp"] = "2026-01-01T11:59:59Z"
    admitted = actions_module.Change("ns", "b", status=ADMITTED, status_may_wait=30)
    writer.workload(job_b, new_workload(), admitted, True)
    settle(writer)
    assert api.calls == []  # nothing created yet: the admission's record waits for Running
    # ... while the next cycle reads it as created and admitted
    assert cache.get("gpuworkloads", ("ns", "b"))["status"]["state"] == "Queued"
    running = {"state": "Running", "startedAt": "2026-01-01T12:00:02Z"}
    held = cache.get("gpuworkloads", ("ns", "b"))
    writer.workload(job_b, held, actions_module.Change("ns", "b", status=running), False)
    settle(writer)
    ((verb, _, body),) = api.calls
    assert verb == "create" and body["spec"] == {"team": "ml"}
    assert body["status"] == {
        **ADMITTED, "submittedAt": "2026-01-01T11:59:59Z", **running
    }  # fmt: skip
    assert cache.get("gpuworkloads", ("ns", "b"))["status"]["state"] == "Running"
    assert writer.busy() == set()
    # one that waits is created at once, with its first status in the same request
    waiting = {"state": "Pending", "reason": "NoQuota", "position": 3}
    writer.workload(job_b, new_workload(), actions_module.Change("ns", "b", status=waiting), True)
    settle(writer)
    (verb, _, body) = api.calls[-1]
    assert len(api.calls) == 2 and verb == "create"
    assert body["status"] == {**waiting, "submittedAt": "2026-01-01T11:59:59Z"}
    writer.shutdown(1)


def test_a_held_record_is_written_alone_when_due_and_at_shutdown() -> None:
    cache, writer, api = make_with_api()
    job_a, workload_a = cache.get("jobs", ("ns", "a")), cache.get("gpuworkloads", ("ns", "a"))
    writer.workload(job_a, workload_a, workload_change(ADMITTED, wait=0.2, resume=True), False)
    deadline = time.monotonic() + 5
    while not api.statuses() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert api.statuses() == [ADMITTED]
    settle(writer)
    assert writer.busy() == set()
    writer.workload(job_a, workload_a, workload_change(ADMITTED, wait=60, resume=True), False)
    settle(writer)
    assert writer.wait_idle(5)  # a stopping controller writes what it holds
    assert api.statuses() == [ADMITTED, ADMITTED]
    writer.shutdown(1)


def test_a_held_record_whose_write_fails_is_held_again_unless_refused() -> None:
    cache, writer, api = make_with_api()
    job_a, workload_a = cache.get("jobs", ("ns", "a")), cache.get("gpuworkloads", ("ns", "a"))
    writer.workload(job_a, workload_a, workload_change(ADMITTED, wait=60, resume=True), False)
    settle(writer)
    api.fail_status.append(ConnectionResetError("the API server restarts"))
    running = {"state": "Running"}
    writer.workload(job_a, cache.get("gpuworkloads", ("ns", "a")), workload_change(running), False)
    settle(writer)
    # the admission is still shown and held (Running is decided again by the next cycle)
    assert cache.get("gpuworkloads", ("ns", "a"))["status"] == ADMITTED
    assert writer.busy() == {"ns/a"}
    api.fail_status.append(ApiException(status=404, reason="Not Found"))  # gone with its Job
    writer.workload(job_a, cache.get("gpuworkloads", ("ns", "a")), workload_change(running), False)
    settle(writer)
    assert writer.busy() == set()
    assert "status" not in cache.get("gpuworkloads", ("ns", "a"))  # as the store holds it
    writer.shutdown(1)


class PodApi:
    """Answers the writer's pod calls; `refuse` makes the finalizer patch fail as the API
    server does when its `test` op finds something else (422)."""

    def __init__(self, calls: list[tuple[str, str, Any]], refuse: bool) -> None:
        self.calls, self.refuse = calls, refuse

    def patch_namespaced_pod(self, name: str, _namespace: str, body: Any, **_: Any) -> Any:
        self.calls.append(("patch", f"pods/{name}", body))
        if self.refuse:
            raise ApiException(status=422, reason="the test operation failed")
        return type("Response", (), {"read": lambda self: b"{}"})()

    def delete_namespaced_pod(self, name: str, namespace: str, **_: Any) -> Any:
        self.calls.append(("delete", f"pods/{name}", None))
        gone = {"kind": "Pod", "metadata": {"name": name, "namespace": namespace}}
        return type("Response", (), {"data": json.dumps(gone).encode()})()


def test_a_preempted_jobs_pods_go_after_its_suspension_unless_their_finalizers_moved() -> None:
    tracking = "batch.kubernetes.io/job-tracking"
    for refuse in (False, True):
        cache, _, api = make_with_api(cache_module.Store("pods", cache_module.trim_pod))
        writer = writer_module.Writer(
            cache, api, PodApi(api.calls, refuse), threading.Event(), workers=4
        )
        pod = {"metadata": {"name": "a-x", "namespace": "ns", "finalizers": [tracking]}}
        (write,) = actions_module.suspended_pod_writes(
            type("Item", (), {"pods": (pod,)})(), tracking
        )
        change = actions_module.Change(
            "ns",
            "a",
            patches=(JOB.suspend_patch(),),
            evicts=True,
            pod_writes=(write,),
            status={"state": "Preempted"},
        )
        job_a, workload_a = cache.get("jobs", ("ns", "a")), cache.get("gpuworkloads", ("ns", "a"))
        writer.workload(job_a, workload_a, change, False)
        settle(writer)
        verbs = [(verb, what) for verb, what, _ in api.calls]
        # suspended first, so the Job controller makes no new pod; the finalizer off before
        # the delete, so the pod counts as neither failed nor succeeded
        expected = [("patch", "jobs"), ("patch", "pods/a-x")]
        if not refuse:
            expected.append(("delete", "pods/a-x"))
        # a pod whose finalizers moved is left to the Job controller; the record is written
        assert verbs == [*expected, ("status", "gpuworkloads")], refuse
        sent: Any = api.calls[1][2]  # a JSON patch: a list
        assert sent == [
            {"op": "test", "path": "/metadata/finalizers/0", "value": tracking},
            {"op": "remove", "path": "/metadata/finalizers/0"},
        ]
