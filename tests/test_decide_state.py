"""`gpufleet decide` on bad input: located errors, exit code 1, never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpufleet.cli.main import app

GITOPS = (
    Path(__file__).resolve().parent.parent / "examples" / "decide" / "2-priority" / "gitops.yaml"
)


def run(tmp_path: Path, state: str) -> tuple[int, str]:
    path = tmp_path / "state.yaml"
    path.write_text(state)
    result = CliRunner().invoke(app, ["decide", "--gitops", str(GITOPS), "--state", str(path)])
    assert "Traceback" not in result.output
    return result.exit_code, result.output


NODES = "nodes:\n  - {name: a100-1, pool: a100, gpus: 8}\n"


@pytest.mark.parametrize(
    ("state", "line", "text"),
    [
        (
            NODES + "workloads:\n  - {name: w, team: team-a, gpus: 8, colour: red}\n",
            4,
            "unknown field 'workloads.0.colour'",
        ),
        (
            NODES + "workloads:\n  - {name: w, team: team-z, gpus: 8}\n",
            4,
            "team 'team-z' does not exist (did you mean",
        ),
        (
            NODES + "workloads:\n  - {name: w, team: team-a, gpus: 0.3}\n",
            4,
            "a fractional request must be 0.25, 0.5 or 0.75 GPU",
        ),
        (
            NODES + "workloads:\n  - {name: w, team: team-a, gpus: 0.5, pods: 2}\n",
            4,
            "fractional GPUs are for single-pod workloads",
        ),
        (
            NODES + "workloads:\n  - {name: w, team: team-a, gpus: 8, state: Running}\n",
            4,
            "a Running workload lists the node of each pod: 1 pod(s), 0 node(s)",
        ),
        (
            NODES
            + "workloads:\n  - {name: w, team: team-a, gpus: 8, state: Running, nodes: [a100-9]}\n",
            4,
            "node 'a100-9' is not in the state's nodes (did you mean 'a100-1'?)",
        ),
        (NODES + "  - {name: x, pool: a10, gpus: 8}\n", 3, "pool 'a10' does not exist"),
        (
            NODES + "workloads:\n  - {name: w, team: team-a, gpus: 8, priority: 120}\n",
            4,
            "less than or equal to 99",
        ),
        (
            NODES
            + "workloads:\n  - {name: w, team: team-a, gpus: 8}\n"
            + "  - {name: w, team: team-a, gpus: 1}\n",
            5,
            "duplicate workload 'w'",
        ),
        ("nodes: [\n", 2, "invalid YAML"),
    ],
)
def test_state_errors_are_located(tmp_path: Path, state: str, line: int, text: str) -> None:
    code, output = run(tmp_path, state)
    assert code == 1
    assert f"state.yaml:{line}: error:" in output, output
    assert text in output, output


def test_over_allocated_node_is_reported_at_the_workload(tmp_path: Path) -> None:
    code, output = run(
        tmp_path,
        NODES + "workloads:\n"
        "  - {name: a, team: team-a, gpus: 8, state: Running, nodes: [a100-1]}\n"
        "  - {name: b, team: team-a, gpus: 4, state: Running, nodes: [a100-1]}\n",
    )
    assert code == 1
    assert "state.yaml:5: error: workload b: node a100-1 is over-allocated" in output


def test_named_priorities_and_default_time(tmp_path: Path) -> None:
    code, output = run(
        tmp_path, NODES + "workloads:\n  - {name: w, team: team-a, gpus: 8, priority: high}\n"
    )
    assert code == 0, output
    assert "Admitted" in output


def test_invalid_gitops_is_refused(tmp_path: Path) -> None:
    (tmp_path / "state.yaml").write_text(NODES)
    result = CliRunner().invoke(
        app, ["decide", "--gitops", "tests/data/invalid", "--state", str(tmp_path / "state.yaml")]
    )
    assert result.exit_code == 1
    assert "the GitOps input has" in result.output
