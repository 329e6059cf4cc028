"""Helpers for tests of the Kubernetes adapters: the asserting forms of lookups that may find
nothing, so that a test reads what it expects and the type checker sees it."""

from __future__ import annotations

from typing import Any

from gpufleet.kube.request import Request, request_of
from gpufleet.model.fleet import Fleet


def requested(obj: dict[str, Any], fleet: Fleet) -> Request:
    """What `obj` asks for; the test fails if gpufleet would not manage it."""
    found = request_of(obj, fleet)
    assert found is not None, f"{obj.get('kind')} {obj['metadata'].get('name')} is not managed"
    return found
