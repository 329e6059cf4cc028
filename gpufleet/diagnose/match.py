"""Matching a failure's evidence against the diagnosis patterns. Pure."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpufleet.model.api import DiagnosisPattern
from gpufleet.model.fleet import load_fleet

BANK = Path(__file__).parent / "bank"  # the bundled patterns; policies/diagnosis links here
UNKNOWN = "unknown"
XID = re.compile(r"\bXid\s*(\d+)", re.IGNORECASE)


@dataclass(frozen=True)
class Evidence:
    """What the cluster shows about a failed workload."""

    exit_codes: tuple[int, ...] = ()
    reasons: tuple[str, ...] = ()  # termination/waiting reasons, the pod's and the Job's reason
    events: tuple[str, ...] = ()  # Event reasons on its pods and the Job
    event_messages: tuple[str, ...] = ()
    logs: tuple[str, ...] = ()  # the last lines of its containers' logs
    xids: tuple[int, ...] = ()  # Xids on the nodes it ran on
    gpu_unhealthy: bool = False

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name in ("exit_codes", "reasons", "events", "xids"):
            values = getattr(self, name)
            if values:
                out[_camel(name)] = sorted(set(values))
        if self.gpu_unhealthy:
            out["gpuUnhealthy"] = True
        if self.logs:
            out["lastLogLines"] = list(self.logs[-5:])
        return out


@dataclass(frozen=True)
class Diagnosis:
    pattern: str  # the matching pattern's name, or "unknown"
    diagnosis: str
    owner: str | None  # code | node | cluster | capacity; None when unknown
    actions: tuple[str, ...] = ()
    matched: tuple[str, ...] = ()  # the signals that matched, in words
    evidence: Evidence = field(default_factory=Evidence)

    def status(self) -> dict[str, Any]:
        """The `diagnosis` field of the GPUWorkload status."""
        return {
            "pattern": self.pattern,
            "owner": self.owner,
            "summary": self.diagnosis,
            "actions": list(self.actions),
            "matched": list(self.matched),
            "evidence": self.evidence.summary(),
        }


def matched_signals(pattern: DiagnosisPattern, evidence: Evidence) -> list[str] | None:
    """The signals of `pattern` that `evidence` shows (in words), or None if any kind of signal
    the pattern asks for is missing."""
    signals = pattern.spec.signals
    found: list[str] = []
    checks: list[tuple[Sequence[Any], Iterable[Any], str]] = [
        (signals.exit_codes, evidence.exit_codes, "exit code"),
        (signals.reasons, evidence.reasons, "reason"),
        (signals.events, evidence.events, "event"),
        (signals.xids, evidence.xids, "Xid"),
    ]
    for wanted, seen, label in checks:
        if not wanted:
            continue
        hits = sorted(set(wanted) & set(seen), key=str)
        if not hits:
            return None
        found.append(f"{label} {hits[0]}")
    for regexes, lines, label in (
        (signals.logs, evidence.logs, "log line"),
        (signals.event_messages, evidence.event_messages, "event message"),
    ):
        if not regexes:
            continue
        hit = _first_match(regexes, lines)
        if hit is None:
            return None
        found.append(f"{label} {hit!r}")
    if signals.gpu_unhealthy is not None:
        if signals.gpu_unhealthy != evidence.gpu_unhealthy:
            return None
        found.append("GPUHealthy=False" if evidence.gpu_unhealthy else "GPUs healthy")
    return found


def diagnose(patterns: Iterable[DiagnosisPattern], evidence: Evidence) -> Diagnosis:
    """The best matching pattern: the highest priority, then the most signals matched, then
    the name (so the result never depends on file order)."""
    best: tuple[tuple[int, int, str], DiagnosisPattern, list[str]] | None = None
    for pattern in patterns:
        found = matched_signals(pattern, evidence)
        if found is None:
            continue
        key = (pattern.spec.priority, len(found), _reverse(pattern.name))
        if best is None or key > best[0]:
            best = (key, pattern, found)
    if best is None:
        return Diagnosis(
            pattern=UNKNOWN,
            diagnosis="No known pattern matches this failure; the evidence collected is below. "
            "If it recurs, add a pattern to policies/diagnosis/ by pull request.",
            owner=None,
            evidence=evidence,
        )
    _, pattern, found = best
    spec = pattern.spec
    return Diagnosis(
        pattern=pattern.name,
        diagnosis=spec.diagnosis,
        owner=spec.owner,
        actions=tuple(spec.actions),
        matched=tuple(found),
        evidence=evidence,
    )


def load_patterns(paths: Sequence[str | Path] = ()) -> list[DiagnosisPattern]:
    """The bundled patterns and those under `paths` (a pattern of the same name in `paths`
    replaces the bundled one). Raises ValueError with located messages on bad input."""
    by_name: dict[str, DiagnosisPattern] = {}
    for source in (BANK, *paths):
        loaded = load_fleet([source])
        errors = [p for p in loaded.problems if p.severity == "error"]
        if errors:
            raise ValueError("; ".join(f"{p.file}:{p.line}: {p.message}" for p in errors))
        by_name.update(loaded.fleet.diagnosis)
    return list(by_name.values())


def xids_of(text: str) -> list[int]:
    return [int(x) for x in XID.findall(text or "")]


def _first_match(regexes: Sequence[str], lines: Sequence[str]) -> str | None:
    compiled = [re.compile(r) for r in regexes]
    for line in lines:
        if any(r.search(line) for r in compiled):
            return line.strip()[:200]
    return None


def _reverse(name: str) -> str:
    """Sorts names backwards, so that with max() the alphabetically first wins a tie."""
    return "".join(chr(0x10FFFF - ord(c)) for c in name)


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)
