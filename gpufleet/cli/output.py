"""Printing for the CLI: tables for people, JSON and YAML for scripts (kubectl's convention)."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from enum import StrEnum
from typing import Any

import typer
import yaml
from rich.console import Console
from rich.markup import escape

from gpufleet.model.problems import Problem

# Piped output is read by scripts and CI logs: never wrap or truncate it at 80 columns.
_WIDTH = None if sys.stdout.isatty() else 240
console = Console(highlight=False, soft_wrap=True, width=_WIDTH)
err_console = Console(stderr=True, highlight=False, soft_wrap=True)


class OutputFormat(StrEnum):
    TABLE = "table"
    JSON = "json"
    YAML = "yaml"


class ProblemFormat(StrEnum):
    TEXT = "text"
    JSON = "json"


def print_data(data: Any) -> None:
    """Machine output on stdout, plain (no colour, no wrapping)."""
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=False) + "\n")


def print_yaml(data: Any) -> None:
    sys.stdout.write(yaml.safe_dump(data, sort_keys=False))


def print_structured(data: Any, output: OutputFormat) -> bool:
    """Print `data` as JSON or YAML if that is the format asked for; False: print a table."""
    if output is OutputFormat.JSON:
        print_data(data)
        return True
    if output is OutputFormat.YAML:
        print_yaml(data)
        return True
    return False


def print_problems(problems: list[Problem], stream: Console | None = None) -> None:
    target = stream or console
    for problem in problems:
        colour = "red" if problem.severity == "error" else "yellow"
        target.print(
            f"{problem.file}:{problem.line}: [{colour}]{problem.severity}[/{colour}]: "
            f"{escape(problem.message)}",
            markup=True,
            emoji=False,
        )


def problem_counts(problems: list[Problem]) -> str:
    errors = sum(p.severity == "error" for p in problems)
    warnings = len(problems) - errors
    return f"{errors} error{'s' * (errors != 1)}, {warnings} warning{'s' * (warnings != 1)}"


def fail(message: str, code: int = 1) -> typer.Exit:
    """Print a one-line error to stderr and return the exit to raise."""
    err_console.print(f"[red]error:[/red] {escape(message)}", markup=True, emoji=False)
    return typer.Exit(code)


def guarded(command: Callable[[], Any]) -> None:
    """Run a command as the console script does: user errors exit cleanly; a bug says how to
    get its details instead of showing a traceback."""
    try:
        command()
    except KeyboardInterrupt:
        err_console.print("interrupted")
        sys.exit(130)
    except Exception as exc:  # a bug, not a user error: keep the message, hide the traceback
        if os.environ.get("GPUFLEET_DEBUG"):
            raise
        err_console.print(
            f"[red]internal error:[/red] {type(exc).__name__}: {escape(str(exc))}\n"
            "This is a gpufleet bug. Run again with GPUFLEET_DEBUG=1 for the traceback "
            "and report it.",
            markup=True,
        )
        sys.exit(70)
