"""How far a team may go beyond its reservations: one definition for engine, KAI and reports."""

from __future__ import annotations

import math

from gpufleet.model.api import Team

UNLIMITED = -1


def burst_ceiling(team: Team, reserved: float) -> float:
    """The most GPUs the team may use: its reservations plus the burst limit (-1: unlimited)."""
    return ceiling_for(team.spec.burst_limit, reserved)


def ceiling_for(limit: str | None, reserved: float) -> float:
    """`reserved` plus a burst limit ("50%", "16", "0" or None for unlimited; -1: unlimited).

    A percentage is rounded down to whole GPUs: "50%" of 5 reserved allows 7, not 7.5."""
    if limit is None:
        return UNLIMITED
    if limit.endswith("%"):
        extra: float = math.floor(reserved * float(limit[:-1]) / 100)
    else:
        extra = float(limit)
    total = reserved + extra
    return int(total) if float(total).is_integer() else total
