"""GPUs stranded for lack of CPU: the part of placement (R8) that looks at a node's CPU.

A GPU pod needs CPU beside its GPUs. A node whose CPU runs out while GPUs are free strands them:
no GPU pod can use them however well the GPUs were packed. Where nodes report their free CPU,
the engine places a pod where it strands the fewest GPUs, expected over the CPU requests GPU
pods make (the distribution observed, as FGD weighs fragmentation by the observed request
sizes), and leaves smaller differences to best fit.

Measured on the openb traces (`benchmarks/packing.py`): this is worth about a point of GPU
allocation at 130 % load on the default trace, where 16-CPU and 32-CPU nodes hold 2 and 4 GPUs.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable

# differences of expected stranded milli-GPUs below this step count as equal, so that best fit
# decides among them (openb default, seeds 42-45: steps of 200-500 all land within 0.2 points)
STEP = 300


class CpuProfile:
    """The CPU requests (milli-CPU) of GPU pods, observed: how likely a pod needs more CPU than
    a node has left."""

    def __init__(self, requests: Iterable[int]) -> None:
        self._sorted = sorted(requests)

    def __bool__(self) -> bool:
        return bool(self._sorted)

    def short(self, cpu_free: int) -> float:
        """The share of GPU pods that need more CPU than `cpu_free`."""
        if not self._sorted:
            return 0.0
        fit = bisect.bisect_right(self._sorted, cpu_free)
        return 1.0 - fit / len(self._sorted)

    def stranded(self, idle_milli: int, cpu_free: int) -> float:
        """Idle milli-GPUs of a node that the next GPU pod is expected to find without CPU."""
        return idle_milli * self.short(cpu_free) if idle_milli > 0 else 0.0

    def step(self, idle_milli: int, cpu_free: int, taken_milli: int, taken_cpu: int) -> int:
        """How much a pod taking `taken_milli` and `taken_cpu` strands on such a node, in
        steps of `STEP` milli-GPUs (negative: it strands less than before)."""
        before = self.stranded(idle_milli, cpu_free)
        after = self.stranded(idle_milli - taken_milli, cpu_free - taken_cpu)
        return round((after - before) / STEP)
