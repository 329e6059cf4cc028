"""`gpufleet run`: from a project folder to a running GPU workload in one command. It detects
the project, assembles its image without a Docker daemon (or builds a given Dockerfile with
buildah, podman or docker), pushes it, and submits the workload as `gpufleet submit` does."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import typer

from gpufleet.cli.live import KUBECONFIG, ClusterReader
from gpufleet.cli.output import OutputFormat, err_console, fail, print_data, print_yaml
from gpufleet.cli.submit import create_workload
from gpufleet.image.build import BuildError, Pushed, build_and_push, inputs_tag
from gpufleet.image.builder import build_dockerfile, installed_builder
from gpufleet.image.credentials import CredentialsError, save_docker_login
from gpufleet.image.layers import project_files
from gpufleet.image.reference import BadReference, Reference, repository_in
from gpufleet.image.registry import NoCredentials, RegistryError
from gpufleet.kube.kinds import kind_of
from gpufleet.kube.manifests import is_priority, run_workload, with_image
from gpufleet.model.api import NAMED_PRIORITIES
from gpufleet.model.gpu_types import UnknownGPUType, canonical_gpu_types, split_list
from gpufleet.model.suggest import did_you_mean
from gpufleet.project.config import (
    Profile,
    RunConfig,
    load_project_config,
    load_user_config,
    merged,
    profile_of,
    save_profile,
    user_config_path,
)
from gpufleet.project.detect import ProjectError, detect
from gpufleet.project.dockerfile import dockerfile
from gpufleet.project.plan import RunPlan, plan

FORWARDED = "(forwarded from your environment)"  # shown by --dry-run instead of the value


def run_command(
    path: Path = typer.Argument(Path("."), help="The project's folder."),
    team: str | None = typer.Option(
        None, "--team", "-t", help="The team the work belongs to (or team: in the config)."
    ),
    gpus: int | None = typer.Option(None, "--gpus", "-g", min=1, help="GPUs per node (1)."),
    nodes: int | None = typer.Option(
        None,
        "--nodes",
        min=1,
        help="Nodes that run together (1); more than one makes a TrainJob (torchrun), a "
        "RayJob (Ray) or a JobSet.",
    ),
    gpu_type: str | None = typer.Option(
        None,
        "--gpu-type",
        help="The GPU types it accepts, the most preferred first, e.g. H100 or H100,A100: their "
        "pools are tried in this order.",
    ),
    workload_class: str | None = typer.Option(
        None,
        "--class",
        "-c",
        help="reserved (within the team's reservation, never preempted) or elastic (idle "
        "GPUs, may be preempted); default elastic.",
    ),
    pool: str | None = typer.Option(None, "--pool", help="Only this pool."),
    registry: str | None = typer.Option(
        None,
        "--registry",
        help="Where the image is pushed: a registry host, and a path if any: ghcr.io/team, "
        "123456789012.dkr.ecr.us-east-1.amazonaws.com, us-docker.pkg.dev/proj/repo, "
        "localhost:5000. Default: registry: of the profile.",
    ),
    base_image: str | None = typer.Option(
        None, "--base-image", help="Base image instead of the framework's (pin a @sha256:)."
    ),
    dockerfile_path: Path | None = typer.Option(
        None,
        "--dockerfile",
        help="Build this Dockerfile with buildah, podman or docker instead (whichever is "
        "installed), with the project as its context.",
    ),
    no_cache: bool = typer.Option(
        False, "--no-cache", help="Build and push again even if the registry has the image."
    ),
    name: str | None = typer.Option(
        None, "--name", "-n", help="Workload and image name (default: the folder's)."
    ),
    entrypoint: str | None = typer.Option(
        None, "--entrypoint", help="The script to run (default: train.py, main.py, ...)."
    ),
    entrypoint_args: str | None = typer.Option(
        None, "--entrypoint-args", help='Its arguments, one string: "--epochs 3 --lr 1e-4".'
    ),
    env: list[str] | None = typer.Option(
        None, "--env", "-e", help="KEY=VALUE for the workload; repeatable."
    ),
    namespace: str | None = typer.Option(
        None, "--namespace", help="Default: the profile's, else the team's first namespace."
    ),
    priority: str | None = typer.Option(None, "--priority", help="Elastic work: low ... high."),
    profile_name: str | None = typer.Option(
        None, "--profile", help="Profile of the user config (default: its own choice)."
    ),
    dry_run: bool = typer.Option(
        False,
        "--dry-run",
        help="Print the generated Dockerfile and the workload manifest; touch nothing.",
    ),
    save_dockerfile: Path | None = typer.Option(
        None, "--save-dockerfile", help="Write the generated Dockerfile here too."
    ),
    no_submit: bool = typer.Option(
        False, "--no-submit", help="Build and push only; print the image reference (for CI)."
    ),
    platform: str = typer.Option("linux/amd64", "--platform", help="The nodes' platform."),
    output: OutputFormat = typer.Option(
        OutputFormat.TABLE, "-o", "--output", help="table, json or yaml."
    ),
    kubeconfig: Path | None = KUBECONFIG,
) -> None:
    """Run a training project on the cluster's GPUs: detect it, build and push its image
    (no Docker daemon needed), submit it as a workload.

    Settings come from the project's .gpufleet.yaml, then the user config's profile
    (~/.config/gpufleet/config.yaml), then these flags (which win).

    Example: gpufleet run . --team nlp --gpus 8

    Example: gpufleet run ./llm --team llm -g 8 --nodes 4 --class reserved --gpu-type H100

    Example: gpufleet run . --dry-run   (the Dockerfile and the manifest, nothing touched)

    Example: gpufleet run . --no-submit -o json   (in CI: build and push only)
    """
    root = path.resolve()
    try:
        user = load_user_config()
        profile = profile_of(user, profile_name)
        config = _merged(
            load_project_config(root),
            profile,
            team=team,
            gpus=gpus,
            nodes=nodes,
            gpu_type=gpu_type,
            workload_class=workload_class,
            pool=pool,
            registry=registry,
            base_image=base_image,
            name=name,
            entrypoint=entrypoint,
            entrypoint_args=entrypoint_args,
            env=env,
            namespace=namespace,
            priority=priority,
        )
        project = detect(root, config.entrypoint)
        chosen = plan(project, config)
        files = project_files(root, config.ignore)
    except ProjectError as err:
        raise fail(str(err)) from None
    if config.priority and not is_priority(config.priority):
        raise fail(f"priority {config.priority!r}: use {', '.join(NAMED_PRIORITIES)} or 0-99")
    text = dockerfile(chosen)
    if save_dockerfile is not None:
        _write(save_dockerfile, text)
    if dry_run:
        _print_dry_run(chosen, config, root, files, text, platform, output)
        return
    if dockerfile_path is None and not files:
        raise fail(f"{root}: no files to put in the image (all ignored?)")
    if not no_submit and not config.team:
        raise fail("no team: pass --team, or set team: in .gpufleet.yaml or the profile")
    config = _with_registry(
        config, profile_name or os.environ.get("GPUFLEET_PROFILE") or user.profile
    )
    assert config.registry is not None
    try:
        target = repository_in(config.registry, chosen.name)
    except BadReference as err:
        raise fail(str(err)) from None
    reader: ClusterReader | None = None
    workload: dict[str, Any] | None = None
    if not no_submit:
        # everything the cluster could refuse is asked before anything is pushed
        reader = ClusterReader(kubeconfig)
        config = _resolved(reader, config)
        workload = _workload(chosen, config, "placeholder.invalid/image:check")
        _server_dry_run(reader, workload)
    started = time.monotonic()
    pushed = _image(chosen, root, files, target, no_cache, platform, dockerfile_path)
    result: dict[str, Any] = {
        "image": str(pushed.reference),
        "tag": f"{target.name}:{pushed.tag}",
        "built": not pushed.skipped,
        "bytesPushed": pushed.bytes_sent,
        "blobsPushed": len(pushed.blobs_sent),
        "blobsMounted": len(pushed.blobs_mounted),
        "seconds": round(time.monotonic() - started, 2),
    }
    if reader is not None and workload is not None:
        workload = with_image(workload, str(pushed.reference))
        made = create_workload(reader, workload, workload["metadata"]["namespace"])
        adapter = kind_of(made)
        result["workload"] = {
            "kind": made["kind"],
            "namespace": made["metadata"]["namespace"],
            "name": made["metadata"]["name"],
            # what gpufleet workloads list and explain call it
            "gpuworkload": adapter.workload_name(made["metadata"]["name"]) if adapter else None,
        }
    _report(result, output)


# --- settings ----------------------------------------------------------------------------------


def _merged(project: RunConfig, profile: Profile, **flags: Any) -> RunConfig:
    """The project file, then the profile, then the flags (--env KEY=VALUE, repeated)."""
    env = {}
    for item in flags.pop("env") or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ProjectError(f"--env {item!r}: write KEY=VALUE")
        env[key] = value
    if flags.get("entrypoint_args") is not None:
        flags["entrypoint_args"] = flags["entrypoint_args"].split()
    return merged(project, profile, {**flags, "env": env})


def _with_registry(config: RunConfig, profile: str) -> RunConfig:
    """The registry, asked for on a terminal (and saved in the profile) when none is set."""
    if config.registry:
        return config
    where = user_config_path()
    if not (sys.stdin.isatty() and sys.stderr.isatty()):
        raise fail(
            "no registry to push the image to: pass --registry (a host, and a path if any), or "
            f"set registry: in .gpufleet.yaml or in profile {profile!r} of {where}"
        )
    answer = typer.prompt(
        "Registry to push images to (e.g. ghcr.io/you, localhost:5000)", err=True
    ).strip()
    try:
        repository_in(answer, "check")
    except BadReference as err:
        raise fail(str(err)) from None
    save_profile(profile, {"registry": answer})
    err_console.print(f"saved registry {answer} in profile {profile!r} of {where}")
    return config.model_copy(update={"registry": answer})


def _resolved(reader: ClusterReader, config: RunConfig) -> RunConfig:
    """The team checked, the GPU types checked, the namespace chosen."""
    teams = {t["metadata"]["name"]: t for t in reader.list("teams")}
    team = config.team or ""
    if team not in teams:
        known = ", ".join(sorted(teams)) or "none: the fleet declares no Team"
        raise fail(f"team {team!r} does not exist{did_you_mean(team, list(teams))}; teams: {known}")
    updates: dict[str, Any] = {}
    if not config.namespace:
        namespaces = (teams[team].get("spec") or {}).get("namespaces") or []
        updates["namespace"] = namespaces[0] if namespaces else "default"
    if config.gpu_type:
        updates["gpu_type"] = _gpu_types(reader, config.gpu_type)
    return config.model_copy(update=updates)


def _gpu_types(reader: ClusterReader, gpu_type: str) -> str:
    """--gpu-type checked against the pools' GPU types and spelled as they spell them."""
    pool_types = [str((p.get("spec") or {}).get("gpuType", "")) for p in reader.list("gpupools")]
    try:
        return ",".join(canonical_gpu_types(split_list(gpu_type), pool_types))
    except UnknownGPUType as err:
        raise fail(
            f"--gpu-type {err.asked}: no pool has that GPU type{err.suggestion}; "
            f"types: {err.listed}"
        ) from None


# --- the workload ------------------------------------------------------------------------------


def _workload(
    chosen: RunPlan, config: RunConfig, image: str, shown: bool = False
) -> dict[str, Any]:
    """The workload of the run; `shown`: forwarded values left out (for --dry-run)."""
    environ = {k: FORWARDED for k in os.environ} if shown else dict(os.environ)
    workload, missing = run_workload(chosen, config, image, environ)
    for key in missing:
        err_console.print(f"[yellow]note[/]: {key} is not set here: not forwarded")
    return workload


def _server_dry_run(reader: ClusterReader, workload: dict[str, Any]) -> None:
    """The API server's own checks (schema, admission, RBAC, quota) before anything is
    pushed: a workload it would refuse is refused now."""
    try:
        create_workload(reader, workload, workload["metadata"]["namespace"], dry_run=True)
    except typer.Exit:
        err_console.print("nothing was pushed or created")
        raise


# --- the image ---------------------------------------------------------------------------------


def _image(
    chosen: RunPlan,
    root: Path,
    files: list[str],
    target: Reference,
    no_cache: bool,
    platform: str,
    dockerfile_path: Path | None,
) -> Pushed:
    if dockerfile_path is not None:
        return _builder_image(root, dockerfile_path, target, chosen, files, platform, no_cache)
    for attempt in range(2):
        try:
            with _Progress() as progress:
                return build_and_push(
                    chosen, root, files, target, progress.report, no_cache, platform
                )
        except NoCredentials as err:
            if attempt or not (sys.stdin.isatty() and sys.stderr.isatty()):
                raise fail(str(err)) from None
            _login(err.host)
        except (RegistryError, BuildError, CredentialsError, BadReference) as err:
            raise fail(f"image not pushed: {err}") from None
    raise AssertionError("unreachable")


def _login(host: str) -> None:
    err_console.print(f"{host} asks for a login (saved in the Docker config, as docker login does)")
    username = typer.prompt("Username", err=True)
    password = typer.prompt("Password or token", hide_input=True, err=True)
    where = save_docker_login(host, username, password)
    err_console.print(f"saved the login to {host} in {where}")


def _builder_image(
    root: Path,
    path: Path,
    target: Reference,
    chosen: RunPlan,
    files: list[str],
    platform: str,
    no_cache: bool,
) -> Pushed:
    """A user's Dockerfile, built and pushed by the builder installed here."""
    builder = installed_builder()
    if builder is None:
        raise fail(
            "--dockerfile needs buildah, podman or docker, and none is on PATH: install one, "
            "or leave out --dockerfile and gpufleet builds the image without a daemon"
        )
    if not path.is_file():
        raise fail(f"--dockerfile {path}: no such file")
    # the tag covers the Dockerfile and every file of its context
    tag = inputs_tag(chosen, root, files, platform, extra=path.read_bytes())
    try:
        return build_dockerfile(
            builder, root, path, target, tag, platform, no_cache,
            lambda line: err_console.print(line, markup=False, highlight=False),
        )  # fmt: skip
    except (RegistryError, BuildError, CredentialsError) as err:
        raise fail(f"image not pushed: {err}") from None


class _Progress:
    """Progress of a build: bars on a terminal, a line per step otherwise."""

    def __init__(self) -> None:
        self.tty = sys.stderr.isatty()
        self.bars: Any = None
        self.tasks: dict[str, Any] = {}

    def __enter__(self) -> _Progress:
        if self.tty:
            from rich.progress import (
                BarColumn,
                DownloadColumn,
                Progress,
                TextColumn,
                TransferSpeedColumn,
            )

            self.bars = Progress(
                TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
                TransferSpeedColumn(), console=err_console, transient=True,
            )  # fmt: skip
            self.bars.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.bars is not None:
            self.bars.stop()

    def report(self, step: str, name: str, done: int, total: int) -> None:
        short = name.removeprefix("sha256:")[:12]
        if step == "upload":
            if self.bars is None:
                if done == total:
                    err_console.print(f"pushed {short} ({_size(total)})")
                return
            task = self.tasks.get(name)
            if task is None:
                task = self.tasks[name] = self.bars.add_task(f"push {short}", total=total)
            self.bars.update(task, completed=done)
            return
        line = {
            "unchanged": f"the registry has this image ({name}): nothing to build or push",
            "base": f"base image {name}",
            "dependencies": f"installing {name} for the image",
            "code": f"packing {name}",
            "exists": f"the registry has {short}",
            "mounted": f"mounted {short} from the base image's repository",
            "manifest": f"pushed the manifest, tag {name}",
        }.get(step, f"{step} {name}")
        err_console.print(f"[dim]{line}[/]")


def _size(count: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if count < 1024 or unit == "GB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024  # type: ignore[assignment]
    return str(count)


# --- output ------------------------------------------------------------------------------------


def _print_dry_run(
    chosen: RunPlan,
    config: RunConfig,
    root: Path,
    files: list[str],
    text: str,
    platform: str,
    output: OutputFormat,
) -> None:
    tag = inputs_tag(chosen, root, files, platform)
    repository = chosen.name
    if config.registry:
        try:
            repository = repository_in(config.registry, chosen.name).name
        except BadReference as err:
            raise fail(str(err)) from None
    workload = _workload(chosen, config, f"{repository}:{tag}", shown=True)
    if output is OutputFormat.JSON:
        err_console.print(text)
        print_data(workload)
        return
    lines = [
        "# gpufleet run --dry-run: nothing was built, pushed or submitted.",
        *(f"# {note}" for note in chosen.notes),
        f"# {len(files)} files of {root} go into the image",
        "#",
        *(f"# {line}" if line else "#" for line in text.rstrip("\n").split("\n")),
    ]
    if not config.team:
        lines.append("# no team set: pass --team (TEAM below)")
    print("\n".join(lines))
    print_yaml(workload)


def _report(result: dict[str, Any], output: OutputFormat) -> None:
    if output is OutputFormat.JSON:
        print_data(result)
        return
    if output is OutputFormat.YAML:
        print_yaml(result)
        return
    print(result["image"])  # stdout: the image reference, for scripts and CI
    workload = result.get("workload")
    if workload:
        err_console.print(
            f"submitted {workload['kind']} {workload['namespace']}/{workload['name']}; follow "
            f"it with: gpufleet workloads explain {workload['gpuworkload']} -n "
            f"{workload['namespace']}"
        )


def _write(path: Path, text: str) -> None:
    try:
        path.write_text(text)
    except OSError as err:
        raise fail(f"--save-dockerfile {path}: {err}") from None
    err_console.print(f"wrote the Dockerfile to {path}")
