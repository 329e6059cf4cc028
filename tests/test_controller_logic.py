"""The controllers' pure parts: what a Job asks, its state, and the changes a decision makes."""

from __future__ import annotations

import asyncio
import base64
import json
import re
from datetime import UTC, datetime, timedelta
from typing import Any

import jsonpatch
import pytest
from engine_helpers import gitops
from kube_helpers import requested

from gpufleet.controllers import actions, ledger
from gpufleet.engine import (
    Admission,
    Decisions,
    Preemption,
    PreemptionReason,
    Reason,
    Waiting,
    Workload,
    WorkloadClass,
)
from gpufleet.kube import observe
from gpufleet.kube import request as jobs
from gpufleet.kube.cache import trim_pod
from gpufleet.kube.kinds.base import merge_patch
from gpufleet.lifecycle import PoolFacts
from gpufleet.model.fleet import fleet_from_objects
from gpufleet.model.states import WorkloadState

NOW = datetime(2026, 1, 1, 12, tzinfo=UTC)
API = "gpufleet.io/v1alpha1"


def fleet(require_team: bool = False) -> Any:
    objects = [
        {
            "apiVersion": API,
            "kind": "GPUPool",
            "metadata": {"name": "h100"},
            "spec": {
                "provider": "static",
                "gpuType": "H100",
                "gpusPerNode": 8,
                "maxGPUs": 16,
                "nodeSelector": {"a": "b"},
            },
        },
        {
            "apiVersion": API,
            "kind": "Team",
            "metadata": {"name": "nlp"},
            "spec": {"namespaces": ["nlp-ns"]},
        },
        {
            "apiVersion": API,
            "kind": "FleetPolicy",
            "metadata": {"name": "p"},
            "spec": {"admission": {"requireTeam": require_team, "maxGPUsPerWorkload": 16}},
        },
    ]
    loaded = fleet_from_objects(objects)
    assert loaded.problems == []
    return loaded.fleet


def job(
    gpus: int | None = 2,
    namespace: str = "nlp-ns",  # team nlp's: its label is honoured there only
    parallelism: int = 1,
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    labels = labels or {}
    limits = {"nvidia.com/gpu": str(gpus)} if gpus else {}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "j", "namespace": namespace, "labels": labels},
        "spec": {
            "parallelism": parallelism,
            "template": {"spec": {"containers": [{"name": "c", "resources": {"limits": limits}}]}},
        },
    }


def test_request_of_a_team_job() -> None:
    request = requested(
        job(
            4,
            parallelism=3,
            labels={
                "gpufleet.io/team": "nlp",
                "gpufleet.io/class": "reserved",
                "gpufleet.io/priority": "high",
            },
        ),
        fleet(),
    )
    assert (request.team, request.workload_class, request.priority, request.gpus, request.pods) == (
        "nlp",
        "reserved",
        75,
        4.0,
        3,
    )


def test_gpu_types_of_a_job_are_read_checked_and_spelled_as_the_pools_spell_them() -> None:
    def with_types(types: str, **labels: str) -> dict[str, Any]:
        made = job(1, labels={"gpufleet.io/team": "nlp", **labels})
        made["metadata"]["annotations"] = {"gpufleet.io/gpu-types": types}
        return made

    assert requested(job(1), fleet()).gpu_types == ()
    assert requested(with_types(" h100 ,H100"), fleet()).gpu_types == ("H100",)
    assert requested(with_types("H100", **{"gpufleet.io/pool": "h100"}), fleet()).gpu_types == (
        "H100",
    )
    refusals = {
        "MI300X": "no pool has GPU type 'MI300X'; types: H100",
        "H10": "no pool has GPU type 'H10' (did you mean 'H100'?)",
        " , ": "gpufleet.io/gpu-types is empty",
    }
    for types, text in refusals.items():
        with pytest.raises(jobs.RequestError, match=re.escape(text)):
            jobs.request_of(with_types(types), fleet())


def test_team_from_namespace_and_jobs_left_alone() -> None:
    assert requested(job(1, namespace="nlp-ns"), fleet()).team == "nlp"
    assert jobs.request_of(job(None, labels={"gpufleet.io/team": "nlp"}), fleet()) is None
    assert jobs.request_of(job(2, "default"), fleet()) is None  # no team, requireTeam off
    assert jobs.request_of(job(2, namespace="kube-system"), fleet(require_team=True)) is None


@pytest.mark.parametrize(
    ("labels", "gpus", "parallelism", "text"),
    [
        ({}, 2, 1, "belongs to no team: add the label gpufleet.io/team=<team> (teams: nlp)"),
        ({"gpufleet.io/team": "nlq"}, 2, 1, "team 'nlq' does not exist (did you mean 'nlp'?)"),
        ({"gpufleet.io/team": "nlp", "gpufleet.io/class": "gold"}, 2, 1, "is not a class"),
        ({"gpufleet.io/team": "nlp", "gpufleet.io/priority": "urgent"}, 2, 1, "is not a priority"),
        ({"gpufleet.io/team": "nlp"}, 8, 3, "asks 24 GPUs (3 pods x 8); the FleetPolicy allows"),
        ({"gpufleet.io/team": "nlp", "gpufleet.io/pool": "h200"}, 2, 1, "pool 'h200' does not"),
    ],
)
def test_request_errors_say_what_to_change(
    labels: dict[str, str], gpus: int, parallelism: int, text: str
) -> None:
    with pytest.raises(jobs.RequestError, match=None) as raised:
        namespace = "nlp-ns" if labels else "default"  # a namespace no team lists
        requested(
            job(gpus, namespace, parallelism=parallelism, labels=labels), fleet(require_team=True)
        )
    assert text in str(raised.value)


# a Job whose pods ask for a GPU: the pod template an admission pins
GPU_JOB = {
    "spec": {
        "template": {
            "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": 1}}}]}
        }
    }
}


def workload(state: str = "Pending", pods: int = 1, **status: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "j", "namespace": "ns"},
        "spec": {"pods": pods},
        "status": {"state": state, **status},
    }


def pod(phase: str, node: str) -> dict[str, Any]:
    gpu = {"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
    return {
        "metadata": {"name": "p"},
        "spec": {"nodeName": node, "containers": [gpu]},
        "status": {"phase": phase},
    }


def test_workload_state_from_job_pods_and_workload() -> None:
    suspended = {"spec": {"suspend": True}, "status": {}}
    assert observe.workload_state(suspended, workload("Preempted"), [])[0] == "Preempted"
    assert observe.workload_state(suspended, workload("Pending"), [])[0] == "Pending"
    # suspended after admission but the Preempted record was lost (crash between the writes)
    for recorded in ("Queued", "Starting", "Running"):
        assert observe.workload_state(suspended, workload(recorded), [])[0] == "Preempted"
    running = {"spec": {"suspend": False}, "status": {}}
    planned = workload("Queued", pods=2, nodes=["n1", "n2"])
    assert observe.workload_state(running, planned, []) == ("Queued", ("n1", "n2"))
    assert observe.workload_state(running, planned, [pod("Running", "n2")])[0] == "Starting"
    assert observe.workload_state(
        running, planned, [pod("Running", "n2"), pod("Running", "n1")]
    ) == (
        "Running",
        ("n1", "n2"),
    )
    done = {"spec": {}, "status": {"conditions": [{"type": "Complete", "status": "True"}]}}
    assert observe.workload_state(done, planned, [])[0] == "Completed"


def test_an_admission_whose_record_was_lost_is_found_in_the_job() -> None:
    """A controller killed between a Job's admission patch and its status write: the next one
    reads where the Job was admitted from the node affinity the admission gave it, so its GPUs
    are not handed to another workload before its pods are bound."""
    for nodes, pods, expected in (
        (("n1",), 1, ("n1",)),
        (("n1",), 3, ("n1", "n1", "n1")),
        (("n1", "n2"), 2, ("n1", "n2")),
        (("n1", "n2"), 3, ()),  # which node holds two pods is not recorded: unknown
    ):
        patch = actions.admission_patches(GPU_JOB, "pool", nodes)[0]
        admitted = {"spec": {"suspend": False, **patch["spec"]}, "status": {}}
        unrecorded = {"spec": {"pods": pods}, "status": {}}
        assert observe.workload_state(admitted, unrecorded, []) == ("Queued", expected)
    # an admission of an earlier release, pinned by hostname label, reads the same
    legacy = {
        "spec": {
            "suspend": False,
            "template": {
                "spec": {
                    "affinity": {
                        "nodeAffinity": {
                            "requiredDuringSchedulingIgnoredDuringExecution": {
                                "nodeSelectorTerms": [
                                    {
                                        "matchExpressions": [
                                            {
                                                "key": "kubernetes.io/hostname",
                                                "operator": "In",
                                                "values": ["n1", "n2"],
                                            }
                                        ]
                                    }
                                ]
                            }
                        }
                    }
                }
            },
        },
        "status": {},
    }
    assert observe.workload_state(legacy, {"spec": {"pods": 2}, "status": {}}, []) == (
        "Queued",
        ("n1", "n2"),
    )


def test_an_admission_is_recorded_on_the_job_and_its_status_may_wait_for_running() -> None:
    """The admission patch records the pool and time on the Job, so the GPUWorkload's record
    may be written later, with Running, in one request; a controller that crashed while the
    record was held back writes it from the Job, with the time the ledger saw."""
    decided = Decisions(admitted=(Admission("ns/j", "h100", ("n1",)),))
    (change,) = actions.changes_for(decided, [observed("Pending")], NOW)
    (patch,) = change.patches
    assert patch["metadata"]["annotations"] == {
        "gpufleet.io/admitted-pool": "h100",
        "gpufleet.io/admitted-at": "2026-01-01T12:00:00Z",
    }
    assert change.status["admittedAt"] == "2026-01-01T12:00:00Z"
    assert change.status_may_wait >= actions.STARTING_RECORDED_AFTER_S
    admitted = merge_patch({"metadata": {"name": "j", "namespace": "ns", "uid": "u"}}, patch)
    later = NOW + timedelta(seconds=3)
    lost = observe.Observed(admitted, workload("Pending"), WorkloadState.RUNNING, ("n1",))
    (sync,) = actions.changes_for(Decisions(), [lost], later)
    assert sync.status == {
        "state": "Running",
        "pool": "h100",
        "nodes": ["n1"],
        "admittedAt": "2026-01-01T12:00:00Z",
        "startedAt": "2026-01-01T12:00:03Z",
        "reason": None,
        "message": "all pods running",
    }
    # the ledger's reconciliation after the restart reads the same admission
    (live,) = ledger.live_workloads([lost], {})
    assert live.admitted_at == NOW and live.admission is not None
    assert live.admission.pool == "h100"
    # recorded: nothing to add; an older admission's record is replaced by the Job's newer one
    kept = workload("Running", admittedAt="2026-01-01T12:00:00Z", startedAt="x", pool="h100")
    assert (
        actions.changes_for(
            Decisions(), [observe.Observed(admitted, kept, WorkloadState.RUNNING, ("n1",))], later
        )
        == []
    )
    older = workload("Running", admittedAt="2026-01-01T11:00:00Z", startedAt="x", pool="a100")
    (sync,) = actions.changes_for(
        Decisions(), [observe.Observed(admitted, older, WorkloadState.RUNNING, ("n1",))], later
    )
    assert sync.status["admittedAt"] == "2026-01-01T12:00:00Z" and sync.status["pool"] == "h100"
    # a gated kind's admission releases pods and patches no object: each pod it releases,
    # now or as they come, records the admission, so the record may wait as well
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "d", "namespace": "ns", "uid": "u"},
        **GPU_JOB,
    }
    item = observe.Observed(deployment, workload("Pending"), WorkloadState.PENDING, ())
    (gated,) = actions.changes_for(
        Decisions(admitted=(Admission("ns/j", "h100", ("n1",)),)), [item], NOW
    )
    assert gated.patches == () and gated.status_may_wait >= actions.STARTING_RECORDED_AFTER_S


def test_a_job_whose_pods_all_succeeded_is_completed_before_the_job_says_so() -> None:
    """Between the last pod's success and the Job's Complete condition, the Job has no live
    pods; it must not read as admitted-and-waiting (its nodes would be placed again)."""
    job = {"spec": {"suspend": False, "parallelism": 2}, "status": {}}
    planned = {"spec": {"pods": 2}, "status": {"state": "Running", "nodes": ["n1", "n2"]}}
    pods = [{"metadata": {}, "status": {"phase": "Succeeded"}} for _ in range(2)]
    assert observe.workload_state(job, planned, pods) == ("Completed", ())
    assert observe.workload_state(job, planned, pods[:1])[0] == "Queued"
    more = {"spec": {"suspend": False, "completions": 4}, "status": {}}  # more pods to come
    assert observe.workload_state(more, planned, pods)[0] == "Queued"


def observed(state: str, **status: Any) -> Any:
    return observe.Observed(
        {"metadata": {"name": "j", "namespace": "ns", "uid": "u"}, **GPU_JOB},
        workload(state, **status),
        WorkloadState(state),
        (),
    )


def test_plan_admission_preemption_and_waiting() -> None:
    admit = actions.changes_for(
        Decisions(admitted=(Admission("ns/j", "h100", ("n1", "n1")),)), [observed("Pending")], NOW
    )
    (change,) = admit
    (patch,) = change.patches
    spec = patch["spec"]
    assert spec["suspend"] is False
    assert spec["template"]["spec"]["nodeSelector"] == {"gpufleet.io/pool": "h100"}
    assert set(spec["template"]["spec"]["affinity"]) == {"nodeAffinity"}
    terms = spec["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    # by node name: nodes Karpenter launches have a hostname label that is not their name
    assert terms == [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}
    ]
    two = actions.placement("h100", ("n2", "n1"))["spec"]["affinity"]
    # a node field selector takes exactly one name (the API server refuses more): ORed terms
    assert two["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ] == [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [n]}]}
        for n in ("n1", "n2")
    ]
    # admitted at the first decision about it: its pods' events say so, no Event of ours
    assert change.status["state"] == "Queued" and change.event is None
    # one that was told why it waited is told it is admitted
    (told,) = actions.changes_for(
        Decisions(admitted=(Admission("ns/j", "h100", ("n1", "n1")),)),
        [observed("Pending", reason="ReservationExhausted")],
        NOW,
    )
    assert told.event is not None and told.event[0] == "Admitted"
    # a node still to be provisioned: pinned to the pool only
    new = actions.admission_patches(GPU_JOB, "h100", ("h100/new-1", "h100/new-2"))[0]
    # (and whatever an earlier admission pinned is removed: null in a merge patch; only node
    # affinity, the one a suspended Job's template lets change)
    assert new["spec"]["template"]["spec"]["affinity"] == {"nodeAffinity": None}

    preempt = actions.changes_for(
        Decisions(
            preempted=(
                Preemption(
                    "ns/j", "ns/big", PreemptionReason.RESERVATION_RECLAIMED, "needs the GPUs"
                ),
            )
        ),
        [observed("Running", pool="h100", preemptions=1)],
        NOW,
    )
    (change,) = preempt
    assert change.patches == ({"spec": {"suspend": True}},)
    assert change.status["state"] == "Preempted"
    assert change.status["preemptedFrom"] == "h100"
    assert change.status["preemptions"] == 2

    wait = Decisions(pending=(Waiting("ns/j", Reason.POOL_FULL, "full", 1, None),))
    (change,) = actions.changes_for(wait, [observed("Pending")], NOW)
    assert change.patches == () and change.status["reason"] == "PoolFull"
    assert change.status_may_wait == 0  # written at once: the user reads why it waits
    # a wait this decision's preemptions are ending may wait to be written with the admission
    running = workload("Running", pool="h100")
    running["metadata"]["name"] = "v"
    victim = observe.Observed(
        {"metadata": {"name": "v", "namespace": "ns", "uid": "v"}, **GPU_JOB},
        running,
        WorkloadState.RUNNING,
        ("n1",),
    )
    freeing = Decisions(
        pending=wait.pending,
        preempted=(Preemption("ns/v", "ns/j", PreemptionReason.RESERVATION_RECLAIMED, "needs"),),
    )
    ending = actions.changes_for(freeing, [observed("Pending"), victim], NOW)
    (change,) = [c for c in ending if c.key == "ns/j"]
    assert change.status["reason"] == "PoolFull" and change.status_may_wait > 0
    # nothing changed since the last cycle: no patch at all
    same = observed("Pending", reason="PoolFull", message="full", position=1, eta=None)
    assert actions.changes_for(wait, [same], NOW) == []
    # written a moment ago: a new queue position waits for the next refresh, a new reason not
    moved = observed("Pending", reason="PoolFull", message="full", position=7, eta=None)
    assert actions.changes_for(wait, [moved], NOW, settled={"ns/j"}) == []
    (change,) = actions.changes_for(wait, [moved], NOW)
    assert change.status["position"] == 1
    other = observed("Pending", reason="BurstLimit", message="limit", position=1, eta=None)
    (change,) = actions.changes_for(wait, [other], NOW, settled={"ns/j"})
    assert change.status["reason"] == "PoolFull"


def test_a_gang_onto_new_nodes_is_held_in_one_zone_of_its_pool() -> None:
    new = ("h100/new-1", "h100/new-2")
    zones = ("zone-a", "zone-b")
    zone = actions.gang_zone("ns/gang", new, zones)
    assert zone in zones
    assert actions.gang_zone("ns/gang", new, zones) == zone  # stable across restarts
    # spread: among many gangs both zones are used
    assert {actions.gang_zone(f"ns/g{i}", new, zones) for i in range(20)} == set(zones)
    # nothing to pin: one pod, one zone, or a node that exists (pinned by name instead)
    assert actions.gang_zone("ns/gang", new[:1], zones) is None
    assert actions.gang_zone("ns/gang", new, zones[:1]) is None
    assert actions.gang_zone("ns/gang", ("n1", "h100/new-1"), zones) is None
    (patch,) = actions.admission_patches(GPU_JOB, "h100", new, zone)
    affinity = patch["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]
    assert affinity["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"] == [
        {
            "matchExpressions": [
                {"key": "topology.kubernetes.io/zone", "operator": "In", "values": [zone]}
            ]
        }
    ]
    # the admission chooses it from the pool's zones
    facts = {"h100": PoolFacts("H100", None, zones)}
    (change,) = actions.changes_for(
        Decisions(admitted=(Admission("ns/j", "h100", new),)),
        [observed("Pending")],
        NOW,
        pools=facts,
    )
    resumed = change.patches[-1]["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]
    (term,) = resumed["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert term["matchExpressions"][0]["values"] == [actions.gang_zone("ns/j", new, zones)]
    # a gated kind's held pod, released to a new node, gets the zone too
    held_pod = {
        "metadata": {"name": "p"},
        "spec": {"schedulingGates": [{"name": "gpufleet.io/admission"}]},
    }
    write = actions.release(held_pod, "h100", "h100/new-1", "zone-b")
    assert write.after["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"][0]["matchExpressions"][0]["values"] == ["zone-b"]
    assert write.patch is not None
    assert "schedulingGates" not in jsonpatch.apply_patch(held_pod, write.patch)["spec"]


def test_a_preempted_job_is_suspended_then_its_live_pods_deleted_uncounted() -> None:
    tracking = "batch.kubernetes.io/job-tracking"

    def pod(name: str, phase: str, finalizers: list[str], deleting: bool = False) -> Any:
        metadata: dict[str, Any] = {"name": name, "namespace": "ns", "finalizers": finalizers}
        if deleting:
            metadata["deletionTimestamp"] = "2026-01-01T00:00:00Z"
        return {"metadata": metadata, "spec": {"nodeName": "n1"}, "status": {"phase": phase}}

    # as the loop sees them: the cache's trimmed pods
    pods = tuple(
        trim_pod(p)
        for p in (
            pod("running", "Running", ["example.com/keep", tracking]),
            pod("done", "Succeeded", [tracking]),  # the Job controller counts it
            pod("going", "Running", [tracking], deleting=True),  # already being deleted
            pod("counted", "Running", []),  # the Job controller is deleting it itself
        )
    )
    item = observe.Observed(
        {"metadata": {"name": "j", "namespace": "ns", "uid": "u"}, **GPU_JOB},
        workload("Running", pool="h100"),
        WorkloadState.RUNNING,
        ("n1",),
        pods,
    )
    preemption = Preemption("ns/j", "ns/big", PreemptionReason.RESERVATION_RECLAIMED, "needs")
    (change,) = actions.changes_for(Decisions(preempted=(preemption,)), [item], NOW)
    # suspended first (the writer writes patches before pods): the Job controller, seeing
    # the pods go, must find the Job suspended, not make new ones
    assert change.patches == ({"spec": {"suspend": True}},) and change.evicts
    (write,) = change.pod_writes
    assert write.name == "running" and write.patch is None  # deleted...
    # ...once the Job controller's finalizer is off, tested in place (a 422 if it moved)
    assert write.unfinalize is not None
    after = jsonpatch.apply_patch(pods[0], write.unfinalize)
    assert after["metadata"]["finalizers"] == ["example.com/keep"]
    moved = merge_patch(pods[0], {"metadata": {"finalizers": [tracking]}})
    with pytest.raises(jsonpatch.JsonPatchTestFailed):
        jsonpatch.apply_patch(moved, write.unfinalize)
    # meanwhile the cache shows it deleting, without the finalizer
    assert write.after["metadata"]["deletionTimestamp"]
    assert write.after["metadata"]["finalizers"] == ["example.com/keep"]


def test_a_preempted_job_held_at_its_pods_loses_them_uncounted_and_is_not_suspended() -> None:
    tracking = "batch.kubernetes.io/job-tracking"
    gate = [{"name": "gpufleet.io/admission"}]
    held_job = merge_patch(GPU_JOB, {"spec": {"template": {"spec": {"schedulingGates": gate}}}})

    def pod(name: str, phase: str, finalizers: list[str], gated: bool = False) -> Any:
        spec: dict[str, Any] = {"schedulingGates": gate} if gated else {"nodeName": "n1"}
        metadata = {"name": name, "namespace": "ns", "finalizers": finalizers}
        return {"metadata": metadata, "spec": spec, "status": {"phase": phase}}

    pods = tuple(
        trim_pod(p)
        for p in (
            pod("released", "Running", [tracking]),
            pod("unfinalized", "Running", []),  # its finalizer came off before a crash
            pod("waiting", "Pending", [tracking], gated=True),  # holds no GPU: it stays
            pod("done", "Succeeded", [tracking]),  # the Job controller counts it
        )
    )
    item = observe.Observed(
        {"metadata": {"name": "j", "namespace": "ns", "uid": "u"}, **held_job},
        workload("Running", pool="h100"),
        WorkloadState.RUNNING,
        ("n1",),
        pods,
    )
    preemption = Preemption("ns/j", "ns/big", PreemptionReason.RESERVATION_RECLAIMED, "needs")
    (change,) = actions.changes_for(Decisions(preempted=(preemption,)), [item], NOW)
    # not suspended: the Job controller makes new pods at once, held at the gate
    assert change.patches == () and change.evicts
    # recorded before the pods go: after a crash, nothing on them says it was preempted
    assert change.status_first and change.status["state"] == "Preempted"
    finalized, bare = change.pod_writes
    assert (finalized.name, finalized.patch) == ("released", None)
    assert finalized.unfinalize is not None  # uncounted: the finalizer off first
    assert (bare.name, bare.patch, bare.unfinalize) == ("unfinalized", None, None)
    # the Job a preemption left held, admitted again: its pods are released, nothing resumed
    again = observe.Observed(
        item.obj, workload("Preempted"), WorkloadState.PREEMPTED, (), (pods[2],)
    )
    (admitted,) = actions.changes_for(
        Decisions(admitted=(Admission("ns/j", "h100", ("n2",)),)), [again], NOW
    )
    assert admitted.patches == ()
    (release,) = admitted.pod_writes
    assert release.name == "waiting" and not observe.held(release.after)
    assert "n2" in json.dumps(release.after["spec"]["affinity"])


def test_a_long_queue_costs_a_bounded_rate_of_position_refreshes() -> None:
    from gpufleet.controllers import loop

    assert loop.waiting_refresh_seconds(3) == loop.WAITING_REFRESH_S
    for waiting in (10, 100, 1_000, 10_000):
        # every waiting workload rewritten once per refresh period: writes per second
        assert waiting / loop.waiting_refresh_seconds(waiting) <= loop.WAITING_REFRESHES_PER_S


def test_creation_patch_holds_pods_at_the_gate_and_hands_them_to_kai_when_asked() -> None:
    request = requested(job(2, labels={"gpufleet.io/team": "nlp"}), fleet())
    plain = jobs.creation_patch(job(2), request, "gpufleet-elastic-normal", None, "nlp")
    # a Job is not suspended: its pods are made at once and wait at gpufleet's gate
    assert "suspend" not in plain["spec"]
    assert plain["spec"]["template"]["spec"]["schedulingGates"] == [
        {"name": "gpufleet.io/admission"}
    ]
    assert plain["metadata"]["annotations"] == {"gpufleet.io/managed": "true"}
    # the user the API server named, over whatever the manifest said
    forged = job(2)
    forged["metadata"]["annotations"] = {"gpufleet.io/submitter": "someone-else"}
    named = jobs.creation_patch(forged, request, "gpufleet-elastic-normal", None, "nlp", "ada")
    assert named["metadata"]["annotations"]["gpufleet.io/submitter"] == "ada"
    pod_spec = plain["spec"]["template"]["spec"]
    assert pod_spec["priorityClassName"] == "gpufleet-elastic-normal"
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod_spec[
        "tolerations"
    ]
    assert "schedulerName" not in pod_spec
    assert "affinity" not in pod_spec  # one pod: nothing to hold together
    # a gang: its pods in one zone, as the engine places gangs (Karpenter launches its nodes in
    # the zone of the first); pod affinity can only be set now, at creation
    three = job(2, parallelism=3, labels={"gpufleet.io/team": "nlp"})
    gang = jobs.creation_patch(
        three, requested(three, fleet()), "gpufleet-elastic-normal", None, "nlp"
    )
    label = gang["spec"]["template"]["metadata"]["labels"]["gpufleet.io/gang"]
    assert gang["spec"]["template"]["spec"]["affinity"] == {
        "podAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "labelSelector": {"matchLabels": {"gpufleet.io/gang": label}},
                    "topologyKey": "topology.kubernetes.io/zone",
                }
            ]
        }
    }
    kai = jobs.creation_patch(
        job(2), request, "gpufleet-elastic-normal", "kai-scheduler", "nlp-own"
    )
    assert kai["spec"]["template"]["spec"]["schedulerName"] == "kai-scheduler"
    assert kai["spec"]["template"]["metadata"]["labels"] == {"kai.scheduler/queue": "nlp-own"}


def test_partition_never_readmits_a_started_job() -> None:
    nodes = [
        {
            "metadata": {"name": "n1", "labels": {"gpufleet.io/pool": "h100"}},
            "spec": {},
            "status": {
                "allocatable": {"nvidia.com/gpu": "8"},
                "conditions": [{"type": "Ready", "status": "True"}],
            },
        }
    ]

    def item(name: str, state: str, nodes: tuple[str, ...], team: str = "nlp") -> Any:
        return observe.Observed(
            {"metadata": {"name": name, "namespace": "ns", "uid": name}},
            {"metadata": {"name": name, "namespace": "ns"}, "spec": {"team": team, "pods": 1}},
            WorkloadState(state),
            nodes,
        )

    parts = observe.partition(
        fleet(),
        nodes,
        [
            item("waiting", "Pending", ()),
            item("running-here", "Running", ("n1",)),
            item("queued-nodes-gone", "Queued", ("gone",)),
            item("running-elsewhere", "Running", ("other",)),
            item("removed-team", "Pending", (), team="old"),
            item("done", "Completed", ()),
        ],
    )
    assert [o.obj["metadata"]["name"] for o in parts.included] == ["waiting", "running-here"]
    assert [o.obj["metadata"]["name"] for o in parts.requeue] == ["queued-nodes-gone"]
    assert [o.obj["metadata"]["name"] for o in parts.hidden] == [
        "running-elsewhere",
        "removed-team",
    ]
    (change,) = actions.changes_for(Decisions(), [], NOW, parts.requeue)
    assert change.patches == ({"spec": {"suspend": True}},)
    assert change.status["reason"] == "NodesGone"


def test_an_admission_whose_gpus_its_victims_still_hold_is_undone() -> None:
    # what a controller that stopped mid-preemption leaves: `urgent` recorded on n1 and n2,
    # where `victim` still runs; `other` runs on n3
    def wl(name: str, state: str, nodes: tuple[str, ...]) -> Workload:
        return Workload(
            f"ns/{name}",
            "nlp",
            WorkloadClass.RESERVED,
            8,
            NOW,
            pods=len(nodes) or 1,
            state=WorkloadState(state),
            nodes=nodes,
        )

    workloads = [
        wl("urgent", "Queued", ("n1", "n2")),
        wl("victim", "Running", ("n1",)),
        wl("other", "Running", ("n3",)),
        wl("starting", "Starting", ("n3",)),
        wl("waiting", "Pending", ()),
    ]
    # whichever the engine names, the plan is undone, not the work that runs
    assert observe.admissions_to_undo(workloads, "ns/urgent") == ("ns/urgent",)
    assert observe.admissions_to_undo(workloads, "ns/victim") == ("ns/urgent",)
    assert observe.admissions_to_undo(workloads, "ns/starting") == ("ns/starting",)
    assert observe.admissions_to_undo(workloads, "ns/other") == ("ns/starting",)
    # running work with no admission beside it, or a waiting one, undoes nothing
    assert observe.admissions_to_undo(workloads[1:3], "ns/victim") == ()
    assert observe.admissions_to_undo(workloads, "ns/waiting") == ()
    assert observe.admissions_to_undo(workloads, "ns/unknown") == ()

    item = observe.Observed(
        {"metadata": {"name": "urgent", "namespace": "ns", "uid": "u"}, "spec": {}},
        {"metadata": {"name": "urgent", "namespace": "ns"}, "spec": {"team": "nlp", "pods": 2}},
        WorkloadState.QUEUED,
        ("n1", "n2"),
    )
    (change,) = actions.changes_for(Decisions(), [item], NOW, [item], undone={item.key})
    assert change.status["state"] == "Pending" and change.status["reason"] == "NodesTaken"
    assert change.event is not None and change.event[0] == "Requeued"
    assert change.lifecycle is not None and change.lifecycle.reason == "NodesTaken"


def test_work_waiting_for_autoscaled_or_lost_nodes_is_counted_where_its_pods_can_go() -> None:
    """Admitted to nodes still to be provisioned, the work holds its GPUs while Karpenter
    launches them. A pod whose node went away (a spot interruption) is replaced by the Job
    controller: pinned to the pool only, the replacement waits for room anywhere in the pool;
    pinned to the lost node by name, it never runs, so the Job is suspended and placed again."""
    autoscaled = fleet_from_objects(
        gitops(
            {
                "auto": {
                    "provider": "aws",
                    "instanceTypes": ["p5.48xlarge"],
                    "nodeSelector": {},
                    "aws": {"amiAlias": "al2023@v20251112"},
                }
            },
            {"nlp": {}},
        )
    ).fleet
    node = {
        "metadata": {"name": "n1", "labels": {"gpufleet.io/pool": "auto"}},
        "spec": {},
        "status": {
            "allocatable": {"nvidia.com/gpu": "8"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }
    pinned = {"spec": actions.admission_patches(GPU_JOB, "auto", ("gone",))[0]["spec"]}

    def item(name: str, state: str, nodes: tuple[str, ...], job: Any = None) -> Any:
        return observe.Observed(
            {"metadata": {"name": name, "namespace": "ns", "uid": name}, **(job or {"spec": {}})},
            {
                "metadata": {"name": name, "namespace": "ns"},
                "spec": {"team": "nlp", "class": "elastic", "gpus": 8, "pods": len(nodes)},
                "status": {"state": state, "pool": "auto"},
            },
            WorkloadState(state),
            nodes,
        )

    items = [
        item("to-provision", "Starting", ("auto/new-1", "auto/new-2")),
        item("lost-a-node", "Starting", ("n1", "gone")),
        item("pinned-to-lost", "Starting", ("gone",), pinned),
    ]
    parts = observe.partition(autoscaled, [node], items)
    assert [o.obj["metadata"]["name"] for o in parts.included] == ["to-provision", "lost-a-node"]
    assert [o.obj["metadata"]["name"] for o in parts.requeue] == ["pinned-to-lost"]
    state = observe.snapshot(autoscaled, [node], parts.included, NOW)
    assert {w.name: w.nodes for w in state.workloads} == {
        "ns/to-provision": ("auto/new-1", "auto/new-2"),
        "ns/lost-a-node": ("n1", "auto/new-any"),
    }
    # a node Karpenter drains takes no new work
    draining = {
        **node,
        "spec": {"taints": [{"key": "karpenter.sh/disrupted", "effect": "NoSchedule"}]},
    }
    drained = observe.node_of(draining)
    assert drained is not None and drained.schedulable is False
    # bound pods count where they are, the rest where the admission planned them
    job = {"spec": {"suspend": False}, "status": {}}
    planned = workload("Starting", pods=2, nodes=["auto/new-1", "auto/new-2"])
    pods = [pod("Running", "n1"), {"metadata": {}, "spec": {}, "status": {"phase": "Pending"}}]
    assert observe.workload_state(job, planned, pods) == ("Starting", ("n1", "auto/new-1"))


def test_what_karpenter_said_about_a_pool() -> None:
    from gpufleet.controllers import provisioning

    said = (
        "Failed to schedule pod, all available instance types exceed limits for nodepool "
        "(NodePool=burst); incompatible requirements, key gpufleet.io/pool, gpufleet.io/pool "
        "In [burst] not in gpufleet.io/pool In [auto]"
    )
    assert provisioning.about_pool(said, "burst") == (
        "all available instance types exceed limits for nodepool (NodePool=burst)"
    )
    other = provisioning.about_pool(said, "l4")
    assert other.startswith("it does not consider NodePool l4 (")
    assert len(other) <= 300 and other.endswith("...")


def test_plan_syncs_the_state_of_finished_work() -> None:
    finished = observe.Observed(
        {"metadata": {"name": "j", "namespace": "ns", "uid": "u"}},
        workload("Running", startedAt="2026-01-01T11:00:00Z"),
        WorkloadState.COMPLETED,
        (),
    )
    finished.obj["status"] = {"succeeded": 2}
    (change,) = actions.changes_for(Decisions(), [finished], NOW)
    assert change.status["state"] == "Completed"
    assert change.status["finishedAt"] == "2026-01-01T12:00:00Z"
    # how it finished, not the "all pods running" of the Running state before
    assert change.status["message"] == "the Job completed: 2 pod(s) succeeded"
    assert change.event == ("Completed", "the Job completed: 2 pod(s) succeeded")
    failed = observe.Observed(
        {
            "metadata": {"name": "j", "namespace": "ns", "uid": "u"},
            "status": {
                "failed": 7,
                "conditions": [
                    {
                        "type": "Failed",
                        "status": "True",
                        "reason": "BackoffLimitExceeded",
                        "message": "Job has reached the specified backoff limit",
                    }
                ],
            },
        },
        workload("Running", startedAt="2026-01-01T11:00:00Z", message="all pods running"),
        WorkloadState.FAILED,
        (),
    )
    (change,) = actions.changes_for(Decisions(), [failed], NOW)
    assert change.status["reason"] == "BackoffLimitExceeded"
    assert change.status["message"] == (
        "the Job failed (BackoffLimitExceeded): Job has reached the specified backoff limit"
    )


def test_starting_is_recorded_only_when_pods_linger() -> None:
    """Queued -> Running without a write for the passing Starting state; a Job whose pods are
    still starting 10 s after its admission shows Starting."""

    def starting(admitted_at: str) -> Any:
        return observe.Observed(
            {"metadata": {"name": "j", "namespace": "ns", "uid": "u"}},
            workload("Queued", admittedAt=admitted_at, nodes=["n1"]),
            WorkloadState.STARTING,
            ("n1",),
        )

    assert actions.changes_for(Decisions(), [starting("2026-01-01T11:59:52Z")], NOW) == []
    (change,) = actions.changes_for(Decisions(), [starting("2026-01-01T11:59:49Z")], NOW)
    assert change.status == {"state": "Starting"}
    running = observe.Observed(
        {"metadata": {"name": "j", "namespace": "ns", "uid": "u"}},
        workload("Queued", admittedAt="2026-01-01T11:59:58Z", nodes=["n1"]),
        WorkloadState.RUNNING,
        ("n1",),
    )
    (change,) = actions.changes_for(Decisions(), [running], NOW)
    assert change.status["state"] == "Running"
    assert change.status["startedAt"] == "2026-01-01T12:00:00Z"


def test_a_node_that_is_not_ready_keeps_its_work_for_a_grace_period() -> None:
    def node(ready: str, since: str, cordoned: bool = False) -> dict[str, Any]:
        return {
            "metadata": {"name": "n1", "labels": {"gpufleet.io/pool": "p"}},
            "spec": {"unschedulable": cordoned},
            "status": {
                "allocatable": {"nvidia.com/gpu": "8"},
                "conditions": [{"type": "Ready", "status": ready, "lastTransitionTime": since}],
            },
        }

    def health(obj: dict[str, Any]) -> tuple[bool, bool]:
        found = observe.node_of(obj, NOW)
        assert found is not None
        return found.healthy, found.schedulable

    assert health(node("True", "2026-01-01T00:00:00Z")) == (True, True)
    assert health(node("True", "2026-01-01T00:00:00Z", cordoned=True)) == (True, False)
    # NotReady for a minute: no new work, nothing evicted; for the grace period: evicted
    assert health(node("False", "2026-01-01T11:59:00Z")) == (True, False)
    assert health(node("Unknown", "2026-01-01T11:55:00Z")) == (False, False)


class _FleetOf:
    def __init__(self, value: Any) -> None:
        self.value, self.fleet_version = value, 1

    def load_fleet(self) -> Any:
        return self.value


def _review(job_object: dict[str, Any]) -> dict[str, Any]:
    from gpufleet.controllers import admission

    admission.Admission.source = _FleetOf(fleet())
    body = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {"uid": "u-1", "operation": "CREATE", "object": job_object},
    }
    # a loop of its own: asyncio.run would leave the main thread without a current loop,
    # which later tests (Pulumi's mocks) expect to find
    loop = asyncio.new_event_loop()
    try:
        answer: dict[str, Any] = loop.run_until_complete(admission.review(body))
    finally:
        loop.close()
        admission.Admission.source = None
    assert answer["kind"] == "AdmissionReview"
    assert answer["response"]["uid"] == "u-1"
    response: dict[str, Any] = answer["response"]
    return response


@pytest.mark.parametrize("with_annotations", [True, False])
def test_the_webhook_patch_holds_and_keeps_what_the_job_had(with_annotations: bool) -> None:
    """The JSON patch, applied as the API server applies it (RFC 6902), gives the Job with the
    creation patch merged in: nothing the user wrote is lost, whether or not the fields the
    patch touches existed."""
    submitted = job(2, labels={"gpufleet.io/team": "nlp", "app": "train"})
    submitted["spec"]["template"]["metadata"] = {"labels": {"app": "train"}}
    submitted["spec"]["template"]["spec"]["tolerations"] = [{"key": "spot", "operator": "Exists"}]
    submitted["spec"]["template"]["spec"]["schedulingGates"] = [{"name": "team.example/quota"}]
    if with_annotations:
        submitted["metadata"]["annotations"] = {"owner": "ada"}
    response = _review(submitted)
    assert response["allowed"] is True and response["patchType"] == "JSONPatch"
    ops = json.loads(base64.b64decode(response["patch"]))
    patched = jsonpatch.apply_patch(submitted, ops)
    assert "suspend" not in patched["spec"]
    assert patched["spec"]["template"]["spec"]["schedulingGates"] == [
        {"name": "team.example/quota"},
        {"name": "gpufleet.io/admission"},
    ]
    assert patched["metadata"]["annotations"] == {
        **({"owner": "ada"} if with_annotations else {}),
        "gpufleet.io/managed": "true",
    }
    assert patched["metadata"]["labels"] == {
        "gpufleet.io/team": "nlp",
        "app": "train",
        "gpufleet.io/class": "elastic",
    }
    template = patched["spec"]["template"]
    assert template["metadata"] == {"labels": {"app": "train"}}
    assert template["spec"]["containers"] == submitted["spec"]["template"]["spec"]["containers"]
    assert template["spec"]["priorityClassName"] == "gpufleet-elastic-normal"
    assert template["spec"]["tolerations"] == [
        {"key": "spot", "operator": "Exists"},
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
    ]
    assert patched["spec"]["parallelism"] == 1


def test_the_webhook_refuses_with_the_reason_and_leaves_other_jobs_alone() -> None:
    refused = _review(job(2, labels={"gpufleet.io/team": "nlq"}))
    assert refused["allowed"] is False
    assert refused["status"]["code"] == 422
    assert "team 'nlq' does not exist" in refused["status"]["message"]
    assert "did you mean 'nlp'" in refused["status"]["message"]
    assert "patch" not in refused
    untouched = _review(job(None))  # no GPUs: not ours
    assert untouched == {"uid": "u-1", "allowed": True}


def test_submit_asks_for_several_gpu_types_in_order() -> None:
    from typer.testing import CliRunner

    from gpufleet.cli.main import app

    args = ["submit", "ft", "--team", "nlp", "--gpus", "8", "--dry-run", "-o", "json"]
    for flags in (["--gpu-type", "H100,A100"], ["--gpu-type", "H100", "--gpu-type", "A100"]):
        out = CliRunner().invoke(app, [*args, *flags])
        assert out.exit_code == 0, out.output
        made = json.loads(out.stdout)
        assert made["metadata"]["annotations"] == {"gpufleet.io/gpu-types": "H100,A100"}


def test_a_bare_pod_keeps_the_gpu_types_beside_its_run_time() -> None:
    from gpufleet.kube.manifests import as_kind, job_manifest

    job = job_manifest("p", "ns", "nlp", "elastic", "normal", 1, 1, "busybox", [], None, "5m",
                       ["H100", "A100"])  # fmt: skip
    pod = as_kind(job, "pod", "torch-distributed")
    assert pod["metadata"]["annotations"] == {
        "gpufleet.io/gpu-types": "H100,A100",
        "gpufleet.io/run-for": "5m",
    }
