"""The docs name every field of the API, so the reference cannot silently fall behind."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from gpufleet.model.api import CRD_TYPES
from gpufleet.model.fleet import _model_in

DOC = (Path(__file__).resolve().parent.parent / "docs" / "api.md").read_text()


def field_names(model: type[BaseModel]) -> set[str]:
    names: set[str] = set()
    for name, info in model.model_fields.items():
        alias = info.alias or name
        names.add(alias)
        inner: Any = _model_in(info.annotation)
        if inner is not None:
            names |= field_names(inner)
    return names


def test_every_api_field_is_documented() -> None:
    ignored = {"apiVersion", "kind", "metadata", "name", "labels", "annotations", "spec", "status"}
    for cls in CRD_TYPES:
        missing = sorted(
            n for n in field_names(cls) - ignored if not re.search(rf"[`.{{ ]{n}[`.,}} ]", DOC)
        )
        assert missing == [], f"{cls.kind_name} fields missing from docs/api.md: {missing}"
