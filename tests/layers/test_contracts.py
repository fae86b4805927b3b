"""The import-linter contracts bite: a deliberate upward import breaks the layers contract.

`scripts/test` runs lint-imports on the tree as it is (all contracts kept); here a copy of
the package gets one import that points up a layer, and lint-imports must refuse it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def _lint(tree: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    return subprocess.run([str(LINT_IMPORTS), "--config", str(tree / "pyproject.toml"),
                           "--no-cache"], cwd=tree, env=env, capture_output=True, text=True,
                          timeout=120, check=False)


@pytest.mark.parametrize(
    ("module", "upward", "contract"),
    [
        # policy sits below the engine: reading engine types from it points up.
        ("policy/_upward.py", "from scaler.engine import types", "Layers:"),
        # signals and actuators are siblings: neither may import the other.
        ("signals/_upward.py", "from scaler.actuators import base", "Layers:"),
        # production code never imports the test harness.
        ("service/_upward.py", "import scaler.testing", "Production code does not"),
    ],
)
def test_an_upward_import_breaks_a_contract(
    tmp_path: Path, module: str, upward: str, contract: str
) -> None:
    tree = tmp_path / "tree"
    shutil.copytree(REPO / "scaler", tree / "scaler",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    shutil.copy(REPO / "pyproject.toml", tree / "pyproject.toml")
    (tree / "scaler" / module).write_text(f'"""A deliberate layer violation."""\n{upward}\n')
    result = _lint(tree)
    assert result.returncode == 1, result.stdout
    broken = [line for line in result.stdout.splitlines() if line.endswith("BROKEN")]
    assert any(line.startswith(contract) for line in broken), result.stdout
