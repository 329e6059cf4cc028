"""How much one caller may ask of `gpufleet server` (apart from `guard.py`, which needs the web
framework, so that the command line reads the defaults without loading it)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Limits:
    """Requests per second per caller (a sustained rate and a burst), and rejected tokens per
    client address per minute: past them the answer is 429 with Retry-After."""

    rate: float = 20.0
    burst: int = 60
    failed_tokens_per_minute: int = 20
    tracked_clients: int = 10_000  # the oldest is forgotten past this
