"""`python -m scaler.emulator`: the emulator served by hand, outside `scaler`."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import urllib.request

import pytest

from scaler.testing import free_port


def _as_a_background_job() -> None:
    """A non-interactive shell starts `cmd &` with SIGINT ignored, and the child inherits
    it: Python then never raises KeyboardInterrupt."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_the_emulator_command_serves_the_api_until_interrupted(signum: int) -> None:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "scaler.emulator", "--port", str(port), "--controller"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=_as_a_background_job)
    try:
        assert process.stdout is not None
        banner = process.stdout.readline()
        assert f"http://127.0.0.1:{port}" in banner, process.stderr.read() if process.stderr \
            else banner
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/apis/apps/v1/namespaces/"
                                    "default/deployments", timeout=5) as response:
            assert json.loads(response.read())["kind"] == "DeploymentList"
        process.send_signal(signum)
        assert process.wait(timeout=10) == 0
    finally:
        if process.poll() is None:
            process.kill()
        process.communicate()
