"""The GitOps wiring files and the Grafana dashboard: well-formed, and the dashboard only
queries metrics gpufleet exports."""

from __future__ import annotations

import json
import re

import yaml
from conftest import REPO
from prometheus_client import CollectorRegistry

from gpufleet.agent.metrics import Metrics

GITOPS = REPO / "gitops"


def exported_names() -> set[str]:
    """Metric family names of the controller and the agent (without _total/_bucket/...)."""
    from gpufleet.controllers import metrics

    agent = CollectorRegistry()
    Metrics(agent)
    return {family.name for r in (metrics.REGISTRY, agent) for family in r.collect()}


def family(sample: str) -> str:
    return re.sub(r"_(total|bucket|sum|count|created)$", "", sample)


def test_dashboard_queries_only_exported_metrics() -> None:
    dashboard = json.loads((GITOPS / "monitoring" / "gpufleet-fleet.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    used = {family(m) for e in exprs for m in re.findall(r"gpufleet_[a-z_]+", e)}
    assert len(used) >= 10
    unknown = used - exported_names()
    assert not unknown, f"the dashboard queries metrics nobody exports: {sorted(unknown)}"


def test_wiring_files_parse_and_point_at_the_desired_state() -> None:
    documents = [
        d
        for path in sorted((GITOPS).glob("*/*.yaml"))
        for d in yaml.safe_load_all(path.read_text())
        if d
    ]
    kinds = {d.get("kind") for d in documents}
    assert {"Application", "ApplicationSet", "GitRepository", "Kustomization"} <= kinds
    paths = {
        s.get("path")
        for d in documents
        if d.get("kind") == "Application"
        for s in d["spec"].get("sources", [d["spec"].get("source", {})])
    }
    assert {"gitops", "policies", "charts/gpufleet"} <= paths
    workflow = yaml.safe_load((GITOPS / "ci" / "pull-request.yaml").read_text())
    steps = " ".join(s.get("run", "") for s in workflow["jobs"]["plan"]["steps"])
    assert "gpufleet validate" in steps and "gpufleet plan" in steps
