"""`pulumi up` entry point: read the stack's configuration and build the cluster."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import aws_stack  # it puts infra/ on the path, for cluster_software
from cluster_software import run_stack

run_stack(aws_stack)
