"""Live placement counts a node's CPU and memory, not its GPUs alone: what other pods request
there (a DaemonSet's, unmanaged work's) is taken from the node's allocatable, and work whose
pods would not fit it goes elsewhere (issue 44)."""

from __future__ import annotations

from typing import Any

import yaml

from gpufleet.engine.placed import natural_key
from gpufleet.testing.cluster import ControlPlane

from .conftest import job_manifest


def test_work_goes_where_its_cpu_fits_not_only_its_gpus(
    scenario: Any, cluster: ControlPlane
) -> None:
    s = scenario(2)
    team = s.team("cpu")
    s.apply()
    # the node the engine would choose by GPUs alone (both are empty: the first by name) has
    # 90 of its 96 CPUs taken by a pod gpufleet does not manage
    first, second = sorted(s.nodes, key=natural_key)
    cluster.apply(
        [
            {"apiVersion": "v1", "kind": "Pod",
             "metadata": {"name": "cpu-hog", "namespace": s.namespace},
             "spec": {"nodeName": first, "tolerations": [{"operator": "Exists"}],
                      "containers": [{"name": "hog", "image": "example.com/hog:1",
                                      "resources": {"requests": {"cpu": "90"}}}]}},
        ]
    )  # fmt: skip
    labels = {"gpufleet.io/team": team, "gpufleet.io/class": "elastic",
              "gpufleet.io/pool": s.pool}  # fmt: skip
    body = job_manifest("train", s.namespace, labels, 1, 1, "600s")
    (container,) = body["spec"]["template"]["spec"]["containers"]
    container["resources"]["requests"] = {"cpu": "16", "memory": "64Gi"}
    created = cluster.kubectl("create", "-f", "-", input=yaml.safe_dump(body), check=False)
    assert created.returncode == 0, created.stderr
    s.wait_states({"train": "Running"}, timeout=90)
    status = cluster.get("gwl", "train", "-n", s.namespace)["status"]
    assert status["nodes"] == [second], status
    (pod,) = cluster.get("pods", "-n", s.namespace, "-l", "job-name=train")["items"]
    assert pod["spec"]["nodeName"] == second
