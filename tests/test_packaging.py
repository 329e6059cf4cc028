"""Every Python package of the repository is listed in pyproject.toml, so installs are whole."""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_all_packages_are_listed() -> None:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    found = set()
    # gpufleet/controllers and gpufleet/agent are links to the top-level folders: follow them
    for folder, _, files in os.walk(REPO / "gpufleet", followlinks=True):
        if "__init__.py" in files:
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
