"""The health controller's decisions: which nodes to quarantine, keep, or release.

Input: every GPU node with its `GPUHealthy` condition (written by the node agent) and what the
controller recorded on it before; output: actions for the shell to apply. Guard rails, all from
`FleetPolicy.spec.health`:

- at most `maxQuarantinedPercent` of a pool's nodes are quarantined at once (at least one node,
  so a small pool can still isolate a bad node); further findings are reported, not acted on;
- a circuit breaker: when nodes with fatal findings first seen within `breakerWindow` reach
  `breakerPercent` of all GPU nodes, no new quarantine happens until a person resets it (a bad
  rule or a driver roll-out must not empty the fleet);
- escalation: a node quarantined `escalateAfter` times within `escalationWindow` stays
  quarantined until a person releases it;
- a node leaves quarantine only after its agent has reported healthy for `probation`, or when a
  person releases it (`gpufleet nodes release NAME`, recorded on the node).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum

from gpufleet.model.api import HealthPolicy
from gpufleet.model.durations import parse_duration
from gpufleet.model.keys import (
    QUARANTINE_ESCALATED_ANNOTATION,
    QUARANTINE_HISTORY_ANNOTATION,
    RELEASE_ANNOTATION,
)


class ActionKind(StrEnum):
    QUARANTINE = "Quarantined"
    RELEASE = "Released"
    MANUAL_RELEASE = "ReleasedManually"
    ESCALATE = "QuarantineEscalated"
    BLOCKED_LIMIT = "QuarantineLimitReached"
    BLOCKED_BREAKER = "QuarantineBreakerOpen"


@dataclass(frozen=True)
class NodeHealth:
    name: str
    pool: str
    healthy: bool | None  # the GPUHealthy condition; None: no agent report
    reason: str = ""
    message: str = ""
    since: datetime | None = None  # lastTransitionTime of the condition
    quarantined: bool = False  # has our taint
    annotations: dict[str, str] = field(default_factory=dict)
    heartbeat: datetime | None = None  # lastHeartbeatTime of the condition

    def agent_silent(self, now: datetime, timeout: timedelta) -> bool:
        return agent_silent(self.healthy, self.heartbeat, now, timeout)

    def history(self) -> list[datetime]:
        raw = self.annotations.get(QUARANTINE_HISTORY_ANNOTATION, "")
        return [datetime.fromisoformat(t) for t in raw.split(",") if t]


@dataclass(frozen=True)
class Action:
    node: str
    kind: ActionKind
    message: str
    history: tuple[datetime, ...] = ()  # for QUARANTINE: the new quarantine history


@dataclass(frozen=True)
class Plan:
    actions: tuple[Action, ...]
    trip_breaker: bool = False
    blocked: dict[str, int] = field(default_factory=dict)  # pool -> nodes left unquarantined


def agent_silent(
    reported: bool | None, heartbeat: datetime | None, now: datetime, timeout: timedelta
) -> bool:
    """An agent that has reported on its node (a GPUHealthy condition exists) but whose last
    heartbeat is older than `timeout`: the node's GPU health is unknown. A node with no report
    at all runs no agent and is left as it is."""
    if reported is None:
        return False
    return heartbeat is None or now - heartbeat > timeout


def fault_score(history: list[datetime], now: datetime, half_life: timedelta) -> float:
    """A node's recent faults: each quarantine counts 1 and halves every `half_life`."""
    ages = [max((now - t).total_seconds(), 0.0) for t in history]
    return float(sum(0.5 ** (age / half_life.total_seconds()) for age in ages))


def limit_for(pool_nodes: int, percent: int) -> int:
    return max(1, pool_nodes * percent // 100) if percent else 0


def decide(
    nodes: list[NodeHealth], policy: HealthPolicy, now: datetime, breaker_open: bool
) -> Plan:
    probation = parse_duration(policy.probation)
    escalation = parse_duration(policy.escalation_window)
    actions: list[Action] = []
    per_pool: dict[str, list[NodeHealth]] = defaultdict(list)
    for node in nodes:
        per_pool[node.pool].append(node)
    quarantined: dict[str, int] = defaultdict(int)
    for node in nodes:
        if node.quarantined:
            quarantined[node.pool] += 1

    for node in sorted(nodes, key=lambda n: n.name):
        if not node.quarantined:
            continue
        if RELEASE_ANNOTATION in node.annotations:
            who = node.annotations[RELEASE_ANNOTATION] or "a person"
            actions.append(Action(node.name, ActionKind.MANUAL_RELEASE, f"released by {who}"))
            quarantined[node.pool] -= 1
        elif node.annotations.get(QUARANTINE_ESCALATED_ANNOTATION):
            continue  # stays until a person releases it
        elif node.healthy and node.since is not None and now - node.since >= probation:
            actions.append(
                Action(
                    node.name,
                    ActionKind.RELEASE,
                    f"GPUs healthy again for {_human(now - node.since)} "
                    f"(probation {policy.probation})",
                )
            )
            quarantined[node.pool] -= 1

    # fatal findings not acted on yet, oldest first
    candidates = sorted(
        (n for n in nodes if n.healthy is False and not n.quarantined),
        key=lambda n: (n.since or now, n.name),
    )
    window = parse_duration(policy.breaker_window)
    recent = [n for n in nodes if n.healthy is False and n.since and now - n.since <= window]
    trip = bool(
        candidates
        and not breaker_open
        and len(recent) * 100 >= policy.breaker_percent * max(len(nodes), 1)
    )
    blocked: dict[str, int] = defaultdict(int)
    for node in candidates:
        what = f"{node.reason}: {node.message}" if node.message else node.reason
        if breaker_open or trip:
            actions.append(
                Action(
                    node.name,
                    ActionKind.BLOCKED_BREAKER,
                    f"not quarantined: the health circuit breaker is open ({what}); "
                    "reset it with `gpufleet nodes reset-breaker` once the cause is understood",
                )
            )
            blocked[node.pool] += 1
            continue
        limit = limit_for(len(per_pool[node.pool]), policy.max_quarantined_percent)
        if quarantined[node.pool] >= limit:
            actions.append(
                Action(
                    node.name,
                    ActionKind.BLOCKED_LIMIT,
                    f"not quarantined: pool {node.pool} already has {quarantined[node.pool]} of "
                    f"{len(per_pool[node.pool])} nodes quarantined (maxQuarantinedPercent "
                    f"{policy.max_quarantined_percent}) ({what})",
                )
            )
            blocked[node.pool] += 1
            continue
        history = (*tuple(t for t in node.history() if now - t <= escalation), now)
        quarantined[node.pool] += 1
        actions.append(Action(node.name, ActionKind.QUARANTINE, what, history))
        if len(history) >= policy.escalate_after:
            actions.append(
                Action(
                    node.name,
                    ActionKind.ESCALATE,
                    f"quarantined {len(history)} times within {policy.escalation_window}: it "
                    "stays quarantined until released by hand (`gpufleet nodes release`)",
                )
            )
    return Plan(tuple(actions), trip, dict(blocked))


def _human(delta: timedelta) -> str:
    seconds = int(delta.total_seconds())
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    return f"{seconds // 3600}h"
