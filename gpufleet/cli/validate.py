"""`gpufleet validate`: check a GitOps repository before merge."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import typer

from gpufleet.cli.output import (
    ProblemFormat,
    err_console,
    print_data,
    print_problems,
    problem_counts,
)
from gpufleet.model import has_errors, validate_paths


def validate(
    paths: list[Path] = typer.Argument(
        ...,
        help="YAML files or folders (searched recursively for *.yaml and *.yml).",
        show_default=False,
    ),
    output: ProblemFormat = typer.Option(
        ProblemFormat.TEXT,
        "-o",
        "--output",
        help="text: FILE:LINE: SEVERITY: MESSAGE; json: a list.",
    ),
    warnings_as_errors: bool = typer.Option(
        False, "--warnings-as-errors", help="Exit 1 on warnings too (strict CI)."
    ),
    now: datetime | None = typer.Option(
        None,
        help="Check expiry against this time instead of now (ISO 8601).",
        formats=["%Y-%m-%dT%H:%M:%S%z", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d"],
    ),
) -> None:
    """Check pools, teams, reservations and policies before merge.

    Checks the schema (types, ranges, unknown fields), references between objects, the team
    tree, reserved capacity against maxGPUs, expiry and provider settings.

    Every problem is reported (not just the first) as FILE:LINE: error|warning: MESSAGE.
    Exit code 1 if there is any error, 0 otherwise.

    Example: gpufleet validate gitops/ policies/
    """
    if now is not None and now.tzinfo is None:
        now = now.replace(tzinfo=UTC)
    fleet, problems = validate_paths(paths, now)
    if output is ProblemFormat.JSON:
        print_data([p.to_dict() for p in problems])
    else:
        print_problems(problems)
        objects = len(fleet.objects())
        err_console.print(
            f"{objects} object{'s' * (objects != 1)} checked: {problem_counts(problems)}"
        )
    failed = has_errors(problems) or (warnings_as_errors and bool(problems))
    raise typer.Exit(1 if failed else 0)
