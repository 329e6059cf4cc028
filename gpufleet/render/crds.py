"""CustomResourceDefinitions generated from the pydantic models.

The models are the single source of truth: their JSON schema is turned into a *structural*
OpenAPI v3 schema as Kubernetes requires (every node typed, no $ref, no anyOf of types), keeping
ranges, patterns, enums and defaults so the API server enforces what `gpufleet validate` does.
"""

from __future__ import annotations

from typing import Any

from gpufleet.model.api import CRD_TYPES, GROUP, VERSION, Resource
from gpufleet.render.common import Manifest, managed_labels

PRINTER_COLUMNS: dict[str, list[dict[str, Any]]] = {
    "GPUPool": [
        {"name": "Provider", "type": "string", "jsonPath": ".spec.provider"},
        {"name": "GPU", "type": "string", "jsonPath": ".spec.gpuType"},
        {"name": "Max", "type": "integer", "jsonPath": ".spec.maxGPUs"},
        {"name": "Total", "type": "integer", "jsonPath": ".status.totalGPUs"},
        {"name": "Allocated", "type": "number", "jsonPath": ".status.allocatedGPUs"},
        {"name": "Idle", "type": "number", "jsonPath": ".status.idleGPUs"},
        {"name": "Healthy", "type": "integer", "jsonPath": ".status.healthyGPUs", "priority": 1},
    ],
    "Team": [
        {"name": "Parent", "type": "string", "jsonPath": ".spec.parent"},
        {"name": "Reserved", "type": "number", "jsonPath": ".status.reservedGPUs"},
        {"name": "Used", "type": "number", "jsonPath": ".status.usedGPUs"},
        {"name": "Borrowed", "type": "number", "jsonPath": ".status.borrowedGPUs"},
        {"name": "Burst Limit", "type": "string", "jsonPath": ".spec.burstLimit", "priority": 1},
    ],
    "Reservation": [
        {"name": "Team", "type": "string", "jsonPath": ".spec.team"},
        {"name": "Pool", "type": "string", "jsonPath": ".spec.pool"},
        {"name": "GPUs", "type": "integer", "jsonPath": ".spec.gpus"},
        {"name": "Used", "type": "number", "jsonPath": ".status.usedGPUs"},
        {"name": "Expires", "type": "date", "jsonPath": ".spec.expiresAt"},
    ],
    "GPUWorkload": [
        {"name": "Kind", "type": "string", "jsonPath": ".spec.workloadRef.kind"},
        {"name": "Team", "type": "string", "jsonPath": ".spec.team"},
        {"name": "Class", "type": "string", "jsonPath": ".spec.class"},
        {"name": "GPUs", "type": "number", "jsonPath": ".spec.gpus"},
        {"name": "Pods", "type": "integer", "jsonPath": ".spec.pods"},
        {"name": "State", "type": "string", "jsonPath": ".status.state"},
        {"name": "Pool", "type": "string", "jsonPath": ".status.pool"},
        {"name": "Reason", "type": "string", "jsonPath": ".status.reason"},
        {"name": "Position", "type": "integer", "jsonPath": ".status.position", "priority": 1},
        {"name": "Message", "type": "string", "jsonPath": ".status.message", "priority": 1},
    ],
    "FleetPolicy": [
        {"name": "Require Team", "type": "boolean", "jsonPath": ".spec.admission.requireTeam"},
        {"name": "Min Runtime", "type": "string", "jsonPath": ".spec.preemption.minRuntime"},
    ],
}
AGE_COLUMN = {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}


PRESERVE_UNKNOWN = "x-kubernetes-preserve-unknown-fields"
# Bounds on every string and list a model leaves open: the API server refuses an object that
# would cost every watcher and every CEL rule its size (etcd itself takes 1.5 MiB); the
# models set tighter ones where they know better (names: 253).
MAX_LENGTH = 4096
MAX_ITEMS = 1024
VALIDATIONS = "x-kubernetes-validations"  # CEL rules, as the model declares them
_KEY_ORDER = (
    "description",
    "type",
    "format",
    "enum",
    "pattern",
    "minimum",
    "maximum",
    "minLength",
    "maxLength",
    "minItems",
    "maxItems",
    "default",
    "required",
    "properties",
    "additionalProperties",
    "items",
    PRESERVE_UNKNOWN,
    VALIDATIONS,
)
# Keys of pydantic's JSON schema that mean the same in OpenAPI v3 and that Kubernetes accepts
# (the structural keys are rebuilt recursively).
_KEPT = set(_KEY_ORDER) - {"properties", "additionalProperties", "items"}
INT_OR_STRING = "x-kubernetes-int-or-string"


def _ordered(node: dict[str, Any]) -> dict[str, Any]:
    return {k: node[k] for k in sorted(node, key=lambda k: (*_KEY_ORDER, k).index(k))}


def _structural(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """Turn one pydantic JSON-schema node into a structural OpenAPI v3 node."""
    if node.get(INT_OR_STRING):
        # Kubernetes' one permitted type union: an integer or a string (e.g. "50%" or 16).
        described = {"description": node["description"]} if "description" in node else {}
        return {
            **described,
            INT_OR_STRING: True,
            "anyOf": [{"type": "integer"}, {"type": "string"}],
        }
    if "$ref" in node:
        target = defs[node["$ref"].rsplit("/", 1)[-1]]
        merged = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
        return _structural(merged, defs)
    for key in ("anyOf", "oneOf"):
        if key in node:
            options = [o for o in node[key] if o.get("type") != "null"]
            nullable = len(options) < len(node[key])
            if len(options) != 1:
                raise ValueError(f"cannot express a union of {options} structurally")
            rest = {k: v for k, v in node.items() if k != key}
            merged = _structural({**options[0], **rest}, defs)
            if nullable and merged.get("default", ...) is None:
                merged.pop("default")
            return merged
    if "const" in node:
        node = {**node, "enum": [node["const"]]}
    out: dict[str, Any] = {k: v for k, v in node.items() if k in _KEPT}
    if out.get("default", ...) is None:
        out.pop("default")
    if out.get("format") == "date-time":
        out["type"] = "string"
    if "enum" in node and "type" not in out:
        out["type"] = "string"
    if node.get("type") == "object" or "properties" in node:
        out["type"] = "object"
        if "properties" in node:
            out["properties"] = {
                name: _structural(child, defs) for name, child in node["properties"].items()
            }
        extra = node.get("additionalProperties")
        if extra is True or extra == {}:
            # free-form (a pod's manifest): kept as written, not pruned
            out[PRESERVE_UNKNOWN] = True
        elif isinstance(extra, dict):
            out["additionalProperties"] = _structural(extra, defs)
    if node.get("type") == "array":
        out["items"] = _structural(node["items"], defs)
        out.setdefault("maxItems", MAX_ITEMS)
    if out.get("type") == "string" and not {"enum", "format", "maxLength"} & out.keys():
        out["maxLength"] = MAX_LENGTH
    if "required" in out and not out["required"]:
        out.pop("required")
    return _ordered(out)


def openapi_schema(cls: type[Resource]) -> dict[str, Any]:
    schema = cls.model_json_schema(by_alias=True, mode="validation")
    defs = schema.get("$defs", {})
    root = _structural(schema, defs)
    props = root["properties"]
    # apiVersion, kind and metadata belong to the API server, not to the object's schema.
    for key in ("apiVersion", "kind", "metadata"):
        props.pop(key, None)
    props["apiVersion"] = {"type": "string"}
    props["kind"] = {"type": "string"}
    props["metadata"] = {"type": "object"}
    root["required"] = [r for r in root.get("required", []) if r not in ("metadata",)]
    if not root["required"]:
        root.pop("required")
    root["description"] = cls.description
    return root


def crd(cls: type[Resource]) -> Manifest:
    columns = [*PRINTER_COLUMNS.get(cls.kind_name, []), AGE_COLUMN]
    version: dict[str, Any] = {
        "name": VERSION,
        "served": True,
        "storage": True,
        "schema": {"openAPIV3Schema": openapi_schema(cls)},
        "additionalPrinterColumns": columns,
    }
    if "status" in cls.model_fields and cls.status_subresource:
        version["subresources"] = {"status": {}}
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{cls.plural}.{GROUP}", "labels": managed_labels()},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced" if cls.namespaced else "Cluster",
            "names": {
                "kind": cls.kind_name,
                "listKind": f"{cls.kind_name}List",
                "plural": cls.plural,
                "singular": cls.kind_name.lower(),
                "shortNames": list(cls.short_names),
                "categories": ["gpufleet"],
            },
            "versions": [version],
        },
    }


def render_crds() -> list[Manifest]:
    return [crd(cls) for cls in CRD_TYPES]
