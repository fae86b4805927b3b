"""The demo's defaults, in a module light enough for the command line to import (no numpy)."""

from __future__ import annotations

from scaler import data

DEFAULT_POLICY = data.path("policies", "llama-8b.yaml")
DEFAULT_TRACE = data.path("traces", "AzureLLMInferenceTrace_conv_20min.csv")
# Conv x8 is ~40 req/s of 1,155-token prompts and 211-token answers: about five 8B
# replicas at saturation (13.5 req/s each), so the service has to scale several up from
# the first minute's four, and back when bursts pass.
DEFAULT_RATE_SCALE = 8.0
# 60 virtual seconds per real second: a 105 s cold start takes 1.75 s to watch, and the
# whole 20-minute slice replays in 20 s.
DEFAULT_SPEED = 60.0
DEFAULT_DURATION_S = 1200.0
