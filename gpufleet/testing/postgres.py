"""A throwaway PostgreSQL server for tests: Debian's server binaries, a fresh data folder, TCP
on 127.0.0.1 with trust authentication. PostgreSQL refuses to run as root, so as root it runs as
the unprivileged user `nobody`."""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

UNPRIVILEGED = "nobody"


class PostgresError(RuntimeError):
    pass


def server_bin() -> Path | None:
    """The folder of initdb and pg_ctl (Debian keeps them out of PATH), newest version first."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), reverse=True)
    if found:
        return Path(found[0]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PostgresServer:
    def __init__(self, bin_dir: Path) -> None:
        self.bin = bin_dir
        self.root = Path(tempfile.mkdtemp(prefix="gpufleet-pg-"))
        self.data = self.root / "data"
        self.port = _free_port()
        self.as_root = os.geteuid() == 0

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://gpufleet@127.0.0.1:{self.port}/gpufleet"

    def _run(self, *args: str | Path, timeout: float = 60) -> None:
        command = [str(a) for a in args]
        if self.as_root:
            command = ["runuser", "-u", UNPRIVILEGED, "--", *command]
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
        if done.returncode != 0:
            raise PostgresError(f"{' '.join(command)} failed: {done.stderr.strip()[-800:]}")

    def start(self) -> PostgresServer:
        if self.as_root:
            os.chmod(self.root, 0o777)
        self._run(self.bin / "initdb", "-D", self.data, "-A", "trust", "-U", "gpufleet")
        options = f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.root} -c fsync=off"
        self._run(
            self.bin / "pg_ctl", "-D", self.data, "-o", options, "-l", self.root / "log", "-w",
            "start",
        )  # fmt: skip
        self._run(self.bin / "createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U",
                  "gpufleet", "gpufleet")  # fmt: skip
        return self

    def stop(self, mode: str = "fast") -> None:
        with contextlib.suppress(PostgresError, subprocess.TimeoutExpired):
            self._run(self.bin / "pg_ctl", "-D", self.data, "-m", mode, "-w", "stop")

    def cleanup(self) -> None:
        self.stop("immediate")
        deadline = time.monotonic() + 10
        while (self.data / "postmaster.pid").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        shutil.rmtree(self.root, ignore_errors=True)
