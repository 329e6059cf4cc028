"""What `gpufleet run` makes of a project and its settings: the base image, the Python the
dependencies are installed for, the command each node starts, and the workload kind. Pure."""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpufleet.project.config import RunConfig
from gpufleet.project.detect import Project, ProjectError, canonical

DEFAULT_PYTHON = "3.11"
WORKDIR = "/workspace"  # the project's files in the image
DEPS_DIR = "/opt/gpufleet/deps"  # the dependencies (pip --target), on PYTHONPATH


@dataclass(frozen=True)
class Base:
    image: str
    python: str
    provides: tuple[str, ...] = ()  # distributions the base holds: not installed again


# a framework's own CUDA image, where one is published for the Python it holds; otherwise the
# Python image, with the framework's CUDA wheels installed from PyPI like any dependency
FRAMEWORK_BASES = {
    "pytorch": Base(
        "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime",
        "3.11",
        ("torch", "torchvision", "torchaudio"),
    ),
    "tensorflow": Base("tensorflow/tensorflow:2.18.0-gpu", "3.11", ("tensorflow",)),
}
NAME = re.compile(r"[^a-z0-9-]+")


@dataclass(frozen=True)
class RunPlan:
    name: str
    base: Base
    python: str
    requirements: tuple[str, ...]  # what the dependencies layer installs
    skipped: tuple[str, ...]  # requirements the base image provides
    command: tuple[str, ...]
    kind: str  # job, jobset, trainjob or rayjob
    gpus: int
    nodes: int
    launcher: str | None
    notes: tuple[str, ...]


def plan(project: Project, config: RunConfig) -> RunPlan:
    """The run of `project` with `config` (the project file, the profile and the flags merged)."""
    notes = list(project.notes)
    entry = config.entrypoint or project.entrypoint
    if entry is None:
        raise ProjectError(
            f"{project.root}: no entrypoint found (none of train.py, main.py, run.py, app.py); "
            "set entrypoint in .gpufleet.yaml or pass --entrypoint"
        )
    python = config.python or project.python
    base = _base(project.framework, python, config.base_image)
    python = base.python  # a given base is checked when it is pulled (PYTHON_VERSION)
    notes.append(f"base image: {base.image} (Python {base.python})")
    provided = set(base.provides)
    kept: list[str] = []
    skipped: list[str] = []
    for line, name in zip(
        project.requirements.lines, _names(project.requirements.lines), strict=True
    ):
        (skipped if name in provided else kept).append(line)
    if skipped:
        notes.append(f"provided by the base image, not installed again: {', '.join(skipped)}")
    launcher = None if config.launcher == "python" else config.launcher or project.launcher
    gpus, nodes = config.gpus or 1, config.nodes or 1
    command = _command(launcher, entry, config.entrypoint_args, gpus, nodes)
    kind = _kind(launcher, nodes)
    return RunPlan(
        name=config.name or _name(project),
        base=base,
        python=python,
        requirements=tuple(kept),
        skipped=tuple(skipped),
        command=command,
        kind=kind,
        gpus=gpus,
        nodes=nodes,
        launcher=launcher,
        notes=tuple(notes),
    )


def _base(framework: str | None, python: str | None, given: str | None) -> Base:
    if given:
        # a user's base: its Python is the project's (or the default), nothing is skipped
        return Base(given, python or DEFAULT_PYTHON)
    held = FRAMEWORK_BASES.get(framework or "")
    if held is not None and python in (None, held.python):
        return held
    version = python or DEFAULT_PYTHON
    return Base(f"python:{version}-slim", version)


def _names(lines: tuple[str, ...]) -> list[str]:
    from gpufleet.project.detect import REQUIREMENT_NAME

    names = []
    for line in lines:
        match = REQUIREMENT_NAME.match(line)
        names.append(canonical(match.group(1)) if match and not line.startswith("-") else "")
    return names


def _command(
    launcher: str | None, entry: str, args: list[str], gpus: int, nodes: int
) -> tuple[str, ...]:
    """What each node runs. Multi-node torchrun and Ray runs are started by their operator
    (the TrainJob's runtime sets torchrun's rendezvous, the RayJob its cluster)."""
    script = (entry, *args)
    if launcher == "torchrun":
        return ("torchrun", f"--nproc_per_node={gpus}", *script)
    if launcher == "accelerate":
        return ("accelerate", "launch", f"--num_processes={gpus * nodes}", *script)
    if launcher == "deepspeed":
        return ("deepspeed", f"--num_gpus={gpus}", *script)
    if launcher == "horovod":
        return ("horovodrun", f"-np={gpus * nodes}", "python3", *script)
    return ("python3", *script)


def _kind(launcher: str | None, nodes: int) -> str:
    if launcher == "ray":
        return "rayjob"
    if nodes == 1:
        return "job"
    return "trainjob" if launcher == "torchrun" else "jobset"


def _name(project: Project) -> str:
    """The workload's name from the folder's: lower case, letters, digits and dashes."""
    name = NAME.sub("-", project.root.resolve().name.lower()).strip("-")[:40].strip("-")
    if not name or not name[0].isalnum():
        raise ProjectError(
            f"{project.root}: cannot make a workload name from the folder's name; set name "
            "in .gpufleet.yaml or pass --name"
        )
    return name
