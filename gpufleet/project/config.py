"""The settings of `gpufleet run`: a project's `.gpufleet.yaml`, the user's config (profiles
holding the default registry, team and namespace), and flags, merged in that order (flags win).
Pure: reading and checking, no network."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from gpufleet.model.fleet import validation_problems
from gpufleet.model.source import parse_yaml
from gpufleet.project.detect import ProjectError

PROJECT_FILE = ".gpufleet.yaml"
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
M = TypeVar("M", bound=BaseModel)


class RunConfig(BaseModel):
    """`.gpufleet.yaml` in a project; every field may also be given as a flag."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    name: str | None = Field(None, pattern=r"^[a-z0-9]([-a-z0-9]{0,40}[a-z0-9])?$")
    entrypoint: str | None = None
    entrypoint_args: list[str] = Field(default_factory=list)
    gpu_type: str | None = None
    gpus: int | None = Field(None, ge=1, le=64)
    nodes: int | None = Field(None, ge=1, le=1024)
    workload_class: Literal["reserved", "elastic"] | None = Field(None, alias="class")
    team: str | None = None
    namespace: str | None = None
    pool: str | None = None
    priority: str | None = None
    registry: str | None = None
    base_image: str | None = None
    python: str | None = Field(None, pattern=r"^3\.\d+$")
    launcher: Literal["torchrun", "accelerate", "deepspeed", "ray", "horovod", "python"] | None = (
        None
    )
    env: dict[str, str] = Field(default_factory=dict)
    forward_env: list[str] = Field(default_factory=list)
    ignore: list[str] = Field(default_factory=list)

    @field_validator("entrypoint_args", mode="before")
    @classmethod
    def _split_args(cls, value: Any) -> Any:
        return value.split() if isinstance(value, str) else value

    @field_validator("env", mode="before")
    @classmethod
    def _env_values(cls, value: Any) -> Any:
        # YAML reads `EPOCHS: 3` as a number; the environment holds strings
        if isinstance(value, dict):
            return {str(k): v if isinstance(v, str) else str(v).lower() if isinstance(v, bool)
                    else str(v) for k, v in value.items()}  # fmt: skip
        return value

    @field_validator("env", "forward_env")
    @classmethod
    def _env_names(cls, value: Any) -> Any:
        for name in value:
            if not ENV_NAME.fullmatch(name):
                raise ValueError(f"{name!r} is not an environment variable name")
        return value


class Profile(BaseModel):
    """One profile of the user's config: where `gpufleet run` pushes and submits by default,
    and the gpufleet server the SDK and `gpufleet login` talk to."""

    model_config = ConfigDict(extra="forbid")

    registry: str | None = None
    team: str | None = None
    namespace: str | None = None
    kubeconfig: str | None = None
    server: str | None = Field(None, pattern=r"^https?://")
    token: str | None = None  # the file is then the user's alone (0600), as a kubeconfig
    ca_cert: str | None = None  # a server of a private CA: its certificate file


PROFILE_KEYS = tuple(Profile.model_fields)


class UserConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    profile: str = "default"  # the one used when neither --profile nor GPUFLEET_PROFILE says
    profiles: dict[str, Profile] = Field(default_factory=dict)


def user_config_path() -> Path:
    """$GPUFLEET_CONFIG, else $XDG_CONFIG_HOME/gpufleet/config.yaml, else ~/.config/..."""
    if os.environ.get("GPUFLEET_CONFIG"):
        return Path(os.environ["GPUFLEET_CONFIG"])
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "gpufleet" / "config.yaml"


def load_project_config(root: Path) -> RunConfig:
    path = root / PROJECT_FILE
    if not path.is_file():
        return RunConfig()
    return _load(path, RunConfig)


def load_user_config(path: Path | None = None) -> UserConfig:
    path = path or user_config_path()
    if not path.is_file():
        return UserConfig()
    return _load(path, UserConfig)


def profile_of(config: UserConfig, name: str | None) -> Profile:
    """The profile `name` (or $GPUFLEET_PROFILE, or the config's own choice); an empty one
    when the config has none of that name and none was asked for by name."""
    wanted = name or os.environ.get("GPUFLEET_PROFILE")
    if wanted and wanted not in config.profiles:
        known = ", ".join(sorted(config.profiles)) or "none yet"
        raise ProjectError(
            f"{user_config_path()}: no profile {wanted!r} (profiles: {known}); add it, or "
            "leave out --profile"
        )
    return config.profiles.get(wanted or config.profile, Profile())


def merged(project: RunConfig, profile: Profile, given: dict[str, Any]) -> RunConfig:
    """The project file, then the profile (its registry, team and namespace where the project
    sets none), then `given` (flags or an SDK call's arguments; None: not given; its env is
    added to the project's); ProjectError naming each setting of the wrong form."""
    values = project.model_dump(exclude_none=True, by_alias=False)
    for key in ("registry", "team", "namespace"):
        if getattr(profile, key) and not values.get(key):
            values[key] = getattr(profile, key)
    values["env"] = {**(values.get("env") or {}), **(given.get("env") or {})}
    for key, value in given.items():
        if value is not None and key != "env":
            values[key] = value
    try:
        return RunConfig.model_validate(
            {("class" if k == "workload_class" else k): v for k, v in values.items()}
        )
    except ValidationError as err:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in err.errors()
        )
        raise ProjectError(f"the settings (flags, {PROJECT_FILE}, profile): {problems}") from None


def save_profile(
    profile_name: str, values: dict[str, str | None], path: Path | None = None
) -> Path:
    """Write `values` into the profile (made if new) of the user's config (None: remove that
    field); other profiles and fields are kept. ProjectError naming a value of the wrong form."""
    path = path or user_config_path()
    config = load_user_config(path)
    held = config.profiles.get(profile_name, Profile()).model_dump(exclude_none=True)
    try:
        config.profiles[profile_name] = Profile.model_validate(
            {k: v for k, v in {**held, **values}.items() if v is not None}
        )
    except ValidationError as err:
        wrong = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in err.errors())
        raise ProjectError(f"{path}: profile {profile_name!r}: {wrong}") from None
    return write_user_config(config, path)


def write_user_config(config: UserConfig, path: Path | None = None) -> Path:
    """Write the user's config, readable by the user alone: a profile may hold a token."""
    import yaml

    path = path or user_config_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    data = config.model_dump(exclude_none=True)
    data["profiles"] = {k: v.model_dump(exclude_none=True) for k, v in config.profiles.items()}
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(yaml.safe_dump(data, sort_keys=False))
    path.chmod(0o600)  # one written before profiles held tokens
    return path


def _load(path: Path, cls: type[M]) -> M:
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as err:
        raise ProjectError(f"{path}: cannot be read ({err})") from None
    documents, problems = parse_yaml(text, str(path))
    if problems:
        raise ProjectError("; ".join(str(p) for p in problems))
    if not documents or documents[0].data is None:
        return cls()
    document = documents[0]
    if not isinstance(document.data, dict):
        raise ProjectError(f"{path}: must be a YAML mapping of settings")
    try:
        return cls.model_validate(document.data)
    except ValidationError as err:
        problems = validation_problems(err, cls, document.source, path.name)
        raise ProjectError("; ".join(str(p) for p in problems)) from None
