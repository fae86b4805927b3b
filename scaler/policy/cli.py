"""`scaler validate` and `scaler schema`: check policy files, print the JSON Schema."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from scaler.policy import loader, model


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    validate = subparsers.add_parser(
        "validate", help="check ScalePolicy files and folders",
        description="Check ScalePolicy files and folders. Exit 0 when all are valid, 1 if not.")
    validate.add_argument("paths", nargs="+", type=Path, metavar="PATH")
    validate.add_argument("--json", action="store_true", help="machine-readable output")
    validate.set_defaults(handler=_validate)

    schema = subparsers.add_parser("schema", help="print the ScalePolicy JSON Schema")
    schema.set_defaults(handler=_schema)


def _validate(args: argparse.Namespace) -> int:
    missing = [p for p in args.paths if not p.exists()]
    result = loader.load_paths([p for p in args.paths if p.exists()])
    errors = [loader.PolicyError(path=str(p), document=None, field="", message="no such file")
              for p in missing] + result.errors
    if args.json:
        json.dump({
            "valid": [{"policy": item.policy.key, "path": item.path, "document": item.document}
                      for item in result.loaded],
            "errors": [e.as_dict() for e in errors],
        }, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        for item in result.loaded:
            print(f"ok    {item.policy.key}  ({item.path}, document {item.document})")
        for error in errors:
            print(f"error {error}")
        print(f"{len(result.loaded)} valid, {len(errors)} error(s)")
    return 1 if errors else 0


def schema_document() -> dict[str, Any]:
    """The JSON Schema of one ScalePolicy document, as written in files (camelCase)."""
    schema = model.ScalePolicy.model_json_schema(by_alias=True)
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "ScalePolicy"
    return schema


def _schema(args: argparse.Namespace) -> int:
    json.dump(schema_document(), sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0
