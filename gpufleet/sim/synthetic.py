"""A seeded synthetic workload trace, shaped by published statistics of the Philly trace.

- GPUs per job (adaptdl's philly.csv, 82,247 jobs): 1 GPU 93.2 %, 2 GPUs 2.2 %, 4 GPUs 2.3 %,
  8 GPUs 2.0 %, 16 GPUs 0.24 %, 32 GPUs 0.08 %; jobs larger than a node are gangs of 8-GPU pods.
- Duration: log-normal with Philly's median of 1,144 s and 90th percentile of 11,266 s
  (sigma = ln(11266 / 1144) / 1.2816 = 1.785), capped at 2 days.
- Arrivals: Poisson, with a day/night swing of +-30 % (Philly and Helios both show one).
- Teams: every leaf team of the fleet submits; each gets a demand factor between 0.3 and 1.7 of
  what its reservations would carry at the target load, so some teams borrow and others lend
  (at most 0.8 for a team whose burstLimit is 0: it may not borrow).
- Swing (optional, `swing` > 0): each team's arrival rate also rises and falls with a period of
  `swing_period_h`, the teams out of phase with each other, as when one team's deadline push
  meets another's quiet week. A quiet team's reserved GPUs are then lent to the others, and
  taken back by preemption when it gets busy again: the demo trace shows that cycle.

The same seed and fleet always give the same trace.
"""

from __future__ import annotations

import math
import random

from gpufleet.model.fleet import Fleet
from gpufleet.sim.trace import TraceJob, gang_shape

GPU_MIX = ((1, 0.932), (2, 0.022), (4, 0.023), (8, 0.020), (16, 0.0024), (32, 0.0008))
MEDIAN_S, SIGMA = 1144.0, 1.785
MAX_DURATION_S = 2 * 86400.0
DAY_S = 86400.0


def mean_job_gpu_seconds() -> float:
    gpus = sum(g * p for g, p in GPU_MIX) / sum(p for _, p in GPU_MIX)
    return gpus * MEDIAN_S * math.exp(SIGMA**2 / 2)


def generate(
    fleet: Fleet,
    seed: int = 42,
    hours: float = 6.0,
    load: float = 1.0,
    swing: float = 0.0,
    swing_period_h: float = 4.0,
    max_duration_s: float = MAX_DURATION_S,
) -> list[TraceJob]:
    """Jobs for the leaf teams of `fleet` over `hours`, offering about `load` x its GPUs; with
    `swing` (0 to 1), each team's rate is scaled by 1 + swing x sin(phase), the teams' phases
    spread evenly over the period."""
    if not 0.0 <= swing <= 1.0:
        raise ValueError(f"swing must be between 0 and 1, not {swing}")
    rng = random.Random(seed)
    leaves = sorted(
        name for name in fleet.teams if not any(t.spec.parent == name for t in fleet.teams.values())
    )
    reserved = {name: 0 for name in leaves}
    for r in fleet.reservations.values():
        if r.spec.team in reserved:
            reserved[r.spec.team] += r.spec.gpus
    capacity = sum(p.spec.max_gpus for p in fleet.pools.values())
    # teams that may not burst (burstLimit 0) stay within what they reserved
    weights = {
        t: (reserved[t] or 1)
        * rng.uniform(0.3, 0.8 if fleet.teams[t].spec.burst_limit in ("0", 0, "0%") else 1.7)
        for t in leaves
    }
    total_weight = sum(weights.values())
    phases = {t: 2 * math.pi * i / len(leaves) for i, t in enumerate(leaves)}
    node_gpus = min((p.spec.gpus_per_node for p in fleet.pools.values()), default=8)
    # jobs per second, all teams; a swing keeps each team's mean by drawing at its peak rate
    rate = load * capacity / mean_job_gpu_seconds() * (1 + swing)
    jobs: list[TraceJob] = []
    now, end = 0.0, hours * 3600
    while True:
        # thinning: draw at the peak rate, keep with the day/night factor
        now += rng.expovariate(rate * 1.3)
        if now >= end:
            return jobs
        if rng.random() > (1 + 0.3 * math.sin(2 * math.pi * now / DAY_S)) / 1.3:
            continue
        team = _pick(rng, weights, total_weight)
        if swing:
            phase = 2 * math.pi * now / (swing_period_h * 3600) + phases[team]
            if rng.random() > (1 + swing * math.sin(phase)) / (1 + swing):
                continue
        gpus = _pick_gpus(rng)
        per_pod, pods = gang_shape(gpus, node_gpus)
        duration = min(rng.lognormvariate(math.log(MEDIAN_S), SIGMA), max_duration_s)
        name = f"job-{len(jobs) + 1:05d}"
        jobs.append(TraceJob(name, team, "auto", per_pod, pods, round(now), round(duration)))


def _pick(rng: random.Random, weights: dict[str, float], total: float) -> str:
    x = rng.random() * total
    for name, weight in weights.items():
        x -= weight
        if x <= 0:
            return name
    return next(reversed(weights))


def _pick_gpus(rng: random.Random) -> int:
    x = rng.random() * sum(p for _, p in GPU_MIX)
    for gpus, p in GPU_MIX:
        x -= p
        if x <= 0:
            return gpus
    return GPU_MIX[0][0]


def to_csv(jobs: list[TraceJob]) -> str:
    lines = ["name,team,class,gpus,pods,submit_s,duration_s"]
    lines += [
        f"{j.name},{j.team},{j.workload_class},{j.gpus:g},{j.pods},{j.submit_s:g},{j.duration_s:g}"
        for j in jobs
    ]
    return "\n".join(lines) + "\n"


def demo(fleet: Fleet) -> list[TraceJob]:
    """The trace of `make demo` (examples/traces/demo.csv): 6 hours at twice the fleet's GPUs,
    each team's demand swinging by ±90 % over 3 hours out of phase with the others, durations
    capped at 4 hours so that the run drains soon after. Teams lend while quiet and take their
    GPUs back by preemption when busy; the preempted work resumes when GPUs free up."""
    return generate(
        fleet, seed=42, hours=6.0, load=2.0, swing=0.9, swing_period_h=3.0, max_duration_s=4 * 3600
    )
