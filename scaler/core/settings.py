"""The settings base class, and loading: defaults < YAML file < `SCALER_` environment.

Every settings group (NATS, Prometheus, Kubernetes, HTTP, ...) derives from `Group`; the
service's root derives from `RootSettings` and nests them. The environment is read by
pydantic-settings' own source (`SCALER_<GROUP>__<FIELD>`, nested groups one `__` deeper),
the file by its YAML source. Errors name the file or the variable, the field path and
what is allowed, with the same formatter as ScalePolicy errors.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pydantic
import pydantic_settings
import yaml
from pydantic import BaseModel, ConfigDict
from pydantic_settings import sources as settings_sources
from pydantic_settings.sources import utils as settings_source_utils

from scaler.core import errors

ENV_PREFIX = "SCALER_"
ENV_NESTED_DELIMITER = "__"
UNKNOWN_SETTING = "unknown setting (check the spelling; settings are snake_case)"

class RootSettings(pydantic_settings.BaseSettings):
    """Base of a root settings object: `SCALER_` variables, `__` between nesting levels.

    Sources are read by `load` (so that errors can name the file or the variable); the
    constructor itself takes only its arguments, so `Settings()` is the pure defaults,
    whatever the process environment holds.
    """

    model_config = pydantic_settings.SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter=ENV_NESTED_DELIMITER,
        extra="forbid",
        frozen=True,
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[pydantic_settings.BaseSettings],
        init_settings: pydantic_settings.PydanticBaseSettingsSource,
        env_settings: pydantic_settings.PydanticBaseSettingsSource,
        dotenv_settings: pydantic_settings.PydanticBaseSettingsSource,
        file_secret_settings: pydantic_settings.PydanticBaseSettingsSource,
    ) -> tuple[pydantic_settings.PydanticBaseSettingsSource, ...]:
        return (init_settings,)


Root = TypeVar("Root", bound=RootSettings)


class Group(BaseModel):
    """Base of every settings group: unknown keys are typos, so they are errors; immutable.

    Every field carries a `description` (unit, and why its default): it is what
    `scaler schema --settings` prints and what the settings table is checked against.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)


def split_commas(value: Any) -> Any:
    """'a, b' -> ['a', 'b'], so a list setting reads naturally from one variable.

    Use with `NoDecode` on the field, which stops pydantic-settings reading it as JSON.
    """
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


@dataclass(frozen=True, slots=True)
class SettingsProblem:
    """One invalid setting: `where` is the file or the variable(s) that set it."""

    where: str
    field: str
    message: str

    def __str__(self) -> str:
        return errors.located(self.where, self.field, self.message)


class SettingsError(ValueError):
    """Settings that cannot be loaded; one line per problem."""

    def __init__(self, problems: list[SettingsProblem]) -> None:
        self.problems = problems
        super().__init__("\n".join(str(p) for p in problems))


class _EnvironSource(settings_sources.EnvSettingsSource):
    """pydantic-settings' environment source over a given mapping (os.environ or a test's)."""

    def __init__(self, settings_cls: type[pydantic_settings.BaseSettings],
                 environ: Mapping[str, str]) -> None:
        self._environ = environ
        super().__init__(settings_cls)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        return settings_source_utils.parse_env_vars(
            self._environ, self.case_sensitive, self.env_ignore_empty, self.env_parse_none_str)


def _merge(low: dict[str, Any], high: dict[str, Any]) -> dict[str, Any]:
    """`high` over `low`, nested mappings merged key by key (the file fills what the
    environment leaves out of a group)."""
    out = dict(low)
    for key, value in high.items():
        below = out.get(key)
        if isinstance(value, dict) and isinstance(below, dict):
            out[key] = _merge(below, value)
        else:
            out[key] = value
    return out


def _variables_at(
    loc: tuple[int | str, ...], environ: Mapping[str, str], *, config: Mapping[str, Any]
) -> tuple[list[str], list[str]]:
    """The SCALER_ variables that set `loc` itself (or a group containing it, as JSON), and
    those that set something inside it: SCALER_NATS__PASSWORD is inside loc ('nats',)."""
    prefix = str(config.get("env_prefix", "")).upper()
    delimiter = str(config.get("env_nested_delimiter") or ENV_NESTED_DELIMITER)
    at, inside = [], []
    path = [part.upper() for part in loc if isinstance(part, str)]
    for name in sorted(environ):
        upper = name.upper()
        if not upper.startswith(prefix):
            continue
        parts = upper[len(prefix):].split(delimiter)
        if parts == path[:len(parts)]:
            at.append(name)
        elif parts[:len(path)] == path:
            inside.append(name)
    return at, inside


def _in_file(loc: tuple[int | str, ...], data: Any) -> bool:
    """Whether the file's mapping has something at `loc` (or at the group containing it)."""
    for part in loc:
        if not isinstance(data, dict) or part not in data:
            return False
        data = data[part]
    return True


def _read_file(root: type[Root], path: Path) -> dict[str, Any]:
    """The YAML file as a mapping, through pydantic-settings' YAML source."""
    if not path.is_file():
        raise SettingsError([SettingsProblem(where=str(path), field="",
                                             message="settings file does not exist")])
    try:
        return dict(settings_sources.YamlConfigSettingsSource(root, yaml_file=path)())
    except yaml.YAMLError as exc:
        message = errors.yaml_problem(exc)
    except (TypeError, ValueError):
        message = "expected a mapping of settings groups (nats:, http:, ...)"
    raise SettingsError([SettingsProblem(where=str(path), field="", message=message)])


def load(root: type[Root], *, path: Path | None, environ: Mapping[str, str]) -> Root:
    """`root` from defaults, then the YAML file at `path`, then `environ` (later wins).

    Raises SettingsError naming the file or variable, the field and what is allowed.
    """
    file_data: dict[str, Any] = {}
    if path is not None:
        file_data = _read_file(root, path)
    try:
        env_data = _EnvironSource(root, environ)()
    except pydantic_settings.SettingsError as exc:
        # A list or mapping variable that is not valid JSON; pydantic-settings names the
        # top-level field only ('error parsing value for field "kube"').
        group = re.search(r'field "([^"]+)"', str(exc))
        at, inside = _variables_at((group.group(1),) if group else (), environ,
                                   config=root.model_config)
        raise SettingsError([SettingsProblem(
            where=", ".join(at + inside) or "environment", field=group.group(1) if group else "",
            message="not valid JSON (lists and mappings are read as JSON, except the "
                    "comma-separated lists)")]) from None
    try:
        return root.model_validate(_merge(file_data, env_data))
    except pydantic.ValidationError as exc:
        problems = []
        for problem in errors.field_problems(exc, unknown_field=UNKNOWN_SETTING):
            # The environment wins over the file: a variable naming the field is the culprit.
            at, inside = _variables_at(problem.loc, environ, config=root.model_config)
            sources = at or inside
            if not at and path is not None and _in_file(problem.loc, file_data):
                sources.insert(0, str(path))
            problems.append(SettingsProblem(where=", ".join(sources) or "settings",
                                            field=problem.field, message=problem.message))
        raise SettingsError(problems) from None
