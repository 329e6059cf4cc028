"""The workload loop keeps the engine's placements between its cycles (`observe.Kept`): over a
random run of arrivals, admissions, preemptions and ends, every cycle decides exactly what a
cycle that placed everything from scratch decides, and most cycles do not place everything."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from gpufleet.engine import Decisions, decide
from gpufleet.kube import observe
from gpufleet.model.fleet import Fleet, fleet_from_objects
from gpufleet.model.states import WorkloadState

API = "gpufleet.io/v1alpha1"
START = datetime(2026, 1, 1, 12, tzinfo=UTC)
NODES = 4


def fleet() -> Fleet:
    objects: list[dict[str, Any]] = [
        {
            "apiVersion": API,
            "kind": "GPUPool",
            "metadata": {"name": "h100"},
            "spec": {
                "provider": "static",
                "gpuType": "H100",
                "gpusPerNode": 8,
                "maxGPUs": 8 * NODES,
                "nodeSelector": {"a": "b"},
            },
        },
        *(
            {"apiVersion": API, "kind": "Team", "metadata": {"name": t}, "spec": {}}
            for t in ("nlp", "cv")
        ),
        {
            "apiVersion": API,
            "kind": "Reservation",
            "metadata": {"name": "nlp-h100"},
            "spec": {"team": "nlp", "pool": "h100", "gpus": 16},
        },
        {
            "apiVersion": API,
            "kind": "FleetPolicy",
            "metadata": {"name": "p"},
            "spec": {"preemption": {"minRuntime": "2m", "backoff": "3m"}},
        },
    ]
    loaded = fleet_from_objects(objects)
    assert loaded.problems == []
    return loaded.fleet


def node(name: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"gpufleet.io/pool": "h100"}},
        "spec": {},
        "status": {
            "allocatable": {"nvidia.com/gpu": "8"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


class Run:
    """Managed Jobs as the loop's caches would hold them: an object replaced by a new one
    whenever it changes, the very same object while it does not."""

    def __init__(self, seed: int) -> None:
        self.random = random.Random(seed)
        self.items: dict[str, Any] = {}
        self.count = 0

    def arrive(self, now: datetime) -> None:
        for _ in range(self.random.choice((0, 0, 1, 2, 3))):
            self.count += 1
            name = f"j{self.count}"
            team = self.random.choice(("nlp", "cv"))
            cls = "reserved" if team == "nlp" and self.random.random() < 0.5 else "elastic"
            shapes = ((1, 1), (2, 1), (4, 1), (8, 1), (8, 2), (4, 2), (1, 1), (0.5, 1))
            # a shared GPU's workload coming or going makes the engine place everything
            gpus, pods = self.random.choice(shapes if self.count < 40 else shapes[:-1])
            obj = {"metadata": {"name": name, "namespace": "ns", "uid": name}, "spec": {}}
            workload = {
                "metadata": {"name": name, "namespace": "ns"},
                "spec": {"team": team, "class": cls, "gpus": gpus, "pods": pods},
                "status": {"state": "Pending", "submittedAt": now.isoformat()},
            }
            self.items[f"ns/{name}"] = observe.Observed(obj, workload, WorkloadState.PENDING, ())

    def end_some(self) -> None:
        running = [k for k, o in self.items.items() if o.state == "Running"]
        for key in running:
            if self.random.random() < 0.1:
                del self.items[key]

    def apply(self, decisions: Decisions, now: datetime) -> None:
        for admission in decisions.admitted:
            item = self.items[admission.workload]
            status = {**item.workload["status"], "state": "Running", "startedAt": now.isoformat()}
            workload = {**item.workload, "status": status}
            self.items[item.key] = observe.Observed(
                {**item.obj}, workload, WorkloadState.RUNNING, admission.nodes
            )
        for preemption in decisions.preempted:
            item = self.items[preemption.workload]
            status = {
                **item.workload["status"],
                "state": "Preempted",
                "preemptedAt": now.isoformat(),
            }
            workload = {**item.workload, "status": status}
            self.items[item.key] = observe.Observed(
                {**item.obj}, workload, WorkloadState.PREEMPTED, ()
            )


@pytest.mark.parametrize("seed", range(6))
def test_kept_placements_decide_what_placing_everything_decides(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    gitops = fleet()
    nodes = [node(f"n{i}") for i in range(NODES)]
    run = Run(seed)
    kept = observe.Kept()
    builds = 0
    build = kept.placed._build

    def counting_build(*args: Any) -> None:
        nonlocal builds
        builds += 1
        build(*args)

    monkeypatch.setattr(kept.placed, "_build", counting_build)
    reused = cycles = preempted = 0
    for minute in range(90):
        now = START + timedelta(minutes=minute)
        run.arrive(now)
        if minute % 3 == 0:
            run.end_some()
        before = dict(kept.workloads)
        observed = list(run.items.values())
        fresh = decide(observe.snapshot(gitops, nodes, observed, now))
        carried = decide(
            observe.snapshot(gitops, nodes, observed, now, kept=kept), placed=kept.placed
        )
        assert carried == fresh, f"cycle {minute}"
        reused += sum(
            1 for k, (_, w) in kept.workloads.items() if k in before and before[k][1] is w
        )
        cycles += 1
        preempted += len(fresh.preempted)
        run.apply(fresh, now)
    assert run.count > 50 and preempted > 0  # the run admitted, preempted and resumed
    assert reused > 0
    assert builds < cycles / 2, (builds, cycles)


def test_a_workload_is_observed_again_only_when_one_of_its_objects_is_another() -> None:
    """The loop reuses a workload's last observation while its object, GPUWorkload and pods
    are the very objects it was made from; any other object, even an equal copy, and any pod
    more, fewer or changed, makes the loop derive its state again."""
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "j", "namespace": "ns", "uid": "u"},
        "spec": {"suspend": False, "template": {"spec": {}}},
    }
    workload = {
        "metadata": {"name": "j", "namespace": "ns"},
        "spec": {"team": "nlp", "class": "elastic", "gpus": 1, "pods": 1},
        "status": {"state": "Queued", "nodes": ["n0"]},
    }
    pod = {
        "metadata": {"name": "j-1", "namespace": "ns"},
        "spec": {
            "nodeName": "n0",
            "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
        },
        "status": {"phase": "Pending"},
    }
    state, nodes = observe.workload_state(job, workload, [pod])
    assert state == "Starting"
    item = observe.Observed(job, workload, state, nodes)
    seen = (item, (pod,))
    assert observe.unchanged(seen, job, workload, [pod]) is item
    assert observe.unchanged(None, job, workload, [pod]) is None
    assert observe.unchanged(seen, {**job}, workload, [pod]) is None
    assert observe.unchanged(seen, job, {**workload}, [pod]) is None
    running = {**pod, "status": {"phase": "Running"}}
    assert observe.unchanged(seen, job, workload, [running]) is None
    assert observe.workload_state(job, workload, [running])[0] == "Running"
    assert observe.unchanged(seen, job, workload, []) is None
    assert observe.unchanged(seen, job, workload, [pod, pod]) is None
