"""The writer reuses its connections to the API server (a new TLS handshake per request costs
the controller and the API server more than the request itself)."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator

import pytest
from kubernetes import client, config

from gpufleet.controllers import writer as writer_module
from gpufleet.controllers.actions import Change
from gpufleet.kube import cache as cache_module
from gpufleet.testing.cluster import ControlPlane


@pytest.fixture
def api(cluster: ControlPlane) -> Iterator[client.ApiClient]:
    configuration = client.Configuration()
    config.load_kube_config(str(cluster.kubeconfig), client_configuration=configuration)
    with client.ApiClient(configuration) as api:
        yield api


def _connections(api: client.ApiClient) -> int:
    pools = api.rest_client.pool_manager.pools
    # the container refuses plain iteration (not thread-safe); keys() takes its lock
    return sum(pools[key].num_connections for key in pools.keys())  # noqa: SIM118


def test_events_and_patches_reuse_one_connection(api: client.ApiClient, namespace: str) -> None:
    core, batch = client.CoreV1Api(api), client.BatchV1Api(api)
    name = f"job-{uuid.uuid4().hex[:6]}"
    job = batch.create_namespaced_job(
        namespace,
        {
            "metadata": {"name": name},
            "spec": {
                "suspend": True,
                "template": {
                    "spec": {
                        "restartPolicy": "Never",
                        "containers": [{"name": "c", "image": "busybox"}],
                    }
                },
            },
        },
    )
    cache = cache_module.ClusterCache([cache_module.Store("jobs")])
    writer = writer_module.Writer(
        cache, client.CustomObjectsApi(api), core, threading.Event(), workers=1
    )
    body = {**api.sanitize_for_serialization(job), "apiVersion": "batch/v1", "kind": "Job"}
    before = _connections(api)
    for i in range(20):
        writer._event(body, "Tested", f"event {i}")
        writer.workload(
            body,
            {"metadata": {"name": name, "namespace": namespace}},
            Change(namespace, name, patches=({"metadata": {"annotations": {"n": str(i)}}},)),
            create=False,
        )
        assert writer.wait_idle(10)
    made = _connections(api) - before
    assert made <= 1, f"{made} new connections for 40 requests made one after another"
    events = core.list_namespaced_event(namespace, field_selector=f"involvedObject.name={name}")
    assert sum(e.reason == "Tested" for e in events.items) == 20
