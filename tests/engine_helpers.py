"""Building scenarios for `gpufleet decide` from compact Python data, and running it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from typer.testing import CliRunner

from gpufleet.cli.main import app

T0 = "2026-01-01T12:00:00Z"


def gitops(
    pools: dict[str, dict[str, Any]],
    teams: dict[str, dict[str, Any]],
    reservations: dict[tuple[str, str], int] | None = None,
    policy: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """GitOps objects: pools by name (spec overrides), teams by name (spec), reservations."""
    objs: list[dict[str, Any]] = []
    for name, spec in pools.items():
        full = {
            "provider": "static",
            "gpuType": "H100",
            "gpusPerNode": 8,
            "maxGPUs": 64,
            "nodeSelector": {"gpufleet.io/pool": name},
            **spec,
        }
        objs.append(_obj("GPUPool", name, full))
    for name, spec in teams.items():
        objs.append(_obj("Team", name, spec))
    for (team, pool), gpus in (reservations or {}).items():
        objs.append(
            _obj("Reservation", f"{team}-{pool}", {"team": team, "pool": pool, "gpus": gpus})
        )
    if policy:
        objs.append(_obj("FleetPolicy", "test", policy))
    return objs


def _obj(kind: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "gpufleet.io/v1alpha1",
        "kind": kind,
        "metadata": {"name": name},
        "spec": spec,
    }


def nodes(pool: str, count: int, gpus: int = 8, **extra: Any) -> list[dict[str, Any]]:
    return [
        {"name": f"{pool}-{i}", "pool": pool, "gpus": gpus, **extra} for i in range(1, count + 1)
    ]


def run_decide(tmp: Path, objs: list[dict[str, Any]], state: dict[str, Any]) -> dict[str, Any]:
    """Write the scenario, run `gpufleet decide -o json`, return the parsed decisions."""
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "gitops.yaml").write_text(yaml.safe_dump_all(objs, sort_keys=False))
    state = {"time": T0, **state}
    (tmp / "state.yaml").write_text(yaml.safe_dump(state, sort_keys=False))
    result = CliRunner().invoke(
        app,
        [
            "decide",
            "--gitops",
            str(tmp / "gitops.yaml"),
            "--state",
            str(tmp / "state.yaml"),
            "-o",
            "json",
        ],
    )
    assert result.exit_code == 0, result.output
    data: dict[str, Any] = json.loads(result.stdout)
    return data


def admitted(decisions: dict[str, Any]) -> dict[str, list[str]]:
    return {a["workload"]: a["nodes"] for a in decisions["admitted"]}


def preempted(decisions: dict[str, Any]) -> dict[str, str]:
    return {p["workload"]: p["by"] for p in decisions["preempted"]}


def pending(decisions: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {p["workload"]: p for p in decisions["pending"]}
