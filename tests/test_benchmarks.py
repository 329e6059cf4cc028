"""Smoke runs of the benchmark scripts: they run and print the JSON they promise (no timing)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def test_decide_latency_quick() -> None:
    result = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "decide_latency.py"), "--quick"],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    data = json.loads(result.stdout)
    assert {r["scenario"] for r in data["results"]} == {"single-pod", "gangs", "preemption"}
    for r in data["results"]:
        assert r["admitted"] + r["still_waiting"] == r["waiting"]
        assert r["full_cycle_s"] > 0
        assert r["per_admitted_ms"]["p99"] is not None
    assert data["results"][2]["preempted"] > 0


def test_teams_smoke() -> None:
    """A few hundred Philly jobs at two loads: the invariants of benchmark B2."""
    from conftest import shared_dir, skip_unless_ci

    base = shared_dir()
    philly = base / "data" / "philly" if base else None
    if philly is None or not (philly / "philly.csv").is_file():
        skip_unless_ci("Philly trace not found: set GPUFLEET_SHARED_DIR to the folder with data/")
    result = subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks" / "teams.py"),
            "--trace",
            str(philly / "philly.csv"),
            "--teams",
            str(philly / "philly_vc.csv"),
            "--max-jobs",
            "300",
            "--load",
            "0.9,1.1",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    )
    data = json.loads(result.stdout)
    assert data["jobs"] == 300
    for r in data["results"]:
        assert r["allocation_rate"] > r["static_partition_allocation_rate"]
        assert r["reserved_guarantee_violations"] == 0
        assert r["idle_gpu_hours_with_demand"] == 0
        assert all(v is None or v <= 0 for v in r["sharing_safety_s"].values())
        assert r["finished"] == r["jobs"] == 300


def _philly() -> Path:
    from conftest import shared_dir, skip_unless_ci

    base = shared_dir()
    philly = base / "data" / "philly" if base else None
    if philly is None or not (philly / "philly.csv").is_file():
        skip_unless_ci("Philly trace not found: set GPUFLEET_SHARED_DIR to the folder with data/")
    return philly


def _json_lines(script: str, *args: str) -> list[dict[str, Any]]:
    philly = _philly()
    result = subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks" / script),
            "--trace",
            str(philly / "philly.csv"),
            "--teams",
            str(philly / "philly_vc.csv"),
            *args,
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    )
    return [json.loads(line) for line in result.stdout.splitlines()]


def test_guarantees_smoke() -> None:
    """The trace's first two (small) weeks: one row per week and load, then a summary."""
    rows = _json_lines("guarantees.py", "--weeks", "2017-09-04,2017-09-11", "--load", "1.0,1.3")
    *weeks, summary = rows
    assert [(r["week"], r["load"]) for r in weeks] == [
        ("2017-09-04", 1.0),
        ("2017-09-11", 1.0),
        ("2017-09-04", 1.3),
        ("2017-09-11", 1.3),
    ]
    for row in weeks:
        assert row["reserved_guarantee_violations"] == 0 == len(row["violations"])
        assert row["idle_gpu_hours_with_demand"] == 0
        assert row["allocation_rate"] >= row["static_partition_allocation_rate"]
    assert summary["summary"] == {"runs": 4, "reserved_guarantee_violations": 0}


def test_sim_speed_smoke() -> None:
    *weeks, summary = _json_lines("sim_speed.py", "--weeks", "2017-09-04", "--load", "1.0")
    (row,) = weeks
    assert row["week"] == "2017-09-04" and row["jobs"] > 0
    assert row["events"] >= row["decisions"] > 0
    assert row["simulated_days"] > 0 and row["ms_per_decision"] > 0
    assert summary["summary"]["runs"] == 1
    # too few cycles in this week to compare the cost of one
    assert summary["summary"]["slowest_to_fastest_per_decision"] is None


def test_lemons_smoke() -> None:
    """Both runs meet the same failures; the figures of each are there."""
    *weeks, summary = _json_lines(
        "lemons.py", "--weeks", "2017-09-18", "--load", "1.0", "--seeds", "1"
    )
    (row,) = weeks
    avoiding, blind = row["avoiding_lemons"], row["blind"]
    assert avoiding["node_failures"] == blind["node_failures"] > 0
    assert set(avoiding) == set(blind) >= {"gpu_hours_lost_to_failures", "gangs_hit_by_failures"}
    assert summary["summary"]["runs"] == 1


def test_lemons_training_cluster_smoke() -> None:
    """The training-cluster scenario: a row per seed with both runs, then who lost less."""
    *seeds, summary = _json_lines("lemons.py", "--training-cluster", "16", "--seeds", "2")
    assert [row["seed"] for row in seeds] == [1, 2]
    for row in seeds:
        assert row["nodes"] == 16 and row["jobs"] > 100
        avoiding, blind = row["avoiding_lemons"], row["blind"]
        # one failure schedule; the runs may end at different times, so counts may differ
        assert avoiding["node_failures"] > 0 and blind["node_failures"] > 0
        assert 0 < avoiding["allocation_rate"] <= 1
    wins = summary["summary"]["seeds_with_less_lost"]
    assert sum(wins.values()) == 2 == summary["summary"]["runs"]


def test_api_latency_quick() -> None:
    result = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "api_latency.py"), "--quick"],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    data = json.loads(result.stdout)
    assert data["workloads"] == 1_000
    by_path = {r["path"]: r for r in data["results"]}
    assert by_path["/workloads?limit=10000"]["items"] == 1_000  # every workload, one page
    assert by_path["/workloads?team=team-7"]["items"] == 100
    assert by_path["/workloads (team lead, one namespace allowed)"]["items"] == 100
    for row in data["results"]:
        assert 0 < row["ms"]["p50"] <= row["ms"]["p99"] <= row["ms"]["max"]
    assert data["list_and_get_p99_ms"] > 0
    # a new caller's reviews (one per namespace) asked side by side and one at a time: each
    # list it got held its own team's workloads only (the benchmark checks every answer)
    cold = data["cold_access"]
    assert cold["side_by_side"]["parallel"] > 1 == cold["one_at_a_time"]["parallel"]
    assert cold["side_by_side"]["ms"]["p50"] > 0 and cold["speedup_p50"] > 0


def test_topology_smoke() -> None:
    result = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "topology.py"), "--seeds", "1"],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    *rows, last = [json.loads(line) for line in result.stdout.splitlines()]
    (row,) = rows
    summary = last["summary"]
    aware, blind = summary["topology_aware"], summary["blind"]
    assert aware["gangs"] == blind["gangs"] == row["blind"]["gangs"] > 0
    # the same week, with and without the nodes' blocks: more gangs inside one block
    assert aware["share_in_one_block"] > blind["share_in_one_block"]
    assert aware["mean_blocks_per_gang"] < blind["mean_blocks_per_gang"]


def test_decision_digest_is_deterministic() -> None:
    """The same seed gives the same digest (what makes two commits comparable); another seed,
    other snapshots and so another digest."""

    def digest(seed: int) -> dict[str, Any]:
        result = subprocess.run(
            [
                sys.executable,
                str(REPO / "benchmarks" / "decision_digest.py"),
                "--snapshots",
                "40",
                "--seed",
                str(seed),
            ],
            capture_output=True,
            text=True,
            check=True,
            timeout=300,
        )
        return dict(json.loads(result.stdout)["snapshots"])

    first, again, other = digest(1), digest(1), digest(2)
    assert first == again and first["count"] == 40 and len(first["digest"]) == 64
    assert other["digest"] != first["digest"]


def test_run_build_smoke(registry: Any) -> None:
    """A few files, no control plane: an unchanged re-run sends nothing, a one-file change
    sends the code layer, the config and the manifest."""
    result = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "run_build.py"), "--files", "3",
         "--no-cluster"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["submitted"] is False
    assert data["unchanged_rerun_bytes_pushed"] == 0
    assert data["code_layer_bytes"] < data["one_file_change_bytes_pushed"]
    assert data["one_file_change_bytes_pushed"] < data["first_bytes_pushed"]


def test_otlp_ingest_quick() -> None:
    result = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "otlp_ingest.py"), "--quick"],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    data = json.loads(result.stdout)
    flood, load = data["flood"], data["brief_load"]
    # every point sent was stored (100 an export) or dropped with its request by a full queue
    dropped = flood["requests_dropped_by_a_full_queue"]
    assert flood["points_stored"] + dropped * 100 == flood["requests_sent"] * 100 > 0
    assert flood["points_per_cpu_second"] > 0 and flood["agent_cpu_seconds"] > 0
    assert load["agent_rss_mib"] > 0 and 0 <= load["agent_cpu_share_of_a_core"] < 1
    reporting = data["brief_load_reporting_to_a_server"]
    assert reporting["reports_taken_by_the_server"] >= 1  # a report every 5 s poll
    assert reporting["agent_rss_mib"] > 0 and 0 <= reporting["agent_cpu_share_of_a_core"] < 1
