#!/usr/bin/env bash
# The GPU check in one command: LLaDA-8B, LLaDA-MoE-7B-A1B and DiffusionGemma-26B-A4B shapes with
# random bf16 weights on the first CUDA device (at most 10 minutes), then the serving benchmark on
# the same device (benchmarks/fdfo.py, at most 3 minutes each: continuous batching with
# first-done-first-out against lockstep, then the prefix cache across requests; one round each).
# Extra arguments go to benchmarks/gpu_check.py (e.g. --json gpu_check.json, --models llada-8b,
# --tiny for the CPU version, which skips the serving part). GPU_CHECK=0 runs the serving part
# alone, SERVING=0 the check alone (each fits a 10-minute call). Exit status: the first failure's.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
PYTHON="${PYTHON:-python3}"
status=0
if [ "${GPU_CHECK:-1}" != 0 ]; then
    timeout 600 "$PYTHON" -m benchmarks.gpu_check "$@" || status=$?
fi
case " $* " in *" --tiny "*) exit "$status" ;; esac
if [ "${SERVING:-1}" != 0 ]; then
    for mode in "" --prefix; do
        timeout 180 "$PYTHON" -m benchmarks.fdfo $mode --device cuda --clients 8 --requests 48 --repeats 1 || { code=$?; [ "$status" = 0 ] && status=$code; }
    done
fi
exit "$status"
