"""`scaler schema` is the reference: every field described, and the README's table agrees."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from scaler import cli
from scaler.policy import cli as policy_cli
from scaler.service import settings
from tests import schema_fields

README = Path(__file__).resolve().parents[2] / "README.md"


def _schemas() -> list[tuple[str, dict[str, Any]]]:
    return [("ScalePolicy", policy_cli.schema_document()),
            ("Settings", settings.schema_document())]


@pytest.mark.parametrize(("name", "schema"), _schemas())
def test_every_field_has_a_description(name: str, schema: dict[str, Any]) -> None:
    fields = schema_fields.fields(schema)
    assert len(fields) > 80, name
    assert [f.path for f in fields if not f.description or len(f.description) < 12] == []


def test_the_readme_policy_reference_matches_the_schema() -> None:
    rows = schema_fields.table_rows(README.read_text(), section="## ScalePolicy reference")
    assert len(rows) > 60
    assert schema_fields.check_table(rows, policy_cli.schema_document()) == []


def test_the_table_check_catches_drift() -> None:
    # The check itself: a missing field, an invented one and a wrong default are each found.
    text = README.read_text(encoding="utf-8")
    drifted = (text.replace("| `spec.replicas.min` | `0` |", "| `spec.replicas.min` | `1` |")
               .replace("| `spec.profile` | none |", "| `spec.profiles` | none |")
               .replace("| `spec.budget.maxGpus` | required | the most GPUs the model may hold |\n",
                        ""))
    assert drifted != text
    problems = schema_fields.check_table(
        schema_fields.table_rows(drifted, section="## ScalePolicy reference"),
        policy_cli.schema_document())
    assert any("spec.replicas.min: table says 1, the schema 0" in p for p in problems)
    assert any("spec.profiles is not a field" in p for p in problems)
    assert "spec.profile is missing from the table" in problems
    assert "spec.budget.maxGpus is missing from the table" in problems


@pytest.mark.parametrize(("argv", "title"), [(["schema"], "ScalePolicy"),
                                             (["schema", "--settings"], "Settings")])
def test_schema_command_prints_the_described_schema(
        argv: list[str], title: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(argv) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["title"] == title
    assert printed["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert all(f.description for f in schema_fields.fields(printed))
