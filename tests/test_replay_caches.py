"""What a replay keeps between cycles: the backlog (engine/backlog.py), whose misuse is refused
loudly, and the placements (engine/placed.py). That a kept backlog and kept placements decide as
a whole snapshot does is a property test in test_engine_properties.py."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from gpufleet.engine import (
    Node,
    Policy,
    PoolInfo,
    Reason,
    Snapshot,
    SnapshotError,
    TeamInfo,
    Workload,
    WorkloadClass,
    WorkloadState,
    decide,
)
from gpufleet.engine.backlog import PERSONAL, Backlog
from gpufleet.engine.placed import Placed

T0 = datetime(2026, 1, 1, 12, tzinfo=UTC)
POLICY = Policy()


def waiting(name: str, gpus: int = 8, **fields: object) -> Workload:
    return Workload(name, "ml", WorkloadClass.ELASTIC, gpus, T0, **fields)  # type: ignore[arg-type]


POOLS = {"h100": PoolInfo("h100", "H100", 8, 16, False)}
TEAMS = {"ml": TeamInfo("ml", None, 1, None)}
NODES = (Node("n1", "h100", 8), Node("n2", "h100", 8))


RESERVATIONS: dict[tuple[str, str], int] = {}


def snapshot(*workloads: Workload) -> Snapshot:
    return Snapshot(T0, POOLS, TEAMS, RESERVATIONS, POLICY, NODES, workloads)


def test_reasons_read_after_the_backlog_changed_are_refused() -> None:
    backlog = Backlog(POLICY)
    for name in ("a", "b", "c", "d"):
        backlog.add(waiting(name))
    decisions = decide(snapshot(), with_etas=False, explain=False, backlog=backlog)
    assert [a.workload for a in decisions.admitted] == ["a", "b"]
    assert dict(decisions.reasons) == {"c": Reason.POOL_FULL, "d": Reason.POOL_FULL}
    backlog.remove("a")
    with pytest.raises(RuntimeError, match="read its reasons first"):
        decisions.waiting_for((Reason.POOL_FULL,))


def test_a_waiting_workload_outside_the_backlog_is_an_error() -> None:
    backlog = Backlog(POLICY)
    with pytest.raises(SnapshotError, match="workload a: is waiting but not in the backlog"):
        decide(snapshot(waiting("a")), backlog=backlog)


def test_a_backlog_is_filed_once_per_workload_and_never_goes_back_in_time() -> None:
    backlog = Backlog(POLICY)
    backlog.add(waiting("a"))
    with pytest.raises(ValueError, match="workload a is already waiting"):
        backlog.add(waiting("a"))
    backlog.at(T0)
    with pytest.raises(ValueError, match="cannot go back"):
        backlog.at(T0 - timedelta(seconds=1))
    with pytest.raises(ValueError, match="made for another policy"):
        decide(replace(snapshot(), policy=Policy(backoff=timedelta(minutes=1))), backlog=backlog)


def test_a_back_off_is_a_question_of_its_own_until_it_ends() -> None:
    backlog = Backlog(POLICY)
    backlog.add(
        waiting(
            "p",
            state=WorkloadState.PREEMPTED,
            preempted_at=T0,
            preempted_from="h100",
            preempted_by="x",
        )
    )
    backlog.add(waiting("q"))
    assert sorted(q[0] is PERSONAL for q in backlog.at(T0).questions()) == [False, True]
    # ten minutes later (the default back-off) it asks what every workload of its shape asks
    assert [q[0] for q in backlog.at(T0 + POLICY.backoff).questions()] == ["ml"]
    assert backlog.members(waiting("q").shape) == ["p", "q"]


def test_kept_placements_follow_a_workload_that_moved() -> None:
    """A caller may report an active workload on other nodes than the cycle before: kept
    placements move it, so GPUs it left are free and those it took are not."""
    placed = Placed()
    on_n1 = replace(waiting("a"), state=WorkloadState.RUNNING, nodes=("n1",), started_at=T0)
    assert not decide(snapshot(on_n1), placed=placed).admitted
    moved = replace(on_n1, nodes=("n2",))
    decisions = decide(snapshot(moved, waiting("b")), placed=placed)
    assert [(a.workload, a.nodes) for a in decisions.admitted] == [("b", ("n1",))]


def test_kept_victims_turn_old_enough_to_yield_as_the_clock_passes_min_runtime() -> None:
    """Kept placements keep the possible victims too: work admitted in one cycle is a victim
    from the next, too young to yield to elastic work until minRuntime has passed (R6), and
    a cycle that kept them decides as one that placed everything."""
    placed = Placed()
    low = replace(waiting("low", priority=10), submitted_at=T0 - timedelta(minutes=1))
    first = decide(snapshot(low), placed=placed)
    assert [(a.workload, a.nodes) for a in first.admitted] == [("low", ("n1",))]
    running = replace(low, state=WorkloadState.RUNNING, nodes=("n1",), started_at=T0)
    other = replace(waiting("other"), state=WorkloadState.RUNNING, nodes=("n2",), started_at=T0)
    high = waiting("high", priority=90)

    def at(minutes: int, kept: Placed | None) -> list[str]:
        snap = replace(snapshot(running, other, high), time=T0 + timedelta(minutes=minutes))
        return [p.workload for p in decide(snap, placed=kept).preempted]

    for minutes in (1, 4):  # too young: nothing yields, kept or placed anew
        assert at(minutes, placed) == at(minutes, None) == []
    assert at(5, placed) == at(5, None) == ["low"]


def test_a_node_holding_more_than_its_gpus_is_an_error_that_says_so() -> None:
    # what a controller stopped mid-preemption leaves: `b` recorded on n1, where `a` still runs
    running = waiting("a", state=WorkloadState.RUNNING, nodes=("n1",), started_at=T0)
    planned = waiting("b", state=WorkloadState.QUEUED, nodes=("n1",), started_at=T0)
    with pytest.raises(SnapshotError, match="node n1 is over-allocated") as taken:
        decide(snapshot(running, planned))
    assert taken.value.taken  # the controller undoes such an admission (loop._decide)
    # a contradiction of another kind is not one of taken GPUs
    with pytest.raises(SnapshotError, match="is waiting but not in the backlog") as other:
        decide(snapshot(waiting("c")), backlog=Backlog(POLICY))
    assert not other.value.taken
