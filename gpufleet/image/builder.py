"""A user's Dockerfile, built and pushed by the container builder installed here (buildah,
podman or docker: the first found), under the same content-addressed tag as a daemonless
build, and skipped when the registry has it."""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

from gpufleet.image.build import BuildError, Pushed, registry_of
from gpufleet.image.reference import Reference

BUILDERS = ("buildah", "podman", "docker")
PUSHED_DIGEST = re.compile(r"digest: (sha256:[0-9a-f]{64})")


def installed_builder() -> str | None:
    return next((b for b in BUILDERS if shutil.which(b)), None)


def build_dockerfile(
    builder: str,
    context: Path,
    dockerfile: Path,
    target: Reference,
    tag: str,
    platform: str,
    no_cache: bool,
    echo: Callable[[str], None],
) -> Pushed:
    registry = registry_of(target)
    try:
        held = None if no_cache else registry.manifest_digest(target.repository, tag)
    finally:
        registry.close()
    if held is not None:
        return Pushed(target.with_digest(held), tag, held, skipped=True)
    reference = f"{target.name}:{tag}"
    build = [builder, "bud" if builder == "buildah" else "build", "--platform", platform,
             "-f", str(dockerfile), "-t", reference]  # fmt: skip
    push = [builder, "push"]
    if builder != "docker" and registry.insecure:
        # a registry without TLS (docker's daemon has its own list of those)
        build.append("--tls-verify=false")
        push.append("--tls-verify=false")
    if no_cache:
        build.append("--no-cache")
    with tempfile.TemporaryDirectory(prefix="gpufleet-push-") as tmp:
        digest_file = Path(tmp) / "digest"
        if builder != "docker":
            push += ["--digestfile", str(digest_file)]
        output = ""
        for step in ([*build, str(context)], [*push, reference]):
            echo(f"$ {' '.join(step)}")
            done = subprocess.run(step, stdout=subprocess.PIPE, text=True)
            output = done.stdout or ""
            echo(output.rstrip())
            if done.returncode != 0:
                raise BuildError(f"{step[0]} {step[1]} failed (exit {done.returncode}): see above")
        if digest_file.is_file():
            digest = digest_file.read_text().strip()
        else:  # docker push prints it
            found = PUSHED_DIGEST.search(output)
            digest = found.group(1) if found else ""
    if not digest.startswith("sha256:"):
        raise BuildError(f"{builder} push did not say the digest it pushed")
    return Pushed(target.with_digest(digest), tag, digest, skipped=False)
