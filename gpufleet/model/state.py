"""The cluster state file of `gpufleet decide`: nodes and workloads at one moment.

Documented in docs/decide.md. Loaded with the file and line of every field, like the GitOps
objects, so every mistake is reported where it is.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from gpufleet.model.api import DURATION_PATTERN, NAMED_PRIORITIES
from gpufleet.model.fleet import Fleet, validation_problems
from gpufleet.model.problems import Problem
from gpufleet.model.source import Document, Source, parse_yaml
from gpufleet.model.states import ADMITTED_STATES
from gpufleet.model.suggest import did_you_mean
from gpufleet.model.virtual_nodes import to_be_provisioned

WorkloadStateName = Literal["Pending", "Preempted", "Queued", "Starting", "Running"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class NodeEntry(_Model):
    name: str = Field(min_length=1)
    pool: str = Field(min_length=1)
    gpus: int = Field(ge=1, le=64)
    zone: str = ""
    healthy: bool = True
    # recent faults, each counting 1 and halving weekly (the controller reads the node's
    # quarantine history); 0.5 or more makes it a lemon node that critical work avoids
    faults: float = Field(0.0, ge=0)
    # topology inside the zone: a gang goes into one clique, else one block (R8)
    block: str = ""
    clique: str = ""


class WorkloadEntry(_Model):
    name: str = Field(min_length=1)
    team: str = Field(min_length=1)
    workload_class: Literal["reserved", "elastic"] = Field("elastic", alias="class")
    priority: Annotated[int, Field(ge=0, le=99)] = 50
    gpus: float = Field(gt=0, le=64, description="GPUs per pod")
    pods: int = Field(1, ge=1, le=10000)
    pool: str | None = None
    # the GPU types it accepts, the most preferred first; empty: any
    gpu_types: list[str] = Field(default_factory=list, alias="gpuTypes")
    zone: str | None = None
    # a gang that must run inside one domain of this level (R8); unset: preferred
    topology: Literal["block", "clique"] | None = None
    state: WorkloadStateName = "Pending"
    submitted_at: datetime | None = Field(None, alias="submittedAt")
    started_at: datetime | None = Field(None, alias="startedAt")
    nodes: list[str] = Field(default_factory=list)
    expected_end: datetime | None = Field(None, alias="expectedEnd")
    expected_duration: Annotated[str, Field(pattern=DURATION_PATTERN)] | None = Field(
        None, alias="expectedDuration"
    )
    preempted_at: datetime | None = Field(None, alias="preemptedAt")
    preempted_from: str | None = Field(None, alias="preemptedFrom")
    preempted_by: str | None = Field(None, alias="preemptedBy")

    @field_validator("priority", mode="before")
    @classmethod
    def _named_priority(cls, value: Any) -> Any:
        if isinstance(value, str) and value in NAMED_PRIORITIES:
            return NAMED_PRIORITIES[value]
        return value

    @field_validator("gpus")
    @classmethod
    def _gpu_steps(cls, value: float) -> float:
        if value < 1 and value * 4 != int(value * 4):
            raise ValueError(f"a fractional request must be 0.25, 0.5 or 0.75 GPU, not {value}")
        if value >= 1 and value != int(value):
            raise ValueError(f"whole-GPU requests must be integers, not {value}")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> WorkloadEntry:
        if self.gpus < 1 and self.pods > 1:
            raise ValueError("fractional GPUs are for single-pod workloads; use pods: 1")
        if self.state in ADMITTED_STATES and len(self.nodes) != self.pods:
            raise ValueError(
                f"a {self.state} workload lists the node of each pod: {self.pods} pod(s), "
                f"{len(self.nodes)} node(s) in 'nodes'"
            )
        if self.state not in ADMITTED_STATES and self.nodes:
            raise ValueError(f"a {self.state} workload has no nodes yet; remove 'nodes'")
        return self


class StateFile(_Model):
    time: datetime | None = None
    nodes: list[NodeEntry] = Field(default_factory=list)
    workloads: list[WorkloadEntry] = Field(default_factory=list)


def _utc(value: datetime | None) -> datetime | None:
    if value is not None and value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value


def load_state(
    path: str | Path, fleet: Fleet
) -> tuple[StateFile | None, Source | None, list[Problem]]:
    """Load and check a state file against the fleet; all problems are returned, none raised."""
    file = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        return None, None, [Problem(file, 0, "error", f"cannot read state file: {err}", "IO")]
    documents, problems = parse_yaml(text, file)
    if problems:
        return None, None, problems
    if len(documents) != 1 or not isinstance(documents[0].data, dict):
        line = documents[1].source.line if len(documents) > 1 else 1
        return (
            None,
            None,
            [
                Problem(
                    file,
                    line,
                    "error",
                    "a state file is one YAML mapping with time, nodes and workloads",
                    "NotAState",
                )
            ],
        )
    document: Document = documents[0]
    try:
        state = StateFile.model_validate(document.data)
    except ValidationError as err:
        return None, document.source, validation_problems(err, StateFile, document.source, "state")
    state = state.model_copy(update={"time": _utc(state.time)})
    return state, document.source, _cross_check(state, document.source, fleet)


def _cross_check(state: StateFile, source: Source, fleet: Fleet) -> list[Problem]:

    problems: list[Problem] = []

    def error(path: tuple[str | int, ...], message: str) -> None:
        problems.append(Problem(source.file, source.line_of(path), "error", message, "State"))

    nodes: dict[str, NodeEntry] = {}
    for i, node in enumerate(state.nodes):
        if node.name in nodes:
            error(("nodes", i, "name"), f"duplicate node {node.name!r}")
        nodes.setdefault(node.name, node)
        if node.pool not in fleet.pools:
            error(
                ("nodes", i, "pool"),
                f"node {node.name}: pool {node.pool!r} does not exist"
                f"{did_you_mean(node.pool, fleet.pools)}",
            )
        elif node.gpus != fleet.pools[node.pool].spec.gpus_per_node:
            pass  # mixed node sizes are allowed; the pool's gpusPerNode is for new nodes
    names: set[str] = set()
    for i, w in enumerate(state.workloads):
        if w.name in names:
            error(("workloads", i, "name"), f"duplicate workload {w.name!r}")
        names.add(w.name)
        if w.team not in fleet.teams:
            error(
                ("workloads", i, "team"),
                f"workload {w.name}: team {w.team!r} does not "
                f"exist{did_you_mean(w.team, fleet.teams)}",
            )
        for key, pool in (("pool", w.pool), ("preemptedFrom", w.preempted_from)):
            if pool is not None and pool not in fleet.pools:
                error(
                    ("workloads", i, key),
                    f"workload {w.name}: pool {pool!r} does not "
                    f"exist{did_you_mean(pool, fleet.pools)}",
                )
        types = {p.spec.gpu_type for p in fleet.pools.values()}
        for j, gpu_type in enumerate(w.gpu_types):
            if gpu_type not in types:
                error(
                    ("workloads", i, "gpuTypes", j),
                    f"workload {w.name}: no pool has GPU type {gpu_type!r}"
                    f"{did_you_mean(gpu_type, sorted(types))}",
                )
        for j, node_name in enumerate(w.nodes):
            if node_name not in nodes and not to_be_provisioned(node_name, fleet):
                error(
                    ("workloads", i, "nodes", j),
                    f"workload {w.name}: node {node_name!r} "
                    f"is not in the state's nodes{did_you_mean(node_name, nodes)}",
                )
        pools = {nodes[n].pool for n in w.nodes if n in nodes}
        if len(pools) > 1:
            error(
                ("workloads", i, "nodes"),
                f"workload {w.name}: its pods are on nodes of "
                f"several pools ({', '.join(sorted(pools))}); a workload runs in one pool",
            )
    return problems
