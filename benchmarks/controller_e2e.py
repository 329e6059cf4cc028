"""End-to-end controller benchmark on the local control plane. Prints JSON; not a timed test.

    python benchmarks/controller_e2e.py                 # 125 nodes, 1,000 jobs, 500-GPU reclaim
    python benchmarks/controller_e2e.py --nodes 8 --jobs 64 --reclaim 16   # a smoke run
    python benchmarks/controller_e2e.py --system plain  # no admission control: the floor
    python benchmarks/controller_e2e.py --nodes 1000 --jobs 10000 --reclaim 0   # the scale run

The scenario (admission of elastic Jobs, then a wave of reserved Jobs reclaiming borrowed GPUs)
is described in scenario.py. For gpufleet the report adds the loop's cycle-time quantiles and
cycle count from the controller's own metrics.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parent))

from scenario import Scenario, run, stop_process

from gpufleet.testing.cluster import ControlPlane, default_bin_dir, free_port, missing_binaries

API = "gpufleet.io/v1alpha1"


class Plain:
    """Kubernetes without admission control: Jobs start as soon as the scheduler places them.
    Its reclaim is the harness's floor: the client suspends a victim right after each create."""

    name = "plain"
    reclaims = True

    def start(self, plane: ControlPlane, work: Path, scenario: Scenario) -> int | None:
        return None

    def labels(self, team: str, cls: str) -> dict[str, str]:
        return {}

    def suspend_on_create(self) -> bool:
        return False

    def preempts_itself(self) -> bool:
        return True

    def stop(self) -> None:
        pass

    def extra(self) -> dict[str, Any]:
        return {}


class Gpufleet:
    """`gpufleet controller run` as its own process, with its webhooks."""

    name = "gpufleet"
    reclaims = True

    def __init__(self, interval: float = 5.0) -> None:
        self.interval = interval
        self.process: subprocess.Popen[bytes] | None = None
        self.metrics_port = free_port()

    def start(self, plane: ControlPlane, work: Path, scenario: Scenario) -> int | None:
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gpufleet",
                "controller",
                "run",
                f"--kubeconfig={plane.kubeconfig}",
                f"--webhook-port={free_port()}",
                f"--state-dir={work}",
                f"--metrics-port={self.metrics_port}",
                "--metrics-host=127.0.0.1",
                f"--interval={self.interval}",
            ],
            stdout=(work / "controller.log").open("wb"),
            stderr=subprocess.STDOUT,
        )
        plane.wait_until(
            lambda: (
                plane.kubectl(
                    "get", "mutatingwebhookconfiguration", "gpufleet.io", check=False
                ).returncode
                == 0
            ),
            60,
            "the controller's webhooks",
        )
        plane.apply(
            [
                {
                    "apiVersion": API,
                    "kind": "GPUPool",
                    "metadata": {"name": "bench"},
                    "spec": {
                        "provider": "static",
                        "gpuType": "H100",
                        "gpusPerNode": 8,
                        "maxGPUs": scenario.nodes * 8,
                        "nodeSelector": {"gpufleet.io/pool": "bench"},
                    },
                },
                {"apiVersion": API, "kind": "Team", "metadata": {"name": "batch"}},
                {"apiVersion": API, "kind": "Team", "metadata": {"name": "owner"}},
                *(
                    [
                        {
                            "apiVersion": API,
                            "kind": "Reservation",
                            "metadata": {"name": "owner"},
                            "spec": {"team": "owner", "pool": "bench", "gpus": scenario.reclaim},
                        }
                    ]
                    if scenario.reclaim  # --reclaim 0: admission only
                    else []
                ),
                {
                    "apiVersion": API,
                    "kind": "FleetPolicy",
                    "metadata": {"name": "bench"},
                    "spec": {"preemption": {"minRuntime": "1s"}},
                },
            ]
        )
        time.sleep(2)  # the fleet objects reach the controller's caches through its watches
        return self.process.pid

    def labels(self, team: str, cls: str) -> dict[str, str]:
        return {"gpufleet.io/team": team, "gpufleet.io/class": cls}

    def suspend_on_create(self) -> bool:
        return False  # the webhook suspends; users create Jobs as they always have

    def preempts_itself(self) -> bool:
        return False

    def stop(self) -> None:
        stop_process(self.process, "the controller")

    def extra(self) -> dict[str, Any]:
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        text = urllib.request.urlopen(url, timeout=10).read().decode()
        buckets: list[tuple[float, float]] = []
        count = 0.0
        for family in text_string_to_metric_families(text):
            if family.name != "gpufleet_cycle_seconds":
                continue
            for sample in family.samples:
                if sample.name.endswith("_bucket"):
                    buckets.append((float(sample.labels["le"]), sample.value))
                elif sample.name.endswith("_count"):
                    count = sample.value
        return {
            "cycles": int(count),
            "cycle_seconds_at_most": {
                "p50": _bucket_quantile(buckets, count, 0.5),
                "p99": _bucket_quantile(buckets, count, 0.99),
            },
        }


def _bucket_quantile(buckets: list[tuple[float, float]], count: float, q: float) -> float | None:
    """The upper bound of the histogram bucket that holds quantile `q`."""
    for bound, cumulative in sorted(buckets):
        if count and cumulative >= q * count:
            return bound
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--system", choices=["gpufleet", "plain"], default="gpufleet")
    parser.add_argument("--nodes", type=int, default=125)
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--reclaim", type=int, default=500)
    parser.add_argument("--threads", type=int, default=8, help="client threads that create Jobs")
    parser.add_argument("--interval", type=float, default=5.0, help="controller resync interval")
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument(
        "--quiet", type=float, default=20, help="seconds with nothing new, after admission"
    )
    args = parser.parse_args()
    if missing_binaries(default_bin_dir()):
        print(json.dumps({"skipped": "control-plane binaries missing; run hack/k8s/build.sh"}))
        return
    scenario = Scenario(args.nodes, args.jobs, args.reclaim, args.threads, args.timeout, args.quiet)
    system = Gpufleet(args.interval) if args.system == "gpufleet" else Plain()
    figures = run(system, scenario, lambda m: print(m, file=sys.stderr, flush=True))
    print(
        json.dumps(
            {
                "machine": {"cpus": os.cpu_count()},
                "system": system.name,
                "nodes": args.nodes,
                "gpus": args.nodes * 8,
                "elastic_jobs": args.jobs,
                **figures,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
