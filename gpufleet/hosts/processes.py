"""Name the framework and the workload of a process that holds a GPU, from its command line and
environment (as `/proc/PID/cmdline` and `/proc/PID/environ` give them): PyTorch (torchrun and
torch.distributed), DeepSpeed, vLLM and Ray are recognised; the workload is the scheduler's
name for the job where one is set (Slurm, Ray, torchrun, Kubernetes), else the script run."""

from __future__ import annotations

import os
from dataclasses import dataclass

# the first environment variable set names the workload: a scheduler's job first
WORKLOAD_ENV = (
    "SLURM_JOB_NAME",
    "GPUFLEET_WORKLOAD",
    "OTEL_SERVICE_NAME",  # the service its OTLP metrics name: its GPU time is the service's
    "RAY_JOB_ID",
    "TORCHELASTIC_RUN_ID",
    "JOB_NAME",
    "HOSTNAME",  # in a container, its pod's name
)


@dataclass(frozen=True)
class Recognised:
    framework: str  # pytorch, deepspeed, vllm, ray, python, or the program's name
    workload: str


def _words(cmdline: list[str]) -> list[str]:
    return [os.path.basename(w) if i == 0 else w for i, w in enumerate(cmdline)]


def framework_of(cmdline: list[str], environ: dict[str, str]) -> str:
    words = _words(cmdline)
    joined = " ".join(words)
    if not words:
        return "unknown"
    if words[0].startswith("ray::") or "raylet" in words[0] or "RAY_JOB_ID" in environ:
        return "ray"
    if "vllm" in joined:
        return "vllm"
    if "deepspeed" in joined or "DEEPSPEED_CONFIG" in environ:
        return "deepspeed"
    if (
        words[0] == "torchrun"
        or "torch.distributed" in joined
        or "TORCHELASTIC_RUN_ID" in environ
        or "LOCAL_RANK" in environ
    ):
        return "pytorch"
    if words[0].startswith("python"):
        return "python"
    return words[0]


def workload_of(cmdline: list[str], environ: dict[str, str]) -> str:
    for name in WORKLOAD_ENV[:-1]:
        if environ.get(name):
            return environ[name]
    if "KUBERNETES_SERVICE_HOST" in environ and environ.get("HOSTNAME"):
        return environ["HOSTNAME"]
    words = _words(cmdline)
    script = next((w for w in words[1:] if w.endswith(".py")), None)
    if script:
        return os.path.basename(script).removesuffix(".py")
    if words and words[0].startswith("python") and len(words) > 2 and words[1] == "-m":
        return words[2]  # a module run as a program
    return words[0] if words else "unknown"


def recognise(cmdline: list[str], environ: dict[str, str]) -> Recognised:
    return Recognised(framework_of(cmdline, environ), workload_of(cmdline, environ))
