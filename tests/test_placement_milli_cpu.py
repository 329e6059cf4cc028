"""Placement in milli-GPUs and, where nodes report it, milli-CPU (R8; engine/placement.py and
engine/stranding.py): any fraction of a GPU, a pod's CPU checked, GPUs stranded for lack of CPU
avoided."""

from __future__ import annotations

import random
from datetime import UTC, datetime

from gpufleet.engine import MILLI, Workload, WorkloadClass
from gpufleet.engine.placement import NodeState, PodPlacement, PoolCapacity
from gpufleet.engine.stranding import STEP, CpuProfile

EPOCH = datetime(2026, 1, 1, tzinfo=UTC)


def pod(gpus: float, cpu: int = 0, pods: int = 1, name: str = "w") -> Workload:
    return Workload(name, "t", WorkloadClass.ELASTIC, gpus, EPOCH, pods=pods, cpu=cpu)


def node(i: int, gpus: int, cpu: int | None = None) -> NodeState:
    return NodeState(f"n{i}", "p", "", gpus, True, i, cpu_free=cpu)


def test_the_cpu_profile_counts_idle_gpus_the_free_cpu_cannot_feed() -> None:
    # pods ask 1 GPU per 8 CPUs and 0.5 GPU per 2 CPUs: 1,500 milli-GPU per 10,000 milli-CPU
    profile = CpuProfile([(1000, 8000), (500, 2000)])
    assert profile and profile.gpu_per_cpu == 0.15
    # 2 idle GPUs and 10 CPUs: the CPUs feed 1.5 GPUs, half a GPU is stranded
    assert profile.stranded(2 * MILLI, 10000) == 500
    assert profile.stranded(MILLI, 10000) == 0.0 and profile.stranded(MILLI, -5) == MILLI
    # a pod taking half a GPU and 8 of those CPUs: 1.5 idle GPUs, 2 CPUs feed 0.3: 1,200
    # stranded against 500, 700 more, five steps of STEP
    assert STEP == 150 and profile.step(2 * MILLI, 10000, 500, 8000) == 5
    # a pod that takes GPUs with little CPU strands less
    assert profile.step(2 * MILLI, 10000, MILLI, 0) == -3
    assert not CpuProfile() and not CpuProfile([(0, 100)])


def test_fractions_finer_than_a_quarter_share_a_gpu_best_fit() -> None:
    pool = PoolCapacity("p", [node(0, 1), node(1, 1)])
    first = pool.place(pod(0.81, name="a"))
    assert first is not None and first[0].milli == 810
    small = pool.place(pod(0.19, name="b"))  # exactly the rest of the first GPU
    assert small is not None and small[0].node is first[0].node and small[0].slot == first[0].slot
    assert first[0].node.free_milli == 0
    other = pool.place(pod(0.02, name="c"))  # the first GPU is full: the other node
    assert other is not None and other[0].node is not first[0].node
    assert pool.free_milli([""]) == MILLI - 20
    pool.release(small[0])
    assert first[0].node.free_milli == 190


def test_a_pod_goes_only_where_its_cpu_is_free_and_gives_it_back() -> None:
    poor, rich = node(0, 2, cpu=4000), node(1, 8, cpu=64000)
    pool = PoolCapacity("p", [poor, rich])
    # best fit alone would take the 2-GPU node; it lacks the CPU
    placed = pool.place(pod(1, cpu=8000))
    assert placed is not None and placed[0].node is rich and rich.cpu_free == 56000
    assert pool.place(pod(1, cpu=100000)) is None  # no node has the CPU: nothing is taken
    assert rich.whole_free == 7 and poor.whole_free == 2
    pool.release(placed[0])
    assert rich.cpu_free == 64000 and rich.whole_free == 8


def test_a_gang_that_runs_out_of_cpu_takes_nothing() -> None:
    nodes = [node(0, 4, cpu=8000), node(1, 4, cpu=2000)]
    pool = PoolCapacity("p", nodes)
    assert pool.place(pod(2, cpu=4000, pods=3)) is None
    assert [n.whole_free for n in nodes] == [4, 4] and nodes[0].cpu_free == 8000


def test_the_pod_that_would_strand_gpus_goes_where_cpu_is_plentiful() -> None:
    # Two 2-GPU nodes with one GPU used. On the CPU-poor one a CPU-heavy pod would leave the
    # rest of its last GPU with too little CPU to feed it; the engine places it on the other,
    # and light pods (which strand nothing) where best fit says.
    profile = CpuProfile([(MILLI, 8000)])  # a GPU per 8 CPUs
    poor, rich = node(0, 2, cpu=10000), node(1, 2, cpu=40000)
    pool = PoolCapacity("p", [poor, rich], cpu_profile=profile)
    for n in (poor, rich):
        pool.allocate(PodPlacement(n, gpus=1))
    heavy = pool.place(pod(0.5, cpu=8000, name="heavy"))
    assert heavy is not None and heavy[0].node is rich
    light = pool.place(pod(0.2, cpu=100, name="light"))
    assert light is not None and light[0].node is rich  # the fullest shared GPU first
    tiny = pool.place(pod(0.1, cpu=100, name="tiny"))
    assert tiny is not None and tiny[0].node is rich and rich.free_milli == 200


def test_pods_without_gpus_are_placed_where_nodes_report_cpu() -> None:
    pool = PoolCapacity("p", [node(0, 8, cpu=4000), node(1, 8, cpu=32000)])
    placed = pool.place(pod(0, cpu=8000))
    assert placed is not None and placed[0].node.name == "n1" and placed[0].gpus == 0
    assert pool.fit_zone(pod(0)) == ""


def test_the_slot_index_finds_the_best_fit_for_any_fraction() -> None:
    """Random placements and releases of fractions to 0.001 GPU: the index's answer is the
    shared GPU a search of every node finds (least free that fits, lemons last for critical
    work is not in play: one tier), else a new shared GPU on the node with fewest whole GPUs."""
    rng = random.Random(7)
    nodes = [node(i, rng.choice([1, 2, 4, 8])) for i in range(12)]
    pool = PoolCapacity("p", nodes)
    held: list[PodPlacement] = []
    for step in range(3000):
        if held and rng.random() < 0.4:
            pool.release(held.pop(rng.randrange(len(held))))
            continue
        milli = rng.randrange(1, MILLI)
        slots = [
            (free, n.index, s) for n in nodes for s, free in n.partial.items() if free >= milli
        ]
        wholes = [(n.whole_free, n.index) for n in nodes if n.whole_free >= 1]
        placed = pool.place(pod(milli / MILLI, name=f"w{step}"))
        if not slots and not wholes:
            assert placed is None
            continue
        assert placed is not None
        got = placed[0]
        if slots:
            _, index, slot = min(slots)
            assert (got.node.index, got.slot) == (index, slot), step
        else:
            assert got.slot is not None and got.node.index == min(wholes)[1]
            assert got.node.partial[got.slot] == MILLI - milli
        held.append(got)


def test_reserved_work_joins_reserved_work_only_where_its_cpu_is_free() -> None:
    holder, other = node(0, 8, cpu=4000), node(1, 8, cpu=64000)
    pool = PoolCapacity("p", [holder, other])
    pool.allocate(PodPlacement(holder, gpus=1))
    pool.add_reserved(holder, MILLI)
    reserved = Workload("r", "t", WorkloadClass.RESERVED, 1, EPOCH, cpu=8000)
    placed = pool.place_reserved(reserved)
    assert placed is not None and placed[0].node is other
    light = Workload("l", "t", WorkloadClass.RESERVED, 1, EPOCH, cpu=1000)
    joined = pool.place_reserved(light)
    assert joined is not None and joined[0].node is holder  # beside the reserved work
