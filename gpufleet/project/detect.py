"""What a training project is, read from its folder: its framework, entrypoint, Python version,
distributed launcher and requirements. Pure: reads files, touches nothing else."""

from __future__ import annotations

import ast
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

ENTRYPOINTS = ("train.py", "main.py", "run.py", "app.py")
# the distribution names that say which framework a project uses, first match wins
FRAMEWORKS = {
    "pytorch": ("torch", "pytorch-lightning", "lightning"),
    "jax": ("jax", "flax"),
    "tensorflow": ("tensorflow", "tensorflow-gpu", "tensorflow-cpu", "tf-keras"),
}
LAUNCHERS = ("torchrun", "accelerate", "deepspeed", "ray", "horovod")
REQUIREMENT_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")
PYTHON_VERSION = re.compile(r"(\d+)\.(\d+)")


class ProjectError(ValueError):
    """A project that cannot be run as it is; the message names the file and the fix."""


@dataclass(frozen=True)
class Requirements:
    """The project's dependencies as pip reads them: the lines of requirements.txt, or those
    declared in pyproject.toml or setup.py, and where they came from."""

    lines: tuple[str, ...] = ()
    source: str | None = None  # "requirements.txt", "pyproject.toml", "setup.py"

    @property
    def names(self) -> tuple[str, ...]:
        found = []
        for line in self.lines:
            match = REQUIREMENT_NAME.match(line)
            if match and not line.lstrip().startswith("-"):
                found.append(canonical(match.group(1)))
        return tuple(found)


@dataclass(frozen=True)
class Project:
    root: Path
    framework: str | None  # pytorch, jax, tensorflow, or None
    entrypoint: str | None  # a path relative to root
    python: str | None  # "3.11", when the project says
    launcher: str | None  # one of LAUNCHERS, or None: plain python
    requirements: Requirements = field(default_factory=Requirements)
    notes: tuple[str, ...] = ()  # what detection chose and why, for --dry-run and -v


def canonical(name: str) -> str:
    """A distribution name as pip compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def detect(root: Path, entrypoint: str | None = None) -> Project:
    """The project in `root`. `entrypoint` (from the config or a flag) wins over the usual
    file names."""
    if not root.is_dir():
        raise ProjectError(f"{root}: not a folder; pass the project's folder")
    notes: list[str] = []
    requirements = read_requirements(root)
    if requirements.source:
        notes.append(f"dependencies: {len(requirements.lines)} from {requirements.source}")
    framework = _framework(requirements)
    if framework:
        notes.append(f"framework: {framework} (from {requirements.source})")
    entry = _entrypoint(root, entrypoint)
    if entry is not None and entrypoint is None:
        notes.append(f"entrypoint: {entry} (found in the project)")
    python = _python(root)
    if python:
        notes.append(f"python: {python[0]} (from {python[1]})")
    source = _source(root, entry)
    launcher = _launcher(requirements, source, framework, root)
    if launcher:
        notes.append(f"launcher: {launcher}")
    return Project(
        root=root,
        framework=framework,
        entrypoint=entry,
        python=python[0] if python else None,
        launcher=launcher,
        requirements=requirements,
        notes=tuple(notes),
    )


def read_requirements(root: Path) -> Requirements:
    path = root / "requirements.txt"
    if path.is_file():
        lines = [
            line.strip()
            for line in _read(path).splitlines()
            if line.strip() and not line.lstrip().startswith("#")
        ]
        return Requirements(tuple(lines), "requirements.txt")
    path = root / "pyproject.toml"
    if path.is_file():
        try:
            data = tomllib.loads(_read(path))
        except tomllib.TOMLDecodeError as err:
            raise ProjectError(f"{path}: not valid TOML ({err}); fix it") from None
        deps = (data.get("project") or {}).get("dependencies") or []
        if deps:
            return Requirements(tuple(str(d) for d in deps), "pyproject.toml")
    path = root / "setup.py"
    if path.is_file():
        deps = _setup_requires(path)
        if deps:
            return Requirements(tuple(deps), "setup.py")
    return Requirements()


def _setup_requires(path: Path) -> list[str]:
    """install_requires of setup.py's setup() call, when it is a literal list."""
    try:
        tree = ast.parse(_read(path), str(path))
    except SyntaxError as err:
        raise ProjectError(f"{path}: not valid Python ({err.msg}, line {err.lineno})") from None
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            for keyword in node.keywords:
                if keyword.arg == "install_requires":
                    try:
                        value = ast.literal_eval(keyword.value)
                    except ValueError:
                        raise ProjectError(
                            f"{path}: install_requires is not a literal list; list the "
                            "dependencies in requirements.txt instead"
                        ) from None
                    return [str(v) for v in value]
    return []


def _framework(requirements: Requirements) -> str | None:
    names = set(requirements.names)
    for framework, distributions in FRAMEWORKS.items():
        if names.intersection(distributions):
            return framework
    return None


def _entrypoint(root: Path, given: str | None) -> str | None:
    if given:
        if not (root / given).is_file():
            raise ProjectError(
                f"{root}: the entrypoint {given!r} is not a file of the project; fix "
                "entrypoint in .gpufleet.yaml or --entrypoint"
            )
        return given
    for name in ENTRYPOINTS:
        if (root / name).is_file():
            return name
    return None


def _python(root: Path) -> tuple[str, str] | None:
    """The major.minor version the project asks for, and where it said so."""
    path = root / ".python-version"
    if path.is_file():
        match = PYTHON_VERSION.search(_read(path))
        if match:
            return f"{match.group(1)}.{match.group(2)}", ".python-version"
    path = root / "pyproject.toml"
    if path.is_file():
        try:
            data = tomllib.loads(_read(path))
        except tomllib.TOMLDecodeError:
            return None  # read_requirements says what is wrong with it
        wanted = (data.get("project") or {}).get("requires-python")
        if isinstance(wanted, str):
            # the lowest version it allows: ">=3.10" and "~=3.10" both mean 3.10
            match = PYTHON_VERSION.search(wanted)
            if match and not wanted.lstrip().startswith(("<", "!")):
                return f"{match.group(1)}.{match.group(2)}", "pyproject.toml requires-python"
    return None


def _source(root: Path, entry: str | None) -> str:
    if entry is None:
        return ""
    try:
        return (root / entry).read_text(errors="replace")
    except OSError:
        return ""


def _launcher(
    requirements: Requirements, source: str, framework: str | None, root: Path
) -> str | None:
    """How the entrypoint is started on each node: by what the code imports first, then by
    what the project depends on."""
    names = set(requirements.names)
    if re.search(r"^\s*(import|from)\s+ray\b", source, re.M) or "ray" in names:
        return "ray"
    if re.search(r"^\s*(import|from)\s+horovod\b", source, re.M) or "horovod" in names:
        return "horovod"
    if re.search(r"^\s*(import|from)\s+deepspeed\b", source, re.M) or (
        "deepspeed" in names and any(root.glob("ds_config*.json"))
    ):
        return "deepspeed"
    if re.search(r"^\s*(import|from)\s+accelerate\b", source, re.M):
        return "accelerate"
    if framework == "pytorch" and re.search(
        r"init_process_group|DistributedDataParallel|torch\.distributed", source
    ):
        return "torchrun"
    return None


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError) as err:
        raise ProjectError(f"{path}: cannot be read ({err})") from None
