"""The policies a replay runs under, as objects of one interface: gpufleet's engine as it is, a
static partition (every team only on its reservations) and FIFO (one shared queue, nothing
reserved). The simulator asks a policy four questions and has no branch of its own per policy.
"""

from __future__ import annotations

from collections.abc import Mapping

from gpufleet.engine import TeamInfo

SHARED_QUEUE = "(shared queue)"  # the one team of the fifo policy, inside the engine
Reservations = dict[tuple[str, str], int]
Expiries = list[tuple[float, str]]  # (seconds into the run, reservation) of each expiry


class SimPolicy:
    """gpufleet as it is: teams, reservations and priorities as declared; a job of class
    `auto` is reserved while its team's reservations cover it, elastic otherwise, and turns
    elastic when its reservation is exhausted while it waits."""

    name = "gpufleet"
    # an auto job that waits because its team's reservations are used up may borrow instead
    turns_auto_elastic = True
    arrival_class: str | None = None  # the class of every job, whatever it declares

    def fleet(
        self,
        teams: dict[str, TeamInfo],
        reservations: Reservations,
        expiries: Expiries,
    ) -> tuple[dict[str, TeamInfo], Reservations, Expiries]:
        """The teams, reservations and reservation expiries the engine sees."""
        return teams, reservations, expiries

    def class_on_arrival(
        self,
        declared: str,
        team: str,
        gpus: float,
        reserved_demand: Mapping[str, float],
        reserved: Mapping[str, int],
    ) -> str:
        """The class a job of `declared` class is admitted as when it arrives."""
        if self.arrival_class is not None:
            return self.arrival_class
        if declared != "auto":
            return declared
        fits = reserved_demand[team] + gpus <= reserved.get(team, 0)
        return "reserved" if fits else "elastic"

    def team_of(self, team: str) -> str:
        """The team the engine sees a job of `team` as."""
        return team

    def priority_of(self, priority: int) -> int:
        return priority


class StaticPartition(SimPolicy):
    """Every job runs on its team's reservations only: nothing is borrowed or lent."""

    name = "static-partition"
    turns_auto_elastic = False
    arrival_class = "reserved"


class Fifo(SimPolicy):
    """One queue for everybody, in arrival order: no reservation, team or priority."""

    name = "fifo"
    turns_auto_elastic = False
    arrival_class = "elastic"

    def fleet(
        self,
        teams: dict[str, TeamInfo],
        reservations: Reservations,
        expiries: Expiries,
    ) -> tuple[dict[str, TeamInfo], Reservations, Expiries]:
        return {SHARED_QUEUE: TeamInfo(SHARED_QUEUE, None, 1, None)}, {}, []

    def team_of(self, team: str) -> str:
        return SHARED_QUEUE

    def priority_of(self, priority: int) -> int:
        return 50


BY_NAME: dict[str, SimPolicy] = {p.name: p for p in (SimPolicy(), StaticPartition(), Fifo())}
POLICIES = tuple(BY_NAME)


def policy_named(name: str) -> SimPolicy:
    if name not in BY_NAME:
        raise ValueError(f"unknown policy {name!r}: use one of {', '.join(POLICIES)}")
    return BY_NAME[name]
