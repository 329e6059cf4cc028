"""One scheduling cycle: snapshot in, decisions out (DESIGN §4, rules R1-R9).

The cycle, step by step:

1. Build the capacity index and the accounting from the snapshot's active workloads.
2. Reserved workloads (by priority, then submission time): admitted where the team's unused
   reservation covers them, on free GPUs, else by preempting elastic work, else on new nodes.
3. Elastic workloads, by priority level; within a level the team that has borrowed least for
   its fair share goes first. Free GPUs, then new nodes where the pool allows, then preemption
   of lower-priority work or of equal-priority work of teams over their share.
4. Work conservation: while anything still waiting fits on GPUs freed in this cycle, admit it.
5. Every workload still waiting gets a reason, its position in its team's queue and an ETA.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from operator import attrgetter
from typing import Any

from gpufleet.engine.accounting import Accounting, fair_share_weights
from gpufleet.engine.backlog import (
    PERSONAL,
    Backlog,
    OrderKey,
    Question,
    WaitingReasons,
    question_shape,
)
from gpufleet.engine.choice import acceptable_pools, elastic_order, reserved_order
from gpufleet.engine.eta import estimate_eta
from gpufleet.engine.placed import Placed, SnapshotError, natural_key
from gpufleet.engine.placement import PodPlacement, PoolCapacity
from gpufleet.engine.preemption import (
    Candidate,
    VictimKey,
    minimise,
    release_all,
    restore_all,
    select_victims,
)
from gpufleet.engine.types import (
    MILLI,
    Admission,
    Decisions,
    Preemption,
    PreemptionReason,
    Reason,
    Snapshot,
    Waiting,
    Workload,
)
from gpufleet.model.durations import format_duration
from gpufleet.model.states import ADMITTED_STATES, WAITING_STATES


@dataclass
class _Blocked:
    reason: Reason
    message: str


# the answers of a cycle that is not asked to explain (a replay): reasons without messages
_QUIET = {reason: _Blocked(reason, "") for reason in Reason}


@dataclass
class _Failure:
    """A question (team, class, priority, shape, constraints) that could not be admitted."""

    searched: bool  # preemption was tried as well
    blocked: _Blocked
    fair_share: bool  # fair-share victims were considered: other teams' admissions matter
    generation: int  # the cycle's admission count when `blocked` was worked out


@dataclass
class Cycle:
    snapshot: Snapshot
    # the waiting workloads, kept by a caller that changes few between cycles (a replay); the
    # snapshot's workloads are then only the active ones. None: all are in the snapshot.
    kept_backlog: Backlog | None = None
    # the placements the last cycle left, kept by a replay (placed.py); None: place them all
    kept_placed: Placed | None = None
    capacity: dict[str, PoolCapacity] = field(default_factory=dict)
    accounting: Accounting = field(init=False)
    placements: dict[str, tuple[str, list[PodPlacement]]] = field(default_factory=dict)
    admitted: dict[str, Admission] = field(default_factory=dict)
    preempted: dict[str, Preemption] = field(default_factory=dict)
    blocked: dict[str, _Blocked] = field(default_factory=dict)
    # memo of the ETA estimates: the state is final when they run (see eta.py)
    eta_memo: dict[str, dict[Any, Any]] = field(default_factory=dict)
    # the simulator replays decisions and never shows ETAs; estimating them is most of a cycle
    with_etas: bool = True
    # a replay reads only the reasons: the messages (and what only they need) are not made
    explain: bool = True
    _allowed: dict[tuple[str | None, tuple[str, ...], bool], list[str]] = field(
        default_factory=dict
    )
    _reservation_blocks: dict[tuple[str, str | None, tuple[str, ...], int], _Blocked] = field(
        default_factory=dict
    )
    # preemption searches that found no victims since the state last changed: a backlog of
    # thousands of waiting workloads has only a few (team, priority, shape) questions
    _no_victims: set[tuple[Any, ...]] = field(default_factory=set)
    # preemption questions whose bound (`_could_yield`) failed at this level: it stays failed
    # until GPUs are freed or nodes added (see `_could_yield`), whoever else is admitted
    _cannot_yield: set[tuple[Any, ...]] = field(default_factory=set)
    # workload questions (team, class, priority, shape, constraints) that failed since the
    # state last changed, with whether preemption was tried, and why
    _failed: dict[tuple[Any, ...], _Failure] = field(default_factory=dict)
    _by_node: dict[str, dict[str, list[tuple[VictimKey, str]]]] = field(default_factory=dict)
    # each team's borrowed milli per pool, read by every preemption search; valid until
    # the accounting changes (an admission or an eviction)
    _borrowed: dict[str, _Borrowed] = field(default_factory=dict)
    _generation: int = 0  # admissions so far: a memo entry is current if made since the last

    def __post_init__(self) -> None:
        snapshot = self.snapshot
        if self.kept_backlog is None:
            active = [w for w in snapshot.workloads if w.state in ADMITTED_STATES]
            waiting = [w for w in snapshot.workloads if w.state in WAITING_STATES]
            self.backlog = Backlog.of(waiting, snapshot.policy, snapshot.time)
        elif not ADMITTED_STATES.issuperset(map(attrgetter("state"), snapshot.workloads)):
            raise SnapshotError(
                next(w.name for w in snapshot.workloads if w.state not in ADMITTED_STATES),
                "is waiting but not in the backlog (with a backlog, the snapshot's workloads "
                "are the active ones)",
            )
        elif self.kept_backlog.policy is not snapshot.policy:
            raise ValueError("the backlog was made for another policy than the snapshot's")
        else:
            self.backlog = self.kept_backlog.at(snapshot.time)
        if self.kept_backlog is not None:
            active = list(snapshot.workloads)  # all of them, as checked above
        self.placed = self.kept_placed if self.kept_placed is not None else Placed()
        self.placed.prepare(snapshot, active, snapshot.time - snapshot.policy.min_runtime)
        self.capacity, self.placements = self.placed.capacity, self.placed.placements
        assert self.placed.accounting is not None
        self.accounting = self.placed.accounting
        # the active workloads and those admitted in this cycle (the rest: self.backlog)
        self.workloads = self.placed.workloads
        # preempted at or before this, a workload's back-off has ended (R6)
        self._backoff_ended_for = snapshot.time - snapshot.policy.backoff
        self._evict_from_unhealthy_nodes()
        index = self.placed.victim_index
        assert index is not None
        # Possible victims per pool, cheapest first (R5): elastic work active at cycle start
        # (kept by `placed` between the cycles of a replay; an eviction takes one out).
        self.victims: dict[str, list[tuple[VictimKey, str]]] = index.all
        # ... and of those, the ones old enough to yield to elastic work (R6), in the same order:
        # an elastic preemptor's search never looks at the young ones
        self.old_victims: dict[str, list[tuple[VictimKey, str]]] = index.old

    # --- setup -----------------------------------------------------------------------------

    def _evict_from_unhealthy_nodes(self) -> None:
        """Work on a quarantined node is requeued, reserved or not: its GPUs may be corrupting
        it. No back-off applies (the controllers do not record a pool it was evicted from)."""
        unhealthy = {n.name for n in self.snapshot.nodes if not n.healthy}
        if not unhealthy:
            return
        for name in sorted(self.placements):
            workload = self.workloads[name]
            bad = sorted(set(workload.nodes) & unhealthy, key=natural_key)
            if not bad:
                continue
            self.placed.release(name)
            self.preempted[name] = Preemption(
                name,
                "",
                PreemptionReason.NODE_UNHEALTHY,
                f"node {', '.join(bad)} is quarantined (a GPU failed a health check); "
                "requeued onto healthy nodes",
            )

    # --- helpers ---------------------------------------------------------------------------

    def priority(self, workload: Workload) -> int:
        """Effective priority: a FleetPolicy may cap what a team's elastic work may use (R4)."""
        return self.snapshot.policy.priority_of(workload)

    def allowed_pools(self, workload: Workload) -> list[str]:
        """The pools the workload accepts, the most preferred first (choice.py)."""
        key = (workload.pool, workload.gpu_types, workload.fractional)
        if key not in self._allowed:
            self._allowed[key] = acceptable_pools(workload, self.snapshot.pools)
        return self._allowed[key]

    def _commit(
        self, workload: Workload, pool: str, pods: list[PodPlacement], evicted: bool = False
    ) -> None:
        self.placed.commit(workload, pool, pods)
        self._borrowed.clear()
        if any(p.node.virtual for p in pods):  # borrowed more without taking free GPUs
            self._cannot_yield.clear()
        self._generation += 1
        self._reservation_blocks.clear()  # a team's use changed
        if evicted:  # GPUs were freed: any failed question may now succeed
            self._no_victims.clear()
            self._cannot_yield.clear()
            self._failed.clear()
        else:
            self._forget_after_admission(workload.team)
        self.admitted[workload.name] = Admission(
            workload.name, pool, tuple(p.node.name for p in pods)
        )
        self.blocked.pop(workload.name, None)

    # --- the cycle -------------------------------------------------------------------------

    def run(self) -> Decisions:
        backlog = self.backlog
        levels: dict[int, dict[str, list[Question]]] = defaultdict(lambda: defaultdict(list))
        reserved = []
        for question in backlog.questions():
            team, is_reserved, priority = question_shape(question)[:3]
            if is_reserved:
                reserved.append(question)
            else:
                levels[priority][team].append(question)
        self._reserved_level(reserved)
        for priority in sorted(levels, reverse=True):
            self._elastic_level(levels[priority])
        self._conserve_work()
        return self._decisions(self.explain)

    def _reserved_level(self, questions: list[Question]) -> None:
        """Reserved work in queue order, preempting where needed (R1). A question that failed
        is passed over until an admission changes what could be decided: its later workloads
        would fail too, for the same reason (a long reserved queue costs a visit per question,
        not per workload)."""
        backlog = self.backlog
        heads = backlog.heads(None, questions)
        while heads:
            at, question = heapq.heappop(heads)
            if question[0] is not PERSONAL:
                failed = self._failed.get(question)
                if failed is not None and failed.searched and failed.generation == self._generation:
                    continue
            if self._try(backlog.workload(at), preempt=True):
                heads = backlog.heads(at, questions)  # GPUs taken: every question asked anew
                continue
            after = backlog.after(question, at)
            if after is not None:
                heapq.heappush(heads, (after, question))

    def _elastic_level(self, questions: dict[str, list[Question]]) -> None:
        """Admit one priority level, team by team in order of borrowed/fair share (R3)."""
        # teams with elastic work placed: possible victims, and what this cycle admitted
        index = self.placed.victim_index
        assert index is not None
        demanding = set(questions) | index.teams.keys() | self.placed.admitted_teams()
        shares = fair_share_weights(self.snapshot, demanding)
        # fair-share victims depend on the shares of this level
        self._no_victims.clear()
        self._cannot_yield.clear()
        self._failed.clear()
        pools = list(self.snapshot.pools)
        heap = [(self._share_key(team, shares, pools), team) for team in sorted(questions)]
        heapq.heapify(heap)
        backlog = self.backlog
        tried_up_to: dict[str, OrderKey | None] = dict.fromkeys(questions)
        while heap:
            _, team = heapq.heappop(heap)
            # a failed attempt changes nothing, so the team stays first in line: its queue is
            # tried on until an admission changes the shares' order
            heads = backlog.heads(tried_up_to[team], questions[team])
            while heads:
                at, question = heapq.heappop(heads)
                if question[0] is not PERSONAL:
                    failed = self._failed.get(question)
                    if (
                        failed is not None
                        and failed.searched
                        and failed.generation == self._generation
                    ):
                        continue  # the question's later workloads fail too, for the same reason
                if self._try(backlog.workload(at), preempt=True, shares=shares):
                    tried_up_to[team] = at
                    if backlog.heads(at, questions[team]):
                        heapq.heappush(heap, (self._share_key(team, shares, pools), team))
                    break
                after = backlog.after(question, at)
                if after is not None:
                    heapq.heappush(heads, (after, question))

    def _share_key(self, team: str, shares: dict[str, float], pools: list[str]) -> float:
        return self.accounting.borrowed_total(team, pools) / max(shares.get(team, 0.0), 1e-9)

    def _conserve_work(self) -> None:
        """R7: GPUs freed in this cycle (victims larger than needed) go to waiting work."""
        backlog = self.backlog
        changed = True
        while changed:
            changed = False
            heads = backlog.heads()
            while heads:
                at, question = heapq.heappop(heads)
                workload = backlog.workload(at)
                if workload.name not in self.admitted:
                    # the back-off does not apply in this pass: every question is a shape
                    failed = self._failed.get(question_shape(question))
                    if failed is not None and failed.generation == self._generation:
                        if question[0] is not PERSONAL:
                            continue  # its later workloads fail too, for the same reason
                    elif self._try(workload, preempt=False, conserving=True):
                        changed = True
                        heads = backlog.heads(at)  # GPUs taken: every question asked anew
                        continue
                after = backlog.after(question, at)
                if after is not None:
                    heapq.heappush(heads, (after, question))

    # --- admitting one workload ------------------------------------------------------------

    def _try(
        self,
        workload: Workload,
        preempt: bool,
        shares: dict[str, float] | None = None,
        conserving: bool = False,
    ) -> bool:
        # a backlog holds many workloads of one team and shape: while nothing changes, the
        # answer for the first is the answer for the rest (back-off messages are personal and
        # never shared; the last pass ignores the back-off)
        question = self.backlog.shape(workload)
        left = workload.preempted_from  # the only pool whose back-off can hold it (R6)
        backing_off = (
            left is not None
            and not conserving
            and left in self.allowed_pools(workload)
            and self._backing_off(workload, left)
        )
        if backing_off:  # a personal question; the team stays first (see _forget...)
            question = (workload.team, (left,), question)
        fair_share = False
        failed = self._failed.get(question)
        if failed is not None and (failed.searched or not preempt):
            if failed.generation == self._generation:
                self._block(workload, failed.blocked, conserving)
                return False
            # admissions since: the search would fail again, only the reason may read
            # differently (fewer GPUs free), so ask again without it
            preempt, fair_share = False, failed.fair_share
        blocked = self._policy_block(workload)
        if blocked is None:
            if workload.reserved:
                blocked = self._try_reserved(workload, preempt)
            else:
                blocked = self._try_elastic(
                    workload, preempt, shares or {}, conserving, backing_off
                )
        if blocked is not None:
            self._block(workload, blocked, conserving)
            if blocked.reason is not Reason.BACK_OFF:
                if failed is None or failed.generation == self._generation:
                    fair_share = preempt and bool(shares) and not workload.reserved
                    searched = preempt
                else:
                    searched = failed.searched
                self._failed[question] = _Failure(searched, blocked, fair_share, self._generation)
            return False
        return True

    def _block(self, workload: Workload, blocked: _Blocked, conserving: bool) -> None:
        earlier = self.blocked.get(workload.name)
        # the last pass ignores the back-off; the back-off is still why it waits
        if not (conserving and earlier is not None and earlier.reason is Reason.BACK_OFF):
            self.blocked[workload.name] = blocked

    def _policy_block(self, workload: Workload) -> _Blocked | None:
        limit = self.snapshot.policy.max_gpus_per_workload
        total = workload.total_milli / MILLI
        if limit is not None and total > limit:
            return _Blocked(
                Reason.POLICY_LIMIT,
                f"asks {total:g} GPUs; the FleetPolicy allows {limit} per workload",
            )
        if not self.allowed_pools(workload):
            what = f"pool {workload.pool!r}" if workload.pool else "any pool"
            kinds = " or ".join(workload.gpu_types)
            kind = f" of GPU type {kinds}" if kinds else ""
            whole = replace(workload, gpus=1.0)
            if workload.fractional and acceptable_pools(whole, self.snapshot.pools):
                scope = f"pool {workload.pool}" if workload.pool else f"every pool{kind}"
                return _Blocked(
                    Reason.NO_MATCHING_POOL,
                    f"asks {workload.gpus:g} GPU, a fraction, but {scope} has sharing: none: "
                    "ask whole GPUs, or run it in a pool that shares them",
                )
            return _Blocked(Reason.NO_MATCHING_POOL, f"no {what}{kind} exists")
        return None

    def _forget_after_admission(self, team: str) -> None:
        """An admission without evictions only takes GPUs and adds to its team's use: what
        failed still fails (less is free, burst limits and reservations are tighter), except
        fair-share preemption by other teams, for which the admitting team is now further over
        its share and so a likelier victim."""
        self._no_victims = {q for q in self._no_victims if not (q[-1] and q[1] != team)}
        self._failed = {
            q: failed
            for q, failed in self._failed.items()
            if not (failed.fair_share and q[0] != team)
        }

    def _try_reserved(self, workload: Workload, preempt: bool) -> _Blocked | None:
        team, need = workload.team, workload.total_milli
        pools = [
            p
            for p in self.allowed_pools(workload)
            if self.accounting.unused_reservation(team, p) >= need
        ]
        if not pools:
            return self._reservation_block(workload)
        pools = reserved_order(
            workload,
            pools,
            self.snapshot.pools,
            lambda p: self.accounting.unused_reservation(team, p),
        )
        for pool in pools:
            pods = self.capacity[pool].place_reserved(workload)
            if pods is not None:
                self._commit(workload, pool, pods)
                return None
        if preempt:
            for pool in pools:
                if self._reclaim_on_reserved_node(workload, pool):
                    return None
                if self._preempt_for(workload, pool, {}):
                    return None
        for pool in pools:
            pods = self.capacity[pool].place(workload, new_nodes=True)
            if pods is not None:
                self._commit(workload, pool, pods)
                return None
        return self._capacity_block(workload, pools)

    def _reservation_block(self, workload: Workload) -> _Blocked:
        # long queues of reserved work over their reservation ask the same question many times
        key = (workload.team, workload.pool, workload.gpu_types, workload.total_milli)
        if key not in self._reservation_blocks:
            self._reservation_blocks[key] = self._explain_reservation_block(workload)
        return self._reservation_blocks[key]

    def _explain_reservation_block(self, workload: Workload) -> _Blocked:
        team = workload.team
        parts = []
        for pool in self.allowed_pools(workload):
            reserved = self.accounting.reserved.get((team, pool), 0)
            if reserved:
                used = reserved - self.accounting.unused_reservation(team, pool)
                parts.append(f"{used / MILLI:g} of {reserved / MILLI:g} used in {pool}")
        detail = "; ".join(parts) if parts else "it has no reservation in the allowed pools"
        return _Blocked(
            Reason.RESERVATION_EXHAUSTED,
            f"team {team}'s reservation cannot cover {workload.total_milli / MILLI:g} "
            f"more GPUs ({detail}); run it as elastic or wait for reserved work to finish",
        )

    def _try_elastic(
        self,
        workload: Workload,
        preempt: bool,
        shares: dict[str, float],
        conserving: bool = False,
        backing_off: bool = False,
    ) -> _Blocked | None:
        """`backing_off`: the pool it was preempted from may not take it back yet (R6)."""
        team, need = workload.team, workload.total_milli
        blocker = self.accounting.burst_blocker(team, need)
        if blocker is not None:
            if not self.explain:
                return _QUIET[Reason.BURST_LIMIT]
            ceiling = self.accounting.ceiling[blocker] or 0
            used = self.accounting.subtree_usage[blocker]
            who = f"team {blocker}" if blocker == team else f"parent team {blocker}"
            return _Blocked(
                Reason.BURST_LIMIT,
                f"{who} uses {used / MILLI:g} of the {ceiling / MILLI:g} GPUs "
                f"its burst limit allows; this workload needs "
                f"{need / MILLI:g} more",
            )
        # R6 yields to R7: in the last pass the back-off no longer keeps work off GPUs that
        # would otherwise stay idle
        pools = list(self.allowed_pools(workload))
        if backing_off:
            assert workload.preempted_from is not None
            pools.remove(workload.preempted_from)
        if not pools:
            assert workload.preempted_at is not None
            if not self.explain:
                return _QUIET[Reason.BACK_OFF]
            by = ""
            if workload.preempted_by:
                by = f" by {workload.preempted_by}, which still holds the GPUs"
            return _Blocked(
                Reason.BACK_OFF,
                f"preempted from pool {workload.preempted_from} at "
                f"{workload.preempted_at.isoformat()}{by}; may not borrow it again until the "
                f"back-off of {format_duration(self.snapshot.policy.backoff)} ends or those "
                "GPUs are released, but runs at once on GPUs no other work is waiting for",
            )
        # R2: the most preferred type first, then where the team's own reservation is idle
        # (the more of the workload it covers the better), then where it fits best
        pools = elastic_order(
            workload,
            pools,
            self.snapshot.pools,
            self.capacity,
            lambda p: min(self.accounting.idle_reservation(team, p), need),
        )
        for pool in pools:
            pods = self.capacity[pool].place(workload)
            if pods is not None:
                self._commit(workload, pool, pods)
                return None
        for pool in pools:
            if self.snapshot.pools[pool].allow_elastic_scale_up:
                pods = self.capacity[pool].place(workload, new_nodes=True)
                if pods is not None:
                    self._commit(workload, pool, pods)
                    return None
        if preempt:
            for pool in pools:
                if self._preempt_for(workload, pool, shares):
                    return None
        return self._capacity_block(workload, pools)

    def _backing_off(self, workload: Workload, pool: str) -> bool:
        """R6: a preempted workload may not borrow the capacity it was evicted from for a while
        (it may still run inside its own team's unused reservation), and only while the
        workload that took it still holds it: once that one is gone the GPUs are released."""
        if workload.preempted_from != pool or workload.preempted_at is None:
            return False
        if workload.preempted_at <= self._backoff_ended_for:
            return False
        if workload.preempted_by is not None and workload.preempted_by not in self.placements:
            return False
        team = workload.team
        used = self.accounting.usage[(team, pool)]
        return used + workload.total_milli > self.accounting.reserved.get((team, pool), 0)

    def _capacity_block(self, workload: Workload, pools: list[str]) -> _Blocked:
        """Why no pool took it: the first pool's reason; for a workload that lists GPU types,
        each pool's, in the order they were tried."""
        first = self._pool_block(workload, pools[0])
        if not workload.gpu_types or len(pools) == 1 or not self.explain:
            return first
        blocks = [first, *(self._pool_block(workload, p) for p in pools[1:])]
        tried = "; ".join(
            f"{self.snapshot.pools[p].gpu_type}: {block.message}"
            for p, block in zip(pools, blocks, strict=True)
        )
        types = ", ".join(dict.fromkeys(self.snapshot.pools[p].gpu_type for p in pools))
        return _Blocked(first.reason, f"tried {types} in that order: {tried}")

    def _pool_block(self, workload: Workload, pool: str) -> _Blocked:
        capacity = self.capacity[pool]
        zones = capacity.zones_for(workload, new_nodes=False)
        need = workload.total_milli / MILLI
        if not zones:
            return _Blocked(
                Reason.NO_HEALTHY_NODE,
                f"pool {pool} has no healthy node"
                + (f" in zone {workload.zone}" if workload.zone else ""),
            )
        free = capacity.free_milli(zones) / MILLI
        if free < need:
            if not self.explain:
                return _QUIET[Reason.POOL_FULL]
            return _Blocked(
                Reason.POOL_FULL, f"needs {need:g} GPUs in pool {pool}; {free:g} are free"
            )
        if not self.explain:
            return _QUIET[Reason.WAITING_FOR_GANG if workload.pods > 1 else Reason.NO_FITTING_NODE]
        if workload.pods > 1:
            fit = capacity.best_gang_capacity(workload)
            where = f"one {workload.topology}" if workload.topology else "one zone"
            return _Blocked(
                Reason.WAITING_FOR_GANG,
                f"only {fit} of {workload.pods} pods of {workload.gpus:g} GPUs fit "
                f"together in {where} of pool {pool}",
            )
        return _Blocked(
            Reason.NO_FITTING_NODE,
            f"{free:g} GPUs are free in pool {pool} but no node has "
            f"{workload.gpus:g} free GPUs together",
        )

    # --- preemption --------------------------------------------------------------------------

    def _preempt_for(self, workload: Workload, pool: str, shares: dict[str, float]) -> bool:
        if not self.victims[pool]:
            return False
        # everything the search depends on besides the cycle's state, which it leaves unchanged
        question = (
            pool,
            workload.team,
            workload.reserved,
            self.priority(workload),
            workload.milli_per_pod,
            workload.pods,
            workload.zone,
            bool(shares),
        )
        if question in self._no_victims or question in self._cannot_yield:
            return False
        if not workload.reserved:
            bound, sharper = self._could_yield(workload, pool, shares)
            if not bound:
                if workload.zone is None:
                    self._cannot_yield.add(question)
                else:  # admissions in another zone take none of its free GPUs: no bound holds
                    self._no_victims.add(question)
                return False
            if not sharper:  # what the search would find: no victims
                self._no_victims.add(question)
                return False
        capacity = self.capacity[pool]
        may_lose = self._fair_share_check(workload, pool, shares)
        victims = select_victims(
            workload, capacity, lambda: self._candidates(workload, pool, shares), may_lose
        )
        if victims is None:
            self._no_victims.add(question)
            return False
        for victim in victims:
            self._evict(victim, workload, pool)
        pods = capacity.place(workload)
        assert pods is not None, "the victims were chosen so that the preemptor fits"
        self._commit(workload, pool, pods, evicted=True)
        return True

    def _reclaim_on_reserved_node(self, workload: Workload, pool: str) -> bool:
        """A single whole-GPU reserved pod reclaims GPUs beside reserved work: on the node that
        already holds the most reserved work and can make room by evicting elastic work (then
        the node needing the cheapest victims). Reserved work then gathers on few nodes and
        whole nodes stay possible for a team's large reserved job (R1, R8). Where no node with
        reserved work can make room, the general (cheapest-victims) search decides."""
        capacity = self.capacity[pool]
        if workload.pods != 1 or workload.fractional or not capacity.reserved_nodes:
            return False
        question = ("reserved-node", pool, workload.milli_per_pod, workload.zone)
        if question in self._no_victims:
            return False
        gpus = workload.milli_per_pod // MILLI
        zones = set(capacity.zones_for(workload, new_nodes=False))
        on_node = self._victims_on_node(pool)
        best: tuple[tuple[int, VictimKey, int], list[Candidate]] | None = None
        for index in capacity.reserved_nodes:
            node = capacity.nodes[index]
            if (
                not node.healthy
                or node.zone not in zones
                or node.capacity * MILLI - node.reserved < workload.milli_per_pod
                or (best is not None and -node.reserved > best[0][0])
            ):
                continue
            chosen: list[Candidate] = []
            for key, name in on_node.get(node.name, ()):  # cheapest first
                if name not in self.placements:
                    continue  # evicted earlier in this cycle
                placed = self.placements[name][1]
                chosen.append(
                    Candidate(
                        self.workloads[name], placed, PreemptionReason.RESERVATION_RECLAIMED, key
                    )
                )
                release_all(capacity, chosen[-1:])
                if node.whole_free >= gpus:
                    break
            fits = node.whole_free >= gpus and bool(chosen)
            restore_all(capacity, chosen)
            if not fits:
                continue
            rank = (-node.reserved, chosen[-1].key, node.index)
            if best is None or rank < best[0]:
                best = (rank, chosen)
        if best is None:
            self._no_victims.add(question)
            return False
        release_all(capacity, best[1])
        for victim in minimise(workload, capacity, best[1]):  # R5: no more than needed
            self._evict(victim, workload, pool)
        pods = capacity.place_reserved(workload)
        assert pods is not None, "the victims were chosen so that the preemptor fits"
        self._commit(workload, pool, pods, evicted=True)
        return True

    def _victims_on_node(self, pool: str) -> dict[str, list[tuple[VictimKey, str]]]:
        """The pool's possible victims by node, cheapest first (built once per cycle; victims
        evicted since are skipped by the reader)."""
        if pool not in self._by_node:
            by_node: dict[str, list[tuple[VictimKey, str]]] = defaultdict(list)
            for key, name in self.victims[pool]:
                for node in dict.fromkeys(p.node.name for p in self.placements[name][1]):
                    by_node[node].append((key, name))
            self._by_node[pool] = by_node
        return self._by_node[pool]

    def _borrowed_in(self, pool: str) -> _Borrowed:
        found = self._borrowed.get(pool)
        if found is None:
            found = self._borrowed[pool] = _Borrowed(self.accounting, pool)
        return found

    def _could_yield(
        self, workload: Workload, pool: str, shares: dict[str, float]
    ) -> tuple[bool, bool]:
        """Whether free GPUs plus all the elastic work this workload may displace add up to
        what it needs: lower-priority work old enough to yield, and equal-priority work of
        other teams down to where their fair-share ratio meets this team's (R3, R4, R6).

        Once false (for a workload of any zone) it stays false at this priority level until
        GPUs are freed or nodes to provision taken: an admission on existing nodes takes as
        many free GPUs as it adds to its team's borrowing, so the room it can add to the sum
        (its team's equal-priority share) is never more than the free GPUs it takes.

        The second answer is sharper, and says what the victim search would find: a team none
        of whose work may go alone (its smallest workload would take it below the ratio, the
        test of `_candidates`) adds nothing. It does not last as the first does (an admission
        by that team may let its smallest go), so a search it spares is remembered as one
        that found no victims."""
        acct, mine = self.accounting, self.priority(workload)
        capacity = self.capacity[pool]
        room = capacity.free_milli(capacity.zones_for(workload, new_nodes=False))
        need = workload.total_milli
        my_ratio = (acct.borrowed(workload.team, pool) + need) / max(
            shares.get(workload.team, 0.0), 1e-9
        )
        borrowed = self._borrowed_in(pool)
        index = self.placed.victim_index
        assert index is not None
        totals = index.yieldable_total[pool]
        for priority, milli in totals.items():
            if priority < mine:
                room += milli
        sharper = room
        if sharper >= need:
            return True, True
        if not shares or room + totals.get(mine, 0) < need:
            return False, False  # even every equal-priority victim would not add up
        for team, milli in index.yieldable[pool].get(mine, {}).items():
            if team == workload.team:
                continue
            share = max(shares.get(team, 0.0), 1e-9)
            theirs = borrowed[team]
            slack = int(theirs - my_ratio * share)
            if slack <= 0:
                continue
            more = milli if milli < slack else slack
            room += more
            if (theirs - index.smallest(pool, team, mine)) / share >= my_ratio:
                sharper += more
                if sharper >= need:
                    return True, True
        return room >= need, False

    def _candidates(
        self, workload: Workload, pool: str, shares: dict[str, float]
    ) -> Iterator[Candidate]:
        """Eligible victims in the pool, cheapest first (lazily)."""
        mine = self.priority(workload)
        borrowed = self._borrowed_in(pool)  # unchanged while victims are searched
        my_share = (borrowed[workload.team] + workload.total_milli) / max(
            shares.get(workload.team, 0.0), 1e-9
        )
        # R6: young elastic work yields only to reserved work
        eligible = self.victims[pool] if workload.reserved else self.old_victims[pool]
        for key, name in eligible:
            victim = self.workloads[name]
            theirs = key[1]
            if workload.reserved:
                reason = PreemptionReason.RESERVATION_RECLAIMED
            else:
                if theirs > mine:
                    continue
                if theirs < mine:
                    reason = PreemptionReason.HIGHER_PRIORITY
                elif victim.team != workload.team and shares:
                    # a victim its team could not lose alone is not allowed in any set (taking
                    # more of the team's work only lowers the team further): skip it early
                    left = borrowed[victim.team] - victim.total_milli
                    if left / max(shares.get(victim.team, 0.0), 1e-9) < my_share:
                        continue
                    reason = PreemptionReason.FAIR_SHARE
                else:
                    continue
            yield Candidate(victim, self.placements[name][1], reason, key)

    def _fair_share_check(
        self, workload: Workload, pool: str, shares: dict[str, float]
    ) -> Callable[[str, int], bool]:
        """Equal-priority victims may be taken only from teams that stay at least as far over
        their fair share as the preemptor's team will be after admission (R3). Taking back
        would then put the victim's team further over than the preemptor's: no ping-pong.
        The answer: whether a team may lose so many milli of such victims."""
        # the accounting does not change while victims are searched
        borrowed = self._borrowed_in(pool)
        mine = (borrowed[workload.team] + workload.total_milli) / max(
            shares.get(workload.team, 0.0), 1e-9
        )

        def may_lose(team: str, milli: int) -> bool:
            return (borrowed[team] - milli) / max(shares.get(team, 0.0), 1e-9) >= mine

        return may_lose

    def _evict(self, victim: Candidate, by: Workload, pool: str) -> None:
        workload = victim.workload
        del self.placements[workload.name]
        self.placed.evicted(workload.name)
        self.accounting.remove(workload, pool)
        self._borrowed.clear()
        if victim.reason is PreemptionReason.RESERVATION_RECLAIMED:
            what = f"reserved workload {by.name} of team {by.team} needs the GPUs in {pool}"
        elif victim.reason is PreemptionReason.HIGHER_PRIORITY:
            what = (
                f"elastic workload {by.name} of team {by.team} has higher priority "
                f"({self.priority(by)} > {self.priority(workload)})"
            )
        else:
            what = (
                f"team {workload.team} is over its fair share of {pool}; "
                f"team {by.team}'s workload {by.name} is under it"
            )
        self.preempted[workload.name] = Preemption(workload.name, by.name, victim.reason, what)

    def _answers(self) -> tuple[dict[Question, _Blocked], dict[str, _Blocked]]:
        """Why the workloads still wait after the cycle: the answer to each question in the
        last pass, which all its workloads share (the passes record only answers), and for
        workloads with questions of their own, their back-off where one held them (R6)."""
        answers: dict[Question, _Blocked] = {}
        own: dict[str, _Blocked] = {}
        for question in self.backlog.questions():
            if question[0] is not PERSONAL:
                failed = self._failed.get(question)
                if failed is not None:  # else all its workloads were admitted
                    answers[question] = failed.blocked
                continue
            for name in self.backlog.members(question):
                if name in self.admitted:
                    continue
                earlier = self.blocked.get(name)
                if earlier is not None and earlier.reason is Reason.BACK_OFF:
                    own[name] = earlier
                else:
                    own[name] = self._failed[question_shape(question)].blocked
        return answers, own

    # --- output --------------------------------------------------------------------------------

    def _decisions(self, explain: bool) -> Decisions:
        admitted = tuple(self.admitted[n] for n in sorted(self.admitted))
        preempted = tuple(self.preempted[n] for n in sorted(self.preempted))
        answers, own = self._answers()
        if not explain:
            reasons = WaitingReasons(
                self.backlog,
                {q: blocked.reason for q, blocked in answers.items()},
                {name: blocked.reason for name, blocked in own.items()},
                self.admitted,
            )
            return Decisions(admitted, preempted, reasons=reasons)
        why = dict(own)
        for question, blocked in answers.items():
            why.update(dict.fromkeys(self.backlog.members(question), blocked))
        # in queue order
        still = [w for w in self.backlog.in_order() if w.name not in self.admitted]
        positions: dict[str, int] = {}
        per_team: dict[str, int] = defaultdict(int)
        for workload in still:
            per_team[workload.team] += 1
            positions[workload.name] = per_team[workload.team]
        pending = []
        for workload in still:
            blocked = why[workload.name]
            eta = estimate_eta(self, workload, blocked.reason) if self.with_etas else None
            pending.append(
                Waiting(
                    workload.name, blocked.reason, blocked.message, positions[workload.name], eta
                )
            )
        return Decisions(
            admitted,
            preempted,
            tuple(sorted(pending, key=lambda p: p.workload)),
            {w.name: why[w.name].reason for w in still},
        )


class _Borrowed(dict[str, int]):
    """Milli-GPUs each team borrows in a pool, looked up once per team."""

    def __init__(self, accounting: Accounting, pool: str) -> None:
        super().__init__()
        self.accounting, self.pool = accounting, pool

    def __missing__(self, team: str) -> int:
        self[team] = self.accounting.borrowed(team, self.pool)
        return self[team]


def decide(
    snapshot: Snapshot,
    with_etas: bool = True,
    explain: bool = True,
    *,
    backlog: Backlog | None = None,
    placed: Placed | None = None,
) -> Decisions:
    """The engine: every admission, preemption and waiting reason for one snapshot, and for
    each waiting workload its message, place in its team's queue and ETA (no ETA unless
    `with_etas`; none of the three unless `explain`: a replay needs only the reasons). A
    replay keeps its waiting workloads in `backlog` (the snapshot then holds only the active
    ones) and the last cycle's placements in `placed`, and passes both to every cycle."""
    try:
        cycle = Cycle(snapshot, backlog, placed, with_etas=with_etas, explain=explain)
        return cycle.run()
    except BaseException:
        if placed is not None:
            placed.forget()  # a cycle cut short leaves placements half changed
        raise
