"""OpenTelemetry metric and attribute names in Prometheus' conventions (as the OpenTelemetry
specification's Prometheus compatibility section sets them): characters Prometheus does not
allow become `_`, the unit becomes a word suffix (`ms` -> `_milliseconds`, `By` -> `_bytes`,
`1` -> `_ratio` for gauges), and a counter ends in `_total`."""

from __future__ import annotations

import re
from functools import lru_cache

UNIT_WORDS = {
    "d": "days",
    "h": "hours",
    "min": "minutes",
    "s": "seconds",
    "ms": "milliseconds",
    "us": "microseconds",
    "ns": "nanoseconds",
    "By": "bytes",
    "KiBy": "kibibytes",
    "MiBy": "mebibytes",
    "GiBy": "gibibytes",
    "TiBy": "tebibytes",
    "KBy": "kilobytes",
    "MBy": "megabytes",
    "GBy": "gigabytes",
    "TBy": "terabytes",
    "bit": "bits",
    "Hz": "hertz",
    "W": "watts",
    "V": "volts",
    "A": "amperes",
    "J": "joules",
    "m": "meters",
    "Cel": "celsius",
    "%": "percent",
}
PER_WORDS = {"s": "second", "m": "minute", "h": "hour", "d": "day", "w": "week", "mo": "month"}
_NOT_IN_NAME = re.compile(r"[^a-zA-Z0-9_:]")
_NOT_IN_LABEL = re.compile(r"[^a-zA-Z0-9_]")
_UNDERSCORES = re.compile(r"__+")


def _unit_suffix(unit: str, kind: str) -> str:
    """The words of a unit (UCUM, as OpenTelemetry writes it); `{...}` annotations say
    nothing Prometheus keeps."""
    unit = re.sub(r"\{[^}]*\}", "", unit).strip()
    if not unit:
        return ""
    if unit == "1":
        return "ratio" if kind == "gauge" else ""
    main, _, per = unit.partition("/")
    words = UNIT_WORDS.get(main, main) if main else ""
    if per:
        words = f"{words}_per_{PER_WORDS.get(per, UNIT_WORDS.get(per, per))}".lstrip("_")
    return _clean(words, _NOT_IN_NAME).strip("_")


def _clean(text: str, pattern: re.Pattern[str]) -> str:
    return _UNDERSCORES.sub("_", pattern.sub("_", text))


@lru_cache(maxsize=4096)
def metric_name(name: str, unit: str, kind: str) -> str:
    """The Prometheus family name of an OpenTelemetry metric of `kind` (counter, gauge,
    histogram or summary); a counter's samples add `_total` to it."""
    base = _clean(name, _NOT_IN_NAME).strip("_") or "unnamed"
    if base[0].isdigit():
        base = f"_{base}"
    if kind == "counter":
        base = base.removesuffix("_total")
    suffix = _unit_suffix(unit, kind)
    if suffix and not base.endswith(f"_{suffix}"):
        base = f"{base}_{suffix}"
    return base


@lru_cache(maxsize=4096)
def label_name(key: str) -> str:
    """An attribute key as a Prometheus label name."""
    label = _clean(key, _NOT_IN_LABEL) or "_"
    if label[0].isdigit():
        label = f"key_{label}"
    return label
