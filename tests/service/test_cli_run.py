"""`scaler run` refuses bad settings (exit 2) and reports a failed start (exit 1)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def run(*args: str, environ: dict[str, str]) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SCALER_")}
    return subprocess.run([sys.executable, "-m", "scaler", "run", *args],
                          env={**clean, **environ}, capture_output=True, text=True,
                          timeout=60, check=False)


def test_invalid_settings_exit_2_naming_the_field() -> None:
    result = run(environ={"SCALER_HTTP__PORT": "not-a-port"})
    assert result.returncode == 2
    assert "http.port" in result.stderr


def test_a_failed_start_exits_1_with_the_cause(tmp_path: Path) -> None:
    result = run("--policies", str(tmp_path), environ={
        "SCALER_KUBE__KUBECONFIG": str(tmp_path / "absent-kubeconfig"),
        "SCALER_HTTP__HOST": "127.0.0.1", "SCALER_HTTP__PORT": "0",
        "SCALER_METRICS_API__ENABLED": "false"})
    assert result.returncode == 1
    assert "scaler could not start" in result.stderr
