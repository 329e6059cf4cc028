"""Reading a process's Prometheus /metrics page in tests, and waiting for a controller's
cycles: what a check that nothing more happens waits for, instead of a number of seconds a
busy machine may not honour."""

from __future__ import annotations

import re
import urllib.request
from collections.abc import Callable

from .cluster import ControlPlane

CYCLES = "gpufleet_cycle_seconds_count"  # the workload loop's cycles so far


def scraped(url: str, series: str, timeout: float = 10) -> float | None:
    """The value of one series (its name and labels as the page writes them) on the /metrics
    page at `url`; None where the page has no such series. Raises OSError when it does not
    answer."""
    with urllib.request.urlopen(url, timeout=timeout) as answer:
        text = answer.read().decode()
    found = re.search(rf"^{re.escape(series)} (\S+)$", text, re.MULTILINE)
    return float(found.group(1)) if found else None


def wait_cycles(
    plane: ControlPlane, cycles: Callable[[], int | None], count: int = 3, timeout: float = 120
) -> None:
    """Let `count` whole cycles pass from now, as `cycles` counts them (None: not answering
    yet). The cycle running at the start is not whole: one more."""
    start = cycles()

    def passed() -> bool:
        nonlocal start
        now = cycles()
        if start is None:
            start = now
            return False
        return now is not None and now >= start + count + 1

    plane.wait_until(passed, timeout, f"{count} controller cycles")
