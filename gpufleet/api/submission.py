"""The manifest `POST /api/v1/workloads` creates, from a submission: the caller's own manifest
labelled for gpufleet, or a Job built from the short form's fields."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpufleet.api.models import Submission, Template
from gpufleet.kube.manifests import as_kind, for_hub, is_priority, job_manifest, label_manifest
from gpufleet.model.api import NAMED_PRIORITIES
from gpufleet.model.keys import EXTERNAL_ID_ANNOTATION
from gpufleet.model.suggest import did_you_mean

# the fields that go with a full manifest
WITH_MANIFEST = {
    "namespace",
    "manifest",
    "team",
    "workload_class",
    "priority",
    "external_id",
    "dry_run",
    "cluster",
}
# the short form's fields a template gives where the submission does not
FROM_TEMPLATE = ("image", "command", "env", "team", "workload_class", "priority", "gpus", "pods",
                 "pool")  # fmt: skip


def manifest_of(
    submission: Submission, templates: Mapping[str, Template] | None = None
) -> dict[str, Any]:
    """The object to create (`templates`: the WorkloadTemplates by name); ValueError saying
    which field is wrong and how to put it right."""
    given = submission.model_fields_set
    if submission.manifest is not None:
        extra = sorted(given - WITH_MANIFEST)
        if extra:
            raise ValueError(
                f"{', '.join(extra)}: not with a manifest (write them into the manifest, or send "
                "the short form without one)"
            )
        obj = _labelled(submission)
    else:
        template = _template(submission, templates or {})
        if template is not None:
            values = {k: getattr(template, k) for k in FROM_TEMPLATE if k not in given}
            submission = submission.model_copy(update=values)
        _check_priority(submission.priority)
        missing = [f for f in ("name", "team", "image") if getattr(submission, f) is None]
        if missing:
            raise ValueError(
                f"{', '.join(missing)}: needed by the short form (or send a manifest, or name a "
                "template that gives them)"
            )
        obj = _built(submission, template)
    if submission.external_id:
        metadata = obj.setdefault("metadata", {})
        annotations = metadata.setdefault("annotations", {}) or {}
        annotations[EXTERNAL_ID_ANNOTATION] = submission.external_id
        metadata["annotations"] = annotations
    if submission.cluster is not None:
        try:
            obj = for_hub(obj, submission.cluster)
        except ValueError as err:
            raise ValueError(f"cluster {submission.cluster}: {err}") from None
    return obj


def _check_priority(value: str) -> None:
    if not is_priority(value):
        raise ValueError(f"priority {value!r}: use {', '.join(NAMED_PRIORITIES)} or 0-99")


def _labelled(submission: Submission) -> dict[str, Any]:
    """The caller's manifest with gpufleet's labels where it has none."""
    _check_priority(submission.priority)
    manifest = dict(submission.manifest or {})
    metadata = manifest.get("metadata") or {}
    if metadata.get("namespace") not in (None, submission.namespace):
        raise ValueError(
            f"the manifest's namespace {metadata['namespace']} is not namespace "
            f"{submission.namespace}: send one of the two, or both the same"
        )
    labels = metadata.get("labels") or {}
    if submission.team is None and "gpufleet.io/team" not in labels:
        raise ValueError("team: give it, or label the manifest gpufleet.io/team")
    return label_manifest(
        manifest,
        submission.team or labels["gpufleet.io/team"],
        submission.workload_class,
        submission.priority,
        submission.namespace,
    )


def _template(submission: Submission, templates: Mapping[str, Template]) -> Template | None:
    if submission.template is None:
        return None
    found = templates.get(submission.template)
    if found is None:
        known = ", ".join(sorted(templates)) or "none: declare WorkloadTemplates in git"
        raise ValueError(
            f"template {submission.template!r} does not exist"
            f"{did_you_mean(submission.template, list(templates))}; templates: {known}"
        )
    if found.team is not None and submission.team not in (None, found.team):
        raise ValueError(f"team {submission.team!r}: template {found.name} is team {found.team}'s")
    return found


def _built(submission: Submission, template: Template | None) -> dict[str, Any]:
    """The short form's Job, as the template's kind where one is named."""
    assert submission.name and submission.team and submission.image
    job = job_manifest(
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
        submission.gpu_types,
    )
    (container,) = job["spec"]["template"]["spec"]["containers"]
    if submission.env:
        container["env"] = [{"name": k, "value": v} for k, v in submission.env.items()]
    if template is not None:
        asked = {k: v for k, v in (("cpu", template.cpu), ("memory", template.memory)) if v}
        if asked:
            container["resources"]["requests"] = {
                **asked, **container["resources"]["limits"]
            }  # fmt: skip
        return as_kind(job, template.kind, "torch-distributed")
    return job
