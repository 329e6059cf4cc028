"""`gpufleet plan`: the object diff of a GitOps change and its simulated impact on a trace."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path

import typer

from gpufleet.cli.output import console, err_console
from gpufleet.cli.simulate import TraceFormat, load_gitops, load_trace, run_with_progress
from gpufleet.plan import make_plan, to_markdown


class PlanFormat(StrEnum):
    MARKDOWN = "markdown"
    JSON = "json"


def plan_command(
    gitops: list[Path] = typer.Option(
        ..., "--gitops", "-g", help="The proposed GitOps files or folders (the pull request)."
    ),
    baseline: list[Path] = typer.Option(
        ..., "--baseline", "-b", help="The current GitOps files or folders (the main branch)."
    ),
    trace: Path | None = typer.Option(
        None, "--trace", "-t", help="Trace to replay; default: a synthetic one (see --seed)."
    ),
    trace_format: TraceFormat = typer.Option(TraceFormat.NATIVE, "--format", "-f"),
    seed: int = typer.Option(42, "--seed", help="Seed of the synthetic trace."),
    checkpoint_interval: float = typer.Option(1800, "--checkpoint-interval"),
    output: PlanFormat = typer.Option(
        PlanFormat.MARKDOWN, "-o", "--output", help="markdown (a PR comment) or json."
    ),
    out_file: Path | None = typer.Option(None, "--out", help="Write here instead of stdout."),
) -> None:
    """Show what a change to pools, teams, reservations or policy does before it is merged:
    the GitOps objects and rendered cluster objects it adds, removes or changes, and the same
    trace simulated under the current and the proposed configuration, side by side.

    Example (in a pull-request job):

      gpufleet plan --baseline main/gitops --gitops gitops --trace traces/last-week.csv \\
          --out plan.md
    """
    old = load_gitops(baseline)
    new = load_gitops(gitops)
    # one trace for both: a synthetic one is generated from the proposed teams
    jobs = load_trace(new, trace, trace_format, seed)
    # from now, as `simulate` by default: a reservation about to expire shows in the plan
    now = datetime.now(UTC).replace(microsecond=0)
    before = run_with_progress(old, jobs, checkpoint_interval, "gpufleet", start=now).metrics()
    after = run_with_progress(new, jobs, checkpoint_interval, "gpufleet", start=now).metrics()
    name = trace.name if trace else f"synthetic trace (seed {seed})"
    plan = make_plan(old, new, before, after, name)
    text = json.dumps(plan, indent=2) + "\n" if output is PlanFormat.JSON else to_markdown(plan)
    if out_file is None:
        console.print(text, markup=False, highlight=False, end="", soft_wrap=True)
        return
    try:
        out_file.write_text(text)
    except OSError as err:
        raise typer.BadParameter(f"cannot write {out_file}: {err}") from err
    err_console.print(f"plan written to {out_file}")
