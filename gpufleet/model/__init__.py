"""The gpufleet data model: API objects, loading with source locations, validation."""

from gpufleet.model.api import (
    API_VERSION,
    GROUP,
    KINDS,
    VERSION,
    FleetPolicy,
    GPUPool,
    Reservation,
    Resource,
    Team,
)
from gpufleet.model.fleet import Fleet, LoadResult, load_fleet
from gpufleet.model.problems import Problem, has_errors
from gpufleet.model.validate import validate_fleet, validate_paths

__all__ = [
    "API_VERSION",
    "GROUP",
    "KINDS",
    "VERSION",
    "Fleet",
    "FleetPolicy",
    "GPUPool",
    "LoadResult",
    "Problem",
    "Reservation",
    "Resource",
    "Team",
    "has_errors",
    "load_fleet",
    "validate_fleet",
    "validate_paths",
]
