"""Kubernetes resource quantities ("500m", "4Gi") in the units the engine counts: milli-CPU and
MiB of memory. Parsing is the Kubernetes client's; imported on first use, as only the
controllers read quantities and they load the client anyway."""

from __future__ import annotations

import functools
import math
from decimal import Decimal
from typing import Any

MIB = 2**20


def _parse(value: Any) -> Decimal:
    from kubernetes.utils.quantity import parse_quantity

    return Decimal(parse_quantity(value))


# every cycle reads every node's allocatable and every unmanaged pod's requests, and a cluster
# has few distinct quantities ("500m", "4Gi"): each is parsed once
@functools.lru_cache(maxsize=4096)
def milli_cpu(value: Any, round_up: bool = True) -> int:
    """A CPU quantity in milli-CPU: a request rounded up, a node's capacity down (`round_up`)."""
    milli = _parse(value) * 1000
    return math.ceil(milli) if round_up else math.floor(milli)


@functools.lru_cache(maxsize=4096)
def mebibytes(value: Any, round_up: bool = True) -> int:
    """A memory quantity in MiB: a request rounded up, a node's capacity down (`round_up`)."""
    mib = _parse(value) / MIB
    return math.ceil(mib) if round_up else math.floor(mib)
