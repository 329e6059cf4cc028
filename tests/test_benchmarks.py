"""Smoke runs of the benchmark scripts: they run and print the JSON they promise (no timing)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

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
