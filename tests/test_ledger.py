"""The usage ledger: segments and intervals written idempotently, crash recovery, and cost and
usage figures checked against independent computations, on SQLite and on a real PostgreSQL."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from conftest import EXAMPLE
from typer.testing import CliRunner

from gpufleet.cli.main import app
from gpufleet.ledger.cost import Interval, Segment, report
from gpufleet.ledger.forecast import forecast
from gpufleet.ledger.reports import window_report
from gpufleet.ledger.store import Ledger, LedgerError, LiveWorkload, open_ledger
from gpufleet.lifecycle import LifecycleEvent, Transition
from gpufleet.model import validate_paths
from gpufleet.sim import synthetic
from gpufleet.sim.recorder import Recorder
from gpufleet.sim.simulator import simulate

T0 = datetime(2026, 12, 1, 8, 0, tzinfo=UTC)
PASSWORD = "s3cret-pa55word"


@pytest.fixture(params=["sqlite", "postgresql"])
def ledger(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Ledger]:
    if request.param == "sqlite":
        store = open_ledger(str(tmp_path / "ledger.db"))
    else:
        store = open_ledger(request.getfixturevalue("postgres"))
        with store.engine.begin() as conn:  # one server for the session: start each test empty
            for table in ("segments", "capacity", "reservations", "host_usage", "deliveries",
                          "alert_state"):  # fmt: skip
                conn.exec_driver_sql(f"DELETE FROM {table}")
    yield store
    store.close()


def event(
    transition: Transition, uid: str, minutes: float, gpus: float = 8, **extra: object
) -> LifecycleEvent:
    fields: dict[str, object] = {
        "team": "nlp",
        "workload_class": "elastic",
        "pool": "h100",
        "gpu_type": "H100",
        "nodes": 1,
        "price_per_gpu_hour": 4.0,
        **extra,
    }
    return LifecycleEvent(
        transition=transition,
        workload=f"ml/{uid}",
        uid=uid,
        at=T0 + timedelta(minutes=minutes),
        gpus=gpus,
        **fields,  # type: ignore[arg-type]
    )


def test_segments_are_recorded_once_however_often_events_repeat(ledger: Ledger) -> None:
    events = [
        event(Transition.ADMITTED, "a", 0),
        event(Transition.RUNNING, "a", 1),
        event(Transition.PREEMPTED, "a", 60, reason="ReservedWorkload", lost_gpu_seconds=3600),
        event(Transition.RESUMED, "a", 90),
        event(Transition.COMPLETED, "a", 150),
        event(Transition.ADMITTED, "b", 30, gpus=2, team="cv", workload_class="reserved"),
    ]
    ledger.apply(events)
    ledger.apply(events)  # a replay after a restart
    ledger.apply(events[:2])
    rows = ledger.segments(T0, T0 + timedelta(days=1))
    assert [(s.uid, s.start, s.end, s.outcome) for s in rows] == [
        ("a", T0, T0 + timedelta(minutes=60), "preempted"),
        ("b", T0 + timedelta(minutes=30), None, "running"),
        ("a", T0 + timedelta(minutes=90), T0 + timedelta(minutes=150), "completed"),
    ]
    assert rows[0].reason == "ReservedWorkload" and rows[0].lost_gpu_seconds == 3600


def test_reconcile_closes_and_opens_what_a_crash_left(ledger: Ledger) -> None:
    ledger.apply(
        [
            event(Transition.ADMITTED, "gone", 0),
            event(Transition.ADMITTED, "done", 0),
            event(Transition.ADMITTED, "kept", 0),
            event(Transition.ADMITTED, "readmitted", 0),
        ]
    )
    now = T0 + timedelta(hours=2)
    live = [
        LiveWorkload("done", "Completed", T0, T0 + timedelta(minutes=30), None),
        LiveWorkload("kept", "Running", T0, None, event(Transition.ADMITTED, "kept", 0)),
        LiveWorkload(
            "readmitted",
            "Running",
            T0 + timedelta(minutes=50),
            None,
            event(Transition.ADMITTED, "readmitted", 50),
        ),
        LiveWorkload(
            "new", "Queued", T0 + timedelta(minutes=70), None, event(Transition.ADMITTED, "new", 70)
        ),
    ]
    assert ledger.reconcile(live, now) == (3, 2)
    assert ledger.reconcile(live, now) == (0, 0)  # idempotent
    rows = {(s.uid, s.start): s for s in ledger.segments(T0, now)}
    assert rows[("gone", T0)].outcome == "cancelled" and rows[("gone", T0)].end == now
    assert rows[("done", T0)].end == T0 + timedelta(minutes=30)
    assert rows[("done", T0)].outcome == "completed"
    assert rows[("kept", T0)].end is None
    assert rows[("readmitted", T0)].end == T0 + timedelta(minutes=50)
    assert rows[("readmitted", T0 + timedelta(minutes=50))].end is None
    assert rows[("new", T0 + timedelta(minutes=70))].outcome == "running"


def test_clusters_of_a_fleet_share_a_ledger_each_keeping_to_its_own_rows(
    ledger: Ledger, tmp_path: Path
) -> None:
    """Two controllers of a fleet write one ledger: what each closes because its cluster no
    longer shows it is only its own, and the reports group and filter by cluster."""
    east, west = Ledger(ledger.engine, "east"), Ledger(ledger.engine, "west")
    east.apply([event(Transition.ADMITTED, "a", 0, pool="east-h100")])
    west.apply([event(Transition.ADMITTED, "b", 0, gpus=2, pool="west-h100")])
    east.observe_capacity("east-h100", "H100", 4.0, 64, 8, 0, T0)
    west.observe_capacity("west-h100", "H100", 4.0, 32, 2, 0, T0)
    now = T0 + timedelta(minutes=3)
    west.observe_capacity("west-h100", "H100", 4.0, 32, 2, 0, now)  # seen again
    # east shows no workload and no pool any more: west's run and pool stay open
    assert east.reconcile([], now) == (1, 0)
    east.close_intervals("capacity", [], now)
    rows = {s.uid: s for s in ledger.segments(T0, now)}
    assert (rows["a"].cluster, rows["a"].outcome, rows["a"].end) == ("east", "cancelled", now)
    assert (rows["b"].cluster, rows["b"].outcome, rows["b"].end) == ("west", "running", None)
    pools = {i.pool: (i.cluster, i.end) for i in ledger.capacity(T0, now)}
    assert pools == {"east-h100": ("east", now), "west-h100": ("west", now)}
    with ledger.engine.connect() as conn:  # west's pool is still open: only east's was closed
        still_open = conn.exec_driver_sql("SELECT pool FROM capacity WHERE ended_at IS NULL")
        assert [row[0] for row in still_open] == ["west-h100"]
    later = now + timedelta(minutes=1)
    both = window_report(ledger, T0.isoformat(), now.isoformat(), ["cluster"], False, "5m",
                         False, now=later)  # fmt: skip
    hours = {g["cluster"]: g["gpuHours"] for g in both["groups"]}
    assert hours == {"east": pytest.approx(8 * 3 / 60), "west": pytest.approx(2 * 3 / 60)}
    only_west = window_report(ledger, T0.isoformat(), now.isoformat(), ["team"], False, "5m",
                              False, now=later, cluster="west")  # fmt: skip
    assert only_west["totals"]["gpuHours"] == pytest.approx(2 * 3 / 60)
    assert only_west["cluster"] == "west"
    assert [(p["pool"], p["cluster"]) for p in only_west["pools"]] == [("west-h100", "west")]
    # a ledger of one cluster (no name) sees none of the fleet's rows as its own
    assert ledger.reconcile([], later) == (0, 0)


def test_capacity_intervals_change_beat_and_end_where_last_seen(ledger: Ledger) -> None:
    def seen(minutes: float, gpus: float) -> None:
        ledger.observe_capacity("h100", "H100", 4.0, gpus, 0, 0, T0 + timedelta(minutes=minutes))

    seen(0, 64)
    seen(0.5, 64)  # unchanged within the heartbeat: nothing written
    seen(2, 64)  # unchanged: seen at 2
    seen(3, 128)  # a change ends the first interval at 3
    seen(4, 128)
    seen(20, 128)  # nobody observed 4 -> 20 (a stopped controller): ends at 4, a new one at 20
    rows = ledger.capacity(T0, T0 + timedelta(hours=1))
    assert [(r.gpus, r.start, r.end) for r in rows] == [
        (64, T0, T0 + timedelta(minutes=3)),
        (128, T0 + timedelta(minutes=3), T0 + timedelta(minutes=4)),
        (128, T0 + timedelta(minutes=20), T0 + timedelta(minutes=20)),
    ]


def _segment(
    team: str,
    pool: str,
    gpus: float,
    start_h: float,
    end_h: float | None,
    outcome: str = "completed",
    price: float | None = 2.0,
    **extra: object,
) -> Segment:
    return Segment(
        uid=f"{team}-{start_h}",
        workload=f"{team}/{start_h}",
        namespace=team,
        team=team,
        workload_class=str(extra.pop("workload_class", "elastic")),
        pool=pool,
        gpu_type="H100",
        gpus=gpus,
        nodes=1,
        price_per_gpu_hour=price,
        start=T0 + timedelta(hours=start_h),
        end=None if end_h is None else T0 + timedelta(hours=end_h),
        outcome=outcome,
        **extra,  # type: ignore[arg-type]
    )


def test_report_costs_idle_waste_and_reservations() -> None:
    segments = [
        _segment("nlp", "p", 8, 0, 2, workload_class="reserved"),  # 16 GPU-h, $32
        _segment("nlp", "p", 4, 2, 3, "failed"),  # 4 GPU-h wasted
        _segment("cv", "p", 2, 1, 5),  # 8 GPU-h, clipped to 6 by --until 4 -> 6 GPU-h
        _segment("cv", "p", 8, 3, 3.05, "preempted"),  # short: all 0.4 GPU-h wasted
        _segment("cv", "p", 8, 0, 1, "preempted", lost_gpu_seconds=7200),  # 2 GPU-h lost
        _segment("cv", "p", 1, 3, None, "running"),  # runs until `now` = 3.5 h: 0.5 GPU-h
    ]
    pools = [Interval("p", "p", "H100", 16, T0, T0 + timedelta(hours=10), 2.0)]
    reserved = [
        Interval("nlp-p", "p", "", 8, T0, T0 + timedelta(hours=10), team="nlp"),
    ]
    until = T0 + timedelta(hours=4)
    now = T0 + timedelta(hours=3.5)
    out = report(segments, pools, reserved, T0, until, now, by=["team"], share_idle=True)
    rows = {r["team"]: r for r in out["groups"]}
    assert rows["nlp"]["gpuHours"] == 20 and rows["nlp"]["gpuCost"] == 40
    assert rows["nlp"]["wasteGPUHours"] == 4 and rows["nlp"]["efficiency"] == 0.8
    assert rows["cv"]["gpuHours"] == pytest.approx(6 + 0.4 + 8 + 0.5)
    assert rows["cv"]["wasteGPUHours"] == pytest.approx(0.4 + 2)
    capacity_cost = 16 * 4 * 2.0
    used_cost = (20 + 14.9) * 2.0
    assert out["totals"]["capacityCost"] == capacity_cost
    assert out["totals"]["idleCost"] == pytest.approx(capacity_cost - used_cost)
    # idle shared in proportion to use of the pool
    assert rows["nlp"]["idleCost"] == pytest.approx((capacity_cost - used_cost) * 20 / 34.9, 0.01)
    assert out["totals"]["unsharedIdleCost"] == pytest.approx(0, abs=0.02)
    assert out["reservations"] == [
        {
            "team": "nlp",
            "pool": "p",
            "reservedGPUHours": 32,
            "usedGPUHours": 16,
            "utilisation": 0.5,
        }
    ]


def test_forecast_projects_the_month_with_a_band() -> None:
    first = datetime(2026, 12, 1, tzinfo=UTC)
    # a pool of 10 GPUs at $1, 24 h a day for 3 days, then 20 GPUs on the 4th
    pools = [
        Interval("p", "p", "H100", 10, first, first + timedelta(days=3), 1.0),
        Interval("p", "p", "H100", 20, first + timedelta(days=3), first + timedelta(days=4), 1.0),
    ]
    now = first + timedelta(days=4)  # midnight of the 5th: 4 complete days
    out = forecast([], pools, now)
    spent = 240 * 3 + 480
    assert out["spentSoFar"] == spent and out["completeDays"] == 4
    assert out["dailyMean"] == 300
    assert out["forecast"] == pytest.approx(spent + 300 * 27)
    assert out["low"] < out["forecast"] < out["high"]
    # a ledger that started on the 3rd at noon: the 1st and 2nd are no $0 days, and the half
    # day of the 3rd is spent but no sample
    started = first + timedelta(days=2, hours=12)
    late = [Interval("p", "p", "H100", 10, started, now, 1.0)]
    out = forecast([], late, now, recorded_since=started)
    assert out["spentSoFar"] == 120 + 240 and out["completeDays"] == 1
    assert out["forecast"] == pytest.approx(360 + 240 * 27) and out["low"] is None
    out = forecast([], late, first + timedelta(days=3), recorded_since=started)
    assert out["completeDays"] == 0 and out["dailyMean"] == 240  # 120 in 12 h


def test_simulated_ledger_costs_what_the_simulator_measured(tmp_path: Path) -> None:
    """An independent check: the simulator's own accounting (its time-integrated allocation
    and cost) against the ledger written from its lifecycle events."""
    fleet, problems = validate_paths([EXAMPLE])
    assert not problems
    jobs = synthetic.generate(fleet, seed=7, hours=3)
    start = datetime(2026, 11, 2, tzinfo=UTC)
    recorder = Recorder(fleet, start)
    result = simulate(fleet, jobs, start=start, recorder=recorder)
    store = open_ledger(str(tmp_path / "sim.db"))
    store.write_recorded(recorder.events, recorder.capacity, recorder.reservations)
    store.write_recorded(recorder.events, recorder.capacity, recorder.reservations)  # no dupes
    first, last = store.span(datetime.now(UTC)) or (start, start)
    out = report(
        store.segments(first, last),
        store.capacity(first, last),
        store.reservations(first, last),
        first,
        last,
        datetime.now(UTC),
        by=["team"],
    )
    expected = result.metrics()["cost_usd"]
    assert out["totals"]["capacityCost"] == pytest.approx(expected["capacity"], abs=0.02)
    assert out["totals"]["gpuCost"] == pytest.approx(expected["allocated"], abs=0.02)
    assert out["totals"]["idleCost"] == pytest.approx(expected["idle"], abs=0.02)
    by_team: dict[str, float] = defaultdict(float)
    for team, gpu_s in result.team_gpu_s.items():
        by_team[team] += gpu_s / 3600
    for row in out["groups"]:
        assert row["gpuHours"] == pytest.approx(by_team[row["team"]], rel=1e-4)
    preempted = sum(j.preemptions for j in result.jobs)
    assert sum(r["outcomes"].get("preempted", 0) for r in out["groups"]) == preempted
    store.close()


def test_cli_cost_and_usage_read_a_simulated_ledger(tmp_path: Path) -> None:
    runner = CliRunner()
    db = tmp_path / "run.db"
    done = runner.invoke(
        app,
        [
            *("simulate", "--gitops", str(EXAMPLE), "--seed", "3", "--policy", "fifo"),
            *("--ledger", str(db), "-o", "json"),
        ],
    )
    assert done.exit_code == 0, done.output
    cost = runner.invoke(app, ["cost", "--ledger", str(db), "--by", "team", "-o", "json"])
    assert cost.exit_code == 0, cost.output
    data = json.loads(cost.stdout)
    assert data["groups"] and data["totals"]["capacityCost"] > data["totals"]["gpuCost"] > 0
    assert [r["rank"] for r in data["leaderboard"]] == list(range(1, len(data["groups"]) + 1))
    usage = runner.invoke(app, ["usage", "--ledger", str(db), "--by", "pool", "-o", "csv"])
    assert usage.exit_code == 0, usage.output
    header, *lines = usage.stdout.splitlines()
    assert header.startswith("pool,gpuHours,") and len(lines) == len(
        {r["pool"] for r in runner_json(runner, db, "pool")}
    )
    table = runner.invoke(app, ["cost", "--ledger", str(db), "--share-idle"])
    assert table.exit_code == 0 and "IDLE SHARE" in table.stdout


def runner_json(runner: CliRunner, db: Path, by: str) -> list[dict[str, object]]:
    done = runner.invoke(app, ["usage", "--ledger", str(db), "--by", by, "-o", "json"])
    groups: list[dict[str, object]] = json.loads(done.stdout)["groups"]
    return groups


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["cost", "--ledger", "/nonexistent/x.db"], "no ledger at /nonexistent/x.db"),
        (["cost"], "no ledger: give --ledger"),
        (["usage", "--ledger", "LEDGER", "--by", "colour"], "--by colour: not a grouping"),
        (["cost", "--ledger", "LEDGER", "--since", "yesterday"], "--since 'yesterday'"),
        (["cost", "--ledger", "mysql+nodriver://x/y"], "cannot use ledger"),
        (["cost", "events"], "no ledger: give --ledger"),
        (["cost", "events", "--ledger", "LEDGER", "--until", "soon"], "--until 'soon'"),
    ],
)
def test_cli_bad_input_is_a_clear_error(tmp_path: Path, args: list[str], message: str) -> None:
    open_ledger(str(tmp_path / "l.db")).close()
    args = [str(tmp_path / "l.db") if a == "LEDGER" else a for a in args]
    done = CliRunner().invoke(app, args, env={"GPUFLEET_LEDGER": ""})
    assert done.exit_code == 1, done.output
    assert message in done.output and "Traceback" not in done.output


def test_a_database_outage_queues_writes_and_catches_up(caplog: pytest.LogCaptureFixture) -> None:
    """The controller's ledger writer while PostgreSQL is down: publishing never blocks, the
    backlog and failures show in the metrics, no log line holds the database's password, and
    everything is written once it is back."""
    from conftest import skip_unless_ci

    from gpufleet.controllers import ledger as sink_module
    from gpufleet.controllers import metrics
    from gpufleet.testing.postgres import PostgresServer, server_bin

    bin_dir = server_bin()
    if bin_dir is None:
        skip_unless_ci("PostgreSQL server not found: apt-get install postgresql (make test does)")
    server = PostgresServer(bin_dir)  # not started yet: the database is down
    # trust authentication ignores the password; the URL carries one as a real one would
    url = server.url.replace("://gpufleet@", f"://gpufleet:{PASSWORD}@")
    assert PASSWORD in url
    stop = threading.Event()
    sink = sink_module.LedgerSink(url, stop, max_backoff=0.5).start()

    def sample(name: str) -> float:
        return metrics.REGISTRY.get_sample_value(name) or 0.0

    failures_before = sample("gpufleet_ledger_write_failures_total")
    caplog.set_level(logging.WARNING, logger="gpufleet.ledger")
    try:
        sink.publish([event(Transition.ADMITTED, "a", 0), event(Transition.COMPLETED, "a", 30)])
        sink.publish([event(Transition.ADMITTED, "b", 10)])
        # both calls returned while the database is down: handed over, not written
        assert sink.writes.unfinished_tasks == 2
        deadline = time.monotonic() + 30
        while sample("gpufleet_ledger_write_failures_total") < failures_before + 2:
            assert time.monotonic() < deadline, "no failed write while the database was down"
            time.sleep(0.1)
        assert sample("gpufleet_ledger_backlog") >= 1
        logged = "\n".join(r.getMessage() for r in caplog.records)
        assert "ledger write failed" in logged and PASSWORD not in logged
        server.start()
        assert sink.drain(30), "the backlog did not drain once the database was back"
        assert sample("gpufleet_ledger_backlog") == 0
        store = open_ledger(server.url)
        rows = store.segments(T0, T0 + timedelta(hours=1))
        store.close()
        assert [(r.uid, r.outcome) for r in rows] == [("a", "completed"), ("b", "running")]
    finally:
        stop.set()
        server.cleanup()


def test_a_long_outage_is_bounded_and_reconciled_after(tmp_path: Path) -> None:
    """The backlog stops at its bound while the database is unreachable: writes past it are
    dropped and counted, observations wait past half full, and once a write goes through the
    controller reconciles the ledger with the cluster."""
    from gpufleet.controllers import ledger as sink_module
    from gpufleet.controllers import metrics

    target = tmp_path / "not-yet" / "ledger.db"  # its folder is missing: every open fails
    stop = threading.Event()
    sink = sink_module.LedgerSink(str(target), stop, max_backoff=0.2, max_backlog=4).start()
    dropped_before = metrics.REGISTRY.get_sample_value("gpufleet_ledger_writes_dropped_total")
    try:
        sink.reconcile(  # the start's reconciliation, as the loop's first cycle asks
            [], datetime(2026, 11, 2, tzinfo=UTC)
        )
        assert not sink.reconcile_due()
        for i in range(10):
            sink.publish([event(Transition.ADMITTED, f"w{i}", i)])
        assert sink.writes.qsize() <= 4 and sink.congested()
        dropped = metrics.REGISTRY.get_sample_value("gpufleet_ledger_writes_dropped_total")
        assert dropped is not None and dropped - (dropped_before or 0) >= 6
        target.parent.mkdir()
        assert sink.drain(30), "the backlog did not drain once the database was reachable"
        assert sink.reconcile_due(), "no reconciliation asked for after dropped writes"
        store = open_ledger(str(target))
        uids = {r.uid for r in store.segments(T0, T0 + timedelta(hours=1))}
        store.close()
        assert uids and uids < {f"w{i}" for i in range(10)}  # kept what fitted, no more
    finally:
        stop.set()


def test_ledger_errors_never_show_the_password() -> None:
    for target in (
        f"postgresql+nodriver://gpufleet:{PASSWORD}@db.internal/x",
        f"postgresql+psycopg://gpufleet:{PASSWORD}@127.0.0.1:1/x",  # nothing listens
    ):
        with pytest.raises(LedgerError) as err:
            open_ledger(target)
        assert PASSWORD not in str(err.value) and "gpufleet:***@" in str(err.value)


def test_an_autoscaled_simulation_records_the_capacity_it_paid_for() -> None:
    """With autoscaled pools, the capacity intervals follow the nodes the simulated
    autoscaler had, and cost what the simulator says they cost."""
    fleet, problems = validate_paths([EXAMPLE])
    assert not problems
    jobs = synthetic.generate(fleet, seed=5, hours=3)
    start = datetime(2026, 11, 2, tzinfo=UTC)
    recorder = Recorder(fleet, start)
    result = simulate(fleet, jobs, start=start, recorder=recorder, provisioning_delay_s=120.0)
    assert len(recorder.capacity) > len(fleet.pools)  # pools grew and shrank
    end = max(i.end for i in recorder.capacity if i.end is not None)
    out = report([], recorder.capacity, [], start, end, end)
    expected = result.metrics()["cost_usd"]["capacity"]
    assert out["totals"]["capacityCost"] == pytest.approx(expected, abs=0.02)


def test_hosts_gpu_hours_are_recorded_as_they_grow_and_summed_over_a_window(
    ledger: Ledger,
) -> None:
    """A GPUHost's totals (status.usage, added up by the server from its agent's reports)
    become rows of what they grew by; a window sums them by host and workload, and the
    totals recorded are where a restarted controller goes on from."""
    from gpufleet.ledger.hosts import grown
    from gpufleet.ledger.reports import window_report

    def host(gpu: float, idle: float, sft: float) -> dict[str, object]:
        return {"metadata": {"name": "vm-1"}, "status": {"usage": [
            {"gpuHours": gpu, "idleGPUHours": idle},
            {"workload": "sft", "gpuHours": sft, "idleGPUHours": 0},
        ]}}  # fmt: skip

    rows, seen = grown([host(2.0, 0.5, 1.0)], ledger.host_usage_totals(), T0)
    ledger.record_host_usage(rows)
    rows, seen = grown([host(3.0, 0.5, 1.5)], seen, T0 + timedelta(hours=1))
    assert [(r.workload, r.gpu_hours, r.idle_gpu_hours) for r in rows] == [
        (None, 1.0, 0.0), ("sft", 0.5, 0.0),
    ]  # fmt: skip
    ledger.record_host_usage(rows)
    assert (
        ledger.host_usage_totals()
        == seen
        == {("vm-1", None): (3.0, 0.5), ("vm-1", "sft"): (1.5, 0.0)}
    )
    # unchanged: nothing recorded; made again from zero (deleted, re-registered): counted anew
    assert grown([host(3.0, 0.5, 1.5)], seen, T0)[0] == []
    again, _ = grown([host(0.25, 0.0, 0.0)], seen, T0)
    assert [(r.workload, r.gpu_hours) for r in again] == [(None, 0.25)]
    report = window_report(ledger, (T0 + timedelta(minutes=30)).isoformat(),
                           (T0 + timedelta(hours=2)).isoformat(), ["pool"], False, "5m",
                           with_forecast=False)  # fmt: skip
    assert report["hosts"] == [
        {"host": "vm-1", "gpuHours": 1.0, "idleGPUHours": 0.0},
        {"host": "vm-1", "workload": "sft", "gpuHours": 0.5, "idleGPUHours": 0.0},
    ]
    # by default a report covers all the ledger holds, its last host row included
    everything = window_report(ledger, None, None, ["pool"], False, "5m", with_forecast=False)
    assert everything["hosts"] == [
        {"host": "vm-1", "gpuHours": 3.0, "idleGPUHours": 0.5},
        {"host": "vm-1", "workload": "sft", "gpuHours": 1.5, "idleGPUHours": 0.0},
    ]


def test_cost_by_user_and_the_cost_events_of_each_run(ledger: Ledger, tmp_path: Path) -> None:
    """The submitter of each run (the GPUWorkload's spec.submitter) is in the ledger: cost
    groups by user, and `cost events` lists each run with its cost and its waste's reason, in
    the API's JSON and as CSV."""
    from gpufleet.ledger.reports import window_events, window_report

    ledger.apply([
        event(Transition.ADMITTED, "a", 0, submitter="alice"),
        event(Transition.COMPLETED, "a", 60, submitter="alice"),
        event(Transition.ADMITTED, "b", 0, gpus=2, submitter="bob"),
        event(Transition.FAILED, "b", 30, gpus=2, submitter="bob"),
        event(Transition.ADMITTED, "c", 0, gpus=1),  # of before the submitter was recorded
        event(Transition.PREEMPTED, "c", 2, gpus=1),
    ])  # fmt: skip
    until = (T0 + timedelta(hours=2)).isoformat()
    by_user = window_report(ledger, T0.isoformat(), until, ["user"], False, "5m", False)
    costs = {g["user"]: g["gpuCost"] for g in by_user["groups"]}
    assert costs == {"alice": 32.0, "bob": 4.0, "(none)": 0.13}  # 1 GPU, 2 min
    events = window_events(ledger, T0.isoformat(), until, "5m")
    rows = {r["workload"]: r for r in events["items"]}
    assert rows["ml/a"]["user"] == "alice" and rows["ml/a"]["cost"] == 32.0
    assert rows["ml/a"]["wasteReason"] is None and rows["ml/a"]["outcome"] == "completed"
    assert (
        rows["ml/b"]["wasteCost"] == 4.0 and rows["ml/b"]["wasteReason"] == "failed: all of the run"
    )
    assert rows["ml/c"]["wasteReason"] == "preempted after less than 5 minutes"
    assert events["totals"]["runs"] == 3
    assert events["totals"]["cost"] == pytest.approx(sum(costs.values()), abs=0.01)
    only_bob = window_events(ledger, T0.isoformat(), until, "5m", user="bob")
    assert [r["workload"] for r in only_bob["items"]] == ["ml/b"]
    if ledger.url.startswith("sqlite"):  # the CLI on the same file
        url = ledger.url.removeprefix("sqlite:///")
        done = CliRunner().invoke(app, ["cost", "events", "--ledger", url, "--since",
                                        T0.isoformat(), "--until", until, "-o", "csv"])  # fmt: skip
        assert done.exit_code == 0, done.output
        header, *lines = done.stdout.splitlines()
        assert header.startswith("workload,team,user,") and len(lines) == 3
        table = CliRunner().invoke(app, ["cost", "events", "--ledger", url, "--since",
                                         T0.isoformat(), "--until", until])  # fmt: skip
        assert "failed: all of the run" in table.stdout and "3 runs" in table.stdout


def test_a_run_costs_its_nodes_capacity_type_rate(ledger: Ledger) -> None:
    """Spot, on-demand and reserved nodes of one pool are priced at the pool's rate for each
    (the nodes' karpenter.sh/capacity-type); a node not labelled falls back to the pool's
    price. The ledger keeps each run's capacity type, and reports group by it."""
    from gpufleet.lifecycle import CAPACITY_TYPE_LABEL, pool_facts

    fleet, problems = validate_paths([EXAMPLE])
    assert not problems
    pool = next(n for n, p in fleet.pools.items() if "spot" in p.spec.capacity_types)
    prices = fleet.pools[pool].spec.price_per_gpu_hour
    assert prices is not None and prices.spot is not None and prices.on_demand is not None

    def node(name: str, kind: str | None) -> dict[str, object]:
        return {"metadata": {"name": name, "labels": {CAPACITY_TYPE_LABEL: kind} if kind else {}}}

    facts = pool_facts(fleet, [node("a", "spot"), node("b", "on-demand"), node("c", None)])[pool]
    assert facts.rate(["a"]) == (prices.spot, "spot")
    assert facts.rate(["b"]) == (prices.on_demand, "on-demand")
    assert facts.rate(["a", "b"]) == ((prices.spot + prices.on_demand) / 2, "mixed")
    assert facts.rate(["a", "c"]) == (facts.price_per_gpu_hour, None)  # one not known
    assert facts.rate([]) == (facts.price_per_gpu_hour, None)

    spot = facts.rate(["a"])
    ledger.apply(
        [
            event(Transition.ADMITTED, "s", 0, price_per_gpu_hour=spot[0], capacity_type=spot[1]),
            event(
                Transition.ADMITTED,
                "o",
                0,
                price_per_gpu_hour=prices.on_demand,
                capacity_type="on-demand",
            ),
            event(Transition.COMPLETED, "s", 60),
            event(Transition.COMPLETED, "o", 60),
        ]
    )
    rows = report(
        ledger.segments(T0, T0 + timedelta(hours=2)),
        [],
        [],
        T0,
        T0 + timedelta(hours=2),
        T0 + timedelta(hours=2),
        by=["capacity-type"],
    )["groups"]
    costs = {r["capacity-type"]: r["gpuCost"] for r in rows}
    assert costs == {"spot": round(8 * prices.spot, 2), "on-demand": round(8 * prices.on_demand, 2)}


def test_the_delivery_log_and_the_alerts_memory_on_each_database(ledger: Ledger) -> None:
    """SQLite and PostgreSQL keep the delivery log (newest first, filtered) and what the
    alerts remember (one row per name and cluster, replaced), each writer its own."""
    row = {"happened_at": T0, "route": "ops", "kind": "preempted", "dedup_key": "preempted:ml/a",
           "team": "nlp", "severity": "warning", "title": "ml/a preempted", "attempts": 1,
           "error": None}  # fmt: skip
    ledger.record_delivery({**row, "at": T0, "outcome": "sent"})
    ledger.record_delivery({**row, "at": T0 + timedelta(minutes=1), "outcome": "failed",
                            "attempts": 5, "error": "HTTP 500"})  # fmt: skip
    log = ledger.deliveries(T0, T0 + timedelta(hours=1))
    assert [(r["outcome"], r["attempts"]) for r in log] == [("failed", 5), ("sent", 1)]
    assert ledger.deliveries(T0, T0 + timedelta(hours=1), outcome="sent")[0]["at"] == T0
    assert ledger.delivered(T0 - timedelta(hours=1)) == [("ops", "preempted:ml/a", T0)]
    ledger.save_alert_state("capacity", {"full": ["h100"]}, T0)
    ledger.save_alert_state("capacity", {"full": []}, T0 + timedelta(minutes=1))  # replaced
    assert ledger.alert_state("capacity") == {"full": []}
    other = Ledger(ledger.engine, cluster="eu")  # another cluster's controller
    assert other.alert_state("capacity") is None and other.delivered(T0) == []
