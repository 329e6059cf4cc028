"""The admission webhook in a process of its own.

Every workload create waits on the webhook's answer. Served from a thread of the controller, the
answer waited for the interpreter behind the watches' decoding and the loop's cycles: 84 ms on
average in a burst of creates, about the whole time the API server needs for a create. In its
own process it waits only for a core.

The controller (`AdmissionProcess`) starts `python -m gpufleet.controllers.admission_process`,
sends it the fleet (pickled, on its stdin) whenever a GitOps object changes, and starts it again
if it dies. The process (`main`) serves the webhook (`admission.AdmissionServer`) from the last
fleet it was sent, says `ready` on its stdout once it listens, and exits when its stdin closes:
a webhook never outlives its controller to answer from a fleet nobody updates.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import pickle
import select
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO

from gpufleet.model.fleet import Fleet

from . import admission

log = logging.getLogger("gpufleet.admission")
READY = b"ready\n"
RESTART_BACKOFF_S = 1.0


class AdmissionProcess:
    """The controller's side: the webhook process, kept running and sent the fleet."""

    def __init__(
        self,
        host: str,
        port: int,
        certfile: Path,
        keyfile: Path,
        source: admission.FleetSource,
        fleet_changed: threading.Event,
        scheduler_name: str | None = None,
    ) -> None:
        self.command = [
            sys.executable,
            "-m",
            __name__,
            f"--host={host}",
            f"--port={port}",
            f"--certfile={certfile}",
            f"--keyfile={keyfile}",
            f"--scheduler-name={scheduler_name or ''}",
        ]
        self.address = f"{host}:{port}"
        self.source, self.fleet_changed = source, fleet_changed
        self.process: subprocess.Popen[bytes] | None = None
        self.sent_version: int | None = None
        self.stopping = threading.Event()
        self.publisher = threading.Thread(
            target=self._publish, name="gpufleet-webhook-fleet", daemon=True
        )

    def start(self, timeout: float = 30) -> None:
        """Start the process; returns once it listens (the webhook may then be registered)."""
        self._spawn(timeout)
        self.publisher.start()
        log.info("webhook serving on %s%s (process %d)", self.address, admission.PATH, self.pid)

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    def _spawn(self, timeout: float) -> None:
        process = subprocess.Popen(self.command, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert process.stdin is not None and process.stdout is not None
        self.process, self.sent_version = process, None
        self._send()  # before it listens: its first answers already know the fleet
        ready, _, _ = select.select([process.stdout], [], [], timeout)
        if not ready or process.stdout.readline() != READY:
            process.kill()
            process.wait()
            raise RuntimeError(
                f"the webhook process did not start listening on {self.address} in {timeout:.0f}s "
                f"(exit code {process.poll()}); is the port free?"
            )

    def _send(self) -> None:
        """Send the fleet if the process has not got this version yet."""
        fleet = self.source.load_fleet()
        version = self.source.fleet_version
        if version == self.sent_version or self.process is None:
            return
        assert self.process.stdin is not None
        try:
            pickle.dump((version, fleet), self.process.stdin)
            self.process.stdin.flush()
        except (BrokenPipeError, OSError):
            return  # it died: `_publish` starts it again
        self.sent_version = version

    def _publish(self) -> None:
        while not self.stopping.is_set():
            self.fleet_changed.wait(1.0)
            self.fleet_changed.clear()
            if self.stopping.is_set():
                return
            if self.process is not None and self.process.poll() is not None:
                log.error(
                    "the webhook process exited (code %s); starting it again", self.process.poll()
                )
                if self.stopping.wait(RESTART_BACKOFF_S):
                    return
                try:
                    self._spawn(30)
                except (RuntimeError, OSError) as err:
                    log.error("%s", err)
                continue
            self._send()

    def health_problem(self) -> str | None:
        """What `/healthz` reports while no webhook process runs (creates fail meanwhile)."""
        if self.process is None or self.process.poll() is not None:
            return f"the webhook process on {self.address} is not running"
        return None

    def stop(self, timeout: float = 5) -> None:
        self.stopping.set()
        self.fleet_changed.set()
        process = self.process
        if process is None:
            return
        if process.stdin is not None:
            process.stdin.close()  # it exits on the end of its input
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


class FleetMirror:
    """The process's side: the fleet as the controller last sent it (`admission.FleetSource`)."""

    def __init__(self) -> None:
        self.fleet = Fleet()
        self.fleet_version = -1

    def load_fleet(self) -> Fleet:
        return self.fleet

    def follow(self, stream: IO[bytes]) -> None:
        """Take each fleet sent until the stream ends; then the controller is gone."""
        while True:
            try:
                version, fleet = pickle.load(stream)
            except (EOFError, OSError, pickle.UnpicklingError):
                return
            # the fleet before its version: a webhook that sees the new version reads it
            self.fleet = fleet
            self.fleet_version = version


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--certfile", type=Path, required=True)
    parser.add_argument("--keyfile", type=Path, required=True)
    parser.add_argument("--scheduler-name", default="")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="[%(asctime)s] %(name)-20.20s [%(levelname)-8.8s] %(message)s"
    )
    # a Ctrl-C reaches the whole process group: the controller stops this process itself
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    mirror = FleetMirror()
    admission.Admission.source = mirror
    admission.Admission.scheduler_name = args.scheduler_name or None
    server = admission.AdmissionServer(args.host, args.port, args.certfile, args.keyfile)
    server.start()
    sys.stdout.buffer.write(READY)
    sys.stdout.buffer.flush()
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # nobody reads the pipe from now on
    mirror.follow(sys.stdin.buffer)
    # answers in flight get a moment, no more: a new controller may want the port at once,
    # and connections still open die with the process
    with contextlib.suppress(Exception):
        server.stop(timeout=1)
    os._exit(0)


if __name__ == "__main__":
    main()
