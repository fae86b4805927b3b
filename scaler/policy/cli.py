"""`scaler validate` and `scaler schema`: check policy files, print the JSON Schema."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from scaler.core import schema as core_schema
from scaler.policy import lint, loader, model

SchemaDocument = Callable[[], dict[str, Any]]


def register(
    subparsers: argparse._SubParsersAction[Any], *, settings_schema: SchemaDocument
) -> None:
    """`validate` and `schema`. `settings_schema` gives the service settings' JSON Schema:
    the settings live in the service layer, above this one, so the caller passes it in."""
    validate = subparsers.add_parser(
        "validate", help="check ScalePolicy files and folders",
        description="Check ScalePolicy files and folders. Exit 0 when all are valid, 1 if not "
        "(an error, or a path with no ScalePolicy in it).")
    validate.add_argument("paths", nargs="+", type=Path, metavar="PATH")
    validate.add_argument("--json", action="store_true", help="machine-readable output")
    validate.set_defaults(handler=_validate)

    schema = subparsers.add_parser(
        "schema", help="print the ScalePolicy (or settings) JSON Schema",
        description="Print the JSON Schema of a ScalePolicy document, every field with its "
        "description and default: the reference for editors and for the README's table.")
    schema.add_argument("--settings", action="store_true",
                        help="the service settings' schema instead (settings file, SCALER_ "
                        "variables)")
    schema.set_defaults(handler=_schema, settings_schema=settings_schema)


def _validate(args: argparse.Namespace) -> int:
    missing = [p for p in args.paths if not p.exists()]
    existing = [p for p in args.paths if p.exists()]
    result = loader.load_paths(existing)
    errors = [loader.PolicyError(path=str(p), document=None, field="", message="no such file")
              for p in missing] + _nothing_found(existing, result) + result.errors
    warned = [text for item in result.loaded for text in lint.warnings(item.policy)]
    if args.json:
        json.dump({
            "valid": [{"policy": item.policy.key, "path": item.path, "document": item.document}
                      for item in result.loaded],
            "errors": [e.as_dict() for e in errors],
            "warnings": warned,
        }, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        for item in result.loaded:
            print(f"ok    {item.policy.key}  ({item.path}, document {item.document})")
        for error in errors:
            print(f"error {error}")
        for text in warned:
            print(f"warn  {text}")
        print(f"{len(result.loaded)} valid, {len(errors)} error(s)")
    return 1 if errors else 0


def _nothing_found(paths: list[Path], result: loader.LoadResult) -> list[loader.PolicyError]:
    """An error for each named path that holds no ScalePolicy document, valid or not: an
    empty folder (or a wrong one) must not pass as "0 valid, 0 error(s)"."""
    seen = {item.path for item in result.loaded} | {error.path for error in result.errors}
    return [loader.PolicyError(
                path=str(path), document=None, field="",
                message="no ScalePolicy found (a folder is searched for *.yaml and *.yml "
                "files; documents of other kinds are skipped)")
            for path in paths
            if not any(str(file) in seen for file in loader.iter_policy_files([path]))]


def schema_document() -> dict[str, Any]:
    """The JSON Schema of one ScalePolicy document, as written in files (camelCase)."""
    return core_schema.document(model.ScalePolicy, title="ScalePolicy", by_alias=True)


def _schema(args: argparse.Namespace) -> int:
    document = args.settings_schema() if args.settings else schema_document()
    json.dump(document, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0
