"""Team tree -> KAI Scheduler Queues (`scheduling.run.ai/v2`).

The queues mirror the engine's accounting so KAI never second-guesses an admission: a queue's
GPU quota is what its team subtree has reserved, its over-quota weight is the team's
`burstingPriority`, and its limit follows the team's `burstLimit`. CPU and memory are left
unlimited: gpufleet manages GPUs only.

KAI accepts jobs only in leaf queues. A team with child teams that also holds reservations of its
own gets an extra leaf queue, `<team>-own`, for its own workloads.
"""

from __future__ import annotations

from typing import Any

from gpufleet.model.api import Team
from gpufleet.model.bursting import UNLIMITED, burst_ceiling
from gpufleet.model.fleet import Fleet
from gpufleet.model.keys import TEAM_LABEL
from gpufleet.render.common import Manifest, managed_labels, manifest

QUEUE_API = "scheduling.run.ai/v2"
OWN_QUEUE_SUFFIX = "-own"


def queue_name_for_team(fleet: Fleet, team: str) -> str:
    """The leaf queue that the workloads of `team` are submitted to."""
    if fleet.children(team):
        return team + OWN_QUEUE_SUFFIX
    return team


def _queue(
    name: str, parent: str | None, team: Team, quota: float, display: str, min_runtime: str
) -> Manifest:
    unlimited = {"quota": UNLIMITED, "limit": UNLIMITED, "overQuotaWeight": 1}
    spec: dict[str, Any] = {"displayName": display}
    if parent:
        spec["parentQueue"] = parent
    spec["preemptMinRuntime"] = min_runtime
    spec["reclaimMinRuntime"] = min_runtime
    spec["resources"] = {
        "gpu": {
            "quota": quota,
            "limit": burst_ceiling(team, quota),
            "overQuotaWeight": team.spec.bursting_priority,
        },
        "cpu": unlimited,
        "memory": unlimited,
    }
    return manifest(QUEUE_API, "Queue", name, spec, managed_labels(**{TEAM_LABEL: team.name}))


def render_kai_queues(fleet: Fleet) -> list[Manifest]:
    min_runtime = fleet.policy.preemption.min_runtime
    out = []
    for name in sorted(fleet.teams):
        team = fleet.teams[name]
        subtree_quota = sum(fleet.reserved_gpus(t) for t in fleet.subtree(name))
        parent = team.spec.parent if team.spec.parent in fleet.teams else None
        out.append(_queue(name, parent, team, subtree_quota, name, min_runtime))
        own = fleet.reserved_gpus(name)
        if fleet.children(name) and own:
            out.append(
                _queue(
                    name + OWN_QUEUE_SUFFIX, name, team, own, f"{name} (own workloads)", min_runtime
                )
            )
    return out
