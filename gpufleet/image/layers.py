"""Image layers made without a daemon: gzipped tar files that depend only on what goes into
them (sorted names, one timestamp, root owners, normalised modes), so the same inputs give the
same digest and a registry that has the layer is not sent it again."""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import stat
import tarfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import pathspec

EPOCH = 0  # every file's mtime in a layer
CHUNK = 1 << 20
# never part of a project's image, whatever its ignore files say
ALWAYS_IGNORED = (
    ".git/",
    ".hg/",
    "__pycache__/",
    "*.py[cod]",
    ".venv/",
    "venv/",
    ".mypy_cache/",
    ".pytest_cache/",
    ".ruff_cache/",
    ".ipynb_checkpoints/",
    ".DS_Store",
)


@dataclass(frozen=True)
class Layer:
    path: Path  # the gzipped tar
    digest: str  # sha256 of the gzipped bytes: the blob's name in a registry
    diff_id: str  # sha256 of the tar: the image config's rootfs entry
    size: int


def project_files(root: Path, ignore: Iterable[str] = ()) -> list[str]:
    """The project's files (relative POSIX paths, sorted) without those its .gitignore and
    `ignore` patterns (gitignore syntax) leave out."""
    patterns = list(ALWAYS_IGNORED)
    gitignore = root / ".gitignore"
    if gitignore.is_file():
        patterns += gitignore.read_text(errors="replace").splitlines()
    patterns += list(ignore)
    spec = pathspec.GitIgnoreSpec.from_lines(patterns)
    found = []
    for folder, dirs, files in os.walk(root):
        base = Path(folder).relative_to(root)
        # a left-out folder is not walked: datasets and checkpoints may be large
        dirs[:] = sorted(d for d in dirs if not spec.match_file(f"{(base / d).as_posix()}/"))
        for name in files:
            relative = (base / name).as_posix()
            if not spec.match_file(relative):
                found.append(relative)
    return sorted(found)


def files_digest(root: Path, files: Iterable[str]) -> str:
    """One hash of the files' names, modes and contents."""
    digest = hashlib.sha256()
    for name in files:
        path = root / name
        info = path.lstat()
        digest.update(f"{name}\0{_mode(info.st_mode):o}\0".encode())
        if stat.S_ISLNK(info.st_mode):
            digest.update(os.readlink(path).encode())
        else:
            with path.open("rb") as handle:
                for chunk in iter(lambda: handle.read(CHUNK), b""):
                    digest.update(chunk)
        digest.update(b"\0")
    return digest.hexdigest()


def folder_layer(root: Path, files: Iterable[str], prefix: str, dest: Path) -> Layer:
    """A layer of `files` of `root`, each at `prefix`/name in the image (the folders above
    them included)."""
    return write_layer(_entries(root, sorted(files), prefix.strip("/")), dest)


def tree_layer(root: Path, dest: Path) -> Layer:
    """A layer of everything under `root`, at the same paths in the image."""
    names = []
    for folder, dirs, files in os.walk(root):
        dirs.sort()
        base = Path(folder).relative_to(root)
        names += [(base / name).as_posix() for name in files]
        names += [(base / d).as_posix() for d in dirs if os.path.islink(os.path.join(folder, d))]
    return write_layer(_entries(root, sorted(names), ""), dest)


def _entries(root: Path, files: list[str], prefix: str) -> Iterator[tuple[str, Path | None]]:
    """(name in the image, file or None for a folder), each folder before what it holds."""
    made: set[str] = set()
    for name in files:
        target = f"{prefix}/{name}" if prefix else name
        parts = target.split("/")
        for depth in range(1, len(parts)):
            folder = "/".join(parts[:depth])
            if folder not in made:
                made.add(folder)
                yield folder, None
        yield target, root / name


def write_layer(entries: Iterable[tuple[str, Path | None]], dest: Path) -> Layer:
    dest.parent.mkdir(parents=True, exist_ok=True)
    with dest.open("wb") as out:
        compressed = _Hashing(out)
        with gzip.GzipFile(filename="", mode="wb", fileobj=compressed, mtime=EPOCH,
                           compresslevel=6) as zipped:  # fmt: skip
            plain = _Hashing(zipped)
            with tarfile.open(fileobj=plain, mode="w|", format=tarfile.PAX_FORMAT) as tar:
                for name, path in entries:
                    _add(tar, name, path)
    return Layer(
        dest,
        "sha256:" + compressed.hash.hexdigest(),
        "sha256:" + plain.hash.hexdigest(),
        compressed.size,
    )


def _add(tar: tarfile.TarFile, name: str, path: Path | None) -> None:
    info = tarfile.TarInfo(name)
    info.mtime, info.uid, info.gid, info.uname, info.gname = EPOCH, 0, 0, "", ""
    if path is None:
        info.type, info.mode = tarfile.DIRTYPE, 0o755
        tar.addfile(info)
        return
    mode = path.lstat().st_mode
    if stat.S_ISLNK(mode):
        info.type, info.mode, info.linkname = tarfile.SYMTYPE, 0o777, os.readlink(path)
        tar.addfile(info)
    elif stat.S_ISDIR(mode):
        info.type, info.mode = tarfile.DIRTYPE, 0o755
        tar.addfile(info)
    else:
        info.mode, info.size = _mode(mode), path.stat().st_size
        with path.open("rb") as handle:
            tar.addfile(info, handle)


def _mode(mode: int) -> int:
    """Only whether a file is executable survives: umasks differ between machines."""
    if stat.S_ISDIR(mode):
        return 0o755
    return 0o755 if mode & 0o111 else 0o644


class _Hashing(io.RawIOBase):
    """A write-through file that hashes and counts what passes."""

    def __init__(self, out: BinaryIO | gzip.GzipFile) -> None:
        self.out = out
        self.hash = hashlib.sha256()
        self.size = 0

    def writable(self) -> bool:
        return True

    def write(self, data: bytes) -> int:  # type: ignore[override]
        self.hash.update(data)
        self.size += len(data)
        self.out.write(data)
        return len(data)
