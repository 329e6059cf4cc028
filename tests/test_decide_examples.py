"""The four worked examples of DESIGN §4, run through `gpufleet decide` on the bundled files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from gpufleet.cli.main import app

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "decide"


def decide(example: str, output: str = "json") -> Any:
    folder = EXAMPLES / example
    result = CliRunner().invoke(
        app,
        [
            "decide",
            "--gitops",
            str(folder / "gitops.yaml"),
            "--state",
            str(folder / "state.yaml"),
            "-o",
            output,
        ],
    )
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout) if output == "json" else result.stdout


def test_1_reserved_job_reclaims_the_teams_own_elastic_gpus() -> None:
    out = decide("1-reserved-reclaims")
    assert out["admitted"] == [
        {"workload": "urgent-train", "pool": "h100", "nodes": ["h100-3", "h100-4", "h100-4"]}
    ]
    assert {p["workload"]: (p["by"], p["reason"]) for p in out["preempted"]} == {
        "eval-sweep": ("urgent-train", "ReservationReclaimed"),
        "ablation": ("urgent-train", "ReservationReclaimed"),
    }
    assert out["pending"] == []


def test_2_higher_priority_elastic_displaces_lower() -> None:
    out = decide("2-priority")
    assert out["admitted"] == [{"workload": "deadline-run", "pool": "a100", "nodes": ["a100-2"]}]
    assert [(p["workload"], p["by"], p["reason"]) for p in out["preempted"]] == [
        ("hparam-sweep", "deadline-run", "HigherPriority")
    ]


def test_3_idle_reservation_lets_elastic_run_without_preemption() -> None:
    out = decide("3-idle-reservation")
    assert out["admitted"] == [{"workload": "segmenter", "pool": "h100", "nodes": ["h100-2"]}]
    assert out["preempted"] == []
    assert out["pending"] == []


def test_4_exactly_the_needed_elastic_gpus_are_preempted() -> None:
    out = decide("4-exact-preemption")
    assert out["admitted"] == [
        {"workload": "research-big", "pool": "h100", "nodes": ["h100-8", "h100-9", "h100-10"]}
    ]
    victims = {p["workload"] for p in out["preempted"]}
    assert victims == {"prod-batch-1", "prod-batch-2", "prod-batch-3"}  # 24 GPUs, no more
    assert all(p["reason"] == "ReservationReclaimed" for p in out["preempted"])
    # production keeps prod-batch-small (4 elastic GPUs) and all of its reserved work


@pytest.mark.parametrize("output", ["yaml", "table"])
def test_other_output_formats(output: str) -> None:
    text = decide("4-exact-preemption", output)
    assert "research-big" in text
    assert "prod-batch-2" in text


def test_5_reserved_work_reclaims_where_reserved_work_already_is() -> None:
    """Regression of the one reserved-guarantee violation of the Philly sweep (issue 12): the
    cheapest victim sits on the all-elastic node, but taking it would leave no node that
    evicting elastic work can empty for vision's whole-node reserved job."""
    out = decide("5-reserved-stays-together")
    assert out["pending"] == []
    assert {a["workload"]: a["nodes"] for a in out["admitted"]} == {
        "nlp-eval": ["h100-1"],
        "vision-train": ["h100-2"],
    }
    assert {p["workload"]: p["by"] for p in out["preempted"]} == {
        "sweep-1": "nlp-eval",
        "sweep-2": "vision-train",
        "sweep-3": "vision-train",
    }
