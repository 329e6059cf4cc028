"""Simulator policies, metrics, trace readers, the synthetic trace, the report and `plan`."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
from conftest import EXAMPLE, REPO
from typer.testing import CliRunner

from gpufleet.cli.main import app
from gpufleet.model import load_fleet
from gpufleet.model.fleet import Fleet
from gpufleet.plan import gitops_objects, make_plan, object_diff, to_markdown, touched_clusters
from gpufleet.sim import report, synthetic
from gpufleet.sim.simulator import _entitled, sharing_safety, simulate
from gpufleet.sim.trace import TraceJob, read_native, read_trace

EXAMPLE_4 = REPO / "examples" / "decide" / "4-exact-preemption" / "gitops.yaml"


@pytest.fixture(scope="module")
def small() -> Fleet:
    loaded = load_fleet([EXAMPLE_4])  # 80 H100: research 48, production 32
    assert loaded.problems == []
    return loaded.fleet


@pytest.fixture(scope="module")
def example() -> Fleet:
    return load_fleet([EXAMPLE]).fleet


def lopsided() -> list[TraceJob]:
    """Production asks for twice its reservation; research for a quarter of its own."""
    jobs = [TraceJob(f"p{i}", "production", "auto", 8, 1, i * 60.0, 3600.0) for i in range(8)]
    jobs += [TraceJob(f"r{i}", "research", "auto", 4, 1, i * 600.0, 1800.0) for i in range(3)]
    return jobs


def test_static_partition_never_borrows_and_gpufleet_does(small: Fleet) -> None:
    static = simulate(small, lopsided(), policy="static-partition")
    ours = simulate(small, lopsided(), policy="gpufleet")
    for point in static.timeline:
        assert point["by_team"].get("production", 0) <= 32
    assert max(p["by_team"].get("production", 0) for p in ours.timeline) == 64
    assert ours.allocation_rate > static.allocation_rate
    # the partition leaves research's GPUs idle while production waits; gpufleet does not
    assert static.metrics()["idle_gpu_hours_with_demand"] > 0
    assert ours.metrics()["idle_gpu_hours_with_demand"] == 0
    safety = sharing_safety(ours, static)
    assert safety["production"] is not None and safety["production"] < 0
    assert safety["research"] == 0  # research never waited in either


def test_auto_jobs_are_reserved_within_the_reservation_and_elastic_beyond(small: Fleet) -> None:
    result = simulate(small, lopsided())
    classes = {j.spec.name: j.workload_class for j in result.jobs}
    assert [classes[f"p{i}"] for i in range(8)] == ["reserved"] * 4 + ["elastic"] * 4
    assert {classes[f"r{i}"] for i in range(3)} == {"reserved"}


def test_fifo_runs_one_queue_in_submission_order(small: Fleet) -> None:
    jobs = [
        TraceJob(f"j{i}", ["production", "research"][i % 2], "reserved", 8, 1, i, 100.0)
        for i in range(12)
    ]
    result = simulate(small, jobs, policy="fifo")
    starts = [j.first_start or 0.0 for j in sorted(result.jobs, key=lambda j: j.submitted)]
    assert all(j.first_start is not None for j in result.jobs)
    assert starts == sorted(starts)  # nobody overtakes
    assert all(j.workload_class == "elastic" for j in result.jobs)
    assert result.metrics()["finished"] == 12


def test_unknown_policy_is_refused(small: Fleet) -> None:
    with pytest.raises(ValueError, match="unknown policy 'lottery'"):
        simulate(small, lopsided(), policy="lottery")


def test_entitled_share_is_weighted_max_min() -> None:
    # 100 GPUs; a reserved 40 but wants 10; b reserved 20, wants 90; c reserved 0, wants 30
    share = _entitled({"a": 10, "b": 90, "c": 30}, {"a": 40, "b": 20}, {"b": 3, "c": 1}, 100)
    assert share["a"] == 10
    # 70 left after a:10, b:20: weights 3:1 -> b +52.5, c +17.5
    assert share["b"] == pytest.approx(72.5) and share["c"] == pytest.approx(17.5)
    assert sum(share.values()) == pytest.approx(100)


def test_metrics_include_cost_and_fairness(example: Fleet) -> None:
    jobs = synthetic.generate(example, seed=3, hours=1)
    metrics = simulate(example, jobs).metrics()
    cost = metrics["cost_usd"]
    assert cost is not None and cost["capacity"] > cost["idle"] > 0
    assert 0 <= metrics["fairness_deviation"] <= 2
    assert set(metrics["teams"]) == {j.team for j in jobs}


def test_synthetic_trace_is_seeded_and_shaped(example: Fleet) -> None:
    first = synthetic.generate(example, seed=7, hours=6)
    assert first == synthetic.generate(example, seed=7, hours=6)
    assert first != synthetic.generate(example, seed=8, hours=6)
    single = sum(1 for j in first if j.gpus * j.pods == 1) / len(first)
    assert 0.88 < single < 0.97  # Philly: 93 % of jobs use one GPU
    durations = sorted(j.duration_s for j in first)
    assert 700 < durations[len(durations) // 2] < 1800  # Philly median: 1,144 s


def test_a_swing_moves_each_team_s_demand_out_of_phase(example: Fleet) -> None:
    """With a swing, a team submits most in its own busy half of the period, and the teams'
    busy halves differ; without one, the trace is the plain one."""
    assert synthetic.generate(example, seed=7, hours=6, swing=0.0) == synthetic.generate(
        example, seed=7, hours=6
    )
    jobs = synthetic.generate(example, seed=7, hours=12, swing=0.9, swing_period_h=3.0)
    teams = sorted({j.team for j in jobs})
    busy_share = {}
    for i, team in enumerate(teams):
        times = [j.submit_s for j in jobs if j.team == team]
        phase = 2 * math.pi * i / len(teams)
        busy = sum(math.sin(2 * math.pi * t / (3 * 3600) + phase) > 0 for t in times)
        busy_share[team] = busy / len(times)
    # 1 + 0.9 sin: the busy half carries (pi + 1.8) / (2 pi) = 79 % of the arrivals
    assert all(share > 0.7 for share in busy_share.values()), busy_share
    with pytest.raises(ValueError, match="swing must be between 0 and 1"):
        synthetic.generate(example, swing=1.5)


def test_the_demo_shows_lending_reclaim_and_resume(example: Fleet) -> None:
    """`make demo`'s trace: borrowed GPUs taken back by reserved work that starts at once, and
    every preempted job started again; nothing idle while work waited."""
    jobs, problems = read_native(REPO / "examples" / "traces" / "demo.csv")
    assert problems == []
    metrics = simulate(example, jobs).metrics()
    lending = metrics["lending"]
    assert lending["borrowed_gpu_hours"] > 100
    assert lending["reclaims"] >= 50
    assert lending["reclaim_wait_s"]["p99"] <= 60
    assert lending["preempted_jobs"] >= 50
    assert lending["preempted_jobs_resumed"] == lending["preempted_jobs"]
    assert metrics["reserved_guarantee_violations"] == 0
    assert metrics["idle_gpu_hours_with_demand"] == 0
    assert metrics["finished"] == len(jobs)


def test_committed_demo_trace_is_what_the_script_generates(example: Fleet) -> None:
    committed = (REPO / "examples" / "traces" / "demo.csv").read_text()
    assert committed == synthetic.to_csv(synthetic.demo(example))


def test_philly_and_openb_readers(tmp_path: Path) -> None:
    philly = tmp_path / "philly.csv"
    philly.write_text(
        "timestamp,duration,num_gpus,gpu_time,cluster\n"
        "2017-10-02 00:00:10,60.0,1,60.0,vc1\n"
        "2017-10-02 00:01:00,600.0,16,9600.0,vc2\n"
        "2017-10-01 23:00:00,60.0,1,60.0,vc1\n"
        "2017-10-02 00:02:00,oops,1,1,vc1\n"
    )
    from datetime import UTC, datetime

    jobs, problems = read_trace(philly, "philly", datetime(2017, 10, 2, tzinfo=UTC))
    assert [(j.team, j.gpus, j.pods, j.submit_s) for j in jobs] == [
        ("vc1", 1, 1, 10.0),
        ("vc2", 8, 2, 60.0),  # 16 GPUs: a gang of two 8-GPU pods
    ]
    assert [p.line for p in problems] == [5]
    openb = tmp_path / "openb.csv"
    openb.write_text(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,"
        "deletion_time,scheduled_time\n"
        "a,1000,100,1,460,,LS,Running,0,100,0\n"
        "b,1000,100,0,0,,BE,Running,0,100,0\n"
        "c,1000,100,2,1000,,BE,Running,50,80,50\n"
    )
    jobs, problems = read_trace(openb, "openb")
    assert problems == []
    assert [(j.name, j.team, j.gpus, j.duration_s) for j in jobs] == [
        ("a", "ls", 0.5, 100.0),  # 460 milli -> half a GPU (quarters)
        ("c", "be", 2.0, 30.0),
    ]
    (bad,) = read_trace(openb, "philly")[1]
    assert "not a Philly trace" in bad.message


def test_report_is_self_contained_with_every_chart(small: Fleet) -> None:
    ours = simulate(small, lopsided())
    static = simulate(small, lopsided(), policy="static-partition")
    page = report.render("test", ours, static, sharing_safety(ours, static))
    for chart in (
        "allocated-vs-reserved",
        "queue-depth",
        "idle-capacity",
        "waits-per-team",
        "preemptions-per-team",
        "versus-static-partition",
    ):
        assert f'id="{chart}"' in page
    assert "http://" not in page and "https://" not in page  # nothing to fetch
    assert page.count('class="series"') >= 6


def test_object_diff() -> None:
    old = {("Team", "a"): {"spec": {"x": 1}}, ("Team", "b"): {}}
    new = {("Team", "a"): {"spec": {"x": 2}}, ("Team", "c"): {}}
    assert object_diff(old, new) == [
        {
            "kind": "Team",
            "name": "a",
            "change": "changed",
            "fields": [{"field": "spec.x", "from": 1, "to": 2}],
        },
        {"kind": "Team", "name": "b", "change": "removed"},
        {"kind": "Team", "name": "c", "change": "added"},
    ]


def test_plan_shows_diff_and_impact(tmp_path: Path, small: Fleet) -> None:
    proposed = tmp_path / "proposed.yaml"
    proposed.write_text(
        EXAMPLE_4.read_text()
        .replace(
            "spec: {team: research, pool: h100, gpus: 48}",
            "spec: {team: research, pool: h100, gpus: 24}",
        )
        .replace(
            "spec: {team: production, pool: h100, gpus: 32}",
            "spec: {team: production, pool: h100, gpus: 56}",
        )
    )
    new = load_fleet([proposed]).fleet
    before = simulate(small, lopsided(), policy="gpufleet").metrics()
    after = simulate(new, lopsided(), policy="gpufleet").metrics()
    plan = make_plan(small, new, before, after, "lopsided")
    changed = {(c["kind"], c["name"]) for c in plan["gitops_changes"]}
    assert changed == {("Reservation", "research-h100"), ("Reservation", "production-h100")}
    assert plan["teams"]["production"]["reserved_gpus"] == {"baseline": 32, "proposed": 56}
    text = to_markdown(plan)
    assert "`spec.gpus`: 48 → 24" in text and "| production | 32 → 56 |" in text

    trace = tmp_path / "t.csv"
    trace.write_text(synthetic.to_csv(lopsided()))
    result = CliRunner().invoke(
        app,
        [
            "plan",
            "--baseline",
            str(EXAMPLE_4),
            "--gitops",
            str(proposed),
            "--trace",
            str(trace),
            "-o",
            "json",
        ],
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["impact"]["reserved_guarantee_violations"]["proposed"] == 0


def test_cli_simulate_policy_report_and_bad_input(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text(synthetic.to_csv(lopsided()))
    page = tmp_path / "r.html"
    result = CliRunner().invoke(
        app,
        ["simulate", "-g", str(EXAMPLE_4), "-t", str(trace), "--report", str(page), "-o", "json"],
    )
    assert result.exit_code == 0, result.output
    metrics = json.loads(result.stdout)
    assert metrics["sharing_safety_s"]["production"] < 0
    assert metrics["allocation_rate"] > metrics["static_partition_allocation_rate"]
    assert 'id="versus-static-partition"' in page.read_text()
    result = CliRunner().invoke(
        app, ["simulate", "-g", str(EXAMPLE_4), "-t", str(trace), "--format", "philly"]
    )
    assert result.exit_code == 1
    assert "not a Philly trace" in result.output and "Traceback" not in result.output


def test_plan_of_a_fleet_says_which_clusters_a_change_reaches(tmp_path: Path) -> None:
    example = Path(__file__).resolve().parents[1] / "examples" / "multicluster"
    baseline = load_fleet([example]).fleet
    proposed_dir = tmp_path / "gitops"
    shutil.copytree(example, proposed_dir)
    reservations = proposed_dir / "reservations.yaml"
    reservations.write_text(
        reservations.read_text().replace(
            "spec: {team: ml-platform, pool: eu-h100, gpus: 32}",
            "spec: {team: ml-platform, pool: eu-h100, gpus: 16}",
        )
    )
    proposed = load_fleet([proposed_dir]).fleet
    plan = make_plan(baseline, proposed, {"teams": {}}, {"teams": {}}, "none")
    assert plan["clusters"] == ["eu"]
    assert "Clusters of the fleet this change reaches: eu." in to_markdown(plan)
    clusters = proposed_dir / "clusters.yaml"
    clusters.write_text(clusters.read_text().replace("lostAfter: 60s", "lostAfter: 90s"))
    moved = load_fleet([proposed_dir]).fleet
    changes = object_diff(gitops_objects(baseline), gitops_objects(moved))
    assert ("Cluster", "us-west") in {(c["kind"], c["name"]) for c in changes}
    assert touched_clusters(baseline, moved, changes) == ["eu", "us-west"]
    team = [{"kind": "Team", "name": "research", "change": "changed"}]
    assert touched_clusters(baseline, moved, team) == ["eu", "us-west"]  # every controller's
    assert (
        touched_clusters(load_fleet([EXAMPLE_4]).fleet, load_fleet([EXAMPLE_4]).fleet, team) == []
    )


def test_plan_of_a_fleet_shows_each_clusters_figures(tmp_path: Path) -> None:
    """A fleet's plan gives each cluster its GPUs, allocation, jobs, queue delay and
    preemptions before and after; they add up to the fleet's (simulate's own figures)."""
    example = Path(__file__).resolve().parents[1] / "examples" / "multicluster"
    proposed = tmp_path / "gitops"
    shutil.copytree(example, proposed)
    pools = proposed / "pools.yaml"
    assert "maxGPUs: 64" in pools.read_text()
    pools.write_text(pools.read_text().replace("maxGPUs: 64", "maxGPUs: 32"))  # eu's pool halved
    args = ["--baseline", str(example), "--gitops", str(proposed), "--seed", "7"]
    result = CliRunner().invoke(app, ["plan", *args, "-o", "json"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    assert plan["clusters"] == ["eu"]
    figures = plan["by_cluster"]
    assert sorted(figures) == ["eu", "us-west"]
    assert figures["eu"]["capacity_gpus"] == {"baseline": 64, "proposed": 32}
    assert figures["us-west"]["capacity_gpus"] == {"baseline": 128, "proposed": 128}
    markdown = CliRunner().invoke(app, ["plan", *args])
    assert markdown.exit_code == 0, markdown.output
    assert "| eu (changed) | 64 → 32 |" in markdown.stdout
    assert "| us-west | 128 → 128 |" in markdown.stdout
    # each cluster's part of the fleet's run adds up to the whole
    result = CliRunner().invoke(app, ["simulate", "-g", str(proposed), "--seed", "7", "-o", "json"])
    assert result.exit_code == 0, result.output
    metrics = json.loads(result.stdout)
    clusters = metrics["clusters"].values()
    assert sum(c["capacity_gpus"] for c in clusters) == metrics["capacity_gpus"]
    weighted = sum(c["capacity_gpus"] * c["allocation"] for c in clusters)
    assert abs(weighted / metrics["capacity_gpus"] - metrics["allocation_rate"]) < 1e-3
    started = metrics["jobs"] - metrics["never_started"]
    assert sum(c["jobs_started"] for c in clusters) == started > 0
    table = CliRunner().invoke(app, ["simulate", "-g", str(proposed), "--seed", "7"])
    assert table.exit_code == 0 and "Per cluster" in table.stdout, table.output
