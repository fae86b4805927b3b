"""The `scaler` command as a new user meets it: --version, pipes, no cluster, missing extras."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import scaler

REPO = Path(__file__).resolve().parents[2]

# Run in a child interpreter with some top-level modules made unimportable, as they are
# when an extra is not installed: a meta-path finder that refuses them (a seam of the
# import system, not a patched attribute).
_WITHOUT = """
import sys
from importlib.abc import MetaPathFinder

class Absent(MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in {blocked!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None

sys.meta_path.insert(0, Absent())
from scaler.cli import main
sys.exit(main(sys.argv[1:]))
"""


def scaler_cli(*args: str, without: frozenset[str] = frozenset(), cwd: Path | None = None,
               env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    code = _WITHOUT.format(blocked=set(without))
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          timeout=60, cwd=cwd or REPO, env=env, check=False)


def test_version() -> None:
    done = scaler_cli("--version")
    assert done.returncode == 0
    assert done.stdout.strip() == f"scaler {scaler.__version__}"


@pytest.mark.parametrize("command", [("schema",), ("demo", "--no-ui", "--duration", "60")])
def test_a_closed_pipe_ends_quietly(command: tuple[str, ...], tmp_path: Path) -> None:
    # `scaler schema | head`: the reader is gone before the writer's first write.
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = subprocess.run([sys.executable, "-m", "scaler", *command], stdout=write_end,
                              stderr=subprocess.PIPE, text=True, timeout=60, check=False,
                              cwd=tmp_path)
    finally:
        os.close(write_end)
    assert "Traceback" not in done.stderr and "BrokenPipeError" not in done.stderr
    assert done.returncode == 141


def test_run_without_a_cluster_says_what_is_missing(tmp_path: Path) -> None:
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("SCALER_", "KUBERNETES_"))}
    done = scaler_cli("run", "--dry-run", "--policies", str(REPO / "config"), env=env,
                      cwd=tmp_path)
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith("scaler could not start: no Kubernetes cluster to talk to")
    assert "kube.kubeconfig" in done.stderr


def test_run_with_an_unreachable_api_says_so_in_one_line(tmp_path: Path) -> None:
    # Port 9 (discard) on loopback: nothing listens there, so the connection is refused.
    env = {**os.environ, "SCALER_KUBE__HOST": "http://127.0.0.1:9"}
    done = scaler_cli("run", "--dry-run", "--policies", str(REPO / "config"), env=env,
                      cwd=tmp_path)
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1, done.stderr
    assert "cannot reach the Kubernetes API at http://127.0.0.1:9" in done.stderr


def test_core_commands_work_without_the_extras() -> None:
    without = frozenset({"numpy", "matplotlib"})
    validate = scaler_cli("validate", "config", without=without)
    assert validate.returncode == 0, validate.stderr
    schema = scaler_cli("schema", without=without)
    assert schema.returncode == 0, schema.stderr
    assert schema.stdout.startswith("{")
    # `scaler run` loads the whole service (then stops at the missing cluster).
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("SCALER_", "KUBERNETES_"))}
    run = scaler_cli("run", "--policies", "config", without=without, env=env)
    assert run.returncode == 1
    assert run.stderr.startswith("scaler could not start: no Kubernetes cluster"), run.stderr


def test_a_missing_extra_is_named_in_one_line() -> None:
    without = frozenset({"numpy", "matplotlib"})
    for command in ("simulate", "demo"):
        done = scaler_cli(command, "--help", without=without) if command == "simulate" else \
            scaler_cli(command, "--no-ui", without=without)
        assert done.returncode == 2, (command, done.stderr)
        assert done.stderr == (f"scaler {command}: needs the 'sim' extra (numpy is not "
                               "installed): pip install 'scaler[sim]'\n")
