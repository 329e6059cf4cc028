"""The chart installed as a new user would, timed: `helm install` with the default values
(observe mode: no pools, teams or reservations declared yet) onto a fresh local control plane
with one real node (containerd, runc, a kubelet) and kwok GPU nodes, with the project's image
already on the node. Prints JSON; not a timed test.

    make image                       # once: build/image/gpufleet.oci.tar and pause.oci.tar
    python benchmarks/install.py     # one run (about a minute)
    python benchmarks/install.py --rounds 3

Figures (seconds from the start of `helm install`): `helm_install_seconds` (the command),
`all_pods_ready_seconds` (every pod of the release Ready, the controller's, the server's and the
agent's on the real node among them), `gap_visible_seconds` (the server's /api/v1/status,
through its Service, counts every GPU of the fleet with its idle share); then the day-2 paths:
tenants' Jobs created while the controller's pod is deleted, `helm upgrade` to a changed value
(the tenants' work before and after), `helm uninstall` (what is left behind). `image_bytes` is
the compressed size of the gpufleet image (its layers and config, as a registry stores it).
The agent plays a scripted NVML (agent.scriptedNVML, agent.runtimeClassName=""): there is no
GPU here. Targets from issue 43: all pods Ready <= 60 s, the gap visible <= 90 s.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

from gpufleet.testing.chart import POOL, Install, install_scenario
from gpufleet.testing.cluster import ClusterError, default_bin_dir, ensure_binaries
from gpufleet.testing.node import check_host, cluster_with_real_node, missing_node_binaries

REPO = Path(__file__).resolve().parents[1]
IMAGES = REPO / "build" / "image"
TARGETS = {"all_pods_ready_seconds": 60.0, "gap_visible_seconds": 90.0}
GPU_NODES = 2  # kwok, 8 GPUs each


def image_bytes(archive: Path) -> dict[str, int]:
    """The image's compressed size (layers and config, from its manifest) and unpacked size."""
    with tarfile.open(archive) as tar:

        def read(name: str) -> Any:
            member = tar.extractfile(name)
            assert member is not None
            return json.load(member)

        index = read("./index.json")
        digest = index["manifests"][0]["digest"].split(":")[1]
        manifest = read(f"./blobs/sha256/{digest}")
        compressed = sum(layer["size"] for layer in manifest["layers"])
        compressed += manifest["config"]["size"]
        unpacked = 0
        for layer in manifest["layers"]:
            blob = tar.extractfile(f"./blobs/sha256/{layer['digest'].split(':')[1]}")
            assert blob is not None
            with tarfile.open(fileobj=blob, mode="r|gz") as files:
                unpacked += sum(member.size for member in files)
    return {"image_bytes": compressed, "image_unpacked_bytes": unpacked}


def ensure_images(rebuild: bool) -> list[Path]:
    archives = [IMAGES / "pause.oci.tar", IMAGES / "gpufleet.oci.tar"]
    if rebuild or not all(a.is_file() for a in archives):
        print("building the images (hack/image/build.sh)...", file=sys.stderr, flush=True)
        subprocess.run(["bash", str(REPO / "hack" / "image" / "build.sh")], check=True)
    return archives


def one_round(work_dir: Path, images: list[Path], tenant_jobs: int) -> dict[str, Any]:
    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    with cluster_with_real_node(work_dir, images, GPU_NODES, POOL, log) as (plane, node, timings):
        install = Install(plane, node, gpus=8 * GPU_NODES, log=log)
        result = install_scenario(install, tenant_jobs)
        return {**timings, **result}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument(
        "--tenant-jobs",
        type=int,
        default=6,
        help="one-GPU Jobs a tenant creates while the controller restarts, and again while "
        "it is scaled to zero (both fit the 16 GPUs)",
    )
    parser.add_argument("--work-dir", type=Path, default=REPO / "build" / "bench-install")
    parser.add_argument("--rebuild-image", action="store_true", help="run make image first")
    args = parser.parse_args()
    problems = check_host()
    if problems:
        print(json.dumps({"skipped": problems}))
        sys.exit(2)
    try:
        ensure_binaries(default_bin_dir(), also=missing_node_binaries)
        images = ensure_images(args.rebuild_image)
        rounds = [one_round(args.work_dir, images, args.tenant_jobs) for _ in range(args.rounds)]
    except (ClusterError, subprocess.CalledProcessError) as err:
        print(json.dumps({"error": str(err)}))
        sys.exit(1)
    summary: dict[str, Any] = {}
    for name, limit in TARGETS.items():
        values = [r[name] for r in rounds]
        summary[name] = {
            "median": statistics.median(values),
            "min": min(values),
            "max": max(values),
            "target": limit,
            "met": max(values) <= limit,
        }
    print(
        json.dumps(
            {
                **image_bytes(images[1]),
                "rounds": len(rounds),
                "targets": summary,
                "runs": rounds,
                "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
