#!/usr/bin/env bash
# Reproduce the results table of docs/simulation.md: Azure LLM 2023 code and conv traces
# at 16x the recorded rate, the example 8B policy, all five strategies, seed 1.
# Usage: loadtests/azure_results.sh [OUT_DIR]   (needs ../shared/traces beside the repo)
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
traces="${SCALER_TRACES:-$repo/../shared/traces}/azure_llm_2023"
out="${1:-$repo/loadtests/results}"
mkdir -p "$out"
for name in code conv; do
  "$repo/.venv/bin/scaler" simulate \
    --trace "$traces/AzureLLMInferenceTrace_${name}.csv" \
    --policy "$repo/config/llama-8b.yaml" --rate-scale 16 --seed 1 \
    --json "$out/azure_${name}_x16.json" --report "$out/azure_${name}_x16.html"
done
