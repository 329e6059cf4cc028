"""`gpufleet validate`: one fixture object per mistake, each reported at its file and line."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpufleet.cli.main import app
from gpufleet.model import validate_paths

INVALID = Path(__file__).parent / "data" / "invalid"
NOW = datetime(2026, 6, 1, tzinfo=UTC)


def line_of(file: str, marker: str) -> int:
    for number, text in enumerate((INVALID / file).read_text().splitlines(), start=1):
        if f"MARK {marker}" in text:
            return number
    raise AssertionError(f"no marker {marker} in {file}")


# (marker, file, severity, text the message must contain)
EXPECTED = [
    (
        "unknown-field",
        "teams.yaml",
        "error",
        "Team/audio: unknown field 'spec.burstingPriorty' (did you mean 'burstingPriority'?)",
    ),
    ("duplicate-name", "teams.yaml", "error", "duplicate Team 'nlp': already defined at"),
    (
        "bursting-priority-range",
        "teams.yaml",
        "error",
        "spec.burstingPriority: Input should be less than or equal to 10 (got 12)",
    ),
    ("malformed-burst-limit", "teams.yaml", "error", "burstLimit 'lots' is malformed"),
    ("unknown-parent", "teams.yaml", "error", "parent team 'researh' does not exist"),
    ("cycle-alpha", "teams.yaml", "error", "the team tree has a cycle (alpha -> beta -> alpha)"),
    ("cycle-beta", "teams.yaml", "error", "the team tree has a cycle (alpha -> beta -> alpha)"),
    (
        "unknown-team",
        "reservations.yaml",
        "error",
        "team 'nlpp' does not exist (did you mean 'nlp'?)",
    ),
    (
        "unknown-pool",
        "reservations.yaml",
        "error",
        "pool 'good-h10' does not exist (did you mean 'good-h100'?)",
    ),
    ("expired", "reservations.yaml", "warning", "expired on 2025-01-31"),
    (
        "over-reserved",
        "pools.yaml",
        "error",
        "reservations add up to 20 GPUs but maxGPUs is 16 (too-much (16), unknown-team (4))",
    ),
    ("aws-needs-instance-types", "pools.yaml", "error", "an AWS pool needs instanceTypes"),
    (
        "gcp-needs-machine-types",
        "pools.yaml",
        "error",
        "a GCP pool needs instanceTypes (the machine types",
    ),
    ("static-needs-node-selector", "pools.yaml", "error", "a static pool needs a nodeSelector"),
]


@pytest.fixture(scope="module")
def problems() -> list[tuple[str, int, str, str]]:
    _, found = validate_paths([INVALID], NOW)
    return [(Path(p.file).name, p.line, p.severity, p.message) for p in found]


@pytest.mark.parametrize(
    ("marker", "file", "severity", "text"), EXPECTED, ids=[e[0] for e in EXPECTED]
)
def test_each_mistake_is_reported_at_its_line(
    problems: list[tuple[str, int, str, str]], marker: str, file: str, severity: str, text: str
) -> None:
    line = line_of(file, marker)
    matching = [p for p in problems if p[0] == file and p[1] == line]
    assert matching, f"nothing reported at {file}:{line}; got {problems}"
    assert any(p[2] == severity and text in p[3] for p in matching), matching


def test_nothing_else_is_reported(problems: list[tuple[str, int, str, str]]) -> None:
    expected_places = {(file, line_of(file, marker)) for marker, file, _, _ in EXPECTED}
    assert {(p[0], p[1]) for p in problems} == expected_places


def test_cli_text_output_and_exit_code() -> None:
    result = CliRunner().invoke(app, ["validate", str(INVALID), "--now", "2026-06-01"])
    assert result.exit_code == 1
    lines = result.stdout.strip().splitlines()
    assert len(lines) == len(EXPECTED)
    line = line_of("teams.yaml", "unknown-field")
    assert f"{INVALID / 'teams.yaml'}:{line}: error: Team/audio: unknown field" in result.stdout
    assert (
        f"{INVALID / 'reservations.yaml'}:{line_of('reservations.yaml', 'expired')}: "
        "warning: Reservation/expired" in result.stdout
    )
    assert "Traceback" not in result.output


def test_cli_json_output() -> None:
    result = CliRunner().invoke(
        app, ["validate", str(INVALID), "-o", "json", "--now", "2026-06-01"]
    )
    assert result.exit_code == 1
    data = json.loads(result.stdout)
    assert len(data) == len(EXPECTED)
    assert {"file", "line", "severity", "message"} <= set(data[0])
    assert sorted({d["severity"] for d in data}) == ["error", "warning"]


def test_warnings_alone_exit_zero_unless_strict(write) -> None:  # type: ignore[no-untyped-def]
    folder = write(
        {
            "r.yaml": (INVALID / "pools.yaml").read_text().split("---")[0]
            + """---
apiVersion: gpufleet.io/v1alpha1
kind: Team
metadata: {name: nlp}
---
apiVersion: gpufleet.io/v1alpha1
kind: Reservation
metadata: {name: old}
spec: {team: nlp, pool: good-h100, gpus: 8, expiresAt: "2020-01-01T00:00:00Z"}
"""
        }
    )
    runner = CliRunner()
    assert runner.invoke(app, ["validate", str(folder)]).exit_code == 0
    strict = runner.invoke(app, ["validate", str(folder), "--warnings-as-errors"])
    assert strict.exit_code == 1
    assert "warning: Reservation/old: expired" in strict.stdout


def test_example_is_valid() -> None:
    result = CliRunner().invoke(app, ["validate", "examples/gitops", "policies"][:2])
    assert result.exit_code == 0, result.output
    assert result.stdout == ""


def test_in_a_fleet_of_clusters_every_pool_names_a_cluster_that_exists(tmp_path: Path) -> None:
    example = Path(__file__).resolve().parent.parent / "examples" / "multicluster"
    for name in ("clusters.yaml", "teams.yaml", "reservations.yaml"):
        (tmp_path / name).write_text((example / name).read_text())
    pools = (example / "pools.yaml").read_text()
    pools = pools.replace("cluster: eu\n", "cluster: euu\n").replace("  cluster: us-west\n", "")
    (tmp_path / "pools.yaml").write_text(pools)
    _, found = validate_paths([tmp_path])
    by_object = {p.object: (p.code, p.message) for p in found if p.code == "UnknownCluster"}
    assert by_object["GPUPool/eu-h100"][1] == (
        "GPUPool/eu-h100: cluster 'euu' does not exist (did you mean 'eu'?); "
        "define a Cluster of that name"
    )
    assert (
        "names no cluster, but the fleet declares clusters (eu, us-west)"
        in (by_object["GPUPool/us-west-h100"][1])
    )
    assert validate_paths([example])[1] == []


def test_a_template_names_a_team_and_pool_that_exist_and_a_pod_is_one_pod(
    tmp_path: Path,
) -> None:
    example = Path(__file__).resolve().parent.parent / "examples" / "gitops"
    for copied in example.glob("*.yaml"):
        (tmp_path / copied.name).write_text(copied.read_text())
    (tmp_path / "more.yaml").write_text(
        "apiVersion: gpufleet.io/v1alpha1\nkind: WorkloadTemplate\nmetadata: {name: broken}\n"
        "spec:\n  image: x\n  team: nlpp\n  pool: nowhere\n  kind: pod\n  pods: 2\n"
        "---\napiVersion: gpufleet.io/v1alpha1\nkind: WorkloadTemplate\nmetadata: {name: odd}\n"
        "spec:\n  image: x\n  memory: lots\n"
    )
    _, found = validate_paths([tmp_path])
    said = sorted((p.line, p.code, p.message) for p in found if p.file.endswith("more.yaml"))
    assert [(line, code) for line, code, _ in said] == [
        (6, "UnknownTeam"), (7, "UnknownPool"), (9, "PodGang"), (16, "InvalidValue"),
    ]  # fmt: skip
    assert "did you mean 'nlp'" in said[0][2]
