"""The console script. `gpufleet agent standalone`, a host's long-running service, starts with
its own few imports (about 50 MiB); every other command goes through the full CLI."""

from __future__ import annotations

import sys


def run() -> None:
    if sys.argv[1:3] == ["agent", "standalone"]:
        from gpufleet.cli.standalone import run_alone

        run_alone(sys.argv[3:])
        return
    from gpufleet.cli.main import run as run_all

    run_all()
