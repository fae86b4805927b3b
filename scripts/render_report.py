"""Render a `scaler simulate` HTML report in headless Chromium and save a screenshot.

A check for people, not CI: it simulates the bundled 20-minute Azure code slice at 8x (or
the trace given), writes the report, and asks Chromium for a full-page PNG to look at.

    .venv/bin/python scripts/render_report.py /tmp/report   # -> report.html, report.png

Needs Chromium (`apt-get install -y chromium`).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

from scaler.policy import loader
from scaler.sim import profiles, report, run, traces

REPO = Path(__file__).resolve().parents[1]
DEFAULT_TRACE = REPO / "loadtests" / "traces" / "AzureLLMInferenceTrace_code_20min.csv"


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    raise SystemExit("no Chromium found: apt-get install -y chromium")


def screenshot(page: Path, png: Path, *, width: int = 1200, height: int = 3000) -> None:
    """Chromium's own headless screenshot of a local file (no network, no profile kept)."""
    subprocess.run(
        [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
         f"--window-size={width},{height}", f"--screenshot={png}", page.resolve().as_uri()],
        check=True, capture_output=True, timeout=120)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="output prefix (writes OUT.html and OUT.png)")
    parser.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    parser.add_argument("--rate-scale", type=float, default=8.0)
    parser.add_argument("--policy", type=Path, default=REPO / "config" / "llama-8b.yaml")
    parser.add_argument("--title", default=None, help="report title (default: the report's)")
    parser.add_argument("--height", type=int, default=3000, help="screenshot height, px")
    args = parser.parse_args()
    policy = loader.load_paths([args.policy]).policies[0]
    profile = profiles.load_profile(policy.spec.profile or "llama-3.1-8b-h100")
    trace = traces.load_trace(args.trace, rate_scale=args.rate_scale, seed=1)
    result = run.simulate(trace, policy=policy, profile=profile)
    page, png = args.out.with_suffix(".html"), args.out.with_suffix(".png")
    report.write_html(result, page, title=args.title)
    screenshot(page, png, height=args.height)
    print(f"{page}\n{png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
