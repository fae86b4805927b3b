#!/usr/bin/env bash
# Reproduce the results table of the README: Azure LLM 2023 code and conv traces
# at 8x the recorded rate, the example 8B policy, the default strategies, seed 1.
# Usage: loadtests/azure_results.sh [OUT_DIR]   (needs ../shared/traces beside the repo)
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
traces="${SCALER_TRACES:-$repo/../shared/traces}/azure_llm_2023"
out="${1:-$repo/loadtests/results}"
mkdir -p "$out"
for name in code conv; do
  "$repo/.venv/bin/scaler" simulate \
    --trace "$traces/AzureLLMInferenceTrace_${name}.csv" \
    --policy "$repo/config/llama-8b.yaml" --rate-scale 8 --seed 1 \
    --json "$out/azure_${name}_x8.json" --report "$out/azure_${name}_x8.html"
done
