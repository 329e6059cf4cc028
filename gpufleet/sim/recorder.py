"""What a simulation publishes for the usage ledger: the same lifecycle events the controller
publishes, and each pool's capacity and each reservation over simulated time. Pure; written
to a ledger by `gpufleet simulate --ledger`."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Protocol

from gpufleet.engine import Node
from gpufleet.ledger.cost import Interval
from gpufleet.lifecycle import LifecycleEvent, Transition, pool_facts
from gpufleet.model.fleet import Fleet


class SimulatedJob(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def team(self) -> str: ...
    @property
    def workload_class(self) -> str: ...
    @property
    def total_gpus(self) -> float: ...
    @property
    def pool(self) -> str | None: ...
    @property
    def nodes(self) -> tuple[str, ...]: ...


class Recorder:
    def __init__(self, fleet: Fleet, start: datetime) -> None:
        self.fleet, self.start = fleet, start
        self.facts = pool_facts(fleet)
        self.events: list[LifecycleEvent] = []
        self.capacity: list[Interval] = []
        self.reservations: list[Interval] = []
        self._open_capacity: dict[str, Interval] = {}
        self._open_reservations: dict[str, Interval] = {}

    def at(self, t: float) -> datetime:
        return self.start + timedelta(seconds=t)

    def event(
        self,
        transition: Transition,
        job: SimulatedJob,
        t: float,
        reason: str | None = None,
        by: str | None = None,
        lost_gpu_seconds: float | None = None,
    ) -> None:
        facts = self.facts.get(job.pool or "")
        self.events.append(
            LifecycleEvent(
                transition=transition,
                workload=job.name,
                uid=job.name,
                at=self.at(t),
                team=job.team,
                workload_class=job.workload_class,
                gpus=job.total_gpus,
                pool=job.pool,
                gpu_type=facts.gpu_type if facts else None,
                nodes=len(set(job.nodes)),
                price_per_gpu_hour=facts.price_per_gpu_hour if facts else None,
                reason=reason,
                by=by,
                lost_gpu_seconds=lost_gpu_seconds,
            )
        )

    def nodes(self, nodes: Iterable[Node], t: float) -> None:
        """The pools' nodes at `t`: an interval starts wherever a pool's GPUs change."""
        gpus: dict[str, float] = {name: 0.0 for name in self.facts}
        unhealthy: dict[str, float] = {name: 0.0 for name in self.facts}
        for node in nodes:
            gpus[node.pool] = gpus.get(node.pool, 0.0) + node.gpus
            if not node.healthy:
                unhealthy[node.pool] = unhealthy.get(node.pool, 0.0) + node.gpus
        for pool, count in gpus.items():
            current = self._open_capacity.get(pool)
            if current and (current.gpus, current.unhealthy_gpus) == (count, unhealthy[pool]):
                continue
            facts = self.facts.get(pool)
            self._switch(
                self.capacity,
                self._open_capacity,
                Interval(
                    key=pool,
                    pool=pool,
                    gpu_type=facts.gpu_type if facts else "",
                    gpus=count,
                    start=self.at(t),
                    end=None,
                    price_per_gpu_hour=facts.price_per_gpu_hour if facts else None,
                    unhealthy_gpus=unhealthy[pool],
                ),
            )

    def reservations_at(self, t: float) -> None:
        """The reservations in force at `t` (one that expired ends its interval)."""
        when = self.at(t)
        for name, reservation in self.fleet.reservations.items():
            expires = reservation.spec.expires_utc
            active = expires is None or expires > when
            current = self._open_reservations.get(name)
            if active and current is None:
                spec = reservation.spec
                self._switch(
                    self.reservations,
                    self._open_reservations,
                    Interval(
                        key=name,
                        pool=spec.pool,
                        gpu_type="",
                        gpus=spec.gpus,
                        start=when,
                        end=None,
                        team=spec.team,
                    ),
                )
            elif not active and current is not None:
                self._close(self.reservations, self._open_reservations, name, when)

    def finish(self, t: float) -> None:
        for opened, closed in (
            (self._open_capacity, self.capacity),
            (self._open_reservations, self.reservations),
        ):
            for key in list(opened):
                self._close(closed, opened, key, self.at(t))

    def _switch(
        self, closed: list[Interval], opened: dict[str, Interval], interval: Interval
    ) -> None:
        if interval.key in opened:
            self._close(closed, opened, interval.key, interval.start)
        opened[interval.key] = interval

    @staticmethod
    def _close(closed: list[Interval], opened: dict[str, Interval], key: str, at: datetime) -> None:
        interval = opened.pop(key)
        if at > interval.start:
            closed.append(replace(interval, end=at))
