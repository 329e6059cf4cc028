"""Problems found in user input, each located at a file and line."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Literal

Severity = Literal["error", "warning"]


@dataclass(frozen=True, order=True)
class Problem:
    """One thing wrong with the input. Sorts by file, then line, so reports read top to bottom."""

    file: str
    line: int
    severity: Severity
    message: str
    code: str = ""
    object: str = ""

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.severity}: {self.message}"

    def to_dict(self) -> dict[str, str | int]:
        return asdict(self)


def has_errors(problems: list[Problem]) -> bool:
    return any(p.severity == "error" for p in problems)
