"""The usage ledger on the real control plane: what ran is recorded once, costs GPUs × time ×
price by team and pool (checked against the GPUWorkloads' own timestamps), on SQLite and on a
real PostgreSQL; a deleted Job's segment ends as cancelled."""

from __future__ import annotations

import json
import time
from collections import defaultdict
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from gpufleet.cli.main import app
from gpufleet.kube.observe import parse_time
from gpufleet.ledger.cost import Segment
from gpufleet.ledger.store import open_ledger
from gpufleet.testing.cluster import ControlPlane

from .conftest import ControllerProcess

PRICE = 3.0  # USD per GPU-hour of the test pool


@pytest.fixture(params=["sqlite", "postgresql"])
def ledger(
    request: pytest.FixtureRequest,
    cluster: ControlPlane,
    controller: ControllerProcess,
    tmp_path: Path,
) -> Iterator[str]:
    """The ledger a running controller keeps: the session controller's SQLite file, or a
    controller of its own writing to PostgreSQL (the session controller stopped meanwhile)."""
    if request.param == "sqlite":
        yield controller.ledger
        return
    url = request.getfixturevalue("postgres")
    controller.stop()
    own = ControllerProcess(cluster, tmp_path, ledger=url)
    try:
        own.start()
        yield url
    finally:
        own.stop()
        controller.start()


def segments(target: str, pool: str) -> list[Segment]:
    store = open_ledger(target, create=False)
    try:
        far = timedelta(days=3650)
        now = datetime.now(UTC)
        return [s for s in store.segments(now - far, now + far) if s.pool == pool]
    finally:
        store.close()


def workloads(cluster: ControlPlane, namespace: str) -> dict[str, dict[str, Any]]:
    items = cluster.get("gpuworkloads.gpufleet.io", "-n", namespace)["items"]
    return {w["metadata"]["name"]: w for w in items}


def test_cost_by_team_is_gpus_times_time_times_price(
    cluster: ControlPlane, scenario: Any, ledger: str
) -> None:
    s = scenario(2)
    s.objects[0]["spec"]["pricePerGPUHour"] = {"onDemand": PRICE}
    owner, lender = s.team("owner"), s.team("lender")
    s.reserve(owner, 8)
    s.apply()
    s.job("train", owner, "reserved", 8, 1, run_for="12s")
    s.job("sweep", lender, "elastic", 3, 2, run_for="8s")
    s.job("eval", lender, "elastic", 2, 1, run_for="5s")
    s.wait_states({"train": "Completed", "sweep": "Completed", "eval": "Completed"}, 120)
    s.job("stray", lender, "elastic", 8, 1, run_for="600s")
    s.wait_states({"stray": "Running"}, 60)
    found = workloads(cluster, s.namespace)
    stray_admitted = parse_time(found["stray"]["status"]["admittedAt"])
    deleted = datetime.now(UTC)
    cluster.kubectl("delete", "job", "stray", "-n", s.namespace, "--wait=false")

    # independently of the ledger: each finished GPUWorkload's GPUs × (finished - admitted)
    expected: dict[str, float] = defaultdict(float)
    for name in ("train", "sweep", "eval"):
        spec, status = found[name]["spec"], found[name]["status"]
        finished, admitted = parse_time(status["finishedAt"]), parse_time(status["admittedAt"])
        assert finished is not None and admitted is not None, status
        held = finished - admitted
        expected[spec["team"]] += spec["gpus"] * spec["pods"] * held.total_seconds() / 3600

    deadline = time.monotonic() + 60
    while True:
        rows = segments(ledger, s.pool)
        if len(rows) == 4 and all(r.end is not None for r in rows):
            break
        assert time.monotonic() < deadline, f"the ledger did not record the 4 runs: {rows}"
        time.sleep(1)
    stray = next(r for r in rows if r.workload.endswith("/stray"))
    assert stray.outcome == "cancelled" and stray.start == stray_admitted
    assert stray.end is not None
    assert deleted - timedelta(seconds=2) <= stray.end <= deleted + timedelta(seconds=20)
    assert sorted(r.outcome for r in rows) == ["cancelled", "completed", "completed", "completed"]
    assert {r.uid for r in rows} == {
        w["spec"]["workloadRef"]["uid"] for w in found.values()
    }  # one segment per run, none twice
    # each run's user: who created its Job, as admission recorded it on its GPUWorkload
    by_uid = {w["spec"]["workloadRef"]["uid"]: w["spec"].get("submitter") for w in found.values()}
    assert all(by_uid.values()) and {r.uid: r.submitter for r in rows} == by_uid
    stray_hours = 8 * (stray.end - stray.start).total_seconds() / 3600

    runner = CliRunner()
    done = runner.invoke(
        app, ["cost", "--ledger", ledger, "--by", "pool", "--by", "team", "-o", "json"]
    )
    assert done.exit_code == 0, done.output
    mine = {r["team"]: r for r in json.loads(done.stdout)["groups"] if r["pool"] == s.pool}
    assert mine[owner]["gpuHours"] == pytest.approx(expected[owner], abs=1e-4)
    assert mine[owner]["gpuCost"] == pytest.approx(expected[owner] * PRICE, abs=0.01)
    assert mine[lender]["gpuHours"] == pytest.approx(expected[lender] + stray_hours, abs=1e-4)
    assert mine[lender]["outcomes"] == {"cancelled": 1, "completed": 2}
    usage = runner.invoke(app, ["usage", "--ledger", ledger, "--by", "pool", "-o", "csv"])
    assert usage.exit_code == 0, usage.output
    header, *lines = usage.stdout.splitlines()
    row = dict(
        zip(
            header.split(","),
            next(x for x in lines if x.startswith(s.pool + ",")).split(","),
            strict=True,
        )
    )
    total = expected[owner] + expected[lender] + stray_hours
    assert float(row["gpuHours"]) == pytest.approx(total, abs=1e-3)
    assert float(row["gpuCost"]) == pytest.approx(total * PRICE, abs=0.02)


def test_a_run_on_spot_nodes_costs_the_spot_rate(
    cluster: ControlPlane, controller: ControllerProcess, scenario: Any
) -> None:
    """A node's karpenter.sh/capacity-type says what it is bought as: work on a spot node is
    recorded at the pool's spot price, with its capacity type."""
    s = scenario(1)
    s.objects[0]["spec"]["pricePerGPUHour"] = {"onDemand": PRICE, "spot": 1.25}
    s.objects[0]["spec"]["capacityTypes"] = ["spot", "on-demand"]
    (node,) = s.nodes
    cluster.kubectl("label", "node", node, "karpenter.sh/capacity-type=spot")
    team = s.team("lender")
    s.apply()
    s.job("cheap", team, "elastic", 4, 1, run_for="3s")
    s.wait_states({"cheap": "Completed"}, 60)

    def recorded() -> list[Segment]:
        return [r for r in segments(controller.ledger, s.pool) if r.end is not None]

    cluster.wait_until(lambda: bool(recorded()), 60, "the ledger to record the run")
    (run,) = recorded()
    assert (run.capacity_type, run.price_per_gpu_hour) == ("spot", 1.25)
    runner = CliRunner()
    done = runner.invoke(app, ["cost", "--ledger", controller.ledger, "--by",
                               "pool,capacity-type", "-o", "json"])  # fmt: skip
    mine = [r for r in json.loads(done.stdout)["groups"] if r["pool"] == s.pool]
    assert [r["capacity-type"] for r in mine] == ["spot"]
    assert mine[0]["gpuCost"] == pytest.approx(mine[0]["gpuHours"] * 1.25, abs=0.01)
