"""Preflight decisions from facts the cloud shells gathered. Pure: no cloud SDK here."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Literal

from gpufleet.model.fleet import Fleet
from gpufleet.model.problems import Problem

Severity = Literal["error", "warning"]

# EC2 vCPU quotas by instance family letter and capacity type (Service Quotas codes)
AWS_QUOTAS = {
    ("p", "on-demand"): ("L-417A185B", "Running On-Demand P instances"),
    ("p", "reserved"): ("L-417A185B", "Running On-Demand P instances"),
    ("g", "on-demand"): ("L-DB2E81BA", "Running On-Demand G and VT instances"),
    ("g", "reserved"): ("L-DB2E81BA", "Running On-Demand G and VT instances"),
    ("p", "spot"): ("L-7212CCBC", "All P Spot Instance Requests"),
    ("g", "spot"): ("L-3819A6DF", "All G and VT Spot Instance Requests"),
}


@dataclass
class AwsFacts:
    region: str
    zones: list[str]
    offered: dict[str, set[str]] = field(default_factory=dict)  # instance type -> zones
    vcpus: dict[str, int] = field(default_factory=dict)
    gpus: dict[str, int] = field(default_factory=dict)
    unknown_types: set[str] = field(default_factory=set)
    quotas: dict[str, float | None] = field(default_factory=dict)  # code -> vCPUs; None: unknown
    reservations: dict[str, dict[str, object]] = field(default_factory=dict)  # id -> facts


def _problem(fleet: Fleet, pool: str, severity: Severity, message: str) -> Problem:
    source = fleet.sources.get(("GPUPool", pool))
    file, line = (source.file, source.line) if source else (pool, 0)
    return Problem(file, line, severity, f"GPUPool/{pool}: {message}", "Preflight")


def aws_problems(fleet: Fleet, facts: AwsFacts) -> list[Problem]:
    out: list[Problem] = []
    need: dict[str, float] = defaultdict(float)
    users: dict[str, list[str]] = defaultdict(list)
    for name in sorted(fleet.pools):
        spec = fleet.pools[name].spec
        if spec.provider != "aws":
            continue

        def add(severity: Severity, message: str, pool: str = name) -> None:
            out.append(_problem(fleet, pool, severity, message))

        zones = spec.zones or facts.zones
        nodes = spec.max_gpus // spec.gpus_per_node if spec.gpus_per_node else 0
        usable = []
        for itype in spec.instance_types:
            if itype in facts.unknown_types:
                add("error", f"instance type {itype} does not exist")
                continue
            offered = facts.offered.get(itype, set())
            where = offered & set(zones)
            if not where:
                elsewhere = ", ".join(sorted(offered)) or "no zone"
                add(
                    "error",
                    f"{itype} is not offered in {', '.join(zones)} ({facts.region}); "
                    f"offered in: {elsewhere}",
                )
                continue
            missing = sorted(set(zones) - where)
            if missing:
                add("warning", f"{itype} is not offered in {', '.join(missing)}")
            gpus = facts.gpus.get(itype)
            if gpus is not None and gpus != spec.gpus_per_node:
                add("warning", f"{itype} has {gpus} GPUs, gpusPerNode is {spec.gpus_per_node}")
            usable.append(itype)
        if usable:
            vcpus = max(facts.vcpus.get(t, 0) for t in usable)
            codes = set()
            for capacity in spec.capacity_types:
                quota = AWS_QUOTAS.get((usable[0][0], capacity))
                if quota is None:
                    add("warning", f"no vCPU quota known for {usable[0]} ({capacity})")
                else:
                    codes.add(quota[0])
            for code in sorted(codes):  # a pool grows to maxGPUs once, whatever it pays
                need[code] += nodes * vcpus
                users[code].append(name)
        reservation_ids = spec.aws.capacity_reservation_ids if spec.aws else []
        reserved_nodes = 0
        for rid in reservation_ids:
            found = facts.reservations.get(rid)
            if found is None:
                add("error", f"capacity reservation {rid} not found")
                continue
            if found.get("state") != "active":
                add("error", f"capacity reservation {rid} is {found.get('state')}, not active")
            if found.get("instanceType") not in spec.instance_types:
                add(
                    "error",
                    f"capacity reservation {rid} is for {found.get('instanceType')}, "
                    f"not one of {', '.join(spec.instance_types)}",
                )
            reserved_nodes += int(str(found.get("total", 0)))
        if "reserved" in spec.capacity_types and reservation_ids and reserved_nodes < nodes:
            add(
                "warning",
                f"its reservations hold {reserved_nodes} instances; maxGPUs needs {nodes}",
            )
    for code, wanted in sorted(need.items()):
        limit = facts.quotas.get(code)
        label = next(q[1] for q in AWS_QUOTAS.values() if q[0] == code)
        pools = ", ".join(users[code])
        first = users[code][0]
        if limit is None:
            message = f"quota {code} ({label}) could not be read; {pools} may need {wanted:g} vCPUs"
            out.append(_problem(fleet, first, "warning", message))
        elif limit < wanted:
            message = (
                f"quota {code} ({label}) is {limit:g} vCPUs in {facts.region}; {pools} can grow "
                f"to {wanted:g}: request an increase in Service Quotas"
            )
            out.append(_problem(fleet, first, "error", message))
    return out


@dataclass
class GcpFacts:
    project: str
    region: str
    zones: list[str]
    accelerators: dict[str, set[str]] = field(default_factory=dict)  # accelerator -> zones
    machine_types: dict[str, set[str]] = field(default_factory=dict)  # machine type -> zones
    quotas: dict[str, float] = field(default_factory=dict)  # metric -> limit - usage


def gcp_problems(fleet: Fleet, facts: GcpFacts, accelerators: dict[str, str]) -> list[Problem]:
    out: list[Problem] = []
    for name in sorted(fleet.pools):
        spec = fleet.pools[name].spec
        if spec.provider != "gcp":
            continue

        def add(severity: Severity, message: str, pool: str = name) -> None:
            out.append(_problem(fleet, pool, severity, message))

        zones = spec.zones or facts.zones
        accelerator = accelerators.get(spec.gpu_type, spec.gpu_type.lower())
        if not facts.accelerators.get(accelerator, set()) & set(zones):
            add("error", f"accelerator {accelerator} is not offered in {', '.join(zones)}")
        for machine in spec.instance_types:
            if not facts.machine_types.get(machine, set()) & set(zones):
                add("error", f"machine type {machine} is not offered in {', '.join(zones)}")
        base = accelerator.upper().replace("-", "_").replace("NVIDIA_TESLA_", "NVIDIA_")
        for capacity in spec.capacity_types:
            metric = f"PREEMPTIBLE_{base}_GPUS" if capacity == "spot" else f"{base}_GPUS"
            free = facts.quotas.get(metric)
            if free is None:
                add("warning", f"quota {metric} not found in {facts.region}")
            elif free < spec.max_gpus:
                add(
                    "error",
                    f"quota {metric} leaves {free:g} GPUs in {facts.region}; maxGPUs is "
                    f"{spec.max_gpus}: request an increase",
                )
    return out


@dataclass
class AzureFacts:
    region: str
    offered: dict[str, set[str]] = field(default_factory=dict)  # VM size (lower) -> zones (1..3)
    restricted: dict[str, str] = field(default_factory=dict)  # size (lower) -> why, region-wide
    zone_restricted: dict[str, set[str]] = field(default_factory=dict)  # size -> zones refused
    usage: dict[str, tuple[float, float]] = field(
        default_factory=dict
    )  # quota (lower) -> used, limit
    cluster: dict[str, object] | None = None  # the AKS cluster's settings, when one was named


# Karpenter on AKS (node auto-provisioning) runs only on these network settings
NAP_NETWORK = {
    "networkPlugin": "azure",
    "networkPluginMode": "overlay",
    "networkDataplane": "cilium",
}


def azure_problems(fleet: Fleet, facts: AzureFacts) -> list[Problem]:
    """Every azure pool's VM sizes offered to the subscription in its zones, the vCPU quotas
    (each size's family for on-demand, the regional Spot quota for spot, the regional total)
    covering every pool at maxGPUs, and, with a cluster, node auto-provisioning's settings."""
    from gpufleet.model.azure import azure_size, canonical_size

    out: list[Problem] = []
    need: dict[str, float] = defaultdict(float)
    users: dict[str, list[str]] = defaultdict(list)
    first_pool = None
    for name in sorted(fleet.pools):
        spec = fleet.pools[name].spec
        if spec.provider != "azure":
            continue
        first_pool = first_pool or name

        def add(severity: Severity, message: str, pool: str = name) -> None:
            out.append(_problem(fleet, pool, severity, message))

        zones = {z.rsplit("-", 1)[1] for z in spec.zones if z.startswith(f"{facts.region}-")}
        for zone in spec.zones:
            if not zone.startswith(f"{facts.region}-"):
                add("error", f"zone {zone} is not in region {facts.region}")
        nodes = spec.max_gpus // spec.gpus_per_node if spec.gpus_per_node else 0
        for size_name in spec.instance_types:
            size, key = azure_size(size_name), size_name.lower()
            shown = canonical_size(size_name)
            if key not in facts.offered:
                add("error", f"{shown} is not offered in {facts.region}")
                continue
            if key in facts.restricted:
                add(
                    "error",
                    f"{shown} is not available to this subscription in {facts.region} "
                    f"({facts.restricted[key]}): ask Azure support to enable it, or pick "
                    "another region",
                )
                continue
            usable = facts.offered[key] - facts.zone_restricted.get(key, set())
            asked = zones or usable
            if not asked & usable:
                where = ", ".join(f"{facts.region}-{z}" for z in sorted(usable)) or "no zone"
                add("error", f"{shown} is not offered in {', '.join(spec.zones)}; it is in {where}")
                continue
            if asked - usable:
                missing = ", ".join(f"{facts.region}-{z}" for z in sorted(asked - usable))
                add("warning", f"{shown} is not offered in {missing}")
            if size is None:
                continue
            vcpus = nodes * size.vcpus
            if "on-demand" in spec.capacity_types:
                for quota in (size.family.lower(), "cores"):
                    need[quota] += vcpus
                    users[quota].append(name)
            if "spot" in spec.capacity_types:
                need["lowprioritycores"] += vcpus
                users["lowprioritycores"].append(name)
    for quota, wanted in sorted(need.items()):
        pools = ", ".join(dict.fromkeys(users[quota]))
        first = users[quota][0]
        found = facts.usage.get(quota)
        if found is None:
            message = (
                f"quota {quota} not found in {facts.region}; {pools} may need {wanted:g} vCPUs"
            )
            out.append(_problem(fleet, first, "warning", message))
            continue
        used, limit = found
        if limit - used < wanted:
            message = (
                f"quota {quota} leaves {limit - used:g} of {limit:g} vCPUs in {facts.region}; "
                f"{pools} can grow to {wanted:g}: request an increase (Azure portal, Quotas)"
            )
            out.append(_problem(fleet, first, "error", message))
    if facts.cluster is not None and first_pool is not None:
        out += _aks_problems(fleet, first_pool, facts.cluster)
    return out


def _aks_problems(fleet: Fleet, pool: str, cluster: dict[str, object]) -> list[Problem]:
    out = []
    name = cluster.get("name")

    def add(severity: Severity, message: str) -> None:
        out.append(_problem(fleet, pool, severity, f"AKS cluster {name}: {message}"))

    if cluster.get("nodeProvisioningMode") != "Auto":
        add(
            "error",
            "node auto-provisioning (Karpenter) is off: az aks update --node-provisioning-mode "
            "Auto (infra/azure turns it on)",
        )
    for key, value in NAP_NETWORK.items():
        if cluster.get(key) != value:
            add(
                "error",
                f"{key} is {cluster.get(key)!r}; node auto-provisioning needs {value!r} "
                "(Azure CNI overlay with Cilium)",
            )
    if not cluster.get("workloadIdentity") or not cluster.get("oidcIssuer"):
        add(
            "warning",
            "workload identity or the OIDC issuer is off: the controller's Azure identity needs "
            "both (az aks update --enable-oidc-issuer --enable-workload-identity)",
        )
    return out
