"""`gpufleet preflight`: AWS facts from moto (offerings, instance types) and recorded responses
(Service Quotas and capacity reservations, which moto does not serve); GCP facts from recorded
compute API responses."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber
from google.cloud import compute_v1
from moto import mock_aws
from typer.testing import CliRunner

from gpufleet.cli.main import app
from gpufleet.iac import GCE_ACCELERATORS
from gpufleet.model import load_fleet
from gpufleet.model.fleet import Fleet
from gpufleet.preflight import aws as aws_preflight
from gpufleet.preflight import gcp as gcp_preflight
from gpufleet.preflight.checks import aws_problems, gcp_problems

POOLS = """\
apiVersion: gpufleet.io/v1alpha1
kind: GPUPool
metadata: {{name: h100}}
spec:
  provider: aws
  gpuType: H100
  gpusPerNode: 8
  maxGPUs: {h100_gpus}
  instanceTypes: [{h100_type}]
  capacityTypes: [reserved, on-demand]
  zones: [{zones}]
  aws: {{amiAlias: al2023@v20251112, capacityReservationIDs: [cr-0123]}}
---
apiVersion: gpufleet.io/v1alpha1
kind: GPUPool
metadata: {{name: l4}}
spec:
  provider: aws
  gpuType: L4
  gpusPerNode: 4
  maxGPUs: 32
  instanceTypes: [{l4_type}]
  capacityTypes: [spot]
  zones: [us-west-2a]
  aws: {{amiAlias: al2023@v20251112}}
"""


def fleet(tmp_path: Path, **values: Any) -> Fleet:
    settings = {
        "h100_gpus": 64,
        "h100_type": "p5.48xlarge",
        "zones": "us-west-2a, us-west-2b",
        "l4_type": "g6.12xlarge",
    }
    path = tmp_path / "pools.yaml"
    path.write_text(POOLS.format(**{**settings, **values}))
    loaded = load_fleet([path])
    assert not loaded.problems, loaded.problems
    return loaded.fleet


class Ec2WithReservations:
    """moto's EC2, plus recorded DescribeCapacityReservations answers (moto lacks the call)."""

    def __init__(self, ec2: Any, reservations: list[dict[str, Any]]) -> None:
        self.ec2 = ec2
        self.recorded = boto3.client("ec2", region_name="us-west-2")
        self.stubber = Stubber(self.recorded)
        self.stubber.add_response(
            "describe_capacity_reservations", {"CapacityReservations": reservations}
        )
        self.stubber.activate()

    def __getattr__(self, name: str) -> Any:
        if name == "describe_capacity_reservations":
            return self.recorded.describe_capacity_reservations
        return getattr(self.ec2, name)


def quotas(values: dict[str, int]) -> Any:
    client = boto3.client("service-quotas", region_name="us-west-2")
    stubber = Stubber(client)
    for code in sorted(values):
        stubber.add_response(
            "get_service_quota",
            {"Quota": {"QuotaCode": code, "Value": values[code]}},
            {"ServiceCode": "ec2", "QuotaCode": code},
        )
    stubber.activate()
    return client


PLENTY = {"L-417A185B": 2000, "L-DB2E81BA": 2000, "L-7212CCBC": 2000, "L-3819A6DF": 2000}
ACTIVE = [
    {
        "CapacityReservationId": "cr-0123",
        "InstanceType": "p5.48xlarge",
        "State": "active",
        "TotalInstanceCount": 8,
        "AvailabilityZone": "us-west-2a",
    }
]


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch) -> Any:
    for key, value in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing"),
                       ("AWS_DEFAULT_REGION", "us-west-2")):  # fmt: skip
        monkeypatch.setenv(key, value)
    with mock_aws():
        yield boto3.client("ec2", region_name="us-west-2")


def test_aws_all_checks_pass(tmp_path: Path, aws_env: Any) -> None:
    pools = fleet(tmp_path)
    facts = aws_preflight.gather(
        pools, "us-west-2", Ec2WithReservations(aws_env, ACTIVE), quotas(PLENTY)
    )
    assert facts.vcpus["p5.48xlarge"] == 192 and facts.gpus["p5.48xlarge"] == 8
    assert {"us-west-2a", "us-west-2b"} <= facts.offered["p5.48xlarge"]
    assert aws_problems(pools, facts) == []


def test_aws_finds_what_would_fail(tmp_path: Path, aws_env: Any) -> None:
    # moto's EC2 offers p5e.48xlarge in us-west-2c only
    pools = fleet(tmp_path, h100_type="p5e.48xlarge", zones="us-west-2a", l4_type="g9.nonsense")
    expired = [dict(ACTIVE[0], State="expired", InstanceType="p4d.24xlarge")]
    small = dict(PLENTY, **{"L-417A185B": 1000})  # 16 p5 nodes x 192 vCPUs need 3,072
    facts = aws_preflight.gather(
        pools, "us-west-2", Ec2WithReservations(aws_env, expired), quotas(small)
    )
    errors = {p.message for p in aws_problems(pools, facts) if p.severity == "error"}
    text = "\n".join(sorted(errors))
    assert "p5e.48xlarge is not offered in us-west-2a (us-west-2); offered in: us-west-2c" in text
    assert "instance type g9.nonsense does not exist" in text
    assert "capacity reservation cr-0123 is expired, not active" in text
    assert "is for p4d.24xlarge" in text
    # the zone problem leaves no usable type, so no quota need is counted for the pool; with
    # the zone right, the quota is the problem
    pools = fleet(tmp_path, h100_gpus=128)
    facts = aws_preflight.gather(
        pools, "us-west-2", Ec2WithReservations(aws_env, ACTIVE), quotas(small)
    )
    (quota,) = [p for p in aws_problems(pools, facts) if "L-417A185B" in p.message]
    assert quota.severity == "error" and "1000 vCPUs" in quota.message and "3072" in quota.message
    assert quota.file.endswith("pools.yaml") and quota.line == 1


def test_aws_cli_under_moto(tmp_path: Path, aws_env: Any) -> None:
    path = tmp_path / "pools.yaml"
    path.write_text(POOLS.split("---\n")[1].format(l4_type="g6.12xlarge"))
    result = CliRunner().invoke(app, ["preflight", "aws", "-g", str(path), "--region", "us-west-2"])
    # moto does not serve EC2 Service Quotas: a warning that the quota could not be read
    assert result.exit_code == 0, result.output
    assert "quota L-3819A6DF" in result.output and "could not be read" in result.output


def recorded_gcp(l4_limit: float, zones: tuple[str, ...]) -> tuple[Any, Any, Any]:
    recorded = compute_v1.Region(
        name="europe-west4",
        zones=[f"https://www.googleapis.com/compute/v1/projects/p/zones/{z}" for z in zones],
        quotas=[
            compute_v1.Quota(metric="NVIDIA_L4_GPUS", limit=l4_limit, usage=8),
            compute_v1.Quota(metric="PREEMPTIBLE_NVIDIA_L4_GPUS", limit=128, usage=0),
            compute_v1.Quota(metric="CPUS", limit=2400, usage=100),
        ],
    )

    class Regions:
        def get(self, project: str, region: str) -> compute_v1.Region:
            return recorded

    class Listing:
        def __init__(self, names: dict[str, list[str]]) -> None:
            self.names = names

        def list(self, project: str, zone: str) -> list[Any]:
            return [type("Item", (), {"name": n})() for n in self.names.get(zone, [])]

    accelerators = Listing({"europe-west4-a": ["nvidia-l4", "nvidia-tesla-t4"],
                            "europe-west4-b": ["nvidia-l4"], "europe-west4-c": []})  # fmt: skip
    machines = Listing({"europe-west4-a": ["g2-standard-48"], "europe-west4-b": ["g2-standard-48"]})
    return Regions(), accelerators, machines


def test_gcp_quota_and_availability(tmp_path: Path) -> None:
    pools = load_fleet([Path(__file__).resolve().parent.parent / "examples" / "gitops"]).fleet
    facts = gcp_preflight.gather("p", "europe-west4", *recorded_gcp(128, ("europe-west4-a",
                                 "europe-west4-b", "europe-west4-c")))  # fmt: skip
    assert facts.quotas["NVIDIA_L4_GPUS"] == 120
    assert gcp_problems(pools, facts, GCE_ACCELERATORS) == []
    facts = gcp_preflight.gather("p", "europe-west4", *recorded_gcp(40, ("europe-west4-c",)))
    messages = [p.message for p in gcp_problems(pools, facts, GCE_ACCELERATORS)]
    assert any(
        "quota NVIDIA_L4_GPUS leaves 32 GPUs" in m and "maxGPUs is 64" in m for m in messages
    )
    assert any("accelerator nvidia-l4 is not offered" in m for m in messages)
