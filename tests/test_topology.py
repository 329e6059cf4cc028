"""Topology-aware gangs (R8): a gang goes into one NVLink clique, else one block, else the
fewest blocks, where the nodes carry those labels; without labels nothing changes."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from engine_helpers import admitted, gitops, nodes, run_decide
from kube_helpers import requested

from gpufleet.engine import (
    Node,
    Policy,
    PoolInfo,
    Snapshot,
    TeamInfo,
    Workload,
    WorkloadClass,
    WorkloadState,
    decide,
)
from gpufleet.model import load_fleet
from gpufleet.model.api import GPUWorkloadSpec
from gpufleet.model.keys import BLOCK_LABEL, CLIQUE_LABEL, TOPOLOGY_LABEL

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def snapshot(nodes: tuple[Node, ...], *workloads: Workload) -> Snapshot:
    return Snapshot(
        NOW,
        {"p": PoolInfo("p", "H100", 8, 8 * len(nodes), autoscaling=False)},
        {"t": TeamInfo("t", None, 1, None)},
        {},
        Policy(),
        nodes,
        workloads,
    )


def busy(name: str, gpus: float, on: str) -> Workload:
    return Workload(name, "t", WorkloadClass.ELASTIC, gpus, NOW, state=WorkloadState.RUNNING,
                    started_at=NOW, nodes=(on,))  # fmt: skip


def gang(pods: int, gpus: float = 8) -> Workload:
    return Workload("gang", "t", WorkloadClass.ELASTIC, gpus, NOW, pods=pods)


def blocks(*sizes: int, clique: dict[int, str] | None = None) -> tuple[Node, ...]:
    """Nodes n-1, n-2, ... in blocks b1 (the first `sizes[0]` nodes), b2, ..."""
    nodes, i = [], 0
    for b, size in enumerate(sizes, start=1):
        for _ in range(size):
            i += 1
            nodes.append(Node(f"n-{i}", "p", 8, block=f"b{b}", clique=(clique or {}).get(i, "")))
    return tuple(nodes)


def placed(decisions: object) -> tuple[str, ...]:
    (admission,) = decisions.admitted  # type: ignore[attr-defined]
    return tuple(admission.nodes)


def test_a_gang_goes_into_the_tightest_block_that_holds_it() -> None:
    # b1: n-1..n-3 with n-1 half used; b2: n-4..n-7 all free; b3: n-8, n-9.
    # Topology-blind best fit would take n-2, n-3 (b1) and then cross into b2 for a 3-pod
    # gang; b1 cannot hold 3 whole nodes, b3 cannot either: the gang goes to b2 whole.
    nodes = blocks(3, 4, 2)
    decisions = decide(snapshot(nodes, busy("small", 4, "n-1"), gang(3)))
    assert placed(decisions) == ("n-4", "n-5", "n-6")
    # a 2-pod gang fits b1 (n-2, n-3) and b3 (n-8, n-9): equally tight, the first by name
    two = decide(snapshot(nodes, busy("small", 4, "n-1"), gang(2)))
    assert placed(two) == ("n-2", "n-3")
    # pods of 4 GPUs: the half-used node counts, b1 holds 5 pods, the tightest for 5
    halves = decide(snapshot(nodes, busy("small", 4, "n-1"), gang(5, gpus=4)))
    assert set(placed(halves)) == {"n-1", "n-2", "n-3"}


def test_a_gang_no_block_holds_spans_the_fewest_blocks() -> None:
    # blocks b1 (n-1, n-2), b2 (n-3..n-5), b3 (n-6, n-7), n-1 half used: b1 holds 1 whole
    # node, b2 3, b3 2. A 5-node gang takes b2 and b3; best fit per pod, blind to blocks,
    # would start at n-2 and span all three.
    nodes = blocks(2, 3, 2)
    decisions = decide(snapshot(nodes, busy("small", 4, "n-1"), gang(5)))
    chosen = placed(decisions)
    in_blocks = {next(n.block for n in nodes if n.name == name) for name in chosen}
    assert len(in_blocks) == 2 and "b2" in in_blocks and "n-1" not in chosen


def test_an_nvlink_clique_comes_before_a_block() -> None:
    # one block of 6; n-3..n-5 form an NVLink clique: a 3-pod gang goes there
    nodes = blocks(6, clique={3: "c1", 4: "c1", 5: "c1"})
    assert placed(decide(snapshot(nodes, gang(3)))) == ("n-3", "n-4", "n-5")
    # a gang larger than any clique falls back to the block level
    assert len(placed(decide(snapshot(nodes, gang(4))))) == 4


def test_without_topology_labels_placement_is_unchanged() -> None:
    plain = tuple(Node(f"n-{i}", "p", 8) for i in range(1, 10))
    decisions = decide(snapshot(plain, busy("small", 4, "n-1"), gang(3)))
    # best fit per pod across the zone, as before topology: the half-used node is not whole,
    # so the first free nodes by name
    assert placed(decisions) == ("n-2", "n-3", "n-4")


def test_nodes_carry_their_topology_labels_into_the_engine() -> None:
    from gpufleet.kube import observe

    labels = {"gpufleet.io/pool": "p", BLOCK_LABEL: "rack-7", CLIQUE_LABEL: "c.1"}
    node = observe.node_of(
        {
            "metadata": {"name": "gpu-1", "labels": labels},
            "status": {
                "allocatable": {"nvidia.com/gpu": "8"},
                "conditions": [{"type": "Ready", "status": "True"}],
            },
        }
    )
    assert node is not None
    assert (node.block, node.clique) == ("rack-7", "c.1")


def test_a_state_file_gives_nodes_their_blocks(tmp_path: Path) -> None:
    state_nodes = nodes("h100", 2, block="b1") + [
        {"name": f"h100-{i}", "pool": "h100", "gpus": 8, "block": "b2"} for i in (3, 4, 5)
    ]
    busy_one = {"name": "small", "team": "nlp", "class": "elastic", "gpus": 4, "pods": 1,
                "state": "Running", "nodes": ["h100-1"]}  # fmt: skip
    out = run_decide(
        tmp_path,
        gitops({"h100": {}}, {"nlp": {}}),
        {
            "nodes": state_nodes,
            "workloads": [busy_one, {"name": "gang", "team": "nlp", "gpus": 8, "pods": 3}],
        },
    )
    assert admitted(out) == {"gang": ["h100-3", "h100-4", "h100-5"]}  # b2, not h100-2 first


def test_a_required_block_holds_the_gang_or_it_waits() -> None:
    required = Workload("gang", "t", WorkloadClass.ELASTIC, 8, NOW, pods=3, topology="block")
    # b1 (n-1, n-2) and b2 (n-3, n-4): no block holds 3 whole nodes; preferred would spread
    nodes = blocks(2, 2)
    decisions = decide(snapshot(nodes, required))
    assert decisions.admitted == ()
    (waiting,) = decisions.pending
    assert waiting.reason == "WaitingForGang"
    assert "only 2 of 3 pods of 8 GPUs fit together in one block of pool p" in waiting.message
    assert len(placed(decide(snapshot(nodes, gang(3))))) == 3  # preferred: placed across
    # with a block of 3 it runs there, whatever best fit across the zone would choose
    roomy = blocks(2, 3)
    assert placed(decide(snapshot(roomy, required))) == ("n-3", "n-4", "n-5")


def test_a_required_block_preempts_inside_one_block() -> None:
    # b1: n-1, n-2 free; b2: n-3, n-4 each held by low-priority elastic work. A reserved
    # 3-node gang that must stay in one block cannot use b1 (2 nodes) with n-3: it waits,
    # reclaiming nothing it could not use
    nodes = blocks(2, 2)

    def reclaim(topology: str | None) -> tuple[int, int]:
        gang = Workload("gang", "t", WorkloadClass.RESERVED, 8, NOW, pods=3, topology=topology)
        decisions = decide(
            Snapshot(
                NOW,
                {"p": PoolInfo("p", "H100", 8, 32, autoscaling=False)},
                {"t": TeamInfo("t", None, 1, None)},
                {("t", "p"): 32},
                Policy(),
                nodes,
                (busy("x", 8, "n-3"), busy("y", 8, "n-4"), gang),
            )
        )
        return len(decisions.admitted), len(decisions.preempted)

    assert reclaim("block") == (0, 0)
    assert reclaim(None) == (1, 1)  # preferred: one victim, the gang across both blocks


def test_the_topology_label_reaches_the_gpuworkload_and_is_checked() -> None:
    from gpufleet.controllers import loop
    from gpufleet.kube import kinds
    from gpufleet.kube import request as jobs

    fleet = load_fleet([Path(__file__).resolve().parents[1] / "examples" / "gitops"]).fleet

    def job(pods: int, topology: str) -> dict[str, Any]:
        labels = {"gpufleet.io/team": "nlp", TOPOLOGY_LABEL: topology}
        container = {"name": "c", "resources": {"limits": {"nvidia.com/gpu": "8"}}}
        return {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": "g", "namespace": "nlp", "uid": "u", "labels": labels},
            "spec": {"parallelism": pods, "template": {"spec": {"containers": [container]}}},
        }

    body = loop._workload_body(job(4, "block"), kinds.JOB, fleet)
    assert body is not None
    assert body["spec"]["topology"] == "block"
    spec = GPUWorkloadSpec.model_validate(body["spec"])  # the CRD's model
    assert spec.topology == "block"
    loose = loop._workload_body(job(1, "block"), kinds.JOB, fleet)
    assert loose is not None and "topology" not in loose["spec"]
    with pytest.raises(jobs.RequestError, match="'rack' is not a topology level"):
        requested(job(4, "rack"), fleet)


def test_submit_asks_for_a_topology() -> None:
    from typer.testing import CliRunner

    from gpufleet.cli.main import app

    args = ["submit", "g", "--team", "nlp", "--gpus", "8", "--pods", "2", "--dry-run"]
    out = CliRunner().invoke(app, [*args, "--topology", "clique", "-o", "json"])
    assert out.exit_code == 0, out.output
    assert '"gpufleet.io/topology": "clique"' in out.stdout
    bad = CliRunner().invoke(app, [*args, "--topology", "rack"])
    assert bad.exit_code == 1 and "use block or clique" in bad.output


# --- CPU and memory where the nodes report them (live placement; issue 44) --------------------


def test_a_gangs_block_is_chosen_where_its_pods_cpu_and_memory_fit() -> None:
    """b1 (n-1..n-3) is the tightest block for 3 pods by GPUs, but n-2 has CPU left for no
    pod and n-3 memory for none: the gang goes into b2, whose nodes hold all three."""
    nodes = tuple(
        Node(f"n-{i}", "p", 8, block="b1" if i <= 3 else "b2",
             cpu_free=1_000 if i == 2 else 96_000,
             memory_free=4_096 if i == 3 else 1_000_000)
        for i in range(1, 8)
    )  # fmt: skip
    hungry = Workload("gang", "t", WorkloadClass.ELASTIC, 8, NOW, pods=3, cpu=32_000,
                      memory=200_000, topology="block")  # fmt: skip
    assert placed(decide(snapshot(nodes, hungry))) == ("n-4", "n-5", "n-6")
    # GPUs alone, it would have taken b1
    blind = Workload("gang", "t", WorkloadClass.ELASTIC, 8, NOW, pods=3, topology="block")
    assert placed(decide(snapshot(nodes, blind))) == ("n-1", "n-2", "n-3")


def test_a_gang_without_room_in_any_block_waits_for_cpu() -> None:
    nodes = tuple(Node(f"n-{i}", "p", 8, block="b1", cpu_free=8_000) for i in (1, 2))
    hungry = Workload("gang", "t", WorkloadClass.ELASTIC, 4, NOW, pods=2, cpu=16_000,
                      topology="block")  # fmt: skip
    decisions = decide(snapshot(nodes, hungry))
    assert not decisions.admitted


def test_a_pod_goes_where_its_memory_fits() -> None:
    nodes = (Node("n-1", "p", 8, memory_free=1_024), Node("n-2", "p", 8, memory_free=512_000))
    pod = Workload("one", "t", WorkloadClass.ELASTIC, 1, NOW, memory=64_000)
    assert placed(decide(snapshot(nodes, pod))) == ("n-2",)


def test_nodes_and_pods_bring_their_cpu_and_memory_into_the_engine() -> None:
    """A node's allocatable CPU and memory less what pods gpufleet does not manage request
    there (a DaemonSet's, a finished pod's not), and a workload's per-pod requests."""
    from gpufleet.kube import observe

    node = observe.node_of(
        {
            "metadata": {"name": "gpu-1", "labels": {"gpufleet.io/pool": "p"}},
            "status": {
                "allocatable": {"nvidia.com/gpu": "8", "cpu": "191900m", "memory": "2Ti"},
                "conditions": [{"type": "Ready", "status": "True"}],
            },
        }
    )
    assert node is not None and (node.cpu_free, node.memory_free) == (191_900, 2 * 2**20)

    def pod(name: str, phase: str = "Running", **requests: str) -> dict[str, Any]:
        return {
            "metadata": {"name": name, "namespace": "kube-system"},
            "spec": {"nodeName": "gpu-1",
                     "containers": [{"name": "c", "resources": {"requests": requests}},
                                    {"name": "d", "resources": {"limits": {"cpu": "1"}}}]},
            "status": {"phase": phase},
        }  # fmt: skip

    used = observe.foreign_use(
        [pod("dcgm", cpu="500m", memory="512Mi"), pod("done", "Succeeded", cpu="64"),
         pod("mine", cpu="8")],
        managed={("kube-system", "mine")},
    )  # fmt: skip
    assert used == {"gpu-1": observe.Use(0, 1_500, 512)}
    # a node without GPUs is not read for CPU and memory (a cycle reads every pod)
    assert observe.foreign_use([pod("dcgm", cpu="500m")], set(), room_on={"gpu-2"}) == {}
    from gpufleet.kube.kinds.base import template_room

    template = {"spec": {
        "initContainers": [{"name": "fetch", "resources": {"requests": {"memory": "64Gi"}}}],
        "containers": [{"name": "a", "resources": {"requests": {"cpu": "12", "memory": "1Gi"}}},
                       {"name": "b", "resources": {"requests": {"cpu": "250m"}}}],
    }}  # fmt: skip
    assert template_room(template) == (12_250, 64 * 1024)  # the init container's memory


def test_room_that_cannot_bind_is_not_tracked() -> None:
    """A node whose CPU would feed all its GPUs even to the hungriest work is placed by GPUs
    alone (through the index); one that would not keeps its free CPU for the engine."""
    from gpufleet.kube.observe import binding_room

    roomy = Node("roomy", "p", 8, cpu_free=96_000, memory_free=2_000_000)
    tight = Node("tight", "p", 8, cpu_free=40_000, memory_free=2_000_000)
    work = [
        Workload("a", "t", WorkloadClass.ELASTIC, 1, NOW, cpu=12_000, memory=100_000),
        Workload("b", "t", WorkloadClass.ELASTIC, 0.5, NOW, cpu=2_000),  # 4 CPUs per GPU
    ]
    kept = {n.name: (n.cpu_free, n.memory_free) for n in binding_room([roomy, tight], work)}
    assert kept == {"roomy": (None, None), "tight": (40_000, None)}
