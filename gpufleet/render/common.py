"""Shared conventions of every rendered object: labels, ordering and YAML output."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import yaml

from gpufleet.model.keys import (
    MANAGED_BY,
    MANAGED_BY_LABEL,
)

Manifest = dict[str, Any]


def managed_labels(**extra: str) -> dict[str, str]:
    """Labels that mark an object as gpufleet's, so controllers prune only what they own."""
    labels = {MANAGED_BY_LABEL: MANAGED_BY}
    labels.update(extra)
    return labels


def manifest(
    api_version: str, kind: str, name: str, spec: Any, labels: dict[str, str] | None = None
) -> Manifest:
    return {
        "apiVersion": api_version,
        "kind": kind,
        "metadata": {"name": name, "labels": labels or managed_labels()},
        **({"spec": spec} if spec is not None else {}),
    }


def sort_key(obj: Manifest) -> tuple[str, str, str]:
    return (obj["apiVersion"], obj["kind"], obj["metadata"]["name"])


class _Dumper(yaml.SafeDumper):
    """Block-style YAML that keeps our key order and indents lists under their key."""

    def increase_indent(self, flow: bool = False, indentless: bool = False) -> None:
        super().increase_indent(flow, False)

    def ignore_aliases(self, data: object) -> bool:
        return True  # manifests are read by people and by tools that dislike anchors


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def to_yaml(objects: Iterable[Manifest]) -> str:
    """A multi-document YAML stream, one document per object."""
    return "".join(
        "---\n"
        + yaml.dump(obj, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=1000)
        for obj in objects
    )


def file_name(obj: Manifest) -> str:
    return f"{obj['kind'].lower()}-{obj['metadata']['name']}.yaml"
