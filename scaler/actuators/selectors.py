"""Kubernetes label and field selectors: parse the string form, match objects (pure)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

Operator = Literal["=", "!=", "in", "notin", "exists", "!exists"]

# One requirement of the string form: `a=b`, `a==b`, `a!=b`, `a in (x,y)`, `a notin (x)`,
# `a` (exists) or `!a` (does not exist). Requirements are joined by commas that are not
# inside parentheses, so `a in (x,y),b=c` is two requirements.
_SET = re.compile(r"^\s*([^\s!=()]+)\s+(in|notin)\s*\(([^)]*)\)\s*$")
_EQ = re.compile(r"^\s*([^\s!=()]+)\s*(==|=|!=)\s*([^\s,()]*)\s*$")
_EXISTS = re.compile(r"^\s*(!?)\s*([^\s!=()]+)\s*$")


@dataclass(frozen=True, slots=True)
class Requirement:
    """One clause of a selector."""

    key: str
    operator: Operator
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        if self.operator == "exists":
            return present
        if self.operator == "!exists":
            return not present
        if self.operator in ("=", "in"):
            return present and labels[self.key] in self.values
        # "!=" and "notin" match objects that lack the key, as the API server does.
        return not present or labels[self.key] not in self.values


@dataclass(frozen=True, slots=True)
class Selector:
    """A conjunction of requirements; the empty selector matches everything."""

    requirements: tuple[Requirement, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(r.matches(labels) for r in self.requirements)

    def __str__(self) -> str:
        parts = []
        for r in self.requirements:
            values = sorted(r.values)
            if r.operator == "exists":
                parts.append(r.key)
            elif r.operator == "!exists":
                parts.append(f"!{r.key}")
            elif r.operator in ("=", "!="):
                parts.append(f"{r.key}{r.operator}{values[0]}")
            else:
                parts.append(f"{r.key} {r.operator} ({','.join(values)})")
        return ",".join(parts)


def _split(text: str) -> list[str]:
    parts: list[str] = []
    depth = 0
    current: list[str] = []
    for char in text:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    parts.append("".join(current))
    return [p for p in parts if p.strip()]


def parse_selector(text: str | None) -> Selector:
    """Parse the string form used in `?labelSelector=` and `?fieldSelector=`.

    Raises ValueError on syntax the API server would also reject (400 Bad Request).
    """
    if not text:
        return Selector()
    requirements = []
    for part in _split(text):
        if match := _SET.match(part):
            values = frozenset(v.strip() for v in match.group(3).split(",") if v.strip())
            op: Operator = "in" if match.group(2) == "in" else "notin"
            requirements.append(Requirement(match.group(1), op, values))
        elif match := _EQ.match(part):
            op = "!=" if match.group(2) == "!=" else "="
            requirements.append(Requirement(match.group(1), op, frozenset({match.group(3)})))
        elif match := _EXISTS.match(part):
            op = "!exists" if match.group(1) else "exists"
            requirements.append(Requirement(match.group(2), op))
        else:
            raise ValueError(f"unable to parse requirement {part!r}")
    return Selector(tuple(requirements))


def from_label_selector(selector: Mapping[str, Any]) -> Selector:
    """A `metav1.LabelSelector` (matchLabels + matchExpressions) as a Selector."""
    requirements = [
        Requirement(key, "=", frozenset({str(value)}))
        for key, value in sorted((selector.get("matchLabels") or {}).items())
    ]
    operators: dict[str, Operator] = {
        "In": "in", "NotIn": "notin", "Exists": "exists", "DoesNotExist": "!exists",
    }
    for expression in selector.get("matchExpressions") or []:
        requirements.append(
            Requirement(
                expression["key"],
                operators[expression["operator"]],
                frozenset(expression.get("values") or ()),
            )
        )
    return Selector(tuple(requirements))


def field_value(obj: Mapping[str, Any], path: str) -> str:
    """The value of a dotted field path (`spec.nodeName`) as the string a field selector sees.

    Missing fields read as "" (the API server does the same for `spec.nodeName` of an
    unscheduled pod, so `spec.nodeName=` selects pending pods).
    """
    value: Any = obj
    for part in path.split("."):
        if not isinstance(value, Mapping):
            return ""
        value = value.get(part)
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def fields_match(selector: Selector, obj: Mapping[str, Any]) -> bool:
    """Match a field selector (parsed with `parse_selector`) against an object."""
    return all(
        r.matches({r.key: field_value(obj, r.key)}) for r in selector.requirements
    )
