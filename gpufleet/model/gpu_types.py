"""The GPU types a workload accepts, as the pools spell them."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from gpufleet.model.suggest import did_you_mean


def split_list(value: str | Sequence[str] | None) -> list[str]:
    """A list given as `a,b`, as several values, or both (`--gpu-type H100,A100`)."""
    if value is None:
        return []
    parts = [value] if isinstance(value, str) else list(value)
    return [item.strip() for part in parts for item in part.split(",") if item.strip()]


class UnknownGPUType(ValueError):
    """A type no pool has; the message names it, the closest one and the pools' types."""

    def __init__(self, asked: str, known: Iterable[str]) -> None:
        self.asked = asked
        self.types = sorted(set(known))
        self.suggestion = did_you_mean(asked, self.types)
        self.listed = ", ".join(self.types) or "none"
        super().__init__(f"no pool has GPU type {asked!r}{self.suggestion}; types: {self.listed}")


def canonical_gpu_types(asked: Iterable[str], pool_types: Iterable[str]) -> tuple[str, ...]:
    """`asked` matched to the pools' types whatever their case and spelled as the pools spell
    them, in the order asked, each once. Raises UnknownGPUType for one no pool has."""
    known = {t.lower(): t for t in pool_types}
    chosen: dict[str, None] = {}
    for name in asked:
        canonical = known.get(name.lower())
        if canonical is None:
            raise UnknownGPUType(name, known.values())
        chosen[canonical] = None
    return tuple(chosen)
