"""Forecasts to any date, GPU-hour budgets and their alerts, recommendations: the pure figures
checked against sums worked out by hand, and the CLI on a simulated ledger."""

from __future__ import annotations

import csv
import io
import json
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from conftest import EXAMPLE
from engine_helpers import gitops
from typer.testing import CliRunner

from gpufleet.cli.main import app
from gpufleet.ledger.budgets import budgets
from gpufleet.ledger.cost import Interval, Segment
from gpufleet.ledger.forecast import TREND_MIN_DAYS, forecast_until, project
from gpufleet.ledger.recommendations import Waiting, recommendations
from gpufleet.ledger.store import open_ledger
from gpufleet.model import validate_paths
from gpufleet.model.fleet import fleet_from_objects
from gpufleet.notify.alerts import BudgetWatch

NOW = datetime(2026, 12, 15, 12, tzinfo=UTC)


def run(team: str, start: datetime, hours: float, gpus: float = 8, **extra: Any) -> Segment:
    fields: dict[str, Any] = {
        "uid": f"{team}-{start.isoformat()}-{hours}",
        "workload": f"ml/{team}",
        "namespace": "ml",
        "team": team,
        "workload_class": "elastic",
        "pool": "h100",
        "gpu_type": "H100",
        "gpus": gpus,
        "nodes": 1,
        "price_per_gpu_hour": 2.0,
        "start": start,
        "end": start + timedelta(hours=hours),
        "outcome": "completed",
        **extra,
    }
    return Segment(**fields)


def test_a_trend_is_projected_and_its_band_widens_with_less_data() -> None:
    daily = [100 + 10 * t for t in range(14)]  # a clean line: the band is the line's own
    ahead = project(daily, 7, 0.0)
    assert ahead["method"] == "trend" and ahead["trendPerDay"] == 10
    expected = sum(100 + 10 * (14 + k + 0.5) for k in range(7))
    assert ahead["projected"] == pytest.approx(expected)
    assert ahead["low"] == ahead["high"] == ahead["projected"]  # no spread around the line
    noisy = [y + (15 if t % 2 else -15) for t, y in enumerate(daily)]
    wide = project(noisy, 7, 0.0)
    assert wide["low"] < wide["projected"] < wide["high"]
    assert project(noisy, 30, 0.0)["high"] - project(noisy, 30, 0.0)["projected"] > (
        wide["high"] - wide["projected"]  # further ahead: wider
    )
    few = project(noisy[: TREND_MIN_DAYS - 1], 7, 0.0)
    assert few["method"] == "mean" and few["trendPerDay"] is None
    assert few["projected"] == pytest.approx(7 * sum(noisy[:6]) / 6)
    guess = project([], 2.5, 48.0)  # no complete day: the rate so far, no band
    assert (guess["method"], guess["projected"], guess["low"]) == ("rate", 120.0, None)


def test_a_forecast_to_a_date_per_team_says_what_it_rests_on() -> None:
    since = (NOW - timedelta(days=20)).replace(hour=0)  # 20 whole days before today
    segments = [run("nlp", since + timedelta(days=d), 24, gpus=4) for d in range(20)]
    segments += [run("cv", NOW - timedelta(days=3) + timedelta(days=d), 12) for d in range(3)]
    data = forecast_until(segments, [], NOW, NOW + timedelta(days=10), since, by="team")
    assert data["basis"]["completeDays"] == 20 and "trend over 20" in data["basis"]["note"]
    rows = {r["team"]: r for r in data["groups"]}
    assert rows["nlp"]["projected"] == pytest.approx(10 * 4 * 24 * 2.0)  # flat: $192 a day
    assert rows["nlp"]["trendPerDay"] == 0
    assert data["totals"]["projected"] > rows["nlp"]["projected"]  # cv adds to it
    short = forecast_until(segments, [], NOW, NOW + timedelta(days=1), NOW - timedelta(hours=5))
    assert short["totals"]["method"] == "rate" and "rough guess" in short["basis"]["note"]
    with pytest.raises(ValueError, match="a year ahead at most"):
        forecast_until(segments, [], NOW, NOW + timedelta(days=400), since)
    with pytest.raises(ValueError, match="not after now"):
        forecast_until(segments, [], NOW, NOW - timedelta(days=1), since)
    with pytest.raises(ValueError, match="team or gpu-type"):
        forecast_until(segments, [], NOW, NOW + timedelta(days=1), since, by="pool")


def budget_fleet(**budget: Any) -> Any:
    objects = gitops({"h100": {}}, {"ml": {"budget": budget}, "nlp": {"parent": "ml"}})
    loaded = fleet_from_objects(objects)
    assert not loaded.problems, loaded.problems
    return loaded.fleet


def test_a_budget_counts_sub_teams_and_alerts_once_per_threshold() -> None:
    fleet = budget_fleet(gpuHoursPerMonth=4000, alertAtPercent=[50, 80, 100])
    first = NOW.replace(day=1, hour=0)
    # nlp (a sub-team of ml) ran 8 GPUs around the clock since the 1st: 14.5 days, 2784 h
    segments = [run("nlp", first, (NOW - first).total_seconds() / 3600)]
    (row,) = budgets(fleet, segments, NOW, first)
    assert row["team"] == "ml" and row["teams"] == ["ml", "nlp"]
    assert row["usedGPUHours"] == pytest.approx(14.5 * 24 * 8)
    assert row["crossed"] == [50] and row["state"] == "warning"
    assert row["forecastGPUHours"] == pytest.approx(31 * 24 * 8, rel=0.01)  # a flat pace
    # 4000 GPU-hours at 192 a day: run out 6.33 days after the 15th at noon
    assert row["runsOutAt"].startswith("2026-12-21")
    watch = BudgetWatch()
    (note,) = watch.check([row], NOW)
    assert note.kind == "budget-threshold" and note.team == "ml" and note.severity == "warning"
    assert "50%" in note.fields["threshold"]
    assert watch.check([row], NOW + timedelta(minutes=5)) == []  # told once
    later = {**row, "crossed": [50, 80, 100], "usedPercent": 101.0}
    restored = BudgetWatch()
    restored.restore(json.loads(json.dumps(watch.state())))  # a restart in between
    (over,) = restored.check([later], NOW + timedelta(days=7))
    assert over.fields["threshold"] == "100%" and over.severity == "critical"  # the highest
    assert restored.check([later], NOW + timedelta(days=7)) == []


def test_budget_alerts_are_read_from_the_ledger_by_the_controller(tmp_path: Path) -> None:
    """The controller's Alerts read the budgets in the ledger's thread and tell the
    threshold at the next cycle."""
    from gpufleet.controllers.ledger import LedgerSink
    from gpufleet.controllers.notifications import Dispatcher
    from gpufleet.controllers.subscribers import Alerts, CycleOutcome
    from gpufleet.lifecycle import LifecycleEvent, Transition

    fleet = budget_fleet(gpuHoursPerMonth=100)
    stop = threading.Event()
    sink = LedgerSink(str(tmp_path / "ledger.db"), stop).start()
    told: list[Any] = []
    sender = Dispatcher(lambda ref: "", stop)
    sender.notify = told.extend  # type: ignore[method-assign,assignment]
    alerts = Alerts(sender, sink)
    admitted = LifecycleEvent(transition=Transition.ADMITTED, workload="ml/big", uid="big",
                              at=NOW - timedelta(hours=20), team="nlp",
                              workload_class="elastic", gpus=8)  # fmt: skip
    sink.publish([admitted])
    outcome: Any = CycleOutcome  # the cycle's engine input and decisions are not read here
    try:
        for minute in range(4):  # restore, read the budgets, tell, nothing more
            alerts(outcome(NOW + timedelta(minutes=minute), fleet, {}, None, None, [], {}, [], []))
            assert sink.drain(10)
    finally:
        stop.set()
    kinds = [n.kind for n in told]
    assert kinds == ["budget-threshold"], kinds
    assert told[0].fields["threshold"] == "100%"
    assert float(told[0].fields["used GPU-hours"]) == pytest.approx(160, abs=0.5)  # 8 × 20 h


def test_recommendations_carry_their_figures() -> None:
    fleet, problems = validate_paths([EXAMPLE])
    assert not problems
    spot_pool = next(n for n, p in fleet.pools.items() if "spot" in p.spec.capacity_types)
    prices = fleet.pools[spot_pool].spec.price_per_gpu_hour
    assert prices is not None and prices.on_demand is not None and prices.spot is not None
    since, until = NOW - timedelta(days=7), NOW
    segments = [
        run("nlp", since, 10, pool=spot_pool, capacity_type="on-demand"),
        run("nlp", since, 10, pool=spot_pool, capacity_type="spot"),  # on spot already
        run(
            "nlp", since, 10, pool=spot_pool, workload_class="reserved", capacity_type="on-demand"
        ),  # reserved work stays where it is
    ]
    segments += [run("cv", since + timedelta(hours=h), 1, outcome="failed") for h in range(2)]
    segments += [run("cv", since + timedelta(hours=h), 1) for h in range(2, 6)]
    reserved = [Interval("cv-h100", "h100", "H100", 16, since - timedelta(days=1), None,
                         team="cv")]  # fmt: skip
    segments.append(run("cv", since, 24, gpus=8, workload_class="reserved"))
    waiting = [Waiting("ml/wide", "nlp", 8, 2, 3600, ("h100",))]
    free = {"h100": {"n1": 4.0, "n2": 4.0, "n3": 4.0, "n4": 6.0}}
    found = recommendations(fleet, segments, reserved, since, until, waiting, free)
    by_kind = {r["kind"]: r for r in found}
    assert set(by_kind) == {"elastic-on-spot", "failing-team", "idle-reservation",
                            "fragmented-pool"}  # fmt: skip
    spot = by_kind["elastic-on-spot"]
    assert spot["figures"]["elasticOnDemandGPUHours"] == 80
    assert spot["saving"] == pytest.approx(80 * (prices.on_demand - prices.spot))
    failing = by_kind["failing-team"]["figures"]
    assert (failing["finishedRuns"], failing["failedRuns"]) == (7, 2)  # 2 of 7: 29 %
    idle = by_kind["idle-reservation"]["figures"]
    assert idle["meanUsedGPUs"] == pytest.approx(8 * 24 / (7 * 24), abs=0.01)
    assert idle["suggestedGPUs"] == 2
    assert by_kind["fragmented-pool"]["figures"]["podsThatFit"] == 0
    # a healthy fleet: nothing to say
    healthy = [s for s in segments if s.outcome != "failed" and s.capacity_type != "on-demand"]
    assert recommendations(fleet, healthy, [], since, until, waiting, {"h100": {"n": 16}}) == []


def test_the_cli_forecasts_budgets_recommends_and_logs(tmp_path: Path) -> None:
    runner = CliRunner()
    db = tmp_path / "run.db"
    done = runner.invoke(app, ["simulate", "--gitops", str(EXAMPLE), "--seed", "3",
                               "--ledger", str(db), "-o", "json"])  # fmt: skip
    assert done.exit_code == 0, done.output
    until = (datetime.now(UTC) + timedelta(days=30)).date().isoformat()
    forecast = runner.invoke(app, ["cost", "forecast", "--ledger", str(db), "--until", until,
                                   "--by", "team", "-o", "json"])  # fmt: skip
    assert forecast.exit_code == 0, forecast.output
    data = json.loads(forecast.stdout)
    assert data["groups"] and data["totals"]["projected"] > 0
    assert "rough guess" in data["basis"]["note"]  # six hours of a simulation
    table = runner.invoke(app, ["cost", "forecast", "--ledger", str(db), "--until", until])
    assert table.exit_code == 0 and "rests on" in table.stdout
    far = runner.invoke(app, ["cost", "forecast", "--ledger", str(db), "--until", "2099-01-01"])
    assert far.exit_code == 1 and "a year ahead at most" in far.output
    cost = runner.invoke(app, ["cost", "--ledger", str(db), "--by", "user,cluster", "-o", "json"])
    assert cost.exit_code == 0 and json.loads(cost.stdout)["by"] == ["user", "cluster"]

    fleet_dir = tmp_path / "fleet"
    fleet_dir.mkdir()
    for path in EXAMPLE.glob("*.yaml"):
        text = path.read_text()
        if path.name == "teams.yaml":
            text = text.replace("spec:\n", "spec:\n  budget: {gpuHoursPerMonth: 50}\n")
        (fleet_dir / path.name).write_text(text)
    shown = runner.invoke(app, ["budgets", "-g", str(fleet_dir), "--ledger", str(db), "-o", "csv"])
    assert shown.exit_code == 0, shown.output
    rows = list(csv.DictReader(io.StringIO(shown.stdout)))
    assert rows and all(r["budgetGPUHours"] == "50.0" for r in rows), shown.stdout
    research = next(r for r in rows if r["team"] == "research")  # nlp's and vision's too
    assert research["teams"] == "nlp research vision" and float(research["usedGPUHours"]) > 0
    recs = runner.invoke(app, ["recommendations", "--ledger", str(db), "-g", str(EXAMPLE),
                               "--since", "30d", "-o", "json"])  # fmt: skip
    assert recs.exit_code == 0, recs.output
    assert {"window", "items"} <= set(json.loads(recs.stdout))

    store = open_ledger(str(db))
    store.record_delivery({"at": datetime.now(UTC), "happened_at": datetime.now(UTC),
                           "route": "ops", "kind": "preempted", "dedup_key": "k", "team": "nlp",
                           "severity": "warning", "title": "ml/x preempted", "outcome": "failed",
                           "attempts": 5, "error": "HTTP 500 from the receiver"})  # fmt: skip
    store.close()
    log = runner.invoke(app, ["notify", "log", "--ledger", str(db), "--outcome", "failed"])
    assert log.exit_code == 0 and "HTTP 500 from the receiver" in log.stdout
    none = runner.invoke(app, ["notify", "log", "--ledger", str(db), "--route", "other",
                               "-o", "json"])  # fmt: skip
    assert json.loads(none.stdout)["items"] == []


def test_the_daily_series_adds_up_to_the_report() -> None:
    """The trend charts' points: each day's work and capacity, summing to the window's."""
    from gpufleet.ledger.cost import daily_series, report

    since = NOW - timedelta(days=3, hours=5)
    segments = [run("nlp", since + timedelta(hours=h), 30, gpus=2) for h in range(0, 70, 9)]
    segments.append(run("cv", NOW - timedelta(hours=30), 40, end=None, outcome="running"))
    capacity = [Interval("h100", "h100", "H100", 16, since - timedelta(days=1), None, 3.0)]
    days = daily_series(segments, capacity, since, NOW, NOW)
    totals = report(segments, capacity, [], since, NOW, NOW)["totals"]
    assert [d["day"] for d in days] == ["2026-12-12", "2026-12-13", "2026-12-14", "2026-12-15"]
    assert sum(d["gpuHours"] for d in days) == pytest.approx(totals["gpuHours"], abs=1e-3)
    assert sum(d["gpuCost"] for d in days) == pytest.approx(totals["gpuCost"], abs=0.05)
    assert sum(d["capacityCost"] for d in days) == pytest.approx(totals["capacityCost"], abs=0.05)
    assert days[-1]["capacityGPUHours"] == 12 * 16  # today until noon
    assert all(0 <= d["allocation"] <= 1 for d in days)


def test_on_the_demo_simulation_used_and_idle_cost_add_up_to_capacity(tmp_path: Path) -> None:
    runner = CliRunner()
    db = tmp_path / "demo.db"
    done = runner.invoke(app, ["simulate", "--gitops", str(EXAMPLE), "--trace",
                               str(EXAMPLE.parent / "traces" / "demo.csv"), "--ledger", str(db),
                               "-o", "json"])  # fmt: skip
    assert done.exit_code == 0, done.output
    cost = runner.invoke(app, ["cost", "--ledger", str(db), "--by", "pool", "-o", "json"])
    totals = json.loads(cost.stdout)["totals"]
    assert totals["capacityCost"] > totals["gpuCost"] > 0
    # each of the three is rounded to the cent: together they may be 1.5 cents apart
    assert abs(totals["gpuCost"] + totals["idleCost"] - totals["capacityCost"]) <= 0.015


def test_in_a_fleet_one_worker_tells_the_budgets() -> None:
    """A budget counts every cluster's work in the shared ledger: the worker of the first
    declared cluster tells it, the others do not."""
    from gpufleet.controllers.subscribers import tells_budgets

    objects = gitops({"h100": {}}, {"ml": {"budget": {"gpuHoursPerMonth": 10}}})
    for name in ("us", "eu"):
        secret = {"name": name, "key": "kubeconfig"}
        objects.append({"apiVersion": "gpufleet.io/v1alpha1", "kind": "Cluster",
                        "metadata": {"name": name},
                        "spec": {"kubeconfigSecretRef": secret}})  # fmt: skip
    objects[0]["spec"]["cluster"] = "eu"
    loaded = fleet_from_objects(objects)
    assert not loaded.problems, loaded.problems
    assert tells_budgets(loaded.fleet.for_cluster("eu"))  # "eu" sorts first
    assert not tells_budgets(loaded.fleet.for_cluster("us"))
    assert tells_budgets(budget_fleet(gpuHoursPerMonth=10))  # a cluster of one
