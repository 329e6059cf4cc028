"""Topology-aware gangs on the real control plane: kwok nodes labelled with network blocks
(`gpufleet.io/block`); the controller admits a gang into one block, pinned to its nodes, and
holds a gang that must stay in one block (`gpufleet.io/topology: block`) while none has room."""

from __future__ import annotations

from typing import Any

import yaml

from gpufleet.testing.cluster import ControlPlane

from .conftest import Scenario, job_manifest


def test_gangs_go_into_one_block_or_wait_for_one(cluster: ControlPlane, scenario: Any) -> None:
    s: Scenario = scenario(5)  # removed after the test: no pool of it lingers for the next
    team = s.team("train")
    s.apply()
    first, second, third, fourth, fifth = s.nodes
    blocks = {first: "b1", second: "b1", third: "b2", fourth: "b2", fifth: "b3"}
    for node, block in blocks.items():
        cluster.kubectl("label", "node", node, f"gpufleet.io/block={block}")
    # half of the first node busy: best fit across the zone would take the second and third
    # nodes for a 2-node gang (one in each block)
    s.job("small", team, "elastic", 4)
    s.wait_states({"small": "Running"})

    def create(name: str, pods: int, **labels: str) -> None:
        body = job_manifest(
            name,
            s.namespace,
            # in this pool: the session's other tests leave pools with more free GPUs
            {
                "gpufleet.io/team": team,
                "gpufleet.io/class": "elastic",
                "gpufleet.io/pool": s.pool,
                **labels,
            },
            8,
            pods,
            "600s",
        )
        cluster.kubectl("create", "-f", "-", input=yaml.safe_dump(body))

    create("gang", 2)
    s.wait_states({"gang": "Running"})
    placed = cluster.get("gwl", "gang", "-n", s.namespace)["status"]["nodes"]
    assert sorted(placed) == sorted([third, fourth]), placed  # block b2, both pods
    pods = cluster.get("pods", "-n", s.namespace, "-l", "batch.kubernetes.io/job-name=gang")
    assert sorted(p["spec"]["nodeName"] for p in pods["items"]) == sorted([third, fourth])

    # a 2-node gang that must stay in one block: two whole nodes are free (the second and the
    # fifth) but in different blocks
    create("together", 2, **{"gpufleet.io/topology": "block"})

    def message() -> str:  # "" until the controller has made its GPUWorkload
        found = cluster.kubectl(
            "get", "gwl", "together", "-n", s.namespace, "-o", "jsonpath={.status.message}",
            check=False,
        )  # fmt: skip
        return found.stdout

    cluster.wait_until(
        lambda: "fit together in one block" in message(),
        60,
        "the required-block gang to wait with its reason",
    )
    found = cluster.get("gwl", "together", "-n", s.namespace)
    assert found["spec"]["topology"] == "block"
    assert found["status"]["state"] == "Pending"
    assert found["status"]["reason"] == "WaitingForGang"
    # the small job ends: b1 has two whole nodes again and the gang runs there
    cluster.kubectl("delete", "job", "small", "-n", s.namespace)
    s.wait_states({"together": "Running"}, timeout=90)
    placed = cluster.get("gwl", "together", "-n", s.namespace)["status"]["nodes"]
    assert sorted(placed) == sorted([first, second])
