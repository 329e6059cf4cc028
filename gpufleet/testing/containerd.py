"""A containerd of its own for tests that pull an image from a registry and run it, as a node
would: the containerd, ctr and runc the harness builds for its real nodes (hack/k8s/build.sh),
a fresh root and state folder, its socket in that folder. Needs root, as a node's does."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

BINARIES = ("containerd", "ctr", "containerd-shim-runc-v2", "runc")


class ContainerdError(RuntimeError):
    pass


def missing(bin_dir: Path) -> list[str]:
    return [name for name in BINARIES if not (bin_dir / name).is_file()]


class Containerd:
    def __init__(self, bin_dir: Path) -> None:
        self.bin_dir = bin_dir
        # a short path: the socket's must fit in 108 bytes
        self.folder = Path(tempfile.mkdtemp(prefix="gpufleet-ctrd-"))
        self.socket = self.folder / "containerd.sock"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 30) -> Containerd:
        config = self.folder / "config.toml"
        config.write_text(
            "version = 3\n"
            f'root = "{self.folder / "root"}"\n'
            f'state = "{self.folder / "state"}"\n'
            f'[grpc]\naddress = "{self.socket}"\n'
            # the node resource interface's socket is one per machine: not ours to take
            '[plugins."io.containerd.nri.v1.nri"]\ndisable = true\n'
        )
        log = (self.folder / "containerd.log").open("wb")
        self.process = subprocess.Popen(
            [str(self.bin_dir / "containerd"), f"--config={config}"],
            stdout=log,
            stderr=subprocess.STDOUT,
            # the shim and runc are found on PATH
            env={**os.environ, "PATH": f"{self.bin_dir}:{os.environ.get('PATH', '')}"},
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ContainerdError(
                    f"containerd exited ({self.process.returncode}): "
                    + (self.folder / "containerd.log").read_text()[-800:]
                )
            if self.socket.exists() and self.ctr("version", check=False).returncode == 0:
                return self
            time.sleep(0.2)
        raise ContainerdError(f"containerd did not answer within {timeout}s")

    def ctr(
        self, *args: str, check: bool = True, timeout: float = 300
    ) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [str(self.bin_dir / "ctr"), f"--address={self.socket}", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, "PATH": f"{self.bin_dir}:{os.environ.get('PATH', '')}"},
        )
        if check and done.returncode != 0:
            raise ContainerdError(f"ctr {' '.join(args)} failed: {done.stderr.strip()[-800:]}")
        return done

    def pull(self, reference: str) -> None:
        """Pull over plain HTTP (the tests' registry is on 127.0.0.1)."""
        self.ctr("images", "pull", "--plain-http", reference)

    def run(self, reference: str, *command: str, env: dict[str, str] | None = None) -> str:
        """Run the image's command (or `command`) to its end; what it printed."""
        name = f"run-{time.monotonic_ns()}"
        flags = [f"--env={k}={v}" for k, v in (env or {}).items()]
        done = self.ctr("run", "--rm", *flags, reference, name, *command)
        return done.stdout

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
        subprocess.run(["umount", "-R", str(self.folder / "root")], capture_output=True)
        shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> Containerd:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
