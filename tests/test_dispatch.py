"""The hub's choice of cluster (engine/dispatch.py) on hand-built snapshots of two clusters."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from gpufleet.engine.dispatch import Candidate, dispatch
from gpufleet.engine.types import (
    Node,
    Policy,
    PoolInfo,
    Snapshot,
    TeamInfo,
    Workload,
    WorkloadClass,
)
from gpufleet.model.states import WorkloadState

NOW = datetime(2026, 12, 1, tzinfo=UTC)
TEAMS = {t: TeamInfo(t, None, 1, None) for t in ("nlp", "vision")}


def cluster(
    pool: str,
    nodes: int,
    reservations: dict[tuple[str, str], int] | None = None,
    running: tuple[Workload, ...] = (),
) -> Snapshot:
    return Snapshot(
        NOW,
        {pool: PoolInfo(pool, "H100", 8, nodes * 8, autoscaling=False)},
        TEAMS,
        reservations or {},
        Policy(min_runtime=timedelta(0)),
        tuple(Node(f"{pool}-{i}", pool, 8) for i in range(nodes)),
        running,
    )


def job(
    name: str, team: str = "nlp", cls: str = "elastic", gpus: int = 8, **kw: object
) -> Workload:
    return Workload(
        name,
        team,
        WorkloadClass(cls),
        gpus,
        NOW - timedelta(seconds=len(name)),
        **kw,  # type: ignore[arg-type]
    )


def running(name: str, team: str, node: str, cls: str = "elastic") -> Workload:
    return job(
        name,
        team,
        cls,
        state=WorkloadState.RUNNING,
        nodes=(node,),
        started_at=NOW - timedelta(hours=1),
    )


def test_a_burst_is_spread_over_the_clusters_that_have_room() -> None:
    clusters = {"east": cluster("e", 2), "west": cluster("w", 2)}
    jobs = [Candidate(job(f"j{i}")) for i in range(5)]
    result = dispatch(clusters, jobs)
    sent = sorted(result.sent.values())
    assert sent == ["east", "east", "west", "west"]
    (waiting,) = result.waiting
    assert "no cluster admits it now" in result.waiting[waiting]
    assert "east PoolFull" in result.waiting[waiting]


def test_reserved_work_goes_where_its_team_has_a_reservation_and_reclaims_it() -> None:
    # west is full of vision's elastic work, on nlp's reservation; east is empty but nlp has
    # no reservation there: nlp's reserved job goes west (preempting), never east
    west = cluster("w", 1, {("nlp", "w"): 8}, (running("borrower", "vision", "w-0"),))
    clusters = {"east": cluster("e", 1), "west": west}
    result = dispatch(clusters, [Candidate(job("train", cls="reserved"))])
    assert result.sent == {"train": "west"}


def test_elastic_work_borrows_idle_gpus_in_another_cluster() -> None:
    west = cluster("w", 1, {("nlp", "w"): 8}, (running("own", "nlp", "w-0", "reserved"),))
    clusters = {"east": cluster("e", 1, {("vision", "e"): 8}), "west": west}
    result = dispatch(clusters, [Candidate(job("sweep", team="nlp"))])
    assert result.sent == {"sweep": "east"}


def test_pinned_work_goes_only_to_its_cluster_or_waits_saying_why() -> None:
    clusters = {"east": cluster("e", 1), "west": cluster("w", 1)}
    result = dispatch(
        clusters,
        [Candidate(job("aa"), "west"), Candidate(job("b"), "west"), Candidate(job("c"), "gone")],
        {"gone": "is lost (no heartbeat for 60s)"},
    )
    assert result.sent == {"aa": "west"}  # the older of the two (the engine's queue order)
    assert result.waiting["b"] == "no cluster admits it now: west PoolFull"
    assert result.waiting["c"] == "its cluster gone is lost (no heartbeat for 60s)"


def test_work_for_a_pool_goes_to_the_cluster_that_has_it() -> None:
    clusters = {"east": cluster("e", 1), "west": cluster("w", 1)}
    result = dispatch(clusters, [Candidate(job("a", pool="w")), Candidate(job("b", pool="x"))])
    assert result.sent == {"a": "west"}
    assert result.waiting == {"b": "no cluster that takes work has its pool x"}


def test_nothing_is_sent_while_no_cluster_takes_work() -> None:
    result = dispatch({}, [Candidate(job("a"))], {"east": "is lost"})
    assert result.sent == {}
    assert result.waiting == {"a": "no cluster takes work now: east is lost"}
