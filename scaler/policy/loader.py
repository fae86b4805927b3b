"""Loading ScalePolicy files and folders, with errors that name file, document and field."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pydantic
import yaml

from scaler.core import errors
from scaler.policy import model

POLICY_SUFFIXES = (".yaml", ".yml")


@dataclass(frozen=True, slots=True)
class PolicyError:
    """One problem in one document: `path` file, `document` index (0-based), `field` path."""

    path: str
    document: int | None
    field: str
    message: str

    def __str__(self) -> str:
        where = self.path if self.document is None else f"{self.path} (document {self.document})"
        return errors.located(where, self.field, self.message)

    def as_dict(self) -> dict[str, Any]:
        return {"path": self.path, "document": self.document, "field": self.field,
                "message": self.message}


@dataclass(frozen=True, slots=True)
class LoadedPolicy:
    """A valid policy and where it came from."""

    policy: model.ScalePolicy
    path: str
    document: int


@dataclass(slots=True)
class LoadResult:
    loaded: list[LoadedPolicy] = field(default_factory=list)
    errors: list[PolicyError] = field(default_factory=list)

    @property
    def policies(self) -> list[model.ScalePolicy]:
        return [item.policy for item in self.loaded]

    @property
    def ok(self) -> bool:
        return not self.errors


def _validation_errors(exc: pydantic.ValidationError, path: str, index: int) -> list[PolicyError]:
    return [PolicyError(path=path, document=index, field=problem.field, message=problem.message)
            for problem in errors.field_problems(
                exc, unknown_field="unknown field (check the spelling; fields are camelCase)")]


def parse_documents(text: str, path: str) -> LoadResult:
    """Parse every YAML document in `text`; empty documents are skipped."""
    result = LoadResult()
    try:
        documents = list(yaml.safe_load_all(text))
    except yaml.YAMLError as exc:
        result.errors.append(PolicyError(path=path, document=None, field="",
                                         message=errors.yaml_problem(exc)))
        return result
    for index, document in enumerate(documents):
        if document is None:
            continue
        if not isinstance(document, dict):
            result.errors.append(PolicyError(
                path=path, document=index, field="",
                message=f"expected a mapping (a ScalePolicy), got {type(document).__name__}"))
            continue
        if document.get("kind") not in (None, model.KIND):
            # Other Kubernetes objects may share a file (e.g. a ConfigMap bundle): not ours.
            continue
        try:
            policy = model.ScalePolicy.model_validate(document)
        except pydantic.ValidationError as exc:
            result.errors.extend(_validation_errors(exc, path, index))
            continue
        result.loaded.append(LoadedPolicy(policy=policy, path=path, document=index))
    return result


def iter_policy_files(paths: Iterable[Path]) -> Iterator[Path]:
    """Files named directly, and every *.yaml / *.yml under named folders (sorted, no dotfiles).

    Dotfiles are skipped because a Kubernetes ConfigMap volume keeps its real files under
    '..data' / '..2024_...' and exposes them through symlinks at the top: reading both would
    load every policy twice.
    """
    for path in paths:
        if path.is_dir():
            for child in sorted(path.rglob("*")):
                rel = child.relative_to(path)
                if any(part.startswith(".") for part in rel.parts):
                    continue
                if child.suffix in POLICY_SUFFIXES and child.is_file():
                    yield child
        else:
            yield path


def load_paths(paths: Iterable[Path]) -> LoadResult:
    """Load every policy under `paths`. Invalid documents become errors; valid ones load.

    Cross-file checks: two policies with the same namespace/name, or two policies that
    target the same object, are both errors (the second one found is rejected).
    """
    result = LoadResult()
    for path in iter_policy_files(paths):
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            result.errors.append(PolicyError(path=str(path), document=None, field="",
                                             message=f"cannot read: {exc.strerror or exc}"))
            continue
        except UnicodeDecodeError:
            result.errors.append(PolicyError(path=str(path), document=None, field="",
                                             message="not UTF-8 text"))
            continue
        part = parse_documents(text, str(path))
        result.errors.extend(part.errors)
        result.loaded.extend(part.loaded)
    return _check_duplicates(result)


def _check_duplicates(result: LoadResult) -> LoadResult:
    by_key: dict[str, LoadedPolicy] = {}
    by_target: dict[tuple[str, str, str, str], LoadedPolicy] = {}
    kept: list[LoadedPolicy] = []
    for item in result.loaded:
        policy = item.policy
        target = policy.spec.target
        target_key = (policy.metadata.namespace, target.api_version, target.kind, target.name)
        if policy.key in by_key:
            first = by_key[policy.key]
            result.errors.append(PolicyError(
                path=item.path, document=item.document, field="metadata.name",
                message=f"policy {policy.key} is already defined in {first.path} "
                        f"(document {first.document})"))
            continue
        if target_key in by_target:
            first = by_target[target_key]
            result.errors.append(PolicyError(
                path=item.path, document=item.document, field="spec.target",
                message=f"{target.kind} {policy.metadata.namespace}/{target.name} is already "
                        f"scaled by policy {first.policy.key} in {first.path}: two scalers "
                        "on one object fight"))
            continue
        by_key[policy.key] = item
        by_target[target_key] = item
        kept.append(item)
    result.loaded = kept
    return result
