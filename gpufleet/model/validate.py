"""Cross-object checks of a fleet: references, the team tree, capacity and provider settings.

Schema problems (types, ranges, unknown fields) are found while loading (`load_fleet`); this
module checks what only makes sense across objects. Each check is a small function that returns
problems, so every check can be tested on its own.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path

from gpufleet.model.api import GPUPool, GPUPoolSpec, Resource, WorkloadTemplate
from gpufleet.model.azure import AZURE_GPU_SIZES, AZURE_ZONE, azure_size
from gpufleet.model.fleet import Fleet, load_fleet, merged_policy_settings
from gpufleet.model.problems import Problem, Severity
from gpufleet.model.suggest import did_you_mean

# aws: family.size (p5.48xlarge); gcp: family-type-size (a3-highgpu-8g)
# provider -> (what it calls a node's type, the article and name, an example)
CLOUDS = {
    "aws": ("instance types", "an AWS", "p5.48xlarge"),
    "gcp": ("machine types", "a GCP", "a3-highgpu-8g"),
    "azure": ("VM sizes", "an Azure", "Standard_ND96isr_H100_v5"),
}
AWS_INSTANCE_TYPE = re.compile(r"^[a-z][a-z0-9-]*\.[a-z0-9-]+$")
GCP_MACHINE_TYPE = re.compile(r"^[a-z][a-z0-9]*(-[a-z0-9]+)+$")


def _at(
    fleet: Fleet,
    obj: Resource,
    path: tuple[str | int, ...],
    severity: Severity,
    message: str,
    code: str,
) -> Problem:
    source = fleet.source_of(obj)
    label = f"{obj.kind_name}/{obj.name}"
    return Problem(source.file, source.line_of(path), severity, f"{label}: {message}", code, label)


def check_references(fleet: Fleet) -> list[Problem]:
    problems = []
    for team in fleet.teams.values():
        parent = team.spec.parent
        if parent is not None and not fleet.exists("Team", parent):
            problems.append(
                _at(
                    fleet,
                    team,
                    ("spec", "parent"),
                    "error",
                    f"parent team {parent!r} does not exist"
                    f"{did_you_mean(parent, list(fleet.teams))}",
                    "UnknownTeam",
                )
            )
    for res in fleet.reservations.values():
        if not fleet.exists("Team", res.spec.team):
            problems.append(
                _at(
                    fleet,
                    res,
                    ("spec", "team"),
                    "error",
                    f"team {res.spec.team!r} does not exist"
                    f"{did_you_mean(res.spec.team, list(fleet.teams))}; define a Team of that name",
                    "UnknownTeam",
                )
            )
        if not fleet.exists("GPUPool", res.spec.pool):
            problems.append(
                _at(
                    fleet,
                    res,
                    ("spec", "pool"),
                    "error",
                    f"pool {res.spec.pool!r} does not exist"
                    f"{did_you_mean(res.spec.pool, list(fleet.pools))}; "
                    "define a GPUPool of that name",
                    "UnknownPool",
                )
            )
    for template in fleet.templates.values():
        problems += _template_problems(fleet, template)
    return problems


def _template_problems(fleet: Fleet, template: WorkloadTemplate) -> list[Problem]:
    spec = template.spec
    problems = []
    if spec.team is not None and not fleet.exists("Team", spec.team):
        known = did_you_mean(spec.team, list(fleet.teams))
        said = f"team {spec.team!r} does not exist{known}"
        problems.append(_at(fleet, template, ("spec", "team"), "error", said, "UnknownTeam"))
    if spec.pool is not None and not fleet.exists("GPUPool", spec.pool):
        known = did_you_mean(spec.pool, list(fleet.pools))
        said = f"pool {spec.pool!r} does not exist{known}"
        problems.append(_at(fleet, template, ("spec", "pool"), "error", said, "UnknownPool"))
    if spec.kind == "pod" and spec.pods != 1:
        said = "a bare pod is one pod: set pods: 1, or kind: job for a gang"
        problems.append(_at(fleet, template, ("spec", "pods"), "error", said, "PodGang"))
    return problems


def check_team_cycles(fleet: Fleet) -> list[Problem]:
    problems = []
    reported: set[str] = set()
    for start in sorted(fleet.teams):
        path = [start]
        current = fleet.teams[start].spec.parent
        while current is not None and current in fleet.teams and current not in path:
            path.append(current)
            current = fleet.teams[current].spec.parent
        if current is None or current not in path:
            continue
        cycle = path[path.index(current) :]
        if reported.intersection(cycle):
            continue
        reported.update(cycle)
        loop = " -> ".join([*cycle, current])
        for name in cycle:
            problems.append(
                _at(
                    fleet,
                    fleet.teams[name],
                    ("spec", "parent"),
                    "error",
                    f"the team tree has a cycle ({loop}); remove the parent of one of these teams",
                    "TeamCycle",
                )
            )
    return problems


def check_pool_capacity(fleet: Fleet) -> list[Problem]:
    problems = []
    for pool in fleet.pools.values():
        reserved = fleet.reserved_in_pool(pool.name)
        if reserved > pool.spec.max_gpus:
            holders = ", ".join(
                f"{r.name} ({r.spec.gpus})"
                for r in sorted(fleet.reservations.values(), key=lambda r: r.name)
                if r.spec.pool == pool.name
            )
            problems.append(
                _at(
                    fleet,
                    pool,
                    ("spec", "maxGPUs"),
                    "error",
                    f"reservations add up to {reserved} GPUs but maxGPUs is {pool.spec.max_gpus} "
                    f"({holders}); raise maxGPUs or lower the reservations",
                    "OverReserved",
                )
            )
        if pool.spec.max_gpus % pool.spec.gpus_per_node:
            problems.append(
                _at(
                    fleet,
                    pool,
                    ("spec", "maxGPUs"),
                    "warning",
                    f"maxGPUs {pool.spec.max_gpus} is not a multiple of gpusPerNode "
                    f"{pool.spec.gpus_per_node}; the last node can never be used in full",
                    "PartialNode",
                )
            )
    return problems


def check_expiry(fleet: Fleet, now: datetime) -> list[Problem]:
    problems = []
    for res in fleet.reservations.values():
        expires = res.spec.expires_utc
        if expires is None:
            continue
        if expires <= now:
            problems.append(
                _at(
                    fleet,
                    res,
                    ("spec", "expiresAt"),
                    "warning",
                    f"expired on {expires.isoformat()}; it no longer guarantees GPUs to "
                    f"team {res.spec.team!r}. Remove it or extend expiresAt",
                    "Expired",
                )
            )
    return problems


def check_provider_settings(fleet: Fleet) -> list[Problem]:
    problems: list[Problem] = []
    for pool in fleet.pools.values():
        problems.extend(_provider_problems(fleet, pool))
    return problems


def _provider_problems(fleet: Fleet, pool: GPUPool) -> list[Problem]:
    spec = pool.spec
    out = []

    def add(path: tuple[str | int, ...], message: str, severity: Severity = "error") -> None:
        out.append(_at(fleet, pool, ("spec", *path), severity, message, "ProviderSettings"))

    if spec.provider in CLOUDS:
        noun, article, example = CLOUDS[spec.provider]
        if not spec.instance_types:
            add(
                ("provider",),
                f"{article} pool needs instanceTypes (the {noun} "
                f"Karpenter may launch), e.g. instanceTypes: [{example}]",
            )
        if spec.provider == "azure":
            out.extend(_azure_problems(fleet, pool))
        pattern = AWS_INSTANCE_TYPE if spec.provider == "aws" else GCP_MACHINE_TYPE
        for index, itype in enumerate(spec.instance_types):
            if spec.provider != "azure" and not pattern.match(itype):
                add(
                    ("instanceTypes", index),
                    f"{itype!r} does not look like {article} {noun[:-1]} (e.g. {example})",
                )
        if spec.node_selector:
            add(
                ("nodeSelector",),
                "nodeSelector is only used by static pools; "
                "Karpenter labels the nodes of this pool itself",
                "warning",
            )
        for other in CLOUDS:
            if other != spec.provider and getattr(spec, other) is not None:
                add((other,), f"{other} settings on {article} pool have no effect; remove them")
    else:
        if not spec.node_selector:
            add(
                ("provider",),
                "a static pool needs a nodeSelector that picks its existing "
                "nodes, e.g. nodeSelector: {nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3}",
            )
        for key in ("instanceTypes", *CLOUDS):
            if key in _set_fields(spec):
                add(
                    (key,),
                    f"{key} has no effect on a static pool (gpufleet does not "
                    "launch its nodes); remove it",
                    "warning",
                )
    if spec.provider == "aws":
        aws = spec.aws
        if "reserved" in spec.capacity_types and not (aws and aws.capacity_reservation_ids):
            add(
                ("capacityTypes",),
                "capacityTypes includes 'reserved' but "
                "spec.aws.capacityReservationIDs is empty; Karpenter only uses the EC2 "
                "capacity reservations it is given, so list them (cr-...)",
            )
        if aws is None or aws.ami_alias.endswith("@latest"):
            add(
                ("aws",) if aws else ("provider",),
                "the AMI alias is '@latest', so every AMI release replaces all nodes of the pool; "
                "pin a version in spec.aws.amiAlias (e.g. al2023@v20251112) for production",
                "warning",
            )
    if spec.provider == "gcp" and "reserved" in spec.capacity_types:
        add(
            ("capacityTypes",),
            "capacity type 'reserved' is not supported by "
            "karpenter-provider-gcp; use on-demand or spot",
        )
    return out


def _azure_problems(fleet: Fleet, pool: GPUPool) -> list[Problem]:
    """An azure pool's VM sizes are ones gpufleet knows, of its GPU type and GPUs per node;
    its zones are AKS's (`eastus-1`); Karpenter's Azure provider buys on-demand and spot only."""
    spec = pool.spec
    out = []

    def add(path: tuple[str | int, ...], message: str) -> None:
        out.append(_at(fleet, pool, ("spec", *path), "error", message, "ProviderSettings"))

    for index, name in enumerate(spec.instance_types):
        size = azure_size(name)
        if size is None:
            same = sorted(n for n, s in AZURE_GPU_SIZES.items() if s.gpu_type == spec.gpu_type)
            known = f"; the {spec.gpu_type} sizes are {', '.join(same)}" if same else ""
            add(
                ("instanceTypes", index),
                f"{name!r} is not an Azure GPU VM size gpufleet knows"
                f"{did_you_mean(name, AZURE_GPU_SIZES)}{known}",
            )
            continue
        if size.gpu_type != spec.gpu_type:
            add(
                ("instanceTypes", index),
                f"{name} holds {size.gpu_type} GPUs, not the pool's gpuType {spec.gpu_type}",
            )
        if size.gpus != spec.gpus_per_node:
            add(
                ("instanceTypes", index),
                f"{name} has {size.gpus} GPU{'s' * (size.gpus != 1)}, not the pool's "
                f"gpusPerNode {spec.gpus_per_node}: give each size's pool its own GPUPool",
            )
    for index, zone in enumerate(spec.zones):
        if not AZURE_ZONE.match(zone):
            add(("zones", index), f"{zone!r} is not an AKS zone label: write <region>-<n>, "
                "e.g. eastus-1")  # fmt: skip
    if "reserved" in spec.capacity_types:
        add(
            ("capacityTypes",),
            "capacity type 'reserved' is not supported by karpenter-provider-azure; use "
            "on-demand or spot (Azure Spot priority)",
        )
    return out


def _set_fields(spec: GPUPoolSpec) -> set[str]:
    fields = GPUPoolSpec.model_fields
    return {fields[name].alias or name for name in spec.model_fields_set}


def check_namespaces(fleet: Fleet) -> list[Problem]:
    problems = []
    owner: dict[str, str] = {}
    for name in sorted(fleet.teams):
        team = fleet.teams[name]
        for index, namespace in enumerate(team.spec.namespaces):
            if namespace in owner and owner[namespace] != name:
                problems.append(
                    _at(
                        fleet,
                        team,
                        ("spec", "namespaces", index),
                        "error",
                        f"namespace {namespace!r} already belongs to team {owner[namespace]!r}; "
                        "a namespace can belong to one team only",
                        "NamespaceConflict",
                    )
                )
            owner.setdefault(namespace, name)
    return problems


def check_policies(fleet: Fleet) -> list[Problem]:
    problems = []
    for fleet_policy in fleet.policies.values():
        for team in sorted(fleet_policy.spec.admission.max_priority):
            if not fleet.exists("Team", team):
                problems.append(
                    _at(
                        fleet,
                        fleet_policy,
                        ("spec", "admission", "maxPriority", team),
                        "error",
                        f"maxPriority names team {team!r}, which does not exist"
                        f"{did_you_mean(team, list(fleet.teams))}",
                        "UnknownTeam",
                    )
                )
        for index, route in enumerate(fleet_policy.spec.notifications.routes):
            for position, team in enumerate(route.teams):
                if not fleet.exists("Team", team):
                    problems.append(
                        _at(
                            fleet,
                            fleet_policy,
                            ("spec", "notifications", "routes", index, "teams", position),
                            "error",
                            f"notification route {route.name!r} names team {team!r}, which "
                            f"does not exist{did_you_mean(team, list(fleet.teams))}",
                            "UnknownTeam",
                        )
                    )
    for path, policy, earlier in merged_policy_settings(fleet)[1]:
        problems.append(
            _at(
                fleet,
                fleet.policies[policy],
                tuple(path.split(".")),
                "error",
                f"{path} conflicts with FleetPolicy {earlier!r}, which sets it to another value; "
                "set it in one FleetPolicy only",
                "PolicyConflict",
            )
        )
    return problems


def check_clusters(fleet: Fleet) -> list[Problem]:
    """In a fleet of clusters every pool names the cluster its nodes are in, and one that
    exists: a pool in no cluster would be enforced by no controller and sent no work."""
    if not fleet.clusters and not any(p.spec.cluster for p in fleet.pools.values()):
        return []
    problems = []
    for pool in fleet.pools.values():
        cluster = pool.spec.cluster
        if cluster is None:
            message = (
                "names no cluster, but the fleet declares clusters "
                f"({', '.join(sorted(fleet.clusters))}): set spec.cluster to the one whose "
                "nodes hold the pool"
            )
        elif not fleet.exists("Cluster", cluster):
            message = (
                f"cluster {cluster!r} does not exist"
                f"{did_you_mean(cluster, list(fleet.clusters))}; define a Cluster of that name"
            )
        else:
            continue
        problems.append(_at(fleet, pool, ("spec", "cluster"), "error", message, "UnknownCluster"))
    return problems


CHECKS: tuple[Callable[[Fleet], list[Problem]], ...] = (
    check_references,
    check_clusters,
    check_team_cycles,
    check_pool_capacity,
    check_provider_settings,
    check_namespaces,
    check_policies,
)


def validate_fleet(fleet: Fleet, now: datetime | None = None) -> list[Problem]:
    """Run every cross-object check; returns problems sorted by file and line."""
    problems: list[Problem] = []
    for check in CHECKS:
        problems.extend(check(fleet))
    problems.extend(check_expiry(fleet, now or datetime.now(UTC)))
    return sorted(problems)


def validate_paths(
    paths: Sequence[str | Path], now: datetime | None = None
) -> tuple[Fleet, list[Problem]]:
    """Load and check everything under `paths`: the whole of `gpufleet validate`."""
    loaded = load_fleet(paths)
    problems = loaded.problems + validate_fleet(loaded.fleet, now)
    return loaded.fleet, sorted(set(problems))
