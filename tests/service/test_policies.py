"""Policy reload: keeping the last good version, and change detection through symlink swaps."""

from __future__ import annotations

import os
from pathlib import Path

from scaler.policy import loader
from scaler.service import policies

from . import factories


def loaded(name: str, path: str, document: int = 0, **spec: object) -> loader.LoadedPolicy:
    return loader.LoadedPolicy(policy=factories.policy(name, spec=dict(spec) or None),
                               path=path, document=document)


def error(path: str) -> loader.PolicyError:
    return loader.PolicyError(path=path, document=0, field="spec.replicas.max",
                              message="Input should be greater than or equal to 1")


def test_a_broken_file_keeps_its_last_good_policies() -> None:
    previous = {"inference/a": loaded("a", "a.yaml"), "inference/b": loaded("b", "b.yaml")}
    result = loader.LoadResult(loaded=[loaded("b", "b.yaml")], errors=[error("a.yaml")])
    merged = policies.merge(previous, result)
    assert merged.policies["inference/a"] is previous["inference/a"]
    assert merged.kept == ("inference/a",)
    assert merged.errors == (error("a.yaml"),)


def test_removal_from_a_clean_file_or_a_deleted_file_removes() -> None:
    previous = {"inference/a": loaded("a", "a.yaml"), "inference/b": loaded("b", "b.yaml")}
    # a.yaml now loads cleanly without `a`; b.yaml is gone (no error names it).
    result = loader.LoadResult(loaded=[loaded("c", "a.yaml")], errors=[])
    merged = policies.merge(previous, result)
    assert sorted(merged.policies) == ["inference/c"]
    assert merged.kept == ()


def test_a_valid_new_version_replaces_the_old() -> None:
    previous = {"inference/a": loaded("a", "a.yaml")}
    newer = loaded("a", "a.yaml", replicas={"min": 2, "max": 9})
    merged = policies.merge(previous, loader.LoadResult(loaded=[newer], errors=[error("x.yaml")]))
    assert merged.policies["inference/a"] is newer
    assert merged.kept == ()


def test_fingerprint_follows_a_configmap_symlink_swap(tmp_path: Path) -> None:
    root = tmp_path / "policies"
    (root / "..2025_01").mkdir(parents=True)
    (root / "..2025_01" / "a.yaml").write_text("kind: ScalePolicy\n# v1\n")
    (root / "..data").symlink_to("..2025_01")
    (root / "a.yaml").symlink_to("..data/a.yaml")
    first = policies.fingerprint([root])
    assert [path for path, _ in first] == [str(root / "a.yaml")]  # the hidden copy is skipped
    (root / "..2025_02").mkdir()
    (root / "..2025_02" / "a.yaml").write_text("kind: ScalePolicy\n# v2\n")
    (root / "..tmp").symlink_to("..2025_02")
    os.replace(root / "..tmp", root / "..data")
    second = policies.fingerprint([root])
    assert second != first
    assert policies.fingerprint([root]) == second  # stable while nothing changes
