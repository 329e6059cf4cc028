"""`gpufleet login`, `logout` and `config`: the profiles of the user's config (one per gpufleet
server, with its credentials, and the defaults of `gpufleet run`), which the SDK's
`Client.from_config()` reads too."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import typer
from rich import box
from rich.table import Table

from gpufleet.cli.output import OutputFormat, console, err_console, fail, print_structured
from gpufleet.project.config import (
    PROFILE_KEYS,
    UserConfig,
    load_user_config,
    save_profile,
    user_config_path,
    write_user_config,
)
from gpufleet.project.detect import ProjectError

config_app = typer.Typer(
    no_args_is_help=True,
    help="""The profiles of your gpufleet config: each names a gpufleet server and how to
    prove who you are to it (gpufleet login), and the defaults of gpufleet run (registry, team,
    namespace). The file is $GPUFLEET_CONFIG, else ~/.config/gpufleet/config.yaml; it is yours
    alone (mode 0600) as it may hold tokens.""",
)
PROFILE = typer.Option(
    None, "--profile", "-p", help="Profile to use; default $GPUFLEET_PROFILE, else the current."
)
REDACTED = "REDACTED"


def _load() -> UserConfig:
    try:
        return load_user_config()
    except ProjectError as err:
        raise fail(str(err)) from None


def _chosen(config: UserConfig, name: str | None) -> str:
    return name or os.environ.get("GPUFLEET_PROFILE") or config.profile


def _save(profile: str, values: dict[str, str | None]) -> Path:
    try:
        return save_profile(profile, values)
    except ProjectError as err:
        raise fail(str(err)) from None


def login(
    url: str = typer.Argument(..., help="The gpufleet server, e.g. https://gpufleet.example.com"),
    token: str | None = typer.Option(
        None,
        "--token",
        envvar="GPUFLEET_TOKEN",
        help="A bearer token (kubectl create token NAME); kept in the profile. Default: none "
        "kept: each call takes the --kubeconfig user's token, fresh.",
    ),
    kubeconfig: Path | None = typer.Option(
        None, "--kubeconfig", help="Whose user's token to send; default $KUBECONFIG or ~/.kube."
    ),
    ca_cert: Path | None = typer.Option(
        None, "--ca-cert", exists=True, dir_okay=False, help="The server's CA (a private one)."
    ),
    profile: str | None = PROFILE,
) -> None:
    """Check who the server sees you as, then save the server and your credentials in a
    profile and make it the current one: the SDK's Client.from_config() and gpufleet run use it.

    Example: gpufleet login https://gpufleet.example.com --profile prod
    """
    from gpufleet.client import ApiError, Client, token_from_kubeconfig

    if not url.startswith(("http://", "https://")):
        raise fail(f"{url}: not a server address; give it as https://HOST[:PORT]")
    config = _load()
    name = _chosen(config, profile)
    where = kubeconfig or Path(
        os.environ.get("KUBECONFIG", "").split(os.pathsep)[0] or Path.home() / ".kube/config"
    )
    if token is None:
        try:
            sent = token_from_kubeconfig(where)
        except Exception as err:  # no file, no user, a certificate user
            raise fail(f"{where}: no token to log in with ({err}); or give --token") from None
    else:
        sent = token
    try:
        with Client(url, sent, ca_cert=ca_cert) as client:
            me = client.whoami()
    except ApiError as err:
        raise fail(f"cannot log in to {url}: {err.message}") from None
    except OSError as err:  # the CA file cannot be read
        raise fail(f"--ca-cert {ca_cert}: {err}") from None
    saved = _save(
        name,
        {
            "server": url.rstrip("/"),
            "token": token,
            "kubeconfig": None if token else str(where.resolve()),
            "ca_cert": str(ca_cert.resolve()) if ca_cert else None,
        },
    )
    config = _load()
    config.profile = name
    write_user_config(config)
    console.print(f"logged in to {url} as {me.user} (profile {name}, saved in {saved})")


def logout(profile: str | None = PROFILE) -> None:
    """Forget the token a profile keeps (its server and defaults stay).

    Example: gpufleet logout --profile prod
    """
    config = _load()
    name = _chosen(config, profile)
    held = config.profiles.get(name)
    if held is None or (held.token is None and held.kubeconfig is None):
        err_console.print(f"profile {name} holds no credentials: nothing to forget")
        return
    _save(name, {"token": None, "kubeconfig": None})
    console.print(f"logged out of {held.server or 'the server'} (profile {name})")


def _shown(config: UserConfig) -> dict[str, Any]:
    """The config as `config view` shows it: tokens left out."""
    data = config.model_dump(exclude_none=True)
    for values in data["profiles"].values():
        if "token" in values:
            values["token"] = REDACTED
    return data


@config_app.command("list")
def list_profiles(
    output: OutputFormat = typer.Option(OutputFormat.TABLE, "-o", "--output"),
) -> None:
    """Each profile: its server, how it logs in, its run defaults; * marks the current one.

    Example: gpufleet config list
    """
    config = _load()
    current = _chosen(config, None)
    rows = [
        {
            "name": name,
            "current": name == current,
            "server": p.server,
            "auth": "token" if p.token else "kubeconfig" if p.kubeconfig else None,
            "team": p.team,
            "namespace": p.namespace,
            "registry": p.registry,
        }
        for name, p in sorted(config.profiles.items())
    ]
    if print_structured(rows, output):
        return
    if not rows:
        err_console.print(f"no profiles in {user_config_path()}: gpufleet login URL makes one")
        return
    table = Table(box=box.SIMPLE)
    for column in ("CURRENT", "NAME", "SERVER", "AUTH", "TEAM", "NAMESPACE", "REGISTRY"):
        table.add_column(column)
    for r in rows:
        shown = [str(r[k] or "-") for k in ("name", "server", "auth", "team", "namespace")]
        table.add_row("*" if r["current"] else "", *shown, str(r["registry"] or "-"))
    console.print(table)


@config_app.command("use")
def use_profile(name: str) -> None:
    """Make a profile the current one.

    Example: gpufleet config use staging
    """
    config = _load()
    if name not in config.profiles:
        known = ", ".join(sorted(config.profiles)) or "none yet (gpufleet login URL makes one)"
        raise fail(f"no profile {name!r} in {user_config_path()}; profiles: {known}")
    config.profile = name
    write_user_config(config)
    console.print(f"current profile: {name}")


@config_app.command("view")
def view_config(
    output: OutputFormat = typer.Option(OutputFormat.YAML, "-o", "--output"),
) -> None:
    """Print the config (tokens shown as REDACTED).

    Example: gpufleet config view -o json
    """
    print_structured(_shown(_load()), OutputFormat.YAML if output is OutputFormat.TABLE else output)


@config_app.command("set")
def set_value(
    key: str = typer.Argument(..., help=f"One of: {', '.join(PROFILE_KEYS)}."),
    value: str = typer.Argument(...),
    profile: str | None = PROFILE,
) -> None:
    """Set one field of a profile (made if new).

    Example: gpufleet config set registry ghcr.io/me --profile prod
    """
    _check_key(key)
    name = _chosen(_load(), profile)
    _save(name, {key: value})
    console.print(f"profile {name}: {key} set")


@config_app.command("unset")
def unset_value(key: str, profile: str | None = PROFILE) -> None:
    """Remove one field of a profile.

    Example: gpufleet config unset namespace
    """
    _check_key(key)
    name = _chosen(_load(), profile)
    _save(name, {key: None})
    console.print(f"profile {name}: {key} unset")


def _check_key(key: str) -> None:
    if key not in PROFILE_KEYS:
        raise fail(f"no profile field {key!r}; the fields are: {', '.join(PROFILE_KEYS)}")
