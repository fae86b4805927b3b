"""Policy safety: the policy in force wins collisions, duplicate keys, file size, empty folders."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from scaler import cli
from scaler.policy import loader
from scaler.service import policies


def policy_text(name: str = "m", *, target: str | None = None, max_replicas: int = 8) -> str:
    return textwrap.dedent(f"""\
        apiVersion: scaler.io/v1alpha1
        kind: ScalePolicy
        metadata: {{name: {name}, namespace: ns}}
        spec:
          target: {{name: {target or name}}}
          replicas: {{min: 1, max: {max_replicas}}}
          signals:
            concurrency: {{targetPerReplica: 16}}
        """)


def in_force(folder: Path) -> dict[str, loader.LoadedPolicy]:
    first = loader.load_paths([folder])
    assert first.errors == []
    return {item.policy.key: item for item in first.loaded}


# -- collisions: the policy in force stays ---------------------------------------------------


def test_a_new_file_reusing_a_name_is_rejected_whatever_it_sorts_like(tmp_path: Path) -> None:
    (tmp_path / "z-team.yaml").write_text(policy_text(max_replicas=8))
    running = in_force(tmp_path)
    # "0-" sorts before "z-": by file order alone the newcomer would win.
    (tmp_path / "0-takeover.yaml").write_text(policy_text(max_replicas=800))
    result = loader.load_paths([tmp_path], in_force=running)
    (kept,) = result.loaded
    assert kept.path == str(tmp_path / "z-team.yaml") and kept.policy.spec.replicas.max == 8
    (error,) = result.errors
    assert error.path == str(tmp_path / "0-takeover.yaml") and error.field == "metadata.name"
    assert str(tmp_path / "z-team.yaml") in error.message
    assert "the policy in force stays" in error.message


def test_a_new_file_reusing_a_target_is_rejected(tmp_path: Path) -> None:
    (tmp_path / "z-team.yaml").write_text(policy_text("m"))
    running = in_force(tmp_path)
    (tmp_path / "0-other.yaml").write_text(policy_text("other", target="m"))
    result = loader.load_paths([tmp_path], in_force=running)
    assert [item.policy.key for item in result.loaded] == ["ns/m"]
    (error,) = result.errors
    assert error.path.endswith("0-other.yaml") and error.field == "spec.target"
    assert "z-team.yaml" in error.message and "the policy in force stays" in error.message


def test_the_file_in_force_may_change_its_own_policy(tmp_path: Path) -> None:
    (tmp_path / "z-team.yaml").write_text(policy_text(max_replicas=8))
    running = in_force(tmp_path)
    (tmp_path / "z-team.yaml").write_text(policy_text(max_replicas=12))
    (tmp_path / "0-takeover.yaml").write_text(policy_text(max_replicas=800))
    result = loader.load_paths([tmp_path], in_force=running)
    (kept,) = result.loaded
    assert kept.path.endswith("z-team.yaml") and kept.policy.spec.replicas.max == 12
    assert [Path(e.path).name for e in result.errors] == ["0-takeover.yaml"]


def test_breaking_the_file_in_force_does_not_hand_the_model_over(tmp_path: Path) -> None:
    (tmp_path / "z-team.yaml").write_text(policy_text(max_replicas=8))
    running = in_force(tmp_path)
    (tmp_path / "z-team.yaml").write_text(policy_text(max_replicas=8) + "  bad: [unclosed\n")
    (tmp_path / "0-takeover.yaml").write_text(policy_text(max_replicas=800))
    merged = policies.merge(running, loader.load_paths([tmp_path], in_force=running))
    assert merged.policies["ns/m"] is running["ns/m"]  # the last good version stays
    assert merged.kept == ("ns/m",)
    assert any(e.path.endswith("0-takeover.yaml") and "in force stays" in e.message
               for e in merged.errors)


def test_a_policy_may_move_to_another_file(tmp_path: Path) -> None:
    (tmp_path / "z-team.yaml").write_text(policy_text())
    running = in_force(tmp_path)
    (tmp_path / "z-team.yaml").unlink()
    (tmp_path / "0-moved.yaml").write_text(policy_text())
    result = loader.load_paths([tmp_path], in_force=running)
    assert result.errors == [] and [i.path for i in result.loaded] == [
        str(tmp_path / "0-moved.yaml")]


def test_on_first_load_the_file_that_sorts_first_wins_and_both_are_named(
        tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(policy_text(max_replicas=8))
    (tmp_path / "b.yaml").write_text(policy_text(max_replicas=9))
    result = loader.load_paths([tmp_path])
    assert [(Path(i.path).name, i.policy.spec.replicas.max) for i in result.loaded] == [
        ("a.yaml", 8)]
    (error,) = result.errors
    assert error.path == str(tmp_path / "b.yaml") and str(tmp_path / "a.yaml") in error.message
    assert "path order" in error.message


async def test_the_watcher_keeps_the_policy_in_force(tmp_path: Path) -> None:
    """The service's reload: a file added later never takes a model over."""
    applied: list[policies.PolicySet] = []

    async def apply(policy_set: policies.PolicySet) -> None:
        applied.append(policy_set)

    (tmp_path / "z-team.yaml").write_text(policy_text(max_replicas=8))
    watcher = policies.PolicyWatcher([tmp_path], poll_seconds=60, apply=apply)
    await watcher.load_now()
    (tmp_path / "0-takeover.yaml").write_text(policy_text(max_replicas=800))
    assert await watcher.changed()
    current = await watcher.load_now()
    assert current.policies["ns/m"].path.endswith("z-team.yaml")
    assert current.policies["ns/m"].policy.spec.replicas.max == 8
    assert [Path(e.path).name for e in current.errors] == ["0-takeover.yaml"]
    # Still so on the reload after that (the newcomer's error does not flip it either).
    (tmp_path / "z-team.yaml").write_text(policy_text(max_replicas=9))
    again = await watcher.load_now()
    assert again.policies["ns/m"].path.endswith("z-team.yaml")
    assert again.policies["ns/m"].policy.spec.replicas.max == 9


# -- duplicate keys ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "line", "key"),
    [
        (policy_text().replace("  replicas: {min: 1, max: 8}\n",
                               "  replicas: {min: 1, max: 8}\n  replicas: {min: 1, max: 400}\n"),
         7, "replicas"),
        (policy_text().replace("{min: 1, max: 8}", "{min: 1, max: 8, max: 400}"), 6, "max"),
        (policy_text() + "kind: ScalePolicy\n", 9, "kind"),
    ],
)
def test_duplicate_keys_are_rejected_with_the_line(tmp_path: Path, text: str, line: int,
                                                   key: str) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(text)
    result = loader.load_paths([path])
    assert result.loaded == []
    (error,) = result.errors
    assert f"duplicate key '{key}'" in error.message
    assert f"line {line}," in error.message


def test_merge_keys_may_still_be_overridden(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(policy_text().replace(
        "  replicas: {min: 1, max: 8}\n",
        "  replicas:\n    <<: {min: 1, max: 4}\n    max: 8\n"))
    result = loader.load_paths([path])
    assert result.errors == [] and result.policies[0].spec.replicas.max == 8


# -- size limit -------------------------------------------------------------------------------


def test_a_file_over_the_size_limit_is_refused_before_parsing(tmp_path: Path) -> None:
    path = tmp_path / "big.yaml"
    # 2 MiB of unclosed YAML: were it parsed, the error would be about YAML, not size.
    path.write_text(policy_text() + "  padding: [" + "x, " * (700 * 1024))
    (error,) = loader.load_paths([path]).errors
    assert error.path == str(path) and error.document is None
    assert f"{path.stat().st_size:,} bytes" in error.message
    assert "limit of 1,048,576 bytes (policies.max_file_bytes)" in error.message
    small = tmp_path / "small.yaml"
    small.write_text(policy_text())
    (limited,) = loader.load_paths([small], max_file_bytes=100).errors
    assert "over the limit of 100 bytes" in limited.message


async def test_the_watcher_applies_the_size_limit_and_keeps_the_last_good(
        tmp_path: Path) -> None:
    async def apply(policy_set: policies.PolicySet) -> None:
        return None

    path = tmp_path / "m.yaml"
    path.write_text(policy_text())
    watcher = policies.PolicyWatcher([tmp_path], poll_seconds=60, apply=apply,
                                     max_file_bytes=1024)
    await watcher.load_now()
    path.write_text(policy_text(max_replicas=9) + "# " + "x" * 2048 + "\n")
    assert await watcher.changed()
    current = await watcher.load_now()
    assert current.kept == ("ns/m",) and current.policies["ns/m"].policy.spec.replicas.max == 8
    assert "over the limit of 1,024 bytes" in current.errors[0].message


# -- scaler validate --------------------------------------------------------------------------


def validate(capsys: pytest.CaptureFixture[str], *paths: Path) -> tuple[int, str]:
    code = cli.main(["validate", *map(str, paths)])
    return code, capsys.readouterr().out


def test_validate_of_an_empty_folder_fails_with_a_message(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    other = tmp_path / "other"
    other.mkdir()
    (other / "cm.yaml").write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n")
    for folder in (empty, other):
        code, out = validate(capsys, folder)
        assert code == 1, out
        assert f"error {folder}: no ScalePolicy found" in out
    good = tmp_path / "good"
    good.mkdir()
    (good / "m.yaml").write_text(policy_text())
    assert validate(capsys, good)[0] == 0
    assert validate(capsys, good, empty)[0] == 1
