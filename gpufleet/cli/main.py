"""The `gpufleet` command line."""

from __future__ import annotations

import typer
from typer._completion_classes import completion_init  # Typer has no public name for these

from gpufleet import __version__
from gpufleet.cli.agent import agent_app, nodes_app
from gpufleet.cli.capacity import capacity
from gpufleet.cli.controller import controller_app
from gpufleet.cli.cost import cost_app, usage_command
from gpufleet.cli.crds import crds
from gpufleet.cli.decide import decide_command
from gpufleet.cli.dev import dev_app
from gpufleet.cli.diagnose import diagnose_workload  # noqa: F401 (registers the command)
from gpufleet.cli.finops import budgets_command, recommendations_command
from gpufleet.cli.fleet import (
    health_command,
    metrics_command,
    reservations_command,
    teams_command,
    templates_command,
    whoami_command,
)
from gpufleet.cli.hosts import hosts_app
from gpufleet.cli.hub import clusters_app, hub_app
from gpufleet.cli.live import status_command, workloads_app
from gpufleet.cli.notify import notify_app
from gpufleet.cli.ops import ops_app
from gpufleet.cli.output import fail, guarded
from gpufleet.cli.plan import plan_command
from gpufleet.cli.preflight import preflight_app
from gpufleet.cli.prices import prices_app
from gpufleet.cli.profiles import config_app, login, logout
from gpufleet.cli.render import render_command
from gpufleet.cli.run import run_command
from gpufleet.cli.server import server_command
from gpufleet.cli.simulate import simulate_command
from gpufleet.cli.submit import submit
from gpufleet.cli.validate import validate

app = typer.Typer(
    name="gpufleet",
    help="GitOps-driven GPU capacity control plane for Kubernetes: guaranteed reservations, "
    "idle GPUs lent to elastic work, automatic preemption and resume, GPU health isolation.\n\n"
    "Start with: gpufleet validate DIR, gpufleet render DIR --target all, gpufleet capacity DIR.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"gpufleet {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """gpufleet command line."""


app.command("validate")(validate)
app.command("render")(render_command)
app.command("capacity")(capacity)
app.command("crds")(crds)
app.command("decide")(decide_command)
app.add_typer(dev_app, name="dev")
app.add_typer(controller_app, name="controller")
app.add_typer(hub_app, name="hub")
app.add_typer(clusters_app, name="clusters")
app.command("status")(status_command)
app.command("teams")(teams_command)
app.command("reservations")(reservations_command)
app.command("templates")(templates_command)
app.command("health")(health_command)
app.command("whoami")(whoami_command)
app.command("metrics")(metrics_command)
app.command("login")(login)
app.command("logout")(logout)
app.add_typer(config_app, name="config")
app.add_typer(workloads_app, name="workloads")
app.command("submit")(submit)
app.command("run")(run_command)
app.command("simulate")(simulate_command)
app.command("plan")(plan_command)
app.add_typer(cost_app, name="cost")
app.command("usage")(usage_command)
app.command("budgets")(budgets_command)
app.command("recommendations")(recommendations_command)
app.add_typer(agent_app, name="agent")
app.add_typer(nodes_app, name="nodes")
app.add_typer(hosts_app, name="hosts")
app.add_typer(preflight_app, name="preflight")
app.add_typer(prices_app, name="prices")
app.add_typer(notify_app, name="notify")
app.add_typer(ops_app, name="ops")
app.command("server")(server_command)


SHELLS = ("bash", "zsh", "fish")
# the completion scripts ask the command itself (_GPUFLEET_COMPLETE=complete_SHELL); Typer
# answers them once its shells are registered, which add_completion=False leaves undone
completion_init()


@app.command("completion")
def completion_command(
    shell: str = typer.Argument(..., help=f"{', '.join(SHELLS)}."),
) -> None:
    """Print the shell's completion script for gpufleet: its commands, options and values.

    Example: gpufleet completion bash > ~/.local/share/bash-completion/completions/gpufleet

    Example: gpufleet completion zsh > "${fpath[1]}/_gpufleet"

    Example: gpufleet completion fish > ~/.config/fish/completions/gpufleet.fish
    """
    from typer._completion_shared import get_completion_script

    if shell not in SHELLS:
        raise fail(f"completion {shell!r}: use {', '.join(SHELLS)}")
    typer.echo(
        get_completion_script(prog_name="gpufleet", complete_var="_GPUFLEET_COMPLETE", shell=shell)
    )


def run() -> None:
    """The full CLI, its user errors and bugs answered as `guarded` does."""
    guarded(app)
