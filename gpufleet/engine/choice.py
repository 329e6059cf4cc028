"""Which pools a workload accepts, and the order in which a cycle tries them (R2).

A workload names one pool, a list of GPU types in order of preference ("H100 or else A100"),
or neither (any pool). Its pools are tried in that order under the same rules as one pool: a
reservation is used where it has room, elastic work takes free GPUs, then new nodes, then
preempts, each step in every accepted pool before the next step; a pool it did not accept is
never touched, for placement or preemption. Within one preference (any pool, or several pools
of one type), reserved work goes where the team's unused reservation is largest and elastic
work where its own team's idle reservation covers most of it, then where it fits best: where
the pod's node is left with the least room (as `PoolCapacity.choose` picks inside a pool), so
that an idle GPU of one pool is not split while another pool has a partly used one it fits.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from gpufleet.engine.placement import PoolCapacity
from gpufleet.engine.types import PoolInfo, Workload


def acceptable_pools(workload: Workload, pools: Mapping[str, PoolInfo]) -> list[str]:
    """The pools the workload may run in, the most preferred first (then by name); a fraction
    of a GPU only where the pool shares GPUs."""
    names = [workload.pool] if workload.pool else sorted(pools)
    names = [n for n in names if n in pools and (pools[n].sharing or not workload.fractional)]
    if not workload.gpu_types:
        return names
    rank = preference_ranks(workload)
    return sorted(
        (n for n in names if pools[n].gpu_type in rank), key=lambda n: rank[pools[n].gpu_type]
    )


def preference_ranks(workload: Workload) -> dict[str, int]:
    """Each accepted GPU type's place in the workload's preference, 0 first."""
    rank: dict[str, int] = {}
    for gpu_type in workload.gpu_types:
        rank.setdefault(gpu_type, len(rank))
    return rank


def reserved_order(
    workload: Workload,
    names: list[str],
    pools: Mapping[str, PoolInfo],
    unused: Callable[[str], int],
) -> list[str]:
    """Pools for reserved work (`names`: those whose unused reservation covers it): the most
    preferred type, then the largest unused reservation, then by name."""
    rank = preference_ranks(workload)
    return sorted(names, key=lambda p: (rank.get(pools[p].gpu_type, 0), -unused(p), p))


def elastic_order(
    workload: Workload,
    names: list[str],
    pools: Mapping[str, PoolInfo],
    capacity: Mapping[str, PoolCapacity],
    covered: Callable[[str], int],
) -> list[str]:
    """Pools for elastic work: the most preferred type, then where the team's own idle
    reservation covers most of it (`covered`), then where it fits best
    (`PoolCapacity.fit_key`), then by name. One pool needs no ranking."""
    if len(names) < 2:
        return list(names)
    rank = preference_ranks(workload)
    return sorted(
        names,
        key=lambda p: (
            rank.get(pools[p].gpu_type, 0),
            -covered(p),
            capacity[p].fit_key(workload),
            p,
        ),
    )
