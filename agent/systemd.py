"""The standalone agent as a systemd service: its unit and its environment file (every setting
of `gpufleet agent standalone`, documented). Pure: `gpufleet agent install` writes them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

UNIT_NAME = "gpufleet-agent.service"
UNIT_PATH = Path("etc/systemd/system") / UNIT_NAME
ENV_PATH = Path("etc/gpufleet/agent.env")
TOKEN_PATH = Path("etc/gpufleet/token")  # the host's token, handed to the service by systemd
DOCS = "https://github.com/gpufleet/gpufleet/blob/main/docs/agent-standalone.md"


@dataclass(frozen=True)
class Setting:
    variable: str
    default: str
    meaning: str


# each is an option of `gpufleet agent standalone` (its envvar), in the order of its --help
SETTINGS = (
    Setting("GPUFLEET_AGENT_HOST_NAME", "", "this host as its metrics name it (empty: hostname)"),
    Setting("GPUFLEET_AGENT_NVML", "nvml", "nvml, or fake:FILE.yaml (a scripted GPU, for tests)"),
    Setting("GPUFLEET_AGENT_POLL_INTERVAL", "5", "seconds between polls of the GPUs' counters"),
    Setting("GPUFLEET_AGENT_METRICS_PORT", "9402", "/metrics and /healthz"),
    Setting("GPUFLEET_AGENT_METRICS_HOST", "0.0.0.0", "where /metrics listens"),
    Setting("GPUFLEET_AGENT_DCGM_EXPORTER", "", "a DCGM exporter's /metrics URL (GPU Usage)"),
    Setting(
        "GPUFLEET_AGENT_OTLP_HOST",
        "127.0.0.1",
        "where the OTLP receiver listens (0.0.0.0: anyone, unauthenticated)",
    ),
    Setting("GPUFLEET_AGENT_OTLP_GRPC_PORT", "4317", "OTLP/gRPC (0: none)"),
    Setting("GPUFLEET_AGENT_OTLP_HTTP_PORT", "4318", "OTLP/HTTP (0: none)"),
    Setting("GPUFLEET_OTLP_METRICS_QUEUE_SIZE", "1000", "OTLP export requests waiting, at most"),
    Setting("GPUFLEET_SERVER", "", "the gpufleet server to report to (empty: report nowhere)"),
    Setting(
        "GPUFLEET_AGENT_TOKEN_FILE",
        "",
        f"the host's token (empty: /{TOKEN_PATH}, which systemd hands to the service; write it "
        "with `gpufleet hosts token HOST --write FILE`)",
    ),
    Setting("GPUFLEET_CA_CERT", "", "the server's CA certificate, if not a public one"),
    Setting(
        "GPUFLEET_AGENT_BUFFER_DIR",
        "",
        "where reports wait (empty: /var/lib/gpufleet-agent/buffer)",
    ),
    Setting(
        "GPUFLEET_AGENT_SLURM_DRAIN",
        "auto",
        "drain the host's Slurm node while gpufleet quarantines the host: auto (where "
        "scontrol is found), on, off; the agent's user must be a Slurm operator",
    ),
    Setting("GPUFLEET_AGENT_SLURM_NODE", "", "the host's Slurm node name (empty: the host name)"),
    Setting(
        "GPUFLEET_AGENT_BUFFER_REPORTS",
        "8640",
        "reports kept while the server is away (then the oldest are dropped and counted)",
    ),
)


def environment_file() -> str:
    lines = [
        "# gpufleet agent standalone: its settings (docs/agent-standalone.md). An empty value",
        "# takes the default; `systemctl restart gpufleet-agent` applies a change.",
    ]
    for s in SETTINGS:
        lines += ["", f"# {s.meaning}", f"{s.variable}={s.default}"]
    return "\n".join(lines) + "\n"


def unit(executable: str) -> str:
    """The unit that runs `executable agent standalone`. Hardened where it does not block
    NVML: a user of its own (DynamicUser) in the video group (the /dev/nvidia* devices), no
    new privileges, a read-only system and no home; not PrivateDevices, which would hide the
    GPUs. Bounded: 256 MiB of memory, half a core. The host's token (root's, mode 0600) is
    handed to it as a credential: its own user could not read the file."""
    return f"""[Unit]
Description=gpufleet agent: GPU health and metrics, and an OpenTelemetry receiver
Documentation={DOCS}
Wants=network-online.target
After=network-online.target nvidia-persistenced.service

[Service]
Type=exec
EnvironmentFile=-/{ENV_PATH}
ExecStart={executable} agent standalone
Restart=always
RestartSec=5
DynamicUser=yes
SupplementaryGroups=video
NoNewPrivileges=yes
ProtectSystem=strict
ProtectHome=yes
PrivateTmp=yes
ProtectKernelTunables=yes
ProtectKernelModules=yes
ProtectControlGroups=yes
RestrictSUIDSGID=yes
RestrictRealtime=yes
LockPersonality=yes
StateDirectory=gpufleet-agent
LoadCredential=token:/{TOKEN_PATH}
MemoryMax=256M
CPUQuota=50%

[Install]
WantedBy=multi-user.target
"""
