"""Loading YAML: source locations, syntax errors, kinds and versions, schema messages."""

from __future__ import annotations

from pathlib import Path

from gpufleet.model import load_fleet, validate_paths
from gpufleet.model.source import parse_yaml

POOL = """\
apiVersion: gpufleet.io/v1alpha1
kind: GPUPool
metadata:
  name: h100
spec:
  provider: aws
  gpuType: H100
  gpusPerNode: 8
  maxGPUs: 64
  instanceTypes:
    - p5.48xlarge
    - p5e.48xlarge
  aws: {amiAlias: al2023@v20251112}
"""


def messages(folder: Path) -> list[str]:
    return [str(p) for p in validate_paths([folder])[1]]


def test_every_field_keeps_its_line() -> None:
    docs, problems = parse_yaml("---\n" + POOL + "---\n" + POOL.replace("h100", "h200"), "f.yaml")
    assert problems == []
    first, second = docs
    assert first.source.line == 2
    assert first.source.line_of(("spec", "maxGPUs")) == 10
    assert first.source.line_of(("spec", "instanceTypes", 1)) == 13
    # a missing field points at its closest parent that exists
    assert first.source.line_of(("spec", "zones")) == 6
    assert second.source.line_of(("metadata", "name")) == 19


def test_yaml_syntax_error_is_located(write) -> None:  # type: ignore[no-untyped-def]
    folder = write({"bad.yaml": "kind: Team\nmetadata:\n  name: [unclosed\n"})
    (problem,) = validate_paths([folder])[1]
    assert problem.severity == "error"
    assert problem.file.endswith("bad.yaml")
    assert problem.message.startswith("invalid YAML")
    assert problem.line in (3, 4)


def test_duplicate_yaml_key_is_an_error(write) -> None:  # type: ignore[no-untyped-def]
    folder = write({"dup.yaml": POOL + "  maxGPUs: 32\n"})
    (problem,) = validate_paths([folder])[1]
    assert "duplicate key 'maxGPUs' (first set on line 9)" in problem.message
    assert problem.line == 14


def test_unknown_kind_and_version_are_reported(write) -> None:  # type: ignore[no-untyped-def]
    folder = write(
        {
            "a.yaml": "apiVersion: gpufleet.io/v1alpha1\nkind: GPUPol\nmetadata: {name: x}\n",
            "b.yaml": "apiVersion: gpufleet.io/v1\nkind: Team\nmetadata: {name: x}\n",
            "c.yaml": "apiVersion: gpufleets.io/v1alpha1\nkind: Team\nmetadata: {name: y}\n",
        }
    )
    found = messages(folder)
    assert any("a.yaml:2: error: unknown kind 'GPUPol'" in m and "'GPUPool'" in m for m in found)
    assert any("b.yaml:1: error: unknown apiVersion 'gpufleet.io/v1'" in m for m in found)
    assert any("c.yaml:1: error: unknown apiVersion 'gpufleets.io/v1alpha1'" in m for m in found)


def test_other_manifests_are_skipped(write) -> None:  # type: ignore[no-untyped-def]
    folder = write(
        {
            "pool.yaml": POOL,
            "app.yaml": "apiVersion: argoproj.io/v1alpha1\nkind: Application\n"
            "metadata: {name: a}\n",
            "notes.txt": "not yaml",
        }
    )
    loaded = load_fleet([folder])
    assert loaded.problems == []
    assert loaded.skipped == 1
    assert list(loaded.fleet.pools) == ["h100"]


def test_missing_field_and_wrong_type(write) -> None:  # type: ignore[no-untyped-def]
    folder = write(
        {
            "p.yaml": POOL.replace("  gpuType: H100\n", "").replace(
                "gpusPerNode: 8", "gpusPerNode: eight"
            )
        }
    )
    found = messages(folder)
    assert any(
        ":5: error: GPUPool/h100: missing required field 'spec.gpuType'" in m for m in found
    ), found
    assert any(
        ":7: error: GPUPool/h100: spec.gpusPerNode: Input should be a valid integer" in m
        and "(got 'eight')" in m
        for m in found
    ), found


def test_missing_path_is_an_error_not_a_crash() -> None:
    (problem,) = validate_paths(["does/not/exist"])[1]
    assert problem.severity == "error"
    assert "no such file or directory" in problem.message


def test_burst_limit_accepts_integers_and_percentages(write) -> None:  # type: ignore[no-untyped-def]
    folder = write(
        {
            "t.yaml": """\
apiVersion: gpufleet.io/v1alpha1
kind: Team
metadata: {name: a}
spec: {burstLimit: 16}
---
apiVersion: gpufleet.io/v1alpha1
kind: Team
metadata: {name: b}
spec: {burstLimit: "12.5%"}
"""
        }
    )
    loaded = load_fleet([folder])
    assert loaded.problems == []
    assert loaded.fleet.teams["a"].spec.burst_limit == "16"
    assert loaded.fleet.teams["b"].spec.burst_limit == "12.5%"
