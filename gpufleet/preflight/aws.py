"""Facts from AWS for the preflight, with boto3: instance-type offerings per zone, vCPUs and GPUs
of each type, the EC2 vCPU quotas, and the pools' capacity reservations."""

from __future__ import annotations

from typing import Any

from gpufleet.model.fleet import Fleet
from gpufleet.preflight.checks import AWS_QUOTAS, AwsFacts


def gather(fleet: Fleet, region: str, ec2: Any, quotas: Any) -> AwsFacts:
    """`ec2` and `quotas` are boto3 clients (ec2, service-quotas) for `region`."""
    pools = [p.spec for p in fleet.pools.values() if p.spec.provider == "aws"]
    types = sorted({t for spec in pools for t in spec.instance_types})
    zones = [
        z["ZoneName"]
        for z in ec2.describe_availability_zones(
            Filters=[{"Name": "zone-type", "Values": ["availability-zone"]}]
        )["AvailabilityZones"]
    ]
    facts = AwsFacts(region, zones)
    for itype in types:
        try:
            described = ec2.describe_instance_types(InstanceTypes=[itype])["InstanceTypes"]
        except ec2.exceptions.ClientError as err:
            if "InvalidInstanceType" in str(err):
                facts.unknown_types.add(itype)
                continue
            raise
        for item in described:
            facts.vcpus[itype] = int(item["VCpuInfo"]["DefaultVCpus"])
            gpus = item.get("GpuInfo", {}).get("Gpus", [])
            facts.gpus[itype] = sum(int(g.get("Count", 0)) for g in gpus)
    if types:
        pages = ec2.get_paginator("describe_instance_type_offerings").paginate(
            LocationType="availability-zone",
            Filters=[{"Name": "instance-type", "Values": types}],
        )
        for page in pages:
            for offer in page["InstanceTypeOfferings"]:
                facts.offered.setdefault(offer["InstanceType"], set()).add(offer["Location"])
    for code in sorted({code for code, _ in AWS_QUOTAS.values()}):
        try:
            quota = quotas.get_service_quota(ServiceCode="ec2", QuotaCode=code)
            facts.quotas[code] = float(quota["Quota"]["Value"])
        except quotas.exceptions.ClientError:
            facts.quotas[code] = None  # reported as "could not be read"
    ids = sorted({r for spec in pools if spec.aws for r in spec.aws.capacity_reservation_ids})
    if ids:
        try:
            found = ec2.describe_capacity_reservations(CapacityReservationIds=ids)
        except ec2.exceptions.ClientError as err:
            if "NotFound" not in str(err):
                raise
            found = {"CapacityReservations": []}
        for item in found["CapacityReservations"]:
            facts.reservations[item["CapacityReservationId"]] = {
                "state": item.get("State"),
                "instanceType": item.get("InstanceType"),
                "total": item.get("TotalInstanceCount", 0),
                "zone": item.get("AvailabilityZone"),
            }
    return facts
