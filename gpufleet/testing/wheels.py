"""Small local wheels for the tests of `gpufleet run`: stand-ins named as the frameworks
(torch, jax, tensorflow) so detection and installs are exercised without downloading them."""

from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path

STAND_INS = {
    "torch": {"torch/__init__.py": '__version__ = "0.0.1"\n',
              "torch/distributed.py": "def init_process_group(backend):\n    pass\n"},
    "jax": {"jax/__init__.py": '__version__ = "0.0.1"\n'},
    "tensorflow": {"tensorflow/__init__.py": '__version__ = "0.0.1"\n'},
    "tinyutil": {"tinyutil/__init__.py": "def answer():\n    return 42\n\n\n"
                 "def main():\n    print('tinyutil', answer())\n"},
}  # fmt: skip
SCRIPTS = {"tinyutil": "tinyutil = tinyutil:main"}


def make_wheel(folder: Path, name: str, version: str = "0.0.1") -> Path:
    """A py3-none-any wheel of `name` (one of STAND_INS) in `folder`."""
    files = dict(STAND_INS[name])
    info = f"{name}-{version}.dist-info"
    files[f"{info}/METADATA"] = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    files[f"{info}/WHEEL"] = (
        "Wheel-Version: 1.0\nGenerator: gpufleet-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    )
    if name in SCRIPTS:
        files[f"{info}/entry_points.txt"] = f"[console_scripts]\n{SCRIPTS[name]}\n"
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
        record.append(f"{path},sha256={digest.decode()},{len(text.encode())}")
    record.append(f"{info}/RECORD,,")
    files[f"{info}/RECORD"] = "\n".join(record) + "\n"
    folder.mkdir(parents=True, exist_ok=True)
    wheel = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for path, text in files.items():
            archive.writestr(zipfile.ZipInfo(path, (1980, 1, 1, 0, 0, 0)), text)
    return wheel


def make_wheels(folder: Path) -> Path:
    for name in STAND_INS:
        make_wheel(folder, name)
    return folder
