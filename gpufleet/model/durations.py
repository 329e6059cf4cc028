"""Go-style durations ("90s", "5m", "1h30m") as Kubernetes and Karpenter write them."""

from __future__ import annotations

import re
from datetime import timedelta

_PART = re.compile(r"([0-9]+)(ms|s|m|h)")
_UNIT = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}


def parse_duration(text: str) -> timedelta:
    parts = _PART.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"{text!r} is not a duration like 90s, 5m or 1h30m")
    return timedelta(seconds=sum(int(n) * _UNIT[u] for n, u in parts))


def format_duration(value: timedelta) -> str:
    """The inverse of parse_duration for whole seconds: 600 s -> "10m", 5400 s -> "1h30m"."""
    seconds = int(value.total_seconds())
    parts = []
    for unit, size in (("h", 3600), ("m", 60), ("s", 1)):
        if seconds >= size:
            parts.append(f"{seconds // size}{unit}")
            seconds %= size
    return "".join(parts) or "0s"
