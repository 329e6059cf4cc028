"""The Slurm node of a standalone agent's host, drained while gpufleet quarantines the host and
resumed after. The decision is the health controller's, under the guard rails of the nodes
(at most maxQuarantinedPercent of the hosts at once, the circuit breaker, escalation,
probation); the server hands it to the agent in the answer to each report. The agent only
carries it out, with `scontrol`, and resumes only a drain of its own (its reason starts with
"gpufleet:"): a node a person drained stays drained."""

from __future__ import annotations

import logging
import shutil
import subprocess
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter

log = logging.getLogger("gpufleet.agent")
PREFIX = "gpufleet: "
TIMEOUT_S = 30


class SlurmError(Exception):
    """scontrol failed: its message."""


def scontrol_present() -> bool:
    return shutil.which("scontrol") is not None


def node_state(node: str, run: Callable[..., subprocess.CompletedProcess[str]]) -> tuple[str, str]:
    """The node's State (IDLE+DRAIN, ...) and Reason (empty without one)."""
    shown = _scontrol(run, "show", "node", node)
    state = reason = ""
    for line in shown.splitlines():
        line = line.strip()
        if line.startswith("State="):
            state = line.split()[0].removeprefix("State=")
        elif line.startswith("Reason="):
            reason = line.removeprefix("Reason=")
    if not state:
        raise SlurmError(f"scontrol show node {node}: no State in its answer")
    return state, reason


def _scontrol(run: Callable[..., subprocess.CompletedProcess[str]], *args: str) -> str:
    try:
        done = run(["scontrol", *args], capture_output=True, text=True, timeout=TIMEOUT_S,
                   check=False)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as err:
        raise SlurmError(f"scontrol {' '.join(args)}: {err}") from None
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip()
        raise SlurmError(f"scontrol {' '.join(args)}: {said or f'exit {done.returncode}'}")
    return str(done.stdout)


class SlurmDrain:
    """Follows the server's word on the host: drain its node while quarantined, resume it once
    not (a drain of its own only)."""

    def __init__(
        self,
        node: str,
        registry: CollectorRegistry,
        run: Callable[..., subprocess.CompletedProcess[str]] = subprocess.run,
    ) -> None:
        self.node, self.run = node, run
        self.actions = Counter(
            "gpufleet_agent_slurm_actions_total",
            "What the agent did to its Slurm node: drained, resumed, failed (scontrol failed; "
            "tried again at the next report), or kept (drained by someone else: not resumed).",
            ["action"],
            registry=registry,
        )
        self.followed: str | bool | None = False  # the drain last carried out (False: none yet)

    def follow(self, drain: str | None) -> None:
        if drain == self.followed:
            return
        try:
            state, reason = node_state(self.node, self.run)
            drained = "DRAIN" in state.split("+")
            if drain and not drained:
                _scontrol(self.run, "update", f"NodeName={self.node}", "State=DRAIN",
                          f"Reason={PREFIX}{drain[:200]}")  # fmt: skip
                self.actions.labels("drained").inc()
                log.warning("Slurm node %s drained: %s", self.node, drain)
            elif not drain and drained:
                if reason.startswith(PREFIX):
                    _scontrol(self.run, "update", f"NodeName={self.node}", "State=RESUME")
                    self.actions.labels("resumed").inc()
                    log.info("Slurm node %s resumed: gpufleet released the host", self.node)
                else:
                    self.actions.labels("kept").inc()
                    log.info("Slurm node %s stays drained: someone else drained it (%s)",
                             self.node, reason)  # fmt: skip
        except SlurmError as err:
            self.actions.labels("failed").inc()
            log.error("Slurm node %s: %s", self.node, err)
            return  # tried again at the next answer
        self.followed = drain
