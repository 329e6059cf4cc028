"""`gpufleet run` from a project folder to a submitted workload: a first build and push, an
unchanged re-run, a one-file change. Prints JSON; not a timed test.

    python benchmarks/run_build.py                     # 60 files of 4 KB, a local control plane
    python benchmarks/run_build.py --files 5 --no-cluster   # smoke: no control plane

A real registry (Debian's docker-registry) on this machine holds the base image (`make image`
builds it: Debian and its python3, 50 MB); the project is the PyTorch sample of the tests with
`--files` generated modules of `--kb` KB each, and dependencies from small local wheels (the
time pip takes to download a real framework is not gpufleet's). With a local control plane
(the default when its binaries are built) each run also submits the workload: the API
server's dry run before the push, then the create. Each figure is the wall time of the whole
command, Python's start included, as a user waits for it:

- `first_build_push_seconds`: an empty registry repository and no dependency cache;
- `unchanged_rerun_seconds`: the same project again (the registry has the tag: nothing built
  or sent);
- `one_file_change_seconds` and `one_file_change_bytes_pushed`: one module changed; with
  `code_layer_bytes` (the compressed code layer) and `one_file_change_pushed_ratio` (bytes
  pushed over the code layer: the config and manifest are the rest).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import string
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from gpufleet.image.registry import Registry
from gpufleet.testing.cluster import ControlPlane, default_bin_dir, missing_binaries
from gpufleet.testing.registry import BASE_ARCHIVE, RegistryServer, push_layout, registry_binary
from gpufleet.testing.wheels import make_wheels

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "tests" / "data" / "run_projects" / "pytorch"
TEAM = "bench"


def module(seed: int, kb: int) -> str:
    """Python source of about `kb` KB that compresses as code does (not as zeros)."""
    rng = random.Random(seed)
    lines = [f'"""Generated module {seed}."""', ""]
    while sum(len(line) + 1 for line in lines) < kb * 1024:
        name = "".join(rng.choices(string.ascii_lowercase, k=rng.randint(5, 12)))
        value = rng.randint(0, 10**6)
        lines += [
            f"def {name}_{seed}(x: int) -> int:",
            f"    return x * {value} + {len(lines)}",
            "",
        ]
    return "\n".join(lines) + "\n"


def project(folder: Path, files: int, kb: int) -> Path:
    shutil.copytree(SAMPLE, folder)
    (folder / "model" / "generated").mkdir()
    for index in range(files):
        (folder / "model" / "generated" / f"m{index}.py").write_text(module(index, kb))
    return folder


def cluster_kubeconfig(work: Path) -> tuple[ControlPlane, Path]:
    plane = ControlPlane(work / "plane")
    plane.start()
    crds = work / "crds"
    subprocess.run([sys.executable, "-m", "gpufleet", "crds", "-o", str(crds)], check=True)
    plane.install_crds([crds])
    plane.kubectl("create", "namespace", TEAM)
    plane.apply(
        [{"apiVersion": "gpufleet.io/v1alpha1", "kind": "Team", "metadata": {"name": TEAM},
          "spec": {"namespaces": [TEAM]}}]
    )  # fmt: skip
    return plane, plane.kubeconfig


def timed_run(args: list[str], env: dict[str, str]) -> tuple[float, dict[str, Any]]:
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "gpufleet", "run", *args, "-o", "json"],
        capture_output=True,
        text=True,
        env=env,
    )
    seconds = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"gpufleet run failed: {done.stderr}")
    return round(seconds, 2), json.loads(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--files", type=int, default=60, help="generated modules")
    parser.add_argument("--kb", type=int, default=4, help="KB of each")
    parser.add_argument("--no-cluster", action="store_true", help="build and push only")
    args = parser.parse_args()
    binary = registry_binary()
    if binary is None:
        parser.error("docker-registry not found: apt-get install docker-registry")
    if not BASE_ARCHIVE.is_file():
        parser.error(f"{BASE_ARCHIVE} not found: bash hack/image/build.sh python-base")
    cluster = not args.no_cluster and not missing_binaries(default_bin_dir())
    work = Path(tempfile.mkdtemp(prefix="gpufleet-bench-run-"))
    env = {
        **os.environ,
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": str(make_wheels(work / "wheels")),
        "XDG_CACHE_HOME": str(work / "cache"),
        "GPUFLEET_CONFIG": str(work / "config.yaml"),
        "DOCKER_CONFIG": str(work / "docker"),
    }
    folder = project(work / "demo", args.files, args.kb)
    count = sum(1 for p in folder.rglob("*") if p.is_file())
    plane = None
    try:
        with RegistryServer(binary) as server:
            client = Registry(server.host, server.host, None)
            push_layout(BASE_ARCHIVE, client, "base/python", "3.11")
            client.close()
            common = [str(folder), "--registry", f"{server.host}/ml", "--name", "demo",
                      "--base-image", f"{server.host}/base/python:3.11"]  # fmt: skip
            if cluster:
                plane, kubeconfig = cluster_kubeconfig(work)
                common += ["--team", TEAM, f"--kubeconfig={kubeconfig}"]
            else:
                common += ["--no-submit"]
            first_seconds, first = timed_run(common, env)
            again_seconds, again = timed_run(common, env)
            target = folder / "model" / "generated" / "m0.py"
            target.write_text(target.read_text() + "# one change\n")
            change_seconds, change = timed_run(common, env)
            repository, _, digest = change["image"].partition("@")
            manifest = httpx.get(
                f"http://{server.host}/v2/{repository.split('/', 1)[1]}/manifests/{digest}",
                headers={"Accept": "application/vnd.oci.image.manifest.v1+json"},
            ).json()
            code = manifest["layers"][-1]["size"]
    finally:
        if plane is not None:
            plane.stop()
        shutil.rmtree(work, ignore_errors=True)
    assert again["built"] is False and change["built"] is True
    print(
        json.dumps(
            {
                "files": count,
                "submitted": cluster,
                "first_build_push_seconds": first_seconds,
                "first_bytes_pushed": first["bytesPushed"],
                "unchanged_rerun_seconds": again_seconds,
                "unchanged_rerun_bytes_pushed": again["bytesPushed"],
                "one_file_change_seconds": change_seconds,
                "one_file_change_bytes_pushed": change["bytesPushed"],
                "code_layer_bytes": code,
                "one_file_change_pushed_ratio": round(change["bytesPushed"] / code, 3),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
