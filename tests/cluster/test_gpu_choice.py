"""Several acceptable GPU types on the real control plane: a Job annotated
`gpufleet.io/gpu-types: P,N` runs in a pool of type N when P is full, and its reclaim of
reserved capacity never reaches into a pool of a type it did not list, although its team's
reservation there is as large and the work there as preemptible."""

from __future__ import annotations

from typing import Any

import yaml

from gpufleet.testing.cluster import ControlPlane

from .conftest import API, Scenario, job_manifest


def _pool(name: str, gpu_type: str) -> dict[str, Any]:
    return {
        "apiVersion": API,
        "kind": "GPUPool",
        "metadata": {"name": name},
        "spec": {
            "provider": "static",
            "gpuType": gpu_type,
            "gpusPerNode": 8,
            "maxGPUs": 8,
            "nodeSelector": {"gpufleet.io/pool": name},
        },
    }


def test_a_workload_takes_its_next_gpu_type_and_preempts_only_where_it_accepts(
    cluster: ControlPlane, scenario: Any
) -> None:
    s: Scenario = scenario(1)  # its pools, nodes and objects are removed after the test
    # GPU types no other test's pool has (pools of earlier tests may linger in the caches);
    # the names sort "other" first: a reclaim free to choose would start there
    tag = s.id.upper()
    preferred, fallback, unlisted = f"P{tag}", f"N{tag}", f"O{tag}"
    pools = {
        t: f"{s.id}-{i}-{t.lower()}" for i, t in ((2, preferred), (3, fallback), (1, unlisted))
    }
    nodes = {}
    for gpu_type, pool in pools.items():
        s.objects.append(_pool(pool, gpu_type))
        nodes[gpu_type] = cluster.add_gpu_nodes(1, 8, gpu_type, pool=pool, prefix=pool)[0]
        s.nodes.append(nodes[gpu_type])
    chooser, other = s.team("chooser"), s.team("other")
    for gpu_type in (fallback, unlisted):
        s.objects.append(
            {
                "apiVersion": API,
                "kind": "Reservation",
                "metadata": {"name": f"{chooser}-{pools[gpu_type]}"},
                "spec": {"team": chooser, "pool": pools[gpu_type], "gpus": 8},
            }
        )
    s.apply()

    def create(name: str, team: str, cls: str, pool: str | None = None, types: str = "") -> None:
        labels = {"gpufleet.io/team": team, "gpufleet.io/class": cls}
        if pool:
            labels["gpufleet.io/pool"] = pool
        body = job_manifest(name, s.namespace, labels, 8, 1, "600s")
        if types:
            body["metadata"]["annotations"] = {"gpufleet.io/gpu-types": types}
        cluster.kubectl("create", "-f", "-", input=yaml.safe_dump(body))

    def pool_of(name: str) -> str:
        return str(cluster.get("gwl", name, "-n", s.namespace)["status"].get("pool"))

    # the preferred type is full: the workload runs on the next one
    create("fill-preferred", other, "elastic", pool=pools[preferred])
    s.wait_states({"fill-preferred": "Running"})
    create("either", chooser, "elastic", types=f"{preferred.lower()},{fallback}")
    s.wait_states({"either": "Running"})
    assert pool_of("either") == pools[fallback]
    spec = cluster.get("gwl", "either", "-n", s.namespace)["spec"]
    assert spec["gpuTypes"] == [preferred, fallback]  # as the pools spell them
    pods = cluster.get("pods", "-n", s.namespace, "-l", "batch.kubernetes.io/job-name=either")
    assert [p["spec"]["nodeName"] for p in pods["items"]] == [nodes[fallback]]

    # every pool full; reserved work of the chooser that accepts the preferred and next types
    # reclaims its reservation in the next type's pool, never in the unlisted one
    create("fill-unlisted", other, "elastic", pool=pools[unlisted])
    s.wait_states({"fill-unlisted": "Running"})
    create("must", chooser, "reserved", types=f"{preferred},{fallback}")
    s.wait_states({"must": "Running"}, timeout=90)
    assert pool_of("must") == pools[fallback]
    assert s.state("either") in ("Preempted", "Pending")
    assert s.state("fill-unlisted") == "Running" and s.state("fill-preferred") == "Running"

    # a type no pool has is refused at creation, by name: the API server's policy leaves the
    # GPU types to the webhook, which checks them against the pools
    body = job_manifest("typo", s.namespace, {"gpufleet.io/team": chooser}, 1, 1, "60s")
    body["metadata"]["annotations"] = {"gpufleet.io/gpu-types": f"{preferred}0"}
    made = cluster.kubectl("create", "-f", "-", input=yaml.safe_dump(body), check=False)
    assert made.returncode != 0, made.stdout
    assert f"no pool has GPU type '{preferred}0' (did you mean '{preferred}'?)" in made.stderr
    assert s.state("typo") is None  # never a request of this fleet
