#!/usr/bin/env bash
# The GPU check in one command (at most 10 minutes): LLaDA-8B, LLaDA-MoE-7B-A1B and DiffusionGemma-26B-A4B
# shapes with random bf16 weights on the first CUDA device. Extra arguments go to benchmarks/gpu_check.py
# (e.g. --json gpu_check.json, --models llada-8b, --tiny for the CPU version).
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
PYTHON="${PYTHON:-python3}"
exec timeout 600 "$PYTHON" -m benchmarks.gpu_check "$@"
