"""`pulumi up` entry point: read the stack's configuration and build the cluster."""

from __future__ import annotations

import sys
from pathlib import Path

import pulumi

sys.path.insert(0, str(Path(__file__).resolve().parent))

from azure_stack import StackConfig, build, load_fleet_for

from gpufleet.iac import ConfigError

try:
    config = StackConfig.from_pulumi(pulumi.Config("gpufleet"))
    outputs = build(config, load_fleet_for(config))
except ConfigError as err:
    raise SystemExit(f"error: {err}") from None
for name, value in outputs.items():
    pulumi.export(name, value)
