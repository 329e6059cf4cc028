"""A fleet: every gpufleet object of a GitOps repository, loaded with its source location."""

from __future__ import annotations

import types
import typing
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from gpufleet.model.api import (
    API_VERSION,
    GROUP,
    KINDS,
    Cluster,
    DiagnosisPattern,
    FleetPolicy,
    FleetPolicySpec,
    GPUPool,
    RemediationPolicy,
    Reservation,
    Resource,
    Team,
    WorkloadTemplate,
)
from gpufleet.model.problems import Problem
from gpufleet.model.source import Document, Source, read_documents
from gpufleet.model.suggest import closest, did_you_mean


@dataclass
class Fleet:
    """The desired state: pools, teams, reservations and policies, keyed by name."""

    clusters: dict[str, Cluster] = field(default_factory=dict)
    pools: dict[str, GPUPool] = field(default_factory=dict)
    teams: dict[str, Team] = field(default_factory=dict)
    reservations: dict[str, Reservation] = field(default_factory=dict)
    policies: dict[str, FleetPolicy] = field(default_factory=dict)
    diagnosis: dict[str, DiagnosisPattern] = field(default_factory=dict)
    remediation: dict[str, RemediationPolicy] = field(default_factory=dict)
    templates: dict[str, WorkloadTemplate] = field(default_factory=dict)
    sources: dict[tuple[str, str], Source] = field(default_factory=dict)
    # (kind, name) of every object in the input, including those with schema errors, so a
    # reference to a broken object is not also reported as a reference to a missing one.
    declared: set[tuple[str, str]] = field(default_factory=set)
    # every cluster of the whole fleet, on one cluster's part of it (`for_cluster`)
    fleet_clusters: tuple[str, ...] = ()

    def exists(self, kind: str, name: str) -> bool:
        return (kind, name) in self.declared or (kind, name) in self.sources

    def add(self, obj: Resource, source: Source) -> Source | None:
        """Add an object; returns the source of an earlier object of the same kind and name."""
        key = (obj.kind_name, obj.name)
        if key in self.sources:
            return self.sources[key]
        self._index(obj)[obj.name] = obj
        self.sources[key] = source
        return None

    def _index(self, obj: Resource) -> dict[str, Any]:
        if isinstance(obj, Cluster):
            return self.clusters
        if isinstance(obj, GPUPool):
            return self.pools
        if isinstance(obj, Team):
            return self.teams
        if isinstance(obj, Reservation):
            return self.reservations
        if isinstance(obj, DiagnosisPattern):
            return self.diagnosis
        if isinstance(obj, RemediationPolicy):
            return self.remediation
        if isinstance(obj, WorkloadTemplate):
            return self.templates
        return self.policies

    def source_of(self, obj: Resource) -> Source:
        return self.sources[(obj.kind_name, obj.name)]

    def objects(self) -> list[Resource]:
        """All objects in a stable order: by kind (API order), then name."""
        groups: list[dict[str, Any]] = [
            self.clusters,
            self.pools,
            self.teams,
            self.reservations,
            self.policies,
            self.diagnosis,
            self.remediation,
            self.templates,
        ]
        return [group[name] for group in groups for name in sorted(group)]

    # --- clusters --------------------------------------------------------------------------

    def pools_in(self, cluster: str | None) -> list[str]:
        """The pools whose nodes are in `cluster` (None: those that name no cluster)."""
        return sorted(name for name, p in self.pools.items() if p.spec.cluster == cluster)

    def for_cluster(self, cluster: str) -> Fleet:
        """What one cluster's controller enforces: its own pools and their reservations, with
        every team and policy. A fleet that declares no clusters is all one cluster's."""
        if not self.clusters:
            return self
        pools = set(self.pools_in(cluster))
        kept = Fleet(
            clusters={cluster: self.clusters[cluster]} if cluster in self.clusters else {},
            pools={n: p for n, p in self.pools.items() if n in pools},
            teams=self.teams,
            reservations={n: r for n, r in self.reservations.items() if r.spec.pool in pools},
            policies=self.policies,
            diagnosis=self.diagnosis,
            remediation=self.remediation,
            templates=self.templates,
            declared=self.declared,
            fleet_clusters=tuple(sorted(self.clusters)),
        )
        kept.sources = {
            key: self.sources[key]
            for key in ((o.kind_name, o.name) for o in kept.objects())
            if key in self.sources
        }
        return kept

    # --- the team tree ---------------------------------------------------------------------

    def children(self, team: str) -> list[str]:
        return sorted(t.name for t in self.teams.values() if t.spec.parent == team)

    def roots(self) -> list[str]:
        return sorted(
            t.name
            for t in self.teams.values()
            if t.spec.parent is None or t.spec.parent not in self.teams
        )

    def subtree(self, team: str) -> list[str]:
        """The team and all its descendants (pre-order); safe on cyclic input."""
        seen: list[str] = []
        stack = [team]
        while stack:
            name = stack.pop()
            if name in seen:
                continue
            seen.append(name)
            stack.extend(reversed(self.children(name)))
        return seen

    def reserved_gpus(self, team: str, pool: str | None = None) -> int:
        """GPUs reserved directly by `team` (in `pool`, or in all pools)."""
        return sum(
            r.spec.gpus
            for r in self.reservations.values()
            if r.spec.team == team and (pool is None or r.spec.pool == pool)
        )

    def reserved_in_pool(self, pool: str) -> int:
        return sum(r.spec.gpus for r in self.reservations.values() if r.spec.pool == pool)

    # --- policy ----------------------------------------------------------------------------

    @property
    def policy(self) -> FleetPolicySpec:
        """The effective policy: every FleetPolicy's explicit settings over the defaults."""
        return FleetPolicySpec.model_validate(merged_policy_settings(self)[0])


def merged_policy_settings(fleet: Fleet) -> tuple[dict[str, Any], list[tuple[str, str, str]]]:
    """Merge the explicitly set fields of all FleetPolicies (in name order).

    Returns the merged settings and the conflicts as (field path, policy, earlier policy)."""
    merged: dict[str, Any] = {}
    owner: dict[str, str] = {}
    conflicts: list[tuple[str, str, str]] = []

    def walk(settings: dict[str, Any], into: dict[str, Any], prefix: str, policy: str) -> None:
        for key, value in settings.items():
            path = f"{prefix}.{key}"
            if isinstance(value, dict):
                walk(value, into.setdefault(key, {}), path, policy)
            elif key in into and into[key] != value:
                conflicts.append((path, policy, owner[path]))
            else:
                into[key] = value
                owner[path] = policy

    for name in sorted(fleet.policies):
        spec = fleet.policies[name].spec
        walk(spec.model_dump(by_alias=True, exclude_unset=True), merged, "spec", name)
    return merged, conflicts


# --- turning documents into objects --------------------------------------------------------


@dataclass
class LoadResult:
    fleet: Fleet
    problems: list[Problem]
    skipped: int = 0  # documents that are not gpufleet objects (other manifests in the repo)


def load_fleet(paths: Sequence[str | Path]) -> LoadResult:
    """Load every gpufleet object under `paths`; all problems are collected, none raised."""
    documents, problems = read_documents(paths)
    result = LoadResult(Fleet(), problems)
    first_seen: dict[tuple[str, str], Source] = {}
    for document in documents:
        obj = _parse_document(document, result)
        # Duplicates are found by the raw kind and name, so an object with a schema error
        # still counts: otherwise fixing that error would reveal a new one.
        key = _raw_key(document.data)
        if key is not None and key in first_seen:
            earlier = first_seen[key]
            result.problems.append(
                Problem(
                    document.source.file,
                    document.source.line_of(("metadata", "name")),
                    "error",
                    f"duplicate {key[0]} {key[1]!r}: already defined at "
                    f"{earlier.file}:{earlier.line}; rename or remove one of them",
                    "DuplicateName",
                    f"{key[0]}/{key[1]}",
                )
            )
            continue
        if key is not None:
            first_seen[key] = document.source
            result.fleet.declared.add(key)
        if obj is not None:
            result.fleet.add(obj, document.source)
    return result


def fleet_from_objects(objects: Sequence[dict[str, Any]], origin: str = "cluster") -> LoadResult:
    """A fleet from objects read from the API server (status and server-set metadata dropped)."""
    result = LoadResult(Fleet(), [])
    for index, obj in enumerate(objects):
        metadata = obj.get("metadata", {})
        data = {
            "apiVersion": obj.get("apiVersion"),
            "kind": obj.get("kind"),
            "metadata": {
                k: metadata[k] for k in ("name", "labels", "annotations") if k in metadata
            },
            **({"spec": obj["spec"]} if "spec" in obj else {}),
        }
        name = metadata.get("name", index)
        document = Document(data, Source(f"{origin}:{obj.get('kind')}/{name}", 0))
        parsed = _parse_document(document, result)
        if parsed is not None:
            result.fleet.add(parsed, document.source)
    return result


def _raw_key(data: Any) -> tuple[str, str] | None:
    if not isinstance(data, dict) or data.get("kind") not in KINDS:
        return None
    metadata = data.get("metadata")
    name = metadata.get("name") if isinstance(metadata, dict) else None
    return (data["kind"], name) if isinstance(name, str) else None


def _parse_document(document: Document, result: LoadResult) -> Resource | None:
    data, source = document.data, document.source

    def problem(path: tuple[str | int, ...], message: str, code: str) -> None:
        result.problems.append(Problem(source.file, source.line_of(path), "error", message, code))

    if not isinstance(data, dict):
        problem(
            (), "expected a Kubernetes object (a mapping with apiVersion and kind)", "NotAnObject"
        )
        return None
    api_version, kind = data.get("apiVersion"), data.get("kind")
    if not isinstance(api_version, str) or not isinstance(kind, str):
        if kind in KINDS:
            problem(("kind",), f"{kind} needs apiVersion: {API_VERSION}", "MissingAPIVersion")
        else:
            result.problems.append(
                Problem(
                    source.file,
                    source.line,
                    "warning",
                    "skipped: not a Kubernetes object (no apiVersion and kind)",
                    "NotAnObject",
                )
            )
        return None
    group = api_version.split("/")[0] if "/" in api_version else ""
    if group != GROUP or api_version != API_VERSION:
        if group == GROUP or closest(group, [GROUP]):
            problem(
                ("apiVersion",),
                f"unknown apiVersion {api_version!r} for kind {kind}; use {API_VERSION}",
                "UnknownAPIVersion",
            )
        else:
            result.skipped += 1
        return None
    cls = KINDS.get(kind)
    if cls is None:
        problem(
            ("kind",),
            f"unknown kind {kind!r} in {GROUP}{did_you_mean(kind, list(KINDS))}; "
            f"known kinds: {', '.join(KINDS)}",
            "UnknownKind",
        )
        return None
    try:
        return cls.model_validate(data)
    except ValidationError as err:
        key = _raw_key(data)
        label = f"{kind}/{key[1]}" if key else kind
        result.problems.extend(validation_problems(err, cls, source, label))
        return None


def validation_problems(
    err: ValidationError, cls: type[BaseModel], source: Source, label: str
) -> list[Problem]:
    """pydantic's errors as located problems: one per field, at the field's line."""
    return [
        Problem(
            source.file,
            source.line_of(tuple(detail["loc"])),
            "error",
            f"{label}: {_describe(cls, detail)}",
            _code(detail),
            label,
        )
        for detail in err.errors()
    ]


def _code(detail: Any) -> str:
    return {"extra_forbidden": "UnknownField", "missing": "MissingField"}.get(
        detail["type"], "InvalidValue"
    )


def _describe(cls: type[BaseModel], detail: Any) -> str:
    loc = tuple(detail["loc"])
    where = ".".join(str(p) for p in loc)
    kind = detail["type"]
    if kind == "extra_forbidden":
        known = _field_names(cls, loc[:-1])
        return f"unknown field {where!r}{did_you_mean(str(loc[-1]), known)}"
    if kind == "missing":
        return f"missing required field {where!r}"
    message = str(detail["msg"]).removeprefix("Value error, ")
    shown = detail.get("input")
    if kind.startswith(("less_than", "greater_than", "literal_error", "string_pattern")) or (
        kind in ("int_parsing", "int_type", "float_parsing", "bool_parsing", "string_type")
    ):
        return f"{where}: {message} (got {shown!r})"
    return f"{where}: {message}"


def _field_names(cls: type[BaseModel], path: tuple[Any, ...]) -> list[str]:
    """The field names (aliases) allowed at `path` inside model `cls`."""
    current: Any = cls
    for part in path:
        current = _model_in(current)
        if current is None or isinstance(part, int):
            continue
        info = next((f for n, f in current.model_fields.items() if (f.alias or n) == part), None)
        if info is None:
            return []
        current = info.annotation
    model = _model_in(current)
    if model is None:
        return []
    return [f.alias or n for n, f in model.model_fields.items()]


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model inside an annotation such as `X | None` or `list[X]`."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType, list, typing.Annotated):
        for arg in typing.get_args(annotation):
            found = _model_in(arg)
            if found is not None:
                return found
    return None
