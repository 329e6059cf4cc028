"""The Dockerfile of the image `gpufleet run` assembles without one: for `--dry-run` and
`--save-dockerfile`, and for users who build with their own tools. Pure."""

from __future__ import annotations

import json
import shlex

from gpufleet.project.plan import DEPS_DIR, WORKDIR, RunPlan


def dockerfile(plan: RunPlan) -> str:
    lines = [
        "# The image gpufleet run builds (without a daemon) for this project, as a Dockerfile.",
        f"FROM {plan.base.image}",
        f"ENV PYTHONPATH={DEPS_DIR} PATH={DEPS_DIR}/bin:$PATH PYTHONUNBUFFERED=1",
    ]
    if plan.skipped:
        lines.append(f"# provided by the base image: {' '.join(plan.skipped)}")
    if plan.requirements:
        packages = " ".join(shlex.quote(r) for r in plan.requirements)
        lines.append(
            f"RUN python3 -m pip install --no-cache-dir --only-binary=:all: --target {DEPS_DIR} "
            f"{packages}"
        )
    lines += [f"WORKDIR {WORKDIR}", f"COPY . {WORKDIR}", f"CMD {json.dumps(list(plan.command))}"]
    return "\n".join(lines) + "\n"
