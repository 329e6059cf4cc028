"""Validate objects against the openAPIV3Schema of real CRD files, the way `kubectl apply
--validate=strict` would: types, enums, patterns, ranges, required fields and unknown fields.

CEL rules (x-kubernetes-validations) are not evaluated here; the real API server of the
control-plane tests does that.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import yaml


def _strict(node: Any) -> Any:
    """Copy of a schema where objects with known properties reject unknown fields."""
    if isinstance(node, list):
        return [_strict(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: _strict(value) for key, value in node.items()}
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


class CRDSchemas:
    def __init__(self, crd_files: list[Path]) -> None:
        self._validators: dict[tuple[str, str], jsonschema.Draft4Validator] = {}
        for path in crd_files:
            for crd in yaml.safe_load_all(path.read_text()):
                if not crd or crd.get("kind") != "CustomResourceDefinition":
                    continue
                group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
                for version in crd["spec"]["versions"]:
                    schema = _strict(version["schema"]["openAPIV3Schema"])
                    schema["properties"]["metadata"] = {"type": "object"}
                    api_version = f"{group}/{version['name']}"
                    self._validators[(api_version, kind)] = jsonschema.Draft4Validator(schema)

    def knows(self, obj: dict[str, Any]) -> bool:
        return (obj["apiVersion"], obj["kind"]) in self._validators

    def errors(self, obj: dict[str, Any]) -> list[str]:
        validator = self._validators[(obj["apiVersion"], obj["kind"])]
        return [
            f"{obj['kind']}/{obj['metadata']['name']} at "
            f"{'.'.join(str(p) for p in err.absolute_path) or '<root>'}: {err.message}"
            for err in validator.iter_errors(obj)
        ]
