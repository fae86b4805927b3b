"""`scaler validate` and `scaler schema`: check policy, pool and budget files, print the JSON
Schema."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from scaler.core import schema as core_schema
from scaler.policy import fleet, lint, loader, model, shards

SchemaDocument = Callable[[], dict[str, Any]]

MODELS: dict[str, type[BaseModel]] = {
    model.KIND: model.ScalePolicy, fleet.POOL_KIND: fleet.GpuPool,
    fleet.BUDGET_KIND: fleet.GpuBudget}
"""The model of each kind of document, for `scaler schema --kind`."""


def register(
    subparsers: argparse._SubParsersAction[Any], *, settings_schema: SchemaDocument
) -> None:
    """`validate` and `schema`. `settings_schema` gives the service settings' JSON Schema:
    the settings live in the service layer, above this one, so the caller passes it in."""
    validate = subparsers.add_parser(
        "validate", help="check ScalePolicy, GpuPool and GpuBudget files and folders",
        description="Check ScalePolicy, GpuPool and GpuBudget files and folders, and their "
        "references to each other (a policy's pool, a budget's pool, guarantees within the "
        "pools). Exit 0 when all are valid, 1 if not (an error, or a path with none of them "
        "in it).")
    validate.add_argument("paths", nargs="+", type=Path, metavar="PATH")
    validate.add_argument("--json", action="store_true", help="machine-readable output")
    validate.add_argument("--shards", type=int, metavar="N",
                          help="also say what each of N shards would evaluate and arbitrate "
                          "(sharding.shards; docs/scaling.md)")
    validate.add_argument("--max-domain-models", type=int, metavar="M",
                          default=shards.DEFAULT_MAX_DOMAIN_MODELS,
                          help="with --shards: split domains of more models "
                          "(sharding.max_domain_models; default %(default)s)")
    validate.set_defaults(handler=_validate)

    schema = subparsers.add_parser(
        "schema", help="print the ScalePolicy (or settings) JSON Schema",
        description="Print the JSON Schema of a ScalePolicy document, every field with its "
        "description and default: the reference for editors and for the README's table.")
    schema.add_argument("--settings", action="store_true",
                        help="the service settings' schema instead (settings file, SCALER_ "
                        "variables)")
    schema.add_argument("--kind", choices=sorted(MODELS), default=model.KIND,
                        help="the kind of document (default: ScalePolicy)")
    schema.set_defaults(handler=_schema, settings_schema=settings_schema)


def _validate(args: argparse.Namespace) -> int:
    missing = [p for p in args.paths if not p.exists()]
    existing = [p for p in args.paths if p.exists()]
    result = loader.load_paths(existing)
    errors = [loader.PolicyError(path=str(p), document=None, field="", message="no such file")
              for p in missing] + _nothing_found(existing, result) + result.errors
    errors += loader.reference_errors(result)
    warned = [text for item in result.loaded for text in lint.warnings(item.policy)]
    fleet_items: list[loader.Loaded[fleet.GpuPool] | loader.Loaded[fleet.GpuBudget]] = [
        *result.pools, *result.budgets]
    if args.shards is not None and args.shards < 1:
        print("--shards must be at least 1", file=sys.stderr)
        return 2
    sharding = None if args.shards is None else _shards(result, count=args.shards,
                                                        max_domain_models=args.max_domain_models)
    if args.json:
        json.dump({
            "valid": [{"policy": item.policy.key, "path": item.path, "document": item.document}
                      for item in result.loaded],
            "fleet": [{"kind": item.value.kind, "name": item.value.name, "path": item.path,
                       "document": item.document} for item in fleet_items],
            "errors": [e.as_dict() for e in errors],
            "warnings": warned,
            **({} if sharding is None else {"sharding": sharding}),
        }, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        for item in result.loaded:
            print(f"ok    {item.policy.key}  ({item.path}, document {item.document})")
        for fleet_item in fleet_items:
            print(f"ok    {fleet_item.value.kind} {fleet_item.value.name}  ({fleet_item.path}, "
                  f"document {fleet_item.document})")
        for error in errors:
            print(f"error {error}")
        for text in warned:
            print(f"warn  {text}")
        print(f"{len(result.loaded)} valid, {len(errors)} error(s)"
              + (f"; {len(result.pools)} GpuPool(s), {len(result.budgets)} GpuBudget(s)"
                 if fleet_items else ""))
        if sharding is not None:
            _print_shards(sharding)
    return 1 if errors else 0


def _shards(result: loader.LoadResult, *, count: int, max_domain_models: int
            ) -> dict[str, Any]:
    """What each of `count` shards would do with the valid documents (`shards.split`)."""
    policies = [item.policy for item in result.loaded]
    pools = fleet.fleet_of(result)
    parts = shards.split(policies, pools, shards=count, max_domain_models=max_domain_models)
    named = parts[0].domain_of  # the same in every part
    return {
        "shards": count, "max_domain_models": max_domain_models,
        "domains": [{"domain": domain, "models": size,
                     "split": size > max_domain_models,
                     "arbiter": shards.owner(domain, shards=count)}
                    for domain, size in shards.sizes(policies, named).items()],
        "by_shard": [{"shard": index, "models": sorted(part.models),
                      "pools": sorted(part.pools), "budgets": sorted(part.budgets),
                      "arbitrated_elsewhere": dict(sorted(part.remote.items())),
                      "arbitrated_here_for_others": dict(sorted(part.foreign.items()))}
                     for index, part in enumerate(parts)],
    }


def _print_shards(sharding: dict[str, Any]) -> None:
    domains = sharding["domains"]
    split = [d for d in domains if d["split"]]
    largest = domains[0] if domains else None
    print(f"{sharding['shards']} shard(s): {len(domains)} domain(s)"
          + (f", the largest {largest['domain']} with {largest['models']} model(s)"
             if largest else "")
          + (f"; {len(split)} split by model (over {sharding['max_domain_models']} models)"
             if split else ""))
    for part in sharding["by_shard"]:
        print(f"shard {part['shard']}: {len(part['models'])} model(s) "
              f"({len(part['arbitrated_elsewhere'])} arbitrated by other shards), "
              f"{len(part['pools'])} GpuPool(s), {len(part['budgets'])} GpuBudget(s), "
              f"arbitrates {len(part['arbitrated_here_for_others'])} model(s) of others")


def _nothing_found(paths: list[Path], result: loader.LoadResult) -> list[loader.PolicyError]:
    """An error for each named path that holds no ScalePolicy, GpuPool or GpuBudget
    document, valid or not: an empty folder (or a wrong one) must not pass as "0 valid,
    0 error(s)"."""
    seen = ({item.path for item in result.loaded} | {error.path for error in result.errors}
            | {item.path for item in result.pools} | {item.path for item in result.budgets})
    return [loader.PolicyError(
                path=str(path), document=None, field="",
                message="no ScalePolicy found, nor a GpuPool or GpuBudget (a folder is "
                "searched for *.yaml and *.yml files; documents of other API groups are "
                "skipped)")
            for path in paths
            if not any(str(file) in seen for file in loader.iter_policy_files([path]))]


def schema_document(kind: str = model.KIND) -> dict[str, Any]:
    """The JSON Schema of one document of `kind` (ScalePolicy, GpuPool, GpuBudget), as
    written in files (camelCase)."""
    return core_schema.document(MODELS[kind], title=kind, by_alias=True)


def _schema(args: argparse.Namespace) -> int:
    document = args.settings_schema() if args.settings else schema_document(args.kind)
    json.dump(document, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0
