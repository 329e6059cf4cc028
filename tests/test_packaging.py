"""Every Python package of the repository is listed in pyproject.toml, so installs are whole."""

from __future__ import annotations

import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_all_packages_are_listed() -> None:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    mapping = config["package-dir"]
    found = set()
    for name, folder in mapping.items():
        root = REPO / folder
        for init in root.rglob("__init__.py"):
            relative = init.parent.relative_to(root).parts
            found.add(".".join((name, *relative)))
    assert found == listed


def test_data_files_the_code_opens_are_installed() -> None:
    """Files read with importlib.resources must be package data, or a wheel lacks them."""
    data = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    shipped = data["package-data"]
    for package, name in (("gpufleet.api", "dashboard.html"), ("gpufleet.testing", "kwok.yaml")):
        folder = REPO.joinpath(*package.split("."))
        matched = {path for pattern in shipped[package] for path in folder.glob(pattern)}
        assert folder / name in matched, f"{package}/{name} is not package data"
