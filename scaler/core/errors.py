"""Error text for configuration (policy files, settings): where, which field, what is allowed.

One formatter, so a ScalePolicy error and a settings error read the same way:
`config/llama-8b.yaml (document 0): spec.replicas.max: Input should be greater than or
equal to 1` and `SCALER_HTTP__PORT: http.port: Input should be less than or equal to 65535`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pydantic
import yaml


def field_path(loc: Sequence[int | str]) -> str:
    """pydantic's loc tuple -> 'spec.behavior.scaleUp.policies[0].value'."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + part
    return out


def located(where: str, field: str, message: str) -> str:
    """'where: field: message', the field left out when the problem is the whole document."""
    return f"{where}: {field}: {message}" if field else f"{where}: {message}"


@dataclass(frozen=True, slots=True)
class FieldProblem:
    """One validation problem: `loc` as pydantic gives it (branch names removed), `message`
    in words (what is allowed), without pydantic's 'Value error, ' prefix."""

    loc: tuple[int | str, ...]
    message: str

    @property
    def field(self) -> str:
        return field_path(self.loc)


def field_problems(exc: pydantic.ValidationError, *, unknown_field: str) -> list[FieldProblem]:
    """The problems of a ValidationError, readable. `unknown_field` replaces pydantic's
    'Extra inputs are not permitted', which does not say that a typo is the usual cause."""
    problems = []
    for err in exc.errors():
        # Union branches add the model name to loc (e.g. 'function-after[...]'): drop them.
        loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and "[" in p))
        message = err["msg"]
        if message.startswith("Value error, "):
            message = message[len("Value error, "):]
        if err["type"] == "extra_forbidden":
            message = unknown_field
        problems.append(FieldProblem(loc=loc, message=message))
    return problems


def yaml_problem(exc: yaml.YAMLError) -> str:
    """'invalid YAML: line 3, column 7: mapping values are not allowed here'."""
    mark = getattr(exc, "problem_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
    problem = getattr(exc, "problem", None) or str(exc)
    return f"invalid YAML: {where}{problem}"
