"""Assemble a project's image from its base image, a dependencies layer and a code layer, and
push it, without a container engine. The tag is a hash of every input: a registry that has it
means nothing to build or send; a blob the registry has (or can mount from the base's
repository) is not sent again."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpufleet.image.credentials import ECR_HOST, credentials_for, ensure_ecr_repository
from gpufleet.image.layers import Layer, files_digest, folder_layer, tree_layer
from gpufleet.image.reference import Reference, parse_reference
from gpufleet.image.registry import (
    DOCKER_MANIFEST,
    INDEX_TYPES,
    OCI_MANIFEST,
    Registry,
)
from gpufleet.project.plan import DEPS_DIR, WORKDIR, RunPlan

DOCKER_CONFIG_TYPE = "application/vnd.docker.container.image.v1+json"
OCI_CONFIG_TYPE = "application/vnd.oci.image.config.v1+json"
DOCKER_LAYER_TYPE = "application/vnd.docker.image.rootfs.diff.tar.gzip"
OCI_LAYER_TYPE = "application/vnd.oci.image.layer.v1.tar+gzip"
CREATED = "1970-01-01T00:00:00Z"  # one date for every build: the same inputs, the same image
FORMAT = "1"  # raised when the image's layout changes, so old tags are not reused
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"  # a base with none


class BuildError(Exception):
    pass


# what the build reports as it goes: (step, blob name, bytes done, bytes in all)
Report = Callable[[str, str, int, int], None]


@dataclass
class Pushed:
    reference: Reference  # repository@digest: what the workload runs
    tag: str
    digest: str
    skipped: bool  # the registry had the tag: nothing built or sent
    bytes_sent: int = 0
    blobs_sent: list[str] = field(default_factory=list)
    blobs_mounted: list[str] = field(default_factory=list)


def inputs_tag(
    plan: RunPlan, root: Path, files: list[str], platform: str, extra: bytes = b""
) -> str:
    """The image's tag: a hash of what goes into it (the base as written: --no-cache looks
    it up again; `extra`: a Dockerfile that builds it instead)."""
    digest = hashlib.sha256(extra)
    for part in (
        FORMAT,
        plan.base.image,
        plan.python,
        platform,
        "\n".join(plan.requirements),
        _pip_settings(),
        json.dumps(list(plan.command)),
        files_digest(root, files),
    ):
        digest.update(part.encode() + b"\0")
    return digest.hexdigest()[:20]


def build_and_push(
    plan: RunPlan,
    root: Path,
    files: list[str],
    target: Reference,
    report: Report,
    no_cache: bool = False,
    platform: str = "linux/amd64",
    cache_dir: Path | None = None,
) -> Pushed:
    tag = inputs_tag(plan, root, files, platform)
    registry = registry_of(target)
    try:
        if ECR_HOST.fullmatch(target.registry):
            ensure_ecr_repository(target.registry, target.repository)
        if not no_cache:
            held = registry.manifest_digest(target.repository, tag)
            if held is not None:
                report("unchanged", tag, 0, 0)
                return Pushed(target.with_digest(held), tag, held, skipped=True)
        base_ref = parse_reference(plan.base.image)
        base_registry = (
            registry if base_ref.registry == target.registry
            else registry_of(base_ref)
        )  # fmt: skip
        try:
            return _build(plan, root, files, target, tag, registry, base_ref, base_registry,
                          report, platform, cache_dir or _cache_dir(), no_cache)  # fmt: skip
        finally:
            if base_registry is not registry:
                base_registry.close()
    finally:
        registry.close()


def _build(
    plan: RunPlan,
    root: Path,
    files: list[str],
    target: Reference,
    tag: str,
    registry: Registry,
    base_ref: Reference,
    base_registry: Registry,
    report: Report,
    platform: str,
    cache: Path,
    no_cache: bool,
) -> Pushed:
    report("base", str(base_ref), 0, 0)
    media, manifest = _base_manifest(base_registry, base_ref, platform)
    config = json.loads(base_registry.blob(base_ref.repository, manifest["config"]["digest"]))
    _check_python(config, plan, base_ref)
    oci = media == OCI_MANIFEST
    with tempfile.TemporaryDirectory(prefix="gpufleet-run-") as tmp:
        layers: list[Layer] = []
        if plan.requirements:
            report("dependencies", f"{len(plan.requirements)} requirements", 0, 0)
            layers.append(_deps_layer(plan, platform, cache, no_cache))
        report("code", f"{len(files)} files", 0, 0)
        layers.append(folder_layer(root, files, WORKDIR, Path(tmp) / "code.tar.gz"))
        image_config = _image_config(config, plan, layers)
        config_bytes = json.dumps(image_config, sort_keys=True, separators=(",", ":")).encode()
        config_digest = "sha256:" + hashlib.sha256(config_bytes).hexdigest()
        layer_type = OCI_LAYER_TYPE if oci else DOCKER_LAYER_TYPE
        new_manifest = {
            "schemaVersion": 2,
            "mediaType": media,
            "config": {
                "mediaType": OCI_CONFIG_TYPE if oci else DOCKER_CONFIG_TYPE,
                "digest": config_digest,
                "size": len(config_bytes),
            },
            "layers": [
                *manifest["layers"],
                *({"mediaType": layer_type, "digest": la.digest, "size": la.size} for la in layers),
            ],
        }
        pushed = Pushed(target, tag, "", skipped=False)
        same_registry = base_registry is registry
        for blob in manifest["layers"]:
            # a generator: the base's blob is read only if it must be sent
            stream = base_registry.stream_blob(base_ref.repository, blob["digest"])
            _send(registry, target, blob["digest"], int(blob["size"]), stream, report, pushed,
                  base_ref.repository if same_registry else None)  # fmt: skip
        for layer in layers:
            _send(registry, target, layer.digest, layer.size, layer.path, report, pushed)
        _send(registry, target, config_digest, len(config_bytes), config_bytes, report, pushed)
        body = json.dumps(new_manifest, separators=(",", ":")).encode()
        digest = registry.put_manifest(target.repository, tag, media, body)
        report("manifest", tag, len(body), len(body))
        pushed.digest = digest
        pushed.reference = target.with_digest(digest)
        pushed.bytes_sent = registry.sent
        return pushed


def registry_of(reference: Reference) -> Registry:
    """A client of the reference's registry, with its credentials; plain HTTP for this
    machine's registries and those listed in $GPUFLEET_INSECURE_REGISTRIES."""
    listed = os.environ.get("GPUFLEET_INSECURE_REGISTRIES", "")
    insecure = True if reference.registry in {h.strip() for h in listed.split(",")} else None
    return Registry(
        reference.registry, reference.endpoint, credentials_for(reference.registry), insecure
    )


def _base_manifest(registry: Registry, ref: Reference, platform: str) -> tuple[str, dict[str, Any]]:
    """The base image's manifest for `platform`, by digest."""
    media, body, _ = registry.manifest(ref.repository, ref.digest or ref.tag or "latest")
    data = json.loads(body)
    if media in INDEX_TYPES or "manifests" in data:
        os_name, _, arch = platform.partition("/")
        chosen = next(
            (
                m for m in data.get("manifests", [])
                if (m.get("platform") or {}).get("os") == os_name
                and (m.get("platform") or {}).get("architecture") == arch
            ),
            None,
        )  # fmt: skip
        if chosen is None:
            raise BuildError(f"the base image {ref} has no {platform} image")
        media, body, _ = registry.manifest(ref.repository, chosen["digest"])
        data = json.loads(body)
    if media not in (OCI_MANIFEST, DOCKER_MANIFEST):
        raise BuildError(f"the base image {ref}: its manifest is of an unknown kind ({media})")
    return media, data


def _check_python(config: dict[str, Any], plan: RunPlan, ref: Reference) -> None:
    """The official Python images say their version in PYTHON_VERSION: a mismatch would
    install the dependencies for the wrong interpreter."""
    for item in (config.get("config") or {}).get("Env") or []:
        name, _, value = item.partition("=")
        if name == "PYTHON_VERSION" and not (value + ".").startswith(plan.python + "."):
            raise BuildError(
                f"the base image {ref} holds Python {value}, not {plan.python}: pass a "
                f"--base-image with Python {plan.python}, or set python in .gpufleet.yaml"
            )


def _image_config(base: dict[str, Any], plan: RunPlan, layers: list[Layer]) -> dict[str, Any]:
    config: dict[str, Any] = json.loads(json.dumps(base))  # a copy
    settings = config.setdefault("config", {}) or {}
    config["config"] = settings
    env = [e for e in settings.get("Env") or [] if not e.startswith(("PYTHONPATH=",))]
    path = next((e.split("=", 1)[1] for e in env if e.startswith("PATH=")), DEFAULT_PATH)
    env = [e for e in env if not e.startswith("PATH=")]
    env += [
        f"PATH={DEPS_DIR}/bin:{path}",
        f"PYTHONPATH={DEPS_DIR}",
        "PYTHONUNBUFFERED=1",
    ]
    settings["Env"] = sorted(set(env), key=env.index)
    settings["WorkingDir"] = WORKDIR
    settings["Entrypoint"] = None
    settings["Cmd"] = list(plan.command)
    settings.setdefault("Labels", {})
    settings["Labels"] = {**(settings["Labels"] or {}), "io.gpufleet.run.base": plan.base.image}
    config["created"] = CREATED
    config.setdefault("rootfs", {"type": "layers", "diff_ids": []})
    config["rootfs"]["diff_ids"] = [*config["rootfs"].get("diff_ids", []),
                                    *(la.diff_id for la in layers)]  # fmt: skip
    history = list(config.get("history") or [])
    if plan.requirements:
        history.append({"created": CREATED, "created_by": "gpufleet run: dependencies"})
    history.append({"created": CREATED, "created_by": "gpufleet run: the project's files"})
    config["history"] = history
    return config


def _send(
    registry: Registry,
    target: Reference,
    digest: str,
    size: int,
    content: Path | bytes | Iterator[bytes],
    report: Report,
    pushed: Pushed,
    mount_from: str | None = None,
) -> None:
    """A blob into the target repository, unless it is there; mounted from `mount_from` (a
    repository of the same registry) when the registry can."""
    if registry.has_blob(target.repository, digest):
        report("exists", digest, size, size)
        return
    if mount_from is not None and registry.mount(target.repository, digest, mount_from):
        report("mounted", digest, size, size)
        pushed.blobs_mounted.append(digest)
        return
    done = 0

    def progress(sent: int) -> None:
        nonlocal done
        done += sent
        report("upload", digest, done, size)

    registry.upload(target.repository, digest, size, content, progress)
    pushed.blobs_sent.append(digest)


# --- the dependencies layer --------------------------------------------------------------------

PLATFORM_TAGS = {
    "amd64": ("manylinux_2_36_x86_64", "manylinux_2_34_x86_64", "manylinux_2_28_x86_64",
              "manylinux_2_17_x86_64", "manylinux2014_x86_64", "linux_x86_64"),
    "arm64": ("manylinux_2_36_aarch64", "manylinux_2_34_aarch64", "manylinux_2_28_aarch64",
              "manylinux_2_17_aarch64", "manylinux2014_aarch64", "linux_aarch64"),
}  # fmt: skip
PIP_SETTINGS = ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "PIP_NO_INDEX")


def _pip_settings() -> str:
    """The settings that change what pip installs: part of the cache key and the tag."""
    return "\n".join(f"{k}={os.environ.get(k, '')}" for k in PIP_SETTINGS)


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "gpufleet" / "run"


def _deps_layer(plan: RunPlan, platform: str, cache: Path, no_cache: bool) -> Layer:
    """The requirements installed for the image's Python and platform (wheels only: nothing
    is compiled for the wrong machine), cached here by what went into them."""
    arch = platform.partition("/")[2]
    if arch not in PLATFORM_TAGS:
        raise BuildError(f"platform {platform}: use linux/amd64 or linux/arm64")
    key = hashlib.sha256(
        "\0".join([FORMAT, plan.python, platform, *plan.requirements, _pip_settings()]).encode()
    ).hexdigest()[:24]
    layer_path, meta_path = cache / f"deps-{key}.tar.gz", cache / f"deps-{key}.json"
    if not no_cache and layer_path.is_file() and meta_path.is_file():
        meta = json.loads(meta_path.read_text())
        return Layer(layer_path, meta["digest"], meta["diff_id"], meta["size"])
    with tempfile.TemporaryDirectory(prefix="gpufleet-deps-") as tmp:
        folder = Path(tmp) / "root"
        target = folder / DEPS_DIR.lstrip("/")
        target.mkdir(parents=True)
        requirements = Path(tmp) / "requirements.txt"
        requirements.write_text("\n".join(plan.requirements) + "\n")
        version = plan.python.replace(".", "")
        command = [
            sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
            "--no-compile", "--only-binary=:all:", "--target", str(target),
            "--python-version", plan.python, "--implementation", "cp",
            "--abi", f"cp{version}", "--abi", "abi3", "--abi", "none",
            *(a for tag in PLATFORM_TAGS[arch] for a in ("--platform", tag)),
            "--platform", "any", "-r", str(requirements),
        ]  # fmt: skip
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=1800)
        except FileNotFoundError:
            raise BuildError(f"{sys.executable} -m pip: pip is not installed") from None
        if done.returncode != 0:
            detail = (done.stderr or done.stdout).strip().splitlines()[-3:]
            raise BuildError(
                f"installing the requirements for Python {plan.python} on {platform} failed: "
                + " / ".join(detail)
                + " (only wheels are used: a package without a wheel for that Python and "
                "platform cannot go in; pin a version that has one)"
            )
        _tidy(target)
        cache.mkdir(parents=True, exist_ok=True)
        layer = tree_layer(folder, Path(tmp) / "deps.tar.gz")
        shutil.move(layer.path, layer_path)
        meta_path.write_text(
            json.dumps({"digest": layer.digest, "diff_id": layer.diff_id, "size": layer.size})
        )
        return Layer(layer_path, layer.digest, layer.diff_id, layer.size)


def _tidy(target: Path) -> None:
    """What pip writes about this machine: records naming its paths, scripts naming its
    interpreter (the image's is python3 on PATH)."""
    for record in list(target.glob("*.dist-info/RECORD")) + list(
        target.glob("*.dist-info/direct_url.json")
    ):
        record.unlink()
    scripts = target / "bin"
    if scripts.is_dir():
        for script in scripts.iterdir():
            if not script.is_file():
                continue
            data = script.read_bytes()
            if data.startswith(b"#!") and b"python" in data.split(b"\n", 1)[0]:
                rest = data.split(b"\n", 1)[1] if b"\n" in data else b""
                script.write_bytes(b"#!/usr/bin/env python3\n" + rest)
