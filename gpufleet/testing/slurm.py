"""A real Slurm of one node on this machine, for the tests of the standalone agent's drain:
munged (its own key and socket), slurmctld and slurmd from Debian's packages, configured in a
folder of their own (nothing of /etc is touched). `scontrol` reaches it through $SLURM_CONF."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

from gpufleet.testing.cluster import free_port

DAEMONS = ("munged", "slurmctld", "slurmd", "scontrol")


def missing() -> list[str]:
    return [d for d in DAEMONS if shutil.which(d) is None]


class Slurm:
    """`node` is the one node of partition `gpu`; `env` reaches it (SLURM_CONF)."""

    def __init__(self, work: Path, node: str) -> None:
        self.work, self.node = work, node
        self.conf = work / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self.processes: list[subprocess.Popen[bytes]] = []

    def start(self) -> Slurm:
        work = self.work
        for folder in ("munge", "state", "spool", "log"):
            (work / folder).mkdir(parents=True, exist_ok=True)
        key = work / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        socket = work / "munge" / "munge.socket.2"
        self.conf.write_text(
            "\n".join(
                [
                    "ClusterName=gpufleet-test",
                    "SlurmctldHost=localhost",
                    f"SlurmctldPort={free_port()}",
                    f"SlurmdPort={free_port()}",
                    "SlurmUser=root",
                    "SlurmdUser=root",
                    "AuthType=auth/munge",
                    f"AuthInfo=socket={socket}",
                    "CredType=cred/munge",
                    f"StateSaveLocation={work / 'state'}",
                    f"SlurmdSpoolDir={work / 'spool'}",
                    f"SlurmctldPidFile={work / 'slurmctld.pid'}",
                    f"SlurmdPidFile={work / 'slurmd.pid'}",
                    f"SlurmctldLogFile={work / 'log' / 'slurmctld.log'}",
                    f"SlurmdLogFile={work / 'log' / 'slurmd.log'}",
                    "ProctrackType=proctrack/linuxproc",
                    "TaskPlugin=task/none",
                    "JobAcctGatherType=jobacct_gather/none",
                    "SelectType=select/linear",
                    "ReturnToService=2",
                    "SlurmdTimeout=300",
                    f"NodeName={self.node} NodeHostname=localhost NodeAddr=127.0.0.1 CPUs=1 "
                    "RealMemory=100 State=UNKNOWN",
                    f"PartitionName=gpu Nodes={self.node} Default=YES State=UP",
                ]
            )
            + "\n"
        )
        self._run("munged", "-F", "-f", f"--socket={socket}", f"--key-file={key}",
                  f"--log-file={work / 'log' / 'munged.log'}", f"--pid-file={work / 'munged.pid'}",
                  f"--seed-file={work / 'munge' / 'seed'}")  # fmt: skip
        self._wait(socket.exists, "munged's socket")
        self._run("slurmctld", "-D", "-i")
        self._wait(lambda: self.scontrol("ping").returncode == 0, "slurmctld to answer")
        self._run("slurmd", "-D", "-N", self.node)
        self._wait(
            lambda: "State=IDLE" in self.scontrol("show", "node", self.node).stdout,
            f"node {self.node} to be IDLE",
        )
        return self

    def _run(self, *command: str) -> None:
        log = (self.work / "log" / f"{command[0]}.out").open("ab")
        self.processes.append(
            subprocess.Popen(list(command), stdout=log, stderr=subprocess.STDOUT, env=self.env)
        )

    def _wait(self, ready: object, what: str, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if callable(ready) and ready():
                return
            time.sleep(0.2)
        logs = "\n".join(p.read_text()[-800:] for p in (self.work / "log").glob("*"))
        raise RuntimeError(f"Slurm: no {what} within {timeout:.0f}s\n{logs}")

    def scontrol(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["scontrol", *args], capture_output=True, text=True, env=self.env,
                              check=False, timeout=30)  # fmt: skip

    def stop(self) -> None:
        for process in reversed(self.processes):
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()

    def __enter__(self) -> Slurm:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
