"""Property tests of the engine's invariants over random clusters and workloads (hypothesis).

The checks below re-derive capacity and accounting on their own, from the snapshot and the
decisions, rather than asking the engine: a bug in the engine's bookkeeping cannot hide itself.
"""

from __future__ import annotations

import math
import random
from collections import defaultdict
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from gpufleet.engine import (
    MILLI,
    Decisions,
    Node,
    Policy,
    PoolInfo,
    PreemptionReason,
    Snapshot,
    TeamInfo,
    Workload,
    WorkloadClass,
    WorkloadState,
    decide,
)
from gpufleet.engine.backlog import Backlog
from gpufleet.engine.placed import Placed
from gpufleet.model.bursting import UNLIMITED, ceiling_for

T0 = datetime(2026, 1, 1, 12, tzinfo=UTC)
CASES = settings(
    max_examples=500,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
ACTIVE = (WorkloadState.QUEUED, WorkloadState.STARTING, WorkloadState.RUNNING)


class Tracker:
    """Independent GPU bookkeeping: whole GPUs and first-fit shared slots per node."""

    def __init__(self, nodes: list[Node]) -> None:
        self.whole = {n.name: n.gpus for n in nodes}
        self.slots: dict[str, list[int]] = defaultdict(list)  # used milli per shared GPU

    def room(self, node: str, milli: int) -> bool:
        if milli >= MILLI:
            return self.whole[node] >= milli // MILLI
        return self.whole[node] >= 1 or any(used + milli <= MILLI for used in self.slots[node])

    def take(self, node: str, milli: int) -> None:
        if milli >= MILLI:
            self.whole[node] -= milli // MILLI
            return
        for i, used in enumerate(self.slots[node]):
            if used + milli <= MILLI:
                self.slots[node][i] += milli
                return
        self.whole[node] -= 1
        self.slots[node].append(milli)


@st.composite
def snapshots(
    draw: Any, whole_only: bool = False, pending_count: tuple[int, int] = (0, 8)
) -> Snapshot:
    pools: dict[str, PoolInfo] = {}
    nodes: list[Node] = []
    for p in range(draw(st.integers(1, 2))):
        name = f"p{p}"
        per_node = draw(st.sampled_from([4, 8]))
        count = draw(st.integers(1, 5))
        autoscaling = draw(st.booleans())
        extra = draw(st.integers(0, 2)) * per_node if autoscaling else 0
        pools[name] = PoolInfo(
            name,
            draw(st.sampled_from(["H100", "A100"])),
            per_node,
            count * per_node + extra,
            autoscaling,
            draw(st.booleans()),
            sharing=draw(st.sampled_from([True, True, False])),
        )
        for i in range(count):
            nodes.append(
                Node(
                    f"{name}-n{i}",
                    name,
                    per_node,
                    zone=draw(st.sampled_from(["a", "b"])),
                    healthy=draw(st.integers(0, 9)) > 0,
                    # topology (R8): unlabelled, or in one of two blocks and maybe a clique
                    block=draw(st.sampled_from(["", "", "b1", "b2"])),
                    clique=draw(st.sampled_from(["", "", "c1"])),
                )
            )
    teams: dict[str, TeamInfo] = {}
    for t in range(draw(st.integers(1, 4))):
        parent = draw(st.one_of(st.none(), st.sampled_from(sorted(teams)))) if teams else None
        teams[f"t{t}"] = TeamInfo(
            f"t{t}",
            parent,
            draw(st.integers(1, 5)),
            draw(st.sampled_from([None, None, "0", "50%", "8"])),
        )
    reservations: dict[tuple[str, str], int] = {}
    for pool in pools.values():
        left = pool.max_gpus
        for team in teams:
            gpus = draw(st.integers(0, left))
            if gpus:
                reservations[(team, pool.name)] = gpus
                left -= gpus
    policy = Policy(
        max_gpus_per_workload=draw(st.sampled_from([None, None, 16])),
        max_priority=draw(st.sampled_from([{}, {"t0": 40}])),
    )
    tracker = Tracker(nodes)
    used_reserved: dict[tuple[str, str], int] = defaultdict(int)
    sizes = [1, 2, 4, 8] if whole_only else [0.25, 0.5, 0.75, 1, 2, 4, 8]
    workloads: list[Workload] = []
    for i in range(draw(st.integers(0, 14))):  # many: full pools make preemption likely
        team = draw(st.sampled_from(sorted(teams)))
        gpus = draw(st.sampled_from(sizes))
        pods = 1 if gpus < 1 else draw(st.integers(1, 3))
        pool = draw(st.sampled_from(sorted(pools)))
        milli = round(gpus * MILLI)
        chosen = []
        for _ in range(pods):
            candidates = [n.name for n in nodes if n.pool == pool and tracker.room(n.name, milli)]
            if not candidates:
                break
            node = draw(st.sampled_from(candidates))
            tracker.take(node, milli)
            chosen.append(node)
        if len(chosen) < pods:  # could not place it: undo by not adding (capacity stays used)
            continue
        reserved = draw(st.booleans()) and (
            used_reserved[(team, pool)] + milli * pods <= reservations.get((team, pool), 0) * MILLI
        )
        if reserved:
            used_reserved[(team, pool)] += milli * pods
        state = draw(st.sampled_from(ACTIVE))
        started = (
            None
            if state is WorkloadState.QUEUED
            else T0 - timedelta(minutes=draw(st.integers(0, 600)))
        )
        workloads.append(
            Workload(
                name=f"run{i}",
                team=team,
                workload_class=WorkloadClass.RESERVED if reserved else WorkloadClass.ELASTIC,
                gpus=gpus,
                pods=pods,
                priority=draw(st.sampled_from([10, 50, 75])),
                state=state,
                submitted_at=T0 - timedelta(hours=12),
                started_at=started,
                nodes=tuple(chosen),
                expected_end=draw(st.one_of(st.none(), st.just(T0 + timedelta(hours=1)))),
            )
        )
    for i in range(draw(st.integers(*pending_count))):
        gpus = draw(st.sampled_from(sizes))
        preempted = draw(st.integers(0, 4)) == 0
        workloads.append(
            Workload(
                name=f"wait{i}",
                team=draw(st.sampled_from(sorted(teams))),
                workload_class=draw(st.sampled_from(list(WorkloadClass))),
                gpus=gpus,
                pods=1 if gpus < 1 else draw(st.integers(1, 3)),
                priority=draw(st.sampled_from([10, 50, 75, 90])),
                state=WorkloadState.PREEMPTED if preempted else WorkloadState.PENDING,
                pool=draw(st.one_of(st.none(), st.sampled_from(sorted(pools)))),
                zone=draw(st.sampled_from([None, None, "a"])),
                topology=draw(st.sampled_from([None, None, None, "block", "clique"])),
                gpu_types=draw(st.sampled_from([(), (), (), ("H100",), ("A100", "H100")])),
                submitted_at=T0 - timedelta(minutes=draw(st.integers(0, 300))),
                preempted_at=T0 - timedelta(minutes=2) if preempted else None,
                preempted_from=draw(st.sampled_from(sorted(pools))) if preempted else None,
                # the preemptor: still active, finished (absent), or not recorded
                preempted_by=draw(st.sampled_from([None, "gone", *(w.name for w in workloads[:3])]))
                if preempted
                else None,
            )
        )
    return Snapshot(T0, pools, teams, reservations, policy, tuple(nodes), tuple(workloads))


@st.composite
def crowded_pools(draw: Any) -> Snapshot:
    """One full pool of elastic work and one waiting preemptor: preemption is the usual case."""
    count = draw(st.integers(2, 6))
    nodes = [Node(f"n{i}", "p", 8, zone=draw(st.sampled_from(["a", "b"]))) for i in range(count)]
    teams = {t: TeamInfo(t, None, draw(st.integers(1, 3)), None) for t in ("t0", "t1", "t2")}
    tracker = Tracker(nodes)
    workloads = []
    for i in range(draw(st.integers(4, 30))):
        gpus = draw(st.sampled_from([1, 2, 4, 8]))
        pods = draw(st.integers(1, 2))
        chosen = []
        for _ in range(pods):
            room = [n.name for n in nodes if tracker.room(n.name, gpus * MILLI)]
            if not room:
                break
            node = draw(st.sampled_from(room))
            tracker.take(node, gpus * MILLI)
            chosen.append(node)
        if len(chosen) == pods:
            workloads.append(
                Workload(
                    f"v{i}",
                    draw(st.sampled_from(["t1", "t2"])),
                    WorkloadClass.ELASTIC,
                    gpus,
                    T0 - timedelta(hours=5),
                    pods=pods,
                    priority=draw(st.sampled_from([10, 50])),
                    state=draw(st.sampled_from(ACTIVE)),
                    nodes=tuple(chosen),
                    started_at=T0 - timedelta(minutes=draw(st.integers(1, 300))),
                )
            )
    cls = draw(st.sampled_from(list(WorkloadClass)))
    workloads.append(
        Workload(
            "preemptor",
            "t0",
            cls,
            draw(st.sampled_from([1, 2, 4, 8])),
            T0,
            pods=draw(st.integers(1, 3)),
            priority=draw(st.sampled_from([50, 90])),
        )
    )
    pool = PoolInfo("p", "H100", 8, count * 8, autoscaling=False)
    return Snapshot(
        T0, {"p": pool}, teams, {("t0", "p"): count * 8}, Policy(), tuple(nodes), tuple(workloads)
    )


# --- re-deriving the outcome -------------------------------------------------------------------


def outcome(snap: Snapshot, decisions: Decisions) -> dict[str, tuple[str, tuple[str, ...]]]:
    """Workload -> (pool, nodes) of everything that holds GPUs after the decisions."""
    node_pool = {n.name: n.pool for n in snap.nodes}
    gone = {p.workload for p in decisions.preempted}
    held = {
        w.name: (node_pool[w.nodes[0]], w.nodes)
        for w in snap.workloads
        if w.state in ACTIVE and w.name not in gone
    }
    for a in decisions.admitted:
        held[a.workload] = (a.pool, a.nodes)
    return held


def usage(
    snap: Snapshot, held: dict[str, tuple[str, tuple[str, ...]]]
) -> dict[tuple[str, str], int]:
    by_name = {w.name: w for w in snap.workloads}
    out: dict[tuple[str, str], int] = defaultdict(int)
    for name, (pool, _) in held.items():
        out[(by_name[name].team, pool)] += by_name[name].total_milli
    return out


def ancestors(snap: Snapshot, team: str) -> list[str]:
    chain = [team]
    while (parent := snap.teams[chain[-1]].parent) is not None and parent not in chain:
        chain.append(parent)
    return chain


def ceiling(snap: Snapshot, team: str) -> float | None:
    reserved = sum(g for (t, _), g in snap.reservations.items() if team in ancestors(snap, t))
    gpus = ceiling_for(snap.teams[team].burst_limit, reserved)
    return None if gpus == UNLIMITED else gpus * MILLI


def subtree_usage(snap: Snapshot, used: dict[tuple[str, str], int], team: str) -> int:
    return sum(q for (t, _), q in used.items() if team in ancestors(snap, t))


def node_load(
    snap: Snapshot, held: dict[str, tuple[str, tuple[str, ...]]]
) -> tuple[dict[str, int], dict[str, list[int]]]:
    by_name = {w.name: w for w in snap.workloads}
    whole: dict[str, int] = defaultdict(int)
    shared: dict[str, list[int]] = defaultdict(list)
    for name, (_, on) in held.items():
        w = by_name[name]
        for node in on:
            if w.fractional:
                shared[node].append(w.milli_per_pod)
            else:
                whole[node] += w.milli_per_pod // MILLI
    return whole, shared


def shared_gpus(milli: list[int]) -> int:
    """Fewest GPUs that can hold these fractional pods (first-fit decreasing is optimal for
    quarter-GPU sizes, the only fractions these tests make)."""
    bins: list[int] = []
    for q in sorted(milli, reverse=True):
        for i, used in enumerate(bins):
            if used + q <= MILLI:
                bins[i] += q
                break
        else:
            bins.append(q)
    return len(bins)


def free_whole(snap: Snapshot, held: dict[str, tuple[str, tuple[str, ...]]]) -> dict[str, int]:
    whole, shared = node_load(snap, held)
    return {n.name: n.gpus - whole[n.name] - shared_gpus(shared[n.name]) for n in snap.nodes}


def fits_whole(snap: Snapshot, w: Workload, pool: str, free: dict[str, int]) -> bool:
    """All pods in one zone, or for a gang with a required topology in one labelled domain of
    that level (R8)."""
    k = w.milli_per_pod // MILLI
    together: dict[tuple[str, str], int] = defaultdict(int)
    for n in snap.nodes:
        if n.pool == pool and n.healthy and (w.zone is None or n.zone == w.zone):
            domain = "" if w.topology is None or w.pods == 1 else getattr(n, w.topology)
            if w.topology is not None and w.pods > 1 and not domain:
                continue  # a node of no domain cannot hold part of such a gang
            together[(n.zone, domain)] += free[n.name] // k
    return any(c >= w.pods for c in together.values())


# --- the invariants ------------------------------------------------------------------------------


@CASES
@given(snapshots())
def test_invariants(snap: Snapshot) -> None:
    decisions = decide(snap)
    by_name = {w.name: w for w in snap.workloads}
    held = outcome(snap, decisions)

    # no node over-allocated (existing nodes; and new nodes within their pool's ceiling)
    whole, shared = node_load(snap, held)
    for n in snap.nodes:
        assert whole[n.name] + shared_gpus(shared[n.name]) <= n.gpus, n.name
    for pool in snap.pools.values():
        new = {
            node for _, (p, on) in held.items() if p == pool.name for node in on if "/new-" in node
        }
        existing = sum(n.gpus for n in snap.nodes if n.pool == pool.name)
        assert existing + len(new) * pool.gpus_per_node <= max(pool.max_gpus, existing)
        for node in new:
            assert whole[node] + shared_gpus(shared[node]) <= pool.gpus_per_node

    # reserved usage within reservations
    reserved_use: dict[tuple[str, str], int] = defaultdict(int)
    for name, (pool_name, _) in held.items():
        if by_name[name].reserved:
            reserved_use[(by_name[name].team, pool_name)] += by_name[name].total_milli
    for key, milli in reserved_use.items():
        assert milli <= snap.reservations.get(key, 0) * MILLI, key

    # no reserved workload preempted; victims were active; no workload both admitted and evicted
    # work on an unhealthy node is evicted (reserved or not), and only that work for that reason
    unhealthy = {n.name for n in snap.nodes if not n.healthy}
    on_bad = {w.name for w in snap.workloads if w.state in ACTIVE and set(w.nodes) & unhealthy}
    health = {
        p.workload for p in decisions.preempted if p.reason is PreemptionReason.NODE_UNHEALTHY
    }
    assert health == on_bad
    for p in decisions.preempted:
        assert by_name[p.workload].state in ACTIVE
        if p.workload not in health:
            assert not by_name[p.workload].reserved
    assert not {p.workload for p in decisions.preempted} & {a.workload for a in decisions.admitted}

    # gangs all-or-nothing, on nodes of the admitted pool, never on unhealthy nodes; the pool
    # one it accepts (its pool, one of its GPU types); its victims only in pools it accepts
    nodes = {n.name: n for n in snap.nodes}
    where = {name: pool for name, (pool, _) in outcome(snap, Decisions()).items()}
    for a in decisions.admitted:
        w = by_name[a.workload]
        accepted = {
            p.name
            for p in snap.pools.values()
            if (not w.pool or p.name == w.pool)
            and (not w.gpu_types or p.gpu_type in w.gpu_types)
            and (p.sharing or not w.fractional)
        }
        assert a.pool in accepted, (w.name, a.pool, accepted)
        for p in decisions.preempted:
            if p.by == w.name:
                assert where[p.workload] in accepted, (p.workload, w.name)
        assert w.state in (WorkloadState.PENDING, WorkloadState.PREEMPTED)
        assert len(a.nodes) == w.pods
        for node in a.nodes:
            if node in nodes:
                assert nodes[node].pool == a.pool and nodes[node].healthy
            else:
                assert node.startswith(f"{a.pool}/new-")
                assert w.reserved or snap.pools[a.pool].allow_elastic_scale_up

    # burst limits held by every admitted elastic workload's team and its ancestors
    used = usage(snap, held)
    for a in decisions.admitted:
        w = by_name[a.workload]
        if w.reserved:
            continue
        for team in ancestors(snap, w.team):
            limit = ceiling(snap, team)
            assert limit is None or subtree_usage(snap, used, team) <= limit, (team, w.name)

    # every waiting workload has a reason, and positions count 1.. per team
    waiting = [w for w in snap.workloads if w.state not in ACTIVE]
    assert {p.workload for p in decisions.pending} | {a.workload for a in decisions.admitted} == {
        w.name for w in waiting
    }
    positions: dict[str, list[int]] = defaultdict(list)
    for waiting_workload in decisions.pending:
        positions[by_name[waiting_workload.workload].team].append(waiting_workload.position)
    for team, seen in positions.items():
        assert sorted(seen) == list(range(1, len(seen) + 1)), team


@CASES
@given(snapshots(whole_only=True))
def test_work_conservation(snap: Snapshot) -> None:
    """No waiting workload is left out while it fits the free capacity it is allowed to use,
    including preempted work inside its back-off window (R6 refined: the back-off orders work,
    it does not leave GPUs idle)."""
    decisions = decide(snap)
    held = outcome(snap, decisions)
    free = free_whole(snap, held)
    used = usage(snap, held)
    by_name = {w.name: w for w in snap.workloads}
    for p in decisions.pending:
        w = by_name[p.workload]
        if snap.policy.max_gpus_per_workload is not None and (
            w.total_milli > snap.policy.max_gpus_per_workload * MILLI
        ):
            continue
        for pool in snap.pools.values():
            if (
                (w.pool and w.pool != pool.name)
                or (w.gpu_types and pool.gpu_type not in w.gpu_types)
                or (w.fractional and not pool.sharing)
            ):
                continue
            if w.reserved:
                reserved = sum(
                    by_name[n].total_milli
                    for n, (pl, _) in held.items()
                    if pl == pool.name and by_name[n].reserved and by_name[n].team == w.team
                )
                if reserved + w.total_milli > snap.reservations.get((w.team, pool.name), 0) * MILLI:
                    continue
            else:
                if any(
                    (limit := ceiling(snap, t)) is not None
                    and subtree_usage(snap, used, t) + w.total_milli > limit
                    for t in ancestors(snap, w.team)
                ):
                    continue
                # no exemption for the R6 back-off: it never keeps GPUs idle (R7 wins)
            assert not fits_whole(snap, w, pool.name, free), (
                f"{w.name} ({p.reason}) fits in {pool.name}: {p.message}"
            )


def _preempts_for_room(snap: Snapshot) -> bool:
    return any(p.reason is not PreemptionReason.NODE_UNHEALTHY for p in decide(snap).preempted)


PREEMPTING = st.one_of(crowded_pools(), snapshots(whole_only=True, pending_count=(1, 1)))


@CASES
@given(PREEMPTING)
def test_every_preemption_is_necessary(snap: Snapshot) -> None:
    """Dropping any one victim would leave the preemptor without room."""
    decisions = decide(snap)
    checked = _preempts_for_room(snap)
    event("preempted for room: checked" if checked else "nothing preempted: nothing to check")
    if not checked:
        return
    by_name = {w.name: w for w in snap.workloads}
    (admission,) = decisions.admitted
    preemptor = by_name[admission.workload]
    held = outcome(snap, decisions)
    del held[preemptor.name]
    for victim in decisions.preempted:
        if victim.reason is PreemptionReason.NODE_UNHEALTHY:
            continue  # evicted for its node, not for room
        assert victim.by == preemptor.name
        w = by_name[victim.workload]
        restored = dict(held)
        restored[w.name] = (admission.pool, w.nodes)
        free = free_whole(snap, restored)
        assert not fits_whole(snap, preemptor, admission.pool, free), victim.workload


def test_the_preemption_property_meets_preemptions() -> None:
    """The property above checks nothing in a case that preempts nothing: its strategy must
    make cases that do, and many of them, or it would pass having checked nothing."""
    seen = {"cases": 0, "preempting": 0}

    @settings(max_examples=200, derandomize=True, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(PREEMPTING)
    def count(snap: Snapshot) -> None:
        seen["cases"] += 1
        seen["preempting"] += _preempts_for_room(snap)

    count()
    assert seen["cases"] >= 100, seen
    assert seen["preempting"] >= seen["cases"] // 10, seen


@CASES
@given(snapshots(), st.randoms(use_true_random=False))
def test_determinism(snap: Snapshot, rng: random.Random) -> None:
    """Same input -> same output, whatever the order of nodes and workloads in the input."""
    first = decide(snap).to_dict()
    assert decide(snap).to_dict() == first
    nodes, workloads = list(snap.nodes), list(snap.workloads)
    rng.shuffle(nodes)
    rng.shuffle(workloads)

    def shuffled(mapping: dict[Any, Any]) -> dict[Any, Any]:
        items = list(mapping.items())
        rng.shuffle(items)
        return dict(items)

    again = replace(
        snap,
        nodes=tuple(nodes),
        workloads=tuple(workloads),
        pools=shuffled(snap.pools),
        teams=shuffled(snap.teams),
        reservations=shuffled(snap.reservations),
    )
    assert decide(again).to_dict() == first


@CASES
@given(snapshots(), st.randoms(use_true_random=False), st.sampled_from([0, 15]))
def test_a_kept_backlog_decides_as_the_snapshot(
    snap: Snapshot, rng: random.Random, minutes_later: int
) -> None:
    """A replay keeps its waiting workloads in a Backlog between cycles: the decisions are the
    ones made from the whole snapshot, explained or not, also once back-offs have ended."""
    snap = replace(snap, time=snap.time + timedelta(minutes=minutes_later))
    waiting = [w for w in snap.workloads if w.state not in ACTIVE]
    rng.shuffle(waiting)
    backlog = Backlog(snap.policy)  # filed before the time is known: back-offs end later
    for workload in waiting:
        backlog.add(workload)
    kept = replace(snap, workloads=tuple(w for w in snap.workloads if w.state in ACTIVE))
    full = decide(snap)
    assert decide(kept, backlog=backlog).to_dict() == full.to_dict()
    quick = decide(kept, with_etas=False, explain=False, backlog=backlog)
    assert (quick.admitted, quick.preempted, quick.pending) == (full.admitted, full.preempted, ())
    assert dict(quick.reasons) == {p.workload: p.reason for p in full.pending} == full.reasons
    for reason in {p.reason for p in full.pending}:
        expected = sorted(p.workload for p in full.pending if p.reason is reason)
        assert sorted(quick.waiting_for((reason,))) == expected


def applied(snap: Snapshot, decisions: Decisions, finished: set[str], minutes: int = 1) -> Snapshot:
    """The next snapshot, `minutes` later, as a replay makes it: admissions run where they
    were placed, preemptions wait again, the `finished` leave."""
    by_name = {w.name: w for w in snap.workloads}
    workloads = []
    for workload in snap.workloads:
        if workload.name in finished:
            continue
        if workload.name in {p.workload for p in decisions.preempted}:
            workload = replace(workload, state=WorkloadState.PREEMPTED, nodes=())
        workloads.append(workload)
    for admission in decisions.admitted:
        workloads.remove(by_name[admission.workload])
        workloads.append(
            replace(
                by_name[admission.workload],
                state=WorkloadState.RUNNING,
                nodes=admission.nodes,
                started_at=snap.time,
            )
        )
    return replace(snap, time=snap.time + timedelta(minutes=minutes), workloads=tuple(workloads))


@CASES
@given(snapshots(), st.randoms(use_true_random=False))
def test_kept_placements_decide_as_placing_everything(snap: Snapshot, rng: random.Random) -> None:
    """A replay keeps the placements a cycle leaves (Placed) and its possible victims for the
    next cycle, which places only what changed: its decisions are those of placing every active
    workload again. Cycles a few minutes apart: work admitted in one turns old enough to yield
    (minRuntime) in a later one."""
    placed = Placed()
    for _ in range(3):
        kept = decide(snap, placed=placed)
        assert kept.to_dict() == decide(snap).to_dict()
        if any(a.nodes and "/new-" in a.nodes[0] for a in kept.admitted):
            return  # nodes to provision are not nodes of the next snapshot
        active = sorted(w.name for w in snap.workloads if w.state in ACTIVE)
        finished = set(rng.sample(active, min(len(active), rng.randint(0, 2))))
        snap = applied(snap, kept, finished, rng.randint(1, 8))


class _Unmemoised(set[Any]):
    """A memo that never remembers: every question is asked again."""

    def add(self, item: Any) -> None:
        pass


@CASES
@given(snapshots())
def test_a_failed_preemption_bound_is_remembered_only_while_it_must_fail(snap: Snapshot) -> None:
    """A cycle remembers a preemption question whose bound on what could yield failed, until
    GPUs are freed or nodes added: its decisions are those of asking every time."""
    from gpufleet.engine.scheduler import Cycle

    asked = Cycle(snap)
    asked._cannot_yield = _Unmemoised()
    assert asked.run().to_dict() == decide(snap).to_dict()


@CASES
@given(snapshots())
def test_the_sharper_bound_spares_only_searches_that_find_no_victims(snap: Snapshot) -> None:
    """The sharper answer of `_could_yield` (a team none of whose work may go alone adds
    nothing) spares victim searches: the decisions are those of searching every time."""
    from gpufleet.engine.scheduler import Cycle

    class Searching(Cycle):
        def _could_yield(self, *args: Any) -> tuple[bool, bool]:
            bound, _ = super()._could_yield(*args)
            return bound, bound

    assert Searching(snap).run().to_dict() == decide(snap).to_dict()


def test_ceiling_helper_matches_percentages() -> None:
    assert ceiling_for("50%", 32) == 48
    assert math.isclose(ceiling_for("12.5%", 8), 9)
