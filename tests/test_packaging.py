"""Every Python package of the repository is listed in pyproject.toml, so installs are whole."""

from __future__ import annotations

import os
import re
import subprocess
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def test_all_packages_are_listed() -> None:
    """Every folder with files is a package of its own in `packages`, a folder of data files
    too: else setuptools warns at every install (and may leave its files out of a wheel)."""
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    found = set()
    # gpufleet/controllers and gpufleet/agent are links to the top-level folders: follow them
    for folder, _, files in os.walk(REPO / "gpufleet", followlinks=True):
        if "__pycache__" not in folder and files:
            found.add(".".join(Path(folder).relative_to(REPO).parts))
    assert found == listed


def test_the_shells_are_linked_into_the_package() -> None:
    """controllers/ and agent/ live at the top level (the project's layout) and are imported
    as gpufleet.controllers and gpufleet.agent through links, which every tool follows."""
    for name in ("controllers", "agent"):
        link = REPO / "gpufleet" / name
        assert link.is_symlink() and link.resolve() == REPO / name


def test_data_files_the_code_opens_are_installed() -> None:
    """Files read with importlib.resources must be package data, or a wheel lacks them."""
    data = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    shipped = data["package-data"]
    for package, name in (("gpufleet.api", "dashboard.html"), ("gpufleet.testing", "kwok.yaml")):
        folder = REPO.joinpath(*package.split("."))
        matched = {path for pattern in shipped[package] for path in folder.glob(pattern)}
        assert folder / name in matched, f"{package}/{name} is not package data"


def test_no_test_skips_under_ci() -> None:
    """A test whose external piece is missing skips through `skip_unless_ci`, which fails
    instead under CI: a plain pytest.skip would hide a broken build step there."""
    tests = Path(__file__).resolve().parent
    allowed = ("conftest.py", "pytest." + "skip(reason)")  # skip_unless_ci's own
    plain = [
        f"{path.relative_to(tests)}:{number}"
        for path in sorted(tests.rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"pytest\.(skip\(|mark\.skip|importorskip)", line)
        and (path.name, line.strip()) != allowed
    ]
    assert plain == [], f"plain skips (use conftest.skip_unless_ci): {plain}"


def test_system_deps_fails_when_a_package_does_not_install(tmp_path: Path) -> None:
    """`make test` stops when apt-get cannot install a package a test needs, whichever
    package it is (the first of the list here), instead of going on to skip its tests."""
    fake = tmp_path / "bin"
    fake.mkdir()
    apt = fake / "apt-get"
    apt.write_text('#!/bin/sh\necho "E: Unable to locate package $*" >&2\nexit 100\n')
    apt.chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{fake}:{os.environ['PATH']}",
        "SYSTEM_DEPS": "gpufleet-absent-one:gpufleet-absent-cmd bash:bash",
    }
    done = subprocess.run(
        ["bash", str(REPO / "hack" / "system-deps.sh")],
        capture_output=True, text=True, env=env, timeout=60,
    )  # fmt: skip
    if os.geteuid() != 0:
        assert done.returncode == 0 and "warning: gpufleet-absent-one not found" in done.stdout
        return
    assert done.returncode == 1, done.stdout + done.stderr
    assert "apt-get install gpufleet-absent-one failed" in done.stderr


def test_every_test_runs_under_a_time_limit(pytestconfig: pytest.Config) -> None:
    assert pytestconfig.pluginmanager.has_plugin("timeout"), "pytest-timeout is not installed"
    assert float(pytestconfig.getini("timeout")) > 0
