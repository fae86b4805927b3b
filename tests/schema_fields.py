"""The fields of a JSON Schema as dotted paths, and the check of a Markdown reference table
against them (README ScalePolicy reference, docs/service.md settings)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import yaml

NO_DEFAULT = object()


@dataclass(frozen=True)
class SchemaField:
    """One property: `path` like 'spec.warmFloor.schedules[].from', as the tables write it."""

    path: str
    description: str | None
    default: Any  # NO_DEFAULT when the schema gives none
    required: bool


def _resolve(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in node:
        node = defs[node["$ref"].rsplit("/", 1)[-1]]
    return node


def _objects(node: dict[str, Any], defs: dict[str, Any], path: str) -> Iterator[tuple[str, Any]]:
    """The object schemas reachable from a property (through refs, nullable unions and
    arrays), each with the path its fields hang under."""
    node = _resolve(node, defs)
    for branch in node.get("anyOf", []):
        yield from _objects(branch, defs, path)
    if node.get("type") == "array" and isinstance(node.get("items"), dict):
        yield from _objects(node["items"], defs, path + "[]")
    if "properties" in node:
        yield path, node


def fields(schema: dict[str, Any]) -> list[SchemaField]:
    """Every property of every object in `schema`, depth first."""
    defs = schema.get("$defs", {})
    out: list[SchemaField] = []

    def walk(node: dict[str, Any], prefix: str) -> None:
        required = set(node.get("required", []))
        for name, prop in node["properties"].items():
            path = f"{prefix}.{name}" if prefix else name
            out.append(SchemaField(path=path, description=prop.get("description"),
                                   default=prop.get("default", NO_DEFAULT),
                                   required=name in required))
            for sub_path, sub in _objects(prop, defs, path):
                walk(sub, sub_path)

    walk(_resolve(schema, defs), "")
    return out


@dataclass(frozen=True)
class Row:
    """One row of a reference table: the field paths it names and its default cell."""

    line: int
    paths: tuple[str, ...]
    default: str


def _expand(path: str) -> list[str]:
    """'a.{b,c}.d' -> ['a.b.d', 'a.c.d'] (one brace group at most)."""
    match = re.search(r"\{([^{}]*)\}", path)
    if match is None:
        return [path]
    return [path[:match.start()] + choice.strip() + path[match.end():]
            for choice in match.group(1).split(",")]


def table_rows(markdown: str, *, section: str) -> list[Row]:
    """The rows of every table under the heading `section` (up to the next heading of the
    same or a higher level) whose header has a 'default' column."""
    lines = markdown.splitlines()
    start = lines.index(section)
    level = len(section) - len(section.lstrip("#"))
    rows: list[Row] = []
    columns: list[str] | None = None
    fenced = False
    for number, line in enumerate(lines[start + 1:], start=start + 2):
        if line.startswith("```"):
            fenced = not fenced
        heading = None if fenced else re.match(r"^(#+) ", line)
        if heading and len(heading.group(1)) <= level:
            break
        if not line.startswith("|"):
            columns = None
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if columns is None:
            columns = [cell.lower() for cell in cells]
            continue
        if set(cells[0]) <= set("-: ") or "default" not in columns:
            continue
        paths: list[str] = []
        for token in re.findall(r"`([^`]+)`", cells[0]):
            # `a.b.c`, `.d` names a.b.c and its sibling a.b.d.
            if token.startswith(".") and paths:
                token = paths[-1].rsplit(".", 1)[0] + token
            paths += _expand(token)
        rows.append(Row(line=number, paths=tuple(paths), default=cells[columns.index("default")]))
    return rows


def check_table(rows: list[Row], schema: dict[str, Any]) -> list[str]:
    """Every schema field in the table, every row a real field, every stated default right.

    A default cell is `required`, `none` (null), a `yaml value` (compared with the schema's
    default), or, for a group whose default is a mapping, words.
    """
    by_path = {f.path: f for f in fields(schema)}
    problems = []
    seen: set[str] = set()
    for row in rows:
        if not row.paths:
            problems.append(f"line {row.line}: no `field` in the first cell")
        for path in row.paths:
            field = by_path.get(path)
            if field is None:
                problems.append(f"line {row.line}: {path} is not a field of the schema")
                continue
            if path in seen:
                problems.append(f"line {row.line}: {path} appears twice")
            seen.add(path)
            problem = _check_default(row.default, field)
            if problem:
                problems.append(f"line {row.line}: {path}: {problem}")
    problems += [f"{path} is missing from the table" for path in by_path if path not in seen]
    return problems


def _check_default(cell: str, field: SchemaField) -> str | None:
    if cell.startswith("required"):
        return None if field.required else f"says required, but the default is {field.default!r}"
    if field.required:
        return f"is required, but the table says {cell!r}"
    if cell.startswith("none"):
        return None if field.default is None else f"default is {field.default!r}, not none"
    literal = re.match(r"^`([^`]*)`", cell)
    if literal:
        stated = yaml.safe_load(literal.group(1))
        return None if stated == field.default else (
            f"table says {stated!r}, the schema {field.default!r}")
    if isinstance(field.default, dict) and field.default:
        return None  # a group: its fields' rows state the defaults
    return f"state the default {field.default!r} as `value`, none or required"
