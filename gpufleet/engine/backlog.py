"""The waiting workloads, in queue order and by question.

A backlog holds thousands of waiting workloads but few questions: what decides a workload's
admission besides the cluster's state is its team, shape and constraints (`Workload.shape`),
and a preempted workload's back-off. While nothing is admitted, the answer for a question's
first workload is the answer for the rest, so a pass over the queue visits the next workload of
each question that has not failed yet, in queue order, and after an admission every question
again: the work of a pass grows with the questions and the admissions, not with the backlog.

A cycle builds the backlog from its snapshot. A replay that changes a few workloads per cycle
(the simulator) keeps one `Backlog` up to date instead and hands it to every cycle, so that no
cycle sorts, groups or reports on the whole backlog again (`decide(..., backlog=...)`).
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Collection, Iterable, Iterator, Mapping
from datetime import datetime
from typing import Any

from gpufleet.engine.types import Policy, Reason, Workload

# a question: a shape (Workload.shape, priority as capped by the policy), or PERSONAL and a shape
Question = tuple[Any, ...]
# first element of the question of a workload that may be backing off: it is asked on its own
PERSONAL = None
# place in the queue (Workload.queue_order, priority as capped): unique, the name last
OrderKey = tuple[Any, ...]


class Backlog:
    """Waiting workloads by question, each question's in queue order."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.by_name: dict[str, Workload] = {}
        self.version = 0  # changes with every add and remove
        self._question: dict[str, Question] = {}
        self._key: dict[str, OrderKey] = {}
        self._positions: dict[Question, list[OrderKey]] = {}
        self._backoff_ends: list[tuple[datetime, str]] = []  # of PERSONAL questions (a heap)
        self._now: datetime | None = None

    @classmethod
    def of(cls, workloads: Iterable[Workload], policy: Policy, now: datetime) -> Backlog:
        backlog = cls(policy)
        backlog._now = now
        for workload in sorted(workloads, key=backlog.order_key):
            backlog.add(workload)
        return backlog

    def order_key(self, workload: Workload) -> OrderKey:
        if not self.policy.max_priority:
            return workload.queue_order
        rank, _, submitted, name = workload.queue_order
        return (rank, -self.policy.priority_of(workload), submitted, name)

    def shape(self, workload: Workload) -> Question:
        if not self.policy.max_priority:
            return workload.shape
        team, reserved, _, *rest = workload.shape
        return (team, reserved, self.policy.priority_of(workload), *rest)

    def add(self, workload: Workload) -> None:
        name = workload.name
        if name in self.by_name:
            raise ValueError(f"workload {name} is already waiting")
        key, question = self.order_key(workload), self.shape(workload)
        if workload.preempted_from is not None and workload.preempted_at is not None:
            ends = workload.preempted_at + self.policy.backoff
            if self._now is None or self._now < ends:
                question = (PERSONAL, *question)
                heapq.heappush(self._backoff_ends, (ends, name))
        self.by_name[name], self._key[name], self._question[name] = workload, key, question
        positions = self._positions.setdefault(question, [])
        if not positions or positions[-1] < key:
            positions.append(key)
        else:
            bisect.insort(positions, key)
        self.version += 1

    def remove(self, name: str) -> Workload:
        workload = self.by_name.pop(name)
        key, question = self._key.pop(name), self._question.pop(name)
        positions = self._positions[question]
        del positions[bisect.bisect_left(positions, key)]
        if not positions:
            del self._positions[question]
        self.version += 1
        return workload

    def at(self, now: datetime) -> Backlog:
        """The backlog at time `now`: workloads whose back-off has ended ask their shape's
        question again. Time only moves forward."""
        if self._now is not None and now < self._now:
            raise ValueError(f"a backlog at {self._now.isoformat()} cannot go back to {now}")
        self._now = now
        while self._backoff_ends and self._backoff_ends[0][0] <= now:
            ends, name = heapq.heappop(self._backoff_ends)
            workload = self.by_name.get(name)
            if (
                workload is None
                or self._question[name][0] is not PERSONAL
                or workload.preempted_at is None
                or workload.preempted_at + self.policy.backoff != ends
            ):
                continue  # gone, or waiting again since with a back-off of its own
            self.remove(name)
            self.add(workload)
        return self

    def __len__(self) -> int:
        return len(self.by_name)

    def questions(self) -> Iterable[Question]:
        return self._positions

    def workload(self, key: OrderKey) -> Workload:
        return self.by_name[key[-1]]

    def heads(
        self, after: OrderKey | None = None, questions: Iterable[Question] | None = None
    ) -> list[tuple[OrderKey, Question]]:
        """The first place after `after` (from the start: None) of each question (all by
        default), as a heap of (place, question): places are unique, so questions are never
        compared."""
        heads = []
        for question in self._positions if questions is None else questions:
            positions = self._positions[question]
            i = 0 if after is None else bisect.bisect_right(positions, after)
            if i < len(positions):
                heads.append((positions[i], question))
        heads.sort(key=_first)
        return heads

    def after(self, question: Question, key: OrderKey) -> OrderKey | None:
        """The question's next place after `key`, if any."""
        positions = self._positions[question]
        i = bisect.bisect_right(positions, key)
        return positions[i] if i < len(positions) else None

    def in_order(self, questions: Iterable[Question] | None = None) -> Iterator[Workload]:
        """The workloads (of the questions; all by default) in queue order."""
        chosen = self._positions if questions is None else questions
        for key in heapq.merge(*(self._positions[q] for q in chosen)):
            yield self.by_name[key[-1]]

    def question_of(self, name: str) -> Question:
        return self._question[name]

    def members(self, question: Question) -> list[str]:
        return [key[-1] for key in self._positions.get(question, ())]


class WaitingReasons(Mapping[str, Reason]):
    """Why each workload of a backlog still waits after a cycle, read from the answers to its
    questions without a record per workload (read it before the backlog changes)."""

    def __init__(
        self,
        backlog: Backlog,
        answers: dict[Question, Reason],
        own: dict[str, Reason],
        admitted: Collection[str],
    ) -> None:
        self._backlog, self._answers, self._own, self._admitted = backlog, answers, own, admitted
        self._version = backlog.version

    def _current(self) -> Backlog:
        if self._backlog.version != self._version:
            raise RuntimeError("the backlog changed after the cycle: read its reasons first")
        return self._backlog

    def __getitem__(self, name: str) -> Reason:
        backlog = self._current()
        if name in self._admitted or name not in backlog.by_name:
            raise KeyError(name)
        if name in self._own:
            return self._own[name]
        return self._answers[backlog.question_of(name)]

    def __iter__(self) -> Iterator[str]:
        backlog = self._current()
        for name in backlog.by_name:
            if name not in self._admitted:
                yield name

    def __len__(self) -> int:
        backlog = self._current()
        return len(backlog) - sum(name in backlog.by_name for name in self._admitted)

    def waiting_for(self, reasons: Collection[Reason]) -> list[str]:
        """The workloads that wait for one of `reasons`, question by question."""
        backlog = self._current()
        names = [name for name, reason in self._own.items() if reason in reasons]
        for question, reason in self._answers.items():
            if reason in reasons:
                names.extend(n for n in backlog.members(question) if n not in self._admitted)
        return names


def question_shape(question: Question) -> tuple[Any, ...]:
    """The shape a question is about (a personal question is PERSONAL and the shape)."""
    return question[1:] if question[0] is PERSONAL else question


def _first(head: tuple[OrderKey, Question]) -> OrderKey:
    return head[0]
