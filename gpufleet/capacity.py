"""Capacity summary of a fleet: what each pool holds and what each team is guaranteed.

Pure data; the CLI prints it as a table, JSON or YAML.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from gpufleet.model.bursting import UNLIMITED, burst_ceiling
from gpufleet.model.fleet import Fleet

HOURS_PER_MONTH = 730  # 365 * 24 / 12


@dataclass(frozen=True)
class PoolCapacity:
    name: str
    provider: str
    gpu_type: str
    max_gpus: int
    reserved_gpus: int
    unreserved_gpus: int
    reserved_percent: float
    price_per_gpu_hour: float | None  # what a reserved GPU costs: reserved, else on-demand
    reserved_cost_per_month: float | None
    allocated_gpus: float | None = None  # live only (from the pool's status)
    idle_gpus: float | None = None


@dataclass(frozen=True)
class TeamCapacity:
    name: str
    parent: str | None
    depth: int
    bursting_priority: int
    burst_limit: str | None
    reserved_gpus: dict[str, int]  # pool -> GPUs reserved by the team itself
    own_reserved_gpus: int
    subtree_reserved_gpus: int  # the team and all its descendants
    max_usable_gpus: float | None  # reservations plus burst limit; None: unlimited
    used_gpus: float | None = None  # live only (from the team's status)
    borrowed_gpus: float | None = None


@dataclass(frozen=True)
class CapacitySummary:
    pools: list[PoolCapacity] = field(default_factory=list)
    teams: list[TeamCapacity] = field(default_factory=list)

    @property
    def total_max_gpus(self) -> int:
        return sum(p.max_gpus for p in self.pools)

    @property
    def total_reserved_gpus(self) -> int:
        return sum(p.reserved_gpus for p in self.pools)

    def to_dict(self) -> dict[str, Any]:
        return {
            "pools": [asdict(p) for p in self.pools],
            "teams": [asdict(t) for t in self.teams],
            "totals": {"maxGPUs": self.total_max_gpus, "reservedGPUs": self.total_reserved_gpus},
        }


def summarize(
    fleet: Fleet, live: dict[tuple[str, str], dict[str, Any]] | None = None
) -> CapacitySummary:
    """The summary; with `live` ((kind, name) -> status) it includes what is in use now."""
    pools = []
    for name in sorted(fleet.pools):
        spec = fleet.pools[name].spec
        reserved = fleet.reserved_in_pool(name)
        prices = spec.price_per_gpu_hour
        price = None
        if prices is not None:
            price = prices.reserved if prices.reserved is not None else prices.on_demand
        pools.append(
            PoolCapacity(
                name=name,
                provider=spec.provider,
                gpu_type=spec.gpu_type,
                max_gpus=spec.max_gpus,
                reserved_gpus=reserved,
                unreserved_gpus=max(spec.max_gpus - reserved, 0),
                reserved_percent=round(100 * reserved / spec.max_gpus, 1) if spec.max_gpus else 0.0,
                price_per_gpu_hour=price,
                reserved_cost_per_month=(
                    round(reserved * price * HOURS_PER_MONTH, 2) if price is not None else None
                ),
                **_live(
                    live, ("GPUPool", name), allocated_gpus="allocatedGPUs", idle_gpus="idleGPUs"
                ),
            )
        )
    teams = []
    for root in fleet.roots():
        for name in fleet.subtree(root):
            team = fleet.teams[name]
            depth, parent = 0, team.spec.parent
            while parent in fleet.teams and depth < len(fleet.teams):
                depth += 1
                parent = fleet.teams[parent].spec.parent
            own = fleet.reserved_gpus(name)
            ceiling = burst_ceiling(team, own)
            teams.append(
                TeamCapacity(
                    name=name,
                    parent=team.spec.parent,
                    depth=depth,
                    bursting_priority=team.spec.bursting_priority,
                    burst_limit=team.spec.burst_limit,
                    reserved_gpus={
                        p: fleet.reserved_gpus(name, p)
                        for p in sorted(fleet.pools)
                        if fleet.reserved_gpus(name, p)
                    },
                    own_reserved_gpus=own,
                    subtree_reserved_gpus=sum(fleet.reserved_gpus(t) for t in fleet.subtree(name)),
                    max_usable_gpus=None if ceiling == UNLIMITED else ceiling,
                    **_live(
                        live, ("Team", name), used_gpus="usedGPUs", borrowed_gpus="borrowedGPUs"
                    ),
                )
            )
    return CapacitySummary(pools, teams)


def _live(
    live: dict[tuple[str, str], dict[str, Any]] | None, key: tuple[str, str], **fields: str
) -> dict[str, Any]:
    if live is None:
        return {}
    status = live.get(key, {})
    return {attr: status.get(source, 0) for attr, source in fields.items()}
