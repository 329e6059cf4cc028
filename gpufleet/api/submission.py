"""The manifest `POST /api/v1/workloads` creates, from a submission: the caller's own manifest
labelled for gpufleet, or a Job built from the short form's fields."""

from __future__ import annotations

from typing import Any

from gpufleet.api.models import Submission
from gpufleet.kube.manifests import is_priority, job_manifest, label_manifest
from gpufleet.model.api import NAMED_PRIORITIES
from gpufleet.model.keys import EXTERNAL_ID_ANNOTATION

# the fields that go with a full manifest
WITH_MANIFEST = {
    "namespace",
    "manifest",
    "team",
    "workload_class",
    "priority",
    "external_id",
    "dry_run",
}


def manifest_of(submission: Submission) -> dict[str, Any]:
    """The object to create; ValueError saying which field is wrong and how to put it right."""
    if not is_priority(submission.priority):
        raise ValueError(
            f"priority {submission.priority!r}: use {', '.join(NAMED_PRIORITIES)} or 0-99"
        )
    given = submission.model_fields_set
    if submission.manifest is not None:
        extra = sorted(given - WITH_MANIFEST)
        if extra:
            raise ValueError(
                f"{', '.join(extra)}: not with a manifest (write them into the manifest, or send "
                "the short form without one)"
            )
        manifest = dict(submission.manifest)
        metadata = manifest.get("metadata") or {}
        if metadata.get("namespace") not in (None, submission.namespace):
            raise ValueError(
                f"the manifest's namespace {metadata['namespace']} is not namespace "
                f"{submission.namespace}: send one of the two, or both the same"
            )
        labels = metadata.get("labels") or {}
        if submission.team is None and "gpufleet.io/team" not in labels:
            raise ValueError("team: give it, or label the manifest gpufleet.io/team")
        obj = label_manifest(
            manifest,
            submission.team or labels["gpufleet.io/team"],
            submission.workload_class,
            submission.priority,
            submission.namespace,
        )
    else:
        missing = [f for f in ("name", "team", "image") if getattr(submission, f) is None]
        if missing:
            raise ValueError(f"{', '.join(missing)}: needed by the short form (or send a manifest)")
        assert submission.name and submission.team and submission.image
        obj = job_manifest(
            submission.name,
            submission.namespace,
            submission.team,
            submission.workload_class,
            submission.priority,
            submission.gpus,
            submission.pods,
            submission.image,
            submission.command,
            submission.pool,
            submission.run_for,
        )
        if submission.env:
            (container,) = obj["spec"]["template"]["spec"]["containers"]
            container["env"] = [{"name": k, "value": v} for k, v in submission.env.items()]
    if submission.external_id:
        metadata = obj.setdefault("metadata", {})
        annotations = metadata.setdefault("annotations", {}) or {}
        annotations[EXTERNAL_ID_ANNOTATION] = submission.external_id
        metadata["annotations"] = annotations
    return obj
