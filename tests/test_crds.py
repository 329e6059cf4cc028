"""CRDs generated from the models: structural, complete, and identical to the chart's copies."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from crdschema import CRDSchemas
from typer.testing import CliRunner

from gpufleet.cli.main import app
from gpufleet.model import load_fleet
from gpufleet.render.common import file_name, to_yaml
from gpufleet.render.crds import render_crds

REPO = Path(__file__).resolve().parent.parent
CHART_CRDS = REPO / "charts" / "gpufleet" / "crds"


def test_chart_crds_are_generated_from_the_models() -> None:
    for crd in render_crds():
        path = CHART_CRDS / file_name(crd)
        assert path.exists(), f"{path} missing: run `make crds`"
        assert path.read_text() == to_yaml([crd]), f"{path} drifted: run `make crds`"
    assert len(list(CHART_CRDS.glob("*.yaml"))) == len(render_crds())


def _walk(node: dict[str, Any], path: str) -> list[str]:
    """Violations of the structural-schema rules Kubernetes enforces."""
    bad = []
    if "$ref" in node or "$defs" in node:
        bad.append(f"{path}: $ref")
    if "type" not in node and not node.get("x-kubernetes-int-or-string"):
        bad.append(f"{path}: no type")
    if "anyOf" in node and not node.get("x-kubernetes-int-or-string"):
        bad.append(f"{path}: anyOf")
    # unbounded sizes cost every watcher, and make CEL rules too costly to admit
    if node.get("type") == "array" and "maxItems" not in node:
        bad.append(f"{path}: no maxItems")
    bounded = {"maxLength", "enum", "format"} & node.keys()
    if node.get("type") == "string" and not bounded and path not in (".apiVersion", ".kind"):
        bad.append(f"{path}: no maxLength")
    for name, child in node.get("properties", {}).items():
        bad.extend(_walk(child, f"{path}.{name}"))
    for key in ("items", "additionalProperties"):
        if isinstance(node.get(key), dict):
            bad.extend(_walk(node[key], f"{path}[{key}]"))
    return bad


@pytest.mark.parametrize("crd", render_crds(), ids=lambda c: c["spec"]["names"]["kind"])
def test_crd_is_structural_and_complete(crd: dict[str, Any]) -> None:
    spec = crd["spec"]
    assert spec["group"] == "gpufleet.io"
    # the GitOps kinds are cluster-scoped; a GPUWorkload lives next to its Job
    kind = spec["names"]["kind"]
    assert spec["scope"] == ("Namespaced" if kind == "GPUWorkload" else "Cluster")
    assert spec["names"]["shortNames"]
    (version,) = spec["versions"]
    assert version["name"] == "v1alpha1"
    schema = version["schema"]["openAPIV3Schema"]
    assert _walk(schema, "") == []
    columns = [c["name"] for c in version["additionalPrinterColumns"]]
    assert columns[-1] == "Age"
    if kind in ("GPUWorkload", "GPUHost"):  # one writer (controller, server): with its status
        assert "subresources" not in version
        assert "status" in schema["properties"]
    elif kind not in ("FleetPolicy", "WorkloadTemplate"):  # nothing writes their status
        assert version["subresources"] == {"status": {}}
        assert "status" in schema["properties"]


def test_crd_schema_keeps_ranges_enums_and_patterns() -> None:
    crds = {c["spec"]["names"]["kind"]: c for c in render_crds()}
    team = crds["Team"]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert team["properties"]["burstingPriority"]["minimum"] == 1
    assert team["properties"]["burstingPriority"]["maximum"] == 10
    assert team["properties"]["burstLimit"]["x-kubernetes-int-or-string"] is True
    pool = crds["GPUPool"]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]
    assert pool["spec"]["properties"]["provider"]["enum"] == ["aws", "gcp", "azure", "static"]
    assert set(pool["spec"]["required"]) == {"provider", "gpuType", "gpusPerNode", "maxGPUs"}
    assert pool["spec"]["properties"]["aws"]["properties"]["amiAlias"]["pattern"]


def test_example_objects_validate_against_our_own_crds(tmp_path: Path) -> None:
    schemas = CRDSchemas(sorted(CHART_CRDS.glob("*.yaml")))
    for path in sorted((REPO / "examples" / "gitops").glob("*.yaml")):
        for obj in yaml.safe_load_all(path.read_text()):
            assert schemas.knows(obj)
            assert schemas.errors(obj) == [], path
    broken = {
        "apiVersion": "gpufleet.io/v1alpha1",
        "kind": "Team",
        "metadata": {"name": "x"},
        "spec": {"burstingPriority": 11, "colour": "red"},
    }
    errors = schemas.errors(broken)
    assert any("11 is greater than the maximum of 10" in e for e in errors), errors
    assert any("colour" in e for e in errors), errors
    assert load_fleet([REPO / "examples" / "gitops"]).problems == []


def test_cli_crds_prints_all_of_them() -> None:
    result = CliRunner().invoke(app, ["crds"])
    assert result.exit_code == 0
    docs = list(yaml.safe_load_all(result.stdout))
    assert [d["metadata"]["name"] for d in docs] == [
        "clusters.gpufleet.io",
        "gpupools.gpufleet.io",
        "teams.gpufleet.io",
        "reservations.gpufleet.io",
        "fleetpolicies.gpufleet.io",
        "workloadtemplates.gpufleet.io",
        "gpuworkloads.gpufleet.io",
        "gpuhosts.gpufleet.io",
    ]
