"""The simulator core: the engine replayed over time on small traces."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from engine_helpers import gitops

from gpufleet.model import load_fleet
from gpufleet.model.fleet import Fleet, fleet_from_objects
from gpufleet.sim.failures import Failures
from gpufleet.sim.simulator import cluster_nodes, simulate
from gpufleet.sim.trace import TraceJob, read_native

EXAMPLE_4 = Path(__file__).resolve().parent.parent / "examples" / "decide" / "4-exact-preemption"


def fleet_of(objects: list[dict[str, Any]]) -> Fleet:
    loaded = fleet_from_objects(objects)
    assert loaded.problems == []
    return loaded.fleet


@pytest.fixture(scope="module")
def fleet():  # type: ignore[no-untyped-def]
    loaded = load_fleet([EXAMPLE_4 / "gitops.yaml"])  # 80 H100: research 48, production 32
    assert loaded.problems == []
    return loaded.fleet


def test_everything_finishes_and_the_gpu_seconds_add_up(fleet) -> None:  # type: ignore[no-untyped-def]
    trace = [TraceJob(f"j{i}", "research", "elastic", 8, 1, i * 10.0, 600.0) for i in range(20)]
    result = simulate(fleet, trace)
    metrics = result.metrics()
    assert metrics["finished"] == 20
    # 20 jobs x 8 GPUs x 600 s of work, nothing preempted
    assert result.allocated_gpu_s == pytest.approx(20 * 8 * 600)
    assert 0 < metrics["allocation_rate"] <= 1
    assert metrics["preemptions"] == 0


def test_reserved_work_reclaims_lent_gpus_without_violations(fleet) -> None:  # type: ignore[no-untyped-def]
    # production borrows the whole pool, then research's reserved gang arrives
    trace = [TraceJob(f"batch-{i}", "production", "elastic", 8, 1, 0.0, 7200.0) for i in range(10)]
    trace.append(TraceJob("big", "research", "reserved", 8, 3, 3600.0, 600.0))
    result = simulate(fleet, trace, checkpoint_interval_s=1800)
    metrics = result.metrics(grace_period_s=60)
    big = next(j for j in result.jobs if j.spec.name == "big")
    assert big.first_start == 3600.0  # admitted at once, by preemption
    assert metrics["preemptions"] == 3  # exactly the 24 GPUs it needs
    assert metrics["reserved_guarantee_violations"] == 0
    # checkpoints every 30 min: preempted after 60 min of work, nothing since the last
    # checkpoint was lost (3600 is a multiple of 1800)
    assert metrics["gpu_hours_lost"] == 0
    assert metrics["finished"] == 11
    assert metrics["queue_delay_s"]["research/reserved"]["p50"] == 0.0
    lending = metrics["lending"]
    assert lending["reclaims"] == 1 and lending["reclaim_wait_s"]["p99"] == 0.0
    # the three preempted jobs resume as soon as the reserved gang ends (R6), 600 s later
    assert lending["preempted_jobs"] == lending["preempted_jobs_resumed"] == 3
    assert lending["resume_wait_s"]["p50"] == lending["resume_wait_s"]["p99"] == 600.0
    # production (32 reserved) ran 80 GPUs for 3,600 s, 56 for 600 s, 80 until 7,200 s and the
    # resumed 24 until 7,800 s: 48 x 3,600 + 24 x 600 + 48 x 3,000 GPU-seconds beyond its
    # reservation; research stayed inside its own
    assert lending["borrowed_gpu_hours"] == pytest.approx((48 * 3600 + 24 * 600 + 48 * 3000) / 3600)
    preempted_so_far = [p["preemptions"] for p in result.timeline]
    assert preempted_so_far[0] == 0 and preempted_so_far[-1] == 3
    assert preempted_so_far == sorted(preempted_so_far)


def test_work_lost_since_the_last_checkpoint_is_counted(fleet) -> None:  # type: ignore[no-untyped-def]
    trace = [TraceJob(f"b{i}", "production", "elastic", 8, 1, 0.0, 7200.0) for i in range(10)]
    trace.append(TraceJob("big", "research", "reserved", 8, 1, 2700.0, 60.0))
    result = simulate(fleet, trace, checkpoint_interval_s=1800)
    # preempted 2700 s in: 900 s since the checkpoint at 1800 s, on 8 GPUs
    assert result.metrics()["gpu_hours_lost"] == pytest.approx(900 * 8 / 3600)


def test_simulation_is_deterministic(fleet) -> None:  # type: ignore[no-untyped-def]
    trace = [
        TraceJob(
            f"j{i}",
            ["research", "production"][i % 2],
            ["elastic", "reserved"][i % 3 == 0],
            [1, 2, 4, 8][i % 4],
            1 + i % 2,
            i * 37.0,
            300.0 + 50 * i,
        )
        for i in range(40)
    ]
    first = simulate(fleet, trace).metrics()
    again = simulate(fleet, list(reversed(trace))).metrics()
    for measured in (first, again):  # CPU time is measured, not simulated
        measured.pop("engine_cpu_s_per_simulated_day")
    assert first == again
    assert first["finished"] == 40


def test_read_native_reports_bad_rows(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text(
        "name,team,class,gpus,pods,submit_s,duration_s\n"
        "a,nlp,elastic,8,1,0,60\n"
        "b,nlp,gold,8,1,0,60\n"
        "c,nlp,elastic,eight,1,0,60\n"
    )
    jobs, problems = read_native(path)
    assert [j.name for j in jobs] == ["a"]
    assert [(p.line, "class 'gold'" in p.message or "bad row" in p.message) for p in problems] == [
        (3, True),
        (4, True),
    ]
    (missing,) = read_native(tmp_path / "nope.csv")[1]
    assert "cannot read trace" in missing.message


def test_cli_simulate(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from gpufleet.cli.main import app

    trace = tmp_path / "trace.csv"
    trace.write_text(
        "name,team,class,gpus,pods,submit_s,duration_s\n"
        + "".join(f"j{i},production,elastic,8,1,0,3600\n" for i in range(10))
        + "big,research,reserved,8,3,1800,600\n"
    )
    out = tmp_path / "m.json"
    result = CliRunner().invoke(
        app,
        [
            "simulate",
            "--gitops",
            str(EXAMPLE_4 / "gitops.yaml"),
            "--trace",
            str(trace),
            "--json",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    assert "reserved-guarantee violations 0" in result.stdout
    import json

    assert json.loads(out.read_text())["preemptions"] == 3
    bad = tmp_path / "bad.csv"
    bad.write_text("name,team\n")
    result = CliRunner().invoke(
        app, ["simulate", "--gitops", str(EXAMPLE_4 / "gitops.yaml"), "--trace", str(bad)]
    )
    assert result.exit_code == 1
    assert "missing columns" in result.output
    typo = tmp_path / "typo.csv"
    typo.write_text(
        "name,team,class,gpus,pods,submit_s,duration_s,gpu_types\nx,research,elastic,1,1,0,60,H10\n"
    )
    result = CliRunner().invoke(
        app, ["simulate", "--gitops", str(EXAMPLE_4 / "gitops.yaml"), "--trace", str(typo)]
    )
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert "job x accepts GPU type 'H10', which no pool has (did you mean 'H100'?)" in result.output


def test_gangs_avoid_a_lemon_node_once_it_has_failed(fleet) -> None:  # type: ignore[no-untyped-def]
    """A node failing about four times a day (the others practically never): without its
    fault history the engine keeps placing gangs there by best fit (first node by name); with
    it, only the gang that ran there before its first failure is hit. Same failures in both."""
    hour = 3600.0
    trace = [
        TraceJob(f"gang-{i}", "research", "reserved", 8, 2, i * 12 * hour, 12 * hour)
        for i in range(10)
    ]
    lemon = cluster_nodes(fleet)[0].name
    results = {}
    for avoid in (True, False):
        failures = Failures(
            per_node_per_day=0.0001,
            lemon_factor=40000.0,
            lemons=(lemon,),
            repair_s=hour,
            avoid_lemons=avoid,
        )
        results[avoid] = simulate(fleet, trace, failures=failures).metrics()
    avoiding, blind = results[True], results[False]
    assert avoiding["node_failures"] == blind["node_failures"] > 10
    assert avoiding["finished"] == blind["finished"] == 10  # failed work runs again
    assert avoiding["gangs_hit_by_failures"] == 1
    assert blind["gangs_hit_by_failures"] >= 4
    assert avoiding["gpu_hours_lost_to_failures"] < blind["gpu_hours_lost_to_failures"] / 4
    # without a failures model the figures are absent, not zero
    assert "node_failures" not in simulate(fleet, trace).metrics()


def test_work_on_a_failed_node_loses_what_it_did_since_its_checkpoint(fleet) -> None:  # type: ignore[no-untyped-def]
    trace = [TraceJob("solo", "research", "elastic", 8, 1, 0.0, 4 * 3600.0)]
    node = cluster_nodes(fleet)[0].name  # where best fit puts it, before any fault is known
    failures = Failures(per_node_per_day=0.0001, lemon_factor=40000.0, lemons=(node,))
    result = simulate(fleet, trace, checkpoint_interval_s=1800, failures=failures)
    (job,) = result.jobs
    metrics = result.metrics()
    assert job.failures == metrics["jobs_hit_by_failures"] >= 1
    assert job.finished is not None and job.finished > 4 * 3600.0
    # lost: at most one checkpoint interval on 8 GPUs per failure
    assert 0 < metrics["gpu_hours_lost_to_failures"] <= job.failures * 0.5 * 8


def test_a_reservation_expires_during_the_trace() -> None:
    """A Reservation whose expiresAt falls inside the run guarantees GPUs until then: the
    team's work after it is elastic, and the same trace started earlier keeps it reserved."""
    from datetime import UTC, datetime, timedelta

    start = datetime(2026, 12, 7, 9, tzinfo=UTC)
    objects = gitops({"h100": {"maxGPUs": 16}}, {"a": {}, "b": {}}, {("a", "h100"): 8})
    objects[-1]["spec"]["expiresAt"] = (start + timedelta(hours=1)).isoformat()
    expiring = fleet_of(objects)
    trace = [
        TraceJob("b1", "b", "elastic", 8, 1, 0.0, 36000.0),
        TraceJob("b2", "b", "elastic", 8, 1, 0.0, 36000.0),
        TraceJob("a1", "a", "auto", 8, 1, 1800.0, 600.0),  # before the expiry: reclaims
        TraceJob("a2", "a", "auto", 8, 1, 5400.0, 600.0),  # after it
    ]
    result = simulate(expiring, trace, start=start)
    classes = {j.spec.name: j.workload_class for j in result.jobs}
    assert classes["a1"] == "reserved" and classes["a2"] == "elastic"
    metrics = result.metrics()
    assert metrics["reservations_expired"] == [{"reservation": "a-h100", "at_s": 3600.0}]
    assert metrics["lending"]["reclaims"] == 1
    assert metrics["reserved_guarantee_violations"] == 0
    earlier = simulate(expiring, trace, start=start - timedelta(hours=2))
    assert {j.spec.name: j.workload_class for j in earlier.jobs}["a2"] == "reserved"
    # the long b jobs still run when it expires there, 3 hours in
    assert earlier.metrics()["reservations_expired"] == [{"reservation": "a-h100", "at_s": 10800.0}]


def test_cli_simulate_at_a_time_a_reservation_expires(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from gpufleet.cli.main import app

    gitops = tmp_path / "fleet.yaml"
    gitops.write_text(
        "apiVersion: gpufleet.io/v1alpha1\nkind: GPUPool\nmetadata: {name: h100}\n"
        "spec: {provider: static, gpuType: H100, gpusPerNode: 8, maxGPUs: 16,"
        " nodeSelector: {pool: h100}}\n---\n"
        "apiVersion: gpufleet.io/v1alpha1\nkind: Team\nmetadata: {name: research}\n---\n"
        "apiVersion: gpufleet.io/v1alpha1\nkind: Team\nmetadata: {name: production}\n---\n"
        "apiVersion: gpufleet.io/v1alpha1\nkind: Reservation\nmetadata: {name: research-extra}\n"
        "spec: {team: research, pool: h100, gpus: 8, expiresAt: '2026-12-07T10:00:00Z'}\n"
    )
    trace = tmp_path / "trace.csv"
    trace.write_text(
        "name,team,class,gpus,pods,submit_s,duration_s\n"
        + "".join(f"j{i},production,elastic,8,1,0,14400\n" for i in range(2))
    )
    out = tmp_path / "m.json"
    args = ["simulate", "--gitops", str(gitops), "--trace", str(trace), "--json", str(out)]
    result = CliRunner().invoke(app, [*args, "--at", "2026-12-07T09:00"])
    assert result.exit_code == 0, result.output
    assert "reservation research-extra expired 1.0 h into the trace" in result.stdout
    import json

    expired = json.loads(out.read_text())["reservations_expired"]
    assert expired == [{"reservation": "research-extra", "at_s": 3600.0}]
    result = CliRunner().invoke(app, [*args, "--at", "next tuesday"])
    assert result.exit_code == 1
    assert "--at:" in result.output and "2026-12-07T09:00" in result.output


def test_spot_nodes_are_interrupted_and_the_lost_work_is_counted_apart() -> None:
    """Only nodes of a pool that prefers spot capacity are taken back; the work on them loses
    what it did since its last checkpoint, counted as lost to spot interruptions, and an
    interruption is no fault of the node."""
    from gpufleet.sim.failures import SPOT, FailureSchedule
    from gpufleet.sim.simulator import EPOCH, spot_pools

    aws = {"provider": "aws", "maxGPUs": 32, "instanceTypes": ["p5.48xlarge"]}
    pools = {
        "spot": {**aws, "capacityTypes": ["spot", "on-demand"]},
        "ondemand": {**aws, "capacityTypes": ["on-demand", "spot"]},
    }
    mixed = fleet_of(gitops(pools, {"t": {}}))
    assert spot_pools(mixed) == {"spot"}
    trace = [TraceJob(f"j{i}", "t", "elastic", 8, 1, 0.0, 86400.0) for i in range(8)]
    failures = Failures(per_node_per_day=0.0, spot_per_node_per_day=2.0, seed=3)
    result = simulate(mixed, trace, failures=failures)
    metrics = result.metrics()
    assert metrics["spot_interruptions"] > 0 and metrics["node_failures"] == 0
    hit = [j for j in result.jobs if j.spot_interruptions]
    assert hit and all(j.failures == 0 for j in result.jobs)
    lost = metrics["gpu_hours_lost_by_cause"]
    assert lost["spot_interruption"] == metrics["gpu_hours_lost_to_spot_interruptions"] > 0
    assert lost["node_failure"] == 0
    assert metrics["finished"] == 8  # everything ran to the end after its interruptions
    schedule = FailureSchedule(failures, cluster_nodes(mixed), EPOCH, frozenset({"spot"}))
    downs = schedule.fail_due(86400.0)
    assert downs and {cause for _, cause in downs} == {SPOT}
    assert all(name.startswith("spot-") for name, _ in downs)
    assert not schedule.history  # no fault history: not the node's fault


def test_autoscaled_pools_grow_with_the_work_and_shrink_when_empty() -> None:
    """With a provisioning delay, an aws pool starts empty: work the engine places on a new node
    waits for it, holding its GPUs; the node goes after consolidateAfter empty; the capacity
    cost counts the GPU-hours the pool had."""
    p5 = {
        "provider": "aws",
        "maxGPUs": 32,
        "instanceTypes": ["p5.48xlarge"],
        "consolidateAfter": "10m",
        "pricePerGPUHour": {"onDemand": 6.0},
    }
    autoscaled = fleet_of(gitops({"p5": p5}, {"t": {}}, {("t", "p5"): 16}))
    trace = [
        TraceJob("first", "t", "reserved", 8, 1, 0.0, 3600.0),
        TraceJob("second", "t", "reserved", 8, 1, 6000.0, 3600.0),
    ]
    result = simulate(autoscaled, trace, provisioning_delay_s=300.0)
    jobs = {j.spec.name: j for j in result.jobs}
    # admitted at once, running once the node is ready 300 s later
    assert jobs["first"].first_start == 0.0 and jobs["first"].finished == 3900.0
    assert jobs["second"].first_start == 6000.0 and jobs["second"].finished == 9900.0
    assert jobs["first"].nodes == ("p5-1",) and jobs["second"].nodes == ("p5-2",)
    metrics = result.metrics()
    grown = metrics["provisioning"]
    assert grown["nodes_provisioned"] == 2 and grown["nodes_removed"] == 1
    # p5-1 from 0 until 10 minutes after it emptied at 3,900 s; p5-2 from 6,000 s to the end
    assert grown["autoscaled_gpu_hours"] == round((4500 + 3900) * 8 / 3600, 3)
    assert grown["admissions_that_waited_for_nodes"] == 2
    assert grown["gpu_hours_waiting_for_nodes"] == round(2 * 300 * 8 / 3600, 3)
    assert metrics["cost_usd"]["capacity"] == pytest.approx((4500 + 3900) * 8 / 3600 * 6.0)
    assert metrics["reserved_guarantee_violations"] == 0
    full = simulate(autoscaled, trace).metrics()  # every pool at its full size
    assert "provisioning" not in full
    assert full["cost_usd"]["capacity"] == pytest.approx(32 * 9600 / 3600 * 6.0)


def test_jobs_that_accept_several_gpu_types_take_the_next_type_when_the_first_is_full(
    tmp_path: Path,
) -> None:
    """A trace's `gpu_types` column: the job that accepts H100 or A100 runs on A100 at once
    while the H100s are busy; the job that accepts H100 alone waits for them."""
    objects = gitops({"h100": {"maxGPUs": 8}, "a100": {"gpuType": "A100", "maxGPUs": 8}}, {"a": {}})
    trace = tmp_path / "trace.csv"
    trace.write_text(
        "name,team,class,gpus,pods,submit_s,duration_s,gpu_types\n"
        "first,a,elastic,8,1,0,3600,H100\n"
        "either,a,elastic,8,1,60,600,H100|A100\n"
        "h100-only,a,elastic,8,1,120,600,H100\n"
    )
    jobs, problems = read_native(trace)
    assert problems == []
    assert [j.gpu_types for j in jobs] == [("H100",), ("H100", "A100"), ("H100",)]
    result = simulate(fleet_of(objects), jobs)
    by_name = {j.spec.name: j for j in result.jobs}
    assert by_name["either"].first_start == 60 and by_name["either"].pool == "a100"
    assert by_name["h100-only"].first_start == 3600 and by_name["h100-only"].pool == "h100"
    assert by_name["first"].pool == "h100"
    # the A100s idle after `either` while `h100-only` waits: not idle GPUs it could use
    assert result.metrics()["idle_gpu_hours_with_demand"] == 0
