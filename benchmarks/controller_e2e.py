"""End-to-end controller benchmark on the local control plane. Prints JSON; not a timed test.

    python benchmarks/controller_e2e.py                 # 125 nodes, 1,000 jobs, 500-GPU reclaim
    python benchmarks/controller_e2e.py --nodes 8 --jobs 64 --reclaim 16   # a smoke run

1. Admission: `--jobs` single-GPU elastic Jobs of team `batch` onto `--nodes` fake 8-GPU nodes;
   time from the first create to all Running, and admissions per second.
2. Reclaim: team `owner` holds a reservation of `--reclaim` GPUs that `batch` has borrowed; a
   wave of `--reclaim` single-GPU reserved Jobs arrives; per reserved Job, the time from its
   creation to Running (it needs an elastic Job preempted first).
The controller runs as its own process; its CPU time and peak memory come from /proc.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from gpufleet.testing.cluster import ControlPlane, default_bin_dir, free_port, missing_binaries

API = "gpufleet.io/v1alpha1"


def job(name: str, team: str, cls: str) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": "bench",
            "labels": {"gpufleet.io/team": team, "gpufleet.io/class": cls},
        },
        "spec": {
            "backoffLimit": 0,
            "template": {
                "metadata": {"annotations": {"gpufleet.io/run-for": "24h"}},
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [
                        {
                            "name": "c",
                            "image": "x",
                            "resources": {"limits": {"nvidia.com/gpu": "1"}},
                        }
                    ],
                },
            },
        },
    }


def states(plane: ControlPlane) -> dict[str, str]:
    items = plane.get("gwl", "-n", "bench")["items"]
    return {w["metadata"]["name"]: (w.get("status") or {}).get("state", "") for w in items}


def proc_usage(pid: int) -> dict[str, float]:
    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    status = Path(f"/proc/{pid}/status").read_text()
    peak = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM"))
    return {
        "cpu_seconds": round((int(stat[11]) + int(stat[12])) / ticks, 1),
        "peak_rss_mib": round(peak / 1024, 1),
    }


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))], 2)


def create(plane: ControlPlane, jobs: list[dict[str, Any]]) -> None:
    for start in range(0, len(jobs), 100):  # kubectl in batches: one request per Job anyway
        plane.kubectl("create", "-f", "-", input=yaml.safe_dump_all(jobs[start : start + 100]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=125)
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--reclaim", type=int, default=500)
    parser.add_argument("--timeout", type=float, default=900)
    args = parser.parse_args()
    if missing_binaries(default_bin_dir()):
        print(json.dumps({"skipped": "control-plane binaries missing; run hack/k8s/build.sh"}))
        return
    work = Path(tempfile.mkdtemp(prefix="gpufleet-bench-"))
    with ControlPlane(work / "cluster") as plane:
        controller = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gpufleet",
                "controller",
                "run",
                f"--kubeconfig={plane.kubeconfig}",
                f"--webhook-port={free_port()}",
                f"--state-dir={work}",
                "--metrics-port=0",
                "--interval=1",
            ],
            stdout=(work / "controller.log").open("wb"),
            stderr=subprocess.STDOUT,
        )
        try:
            plane.wait_until(
                lambda: (
                    plane.kubectl(
                        "get", "mutatingwebhookconfiguration", "gpufleet.io", check=False
                    ).returncode
                    == 0
                ),
                60,
                "the controller",
            )
            plane.add_gpu_nodes(args.nodes, 8, "H100", pool="bench", prefix="gpu")
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
                            "maxGPUs": args.nodes * 8,
                            "nodeSelector": {"gpufleet.io/pool": "bench"},
                        },
                    },
                    {"apiVersion": API, "kind": "Team", "metadata": {"name": "batch"}},
                    {"apiVersion": API, "kind": "Team", "metadata": {"name": "owner"}},
                    {
                        "apiVersion": API,
                        "kind": "Reservation",
                        "metadata": {"name": "owner"},
                        "spec": {"team": "owner", "pool": "bench", "gpus": args.reclaim},
                    },
                    {
                        "apiVersion": API,
                        "kind": "FleetPolicy",
                        "metadata": {"name": "bench"},
                        "spec": {"preemption": {"minRuntime": "1s"}},
                    },
                ]
            )
            plane.kubectl("create", "namespace", "bench")
            time.sleep(2)  # the webhook reads the fleet per request; give the API a moment
            started = time.monotonic()
            create(plane, [job(f"elastic-{i}", "batch", "elastic") for i in range(args.jobs)])
            created = time.monotonic() - started
            plane.wait_until(
                lambda: (
                    sum(s == "Running" for s in states(plane).values())
                    >= min(args.jobs, args.nodes * 8)
                ),
                args.timeout,
                "admission",
            )
            admitted_s = time.monotonic() - started
            before = proc_usage(controller.pid)

            wave = [job(f"reserved-{i}", "owner", "reserved") for i in range(args.reclaim)]
            created_at: dict[str, float] = {}
            wave_start = time.monotonic()
            for start in range(0, len(wave), 100):
                chunk = wave[start : start + 100]
                plane.kubectl("create", "-f", "-", input=yaml.safe_dump_all(chunk))
                now = time.monotonic()
                created_at.update({j["metadata"]["name"]: now for j in chunk})
            running_at: dict[str, float] = {}
            deadline = time.monotonic() + args.timeout
            while len(running_at) < len(wave) and time.monotonic() < deadline:
                now = time.monotonic()
                for name, state in states(plane).items():
                    if name.startswith("reserved-") and state == "Running":
                        running_at.setdefault(name, now)
                time.sleep(0.25)
            latencies = [running_at[n] - created_at[n] for n in running_at]
            preempted = sum(s == "Preempted" for s in states(plane).values())
            after = proc_usage(controller.pid)
        finally:
            controller.terminate()
            controller.wait(timeout=30)
    print(
        json.dumps(
            {
                "machine": {"cpus": os.cpu_count()},
                "nodes": args.nodes,
                "gpus": args.nodes * 8,
                "elastic_jobs": args.jobs,
                "admission": {
                    "create_seconds": round(created, 1),
                    "all_running_seconds": round(admitted_s, 1),
                    "admissions_per_second": round(min(args.jobs, args.nodes * 8) / admitted_s, 1),
                },
                "reclaim": {
                    "reserved_jobs": len(wave),
                    "running": len(running_at),
                    "elastic_preempted": preempted,
                    "wave_seconds": round(time.monotonic() - wave_start, 1),
                    "latency_seconds": {
                        "p50": percentile(latencies, 50),
                        "p99": percentile(latencies, 99),
                    },
                },
                "controller": {"after_admission": before, "after_reclaim": after},
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
