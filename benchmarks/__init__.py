"""Benchmarks and evaluation of the engine.

- `run`: TPS/TPF/accuracy of several configurations in one process (`python -m benchmarks.run`).
- `sweep`: accuracy vs TPF over thresholds, per decoder (`python -m benchmarks.sweep`).
- `cache_modes`: the KV-cache modes side by side: cost, staleness, agreement with no cache.
- `presets`: the named baselines (`llada`, `fastdllm`, `dinfer`) and user configurations.
- `prompts`, `scoring`: prompt sets (the embedded tasks, GSM8K, HumanEval, MBPP) and their scoring.
- `charts`, `machine`: plotly charts of the results; the machine a result was measured on.
- `gpu_check`: cached-forward correctness, per-mode forward time and the bandwidth floor on 8B shapes,
  and the dual forward plain, compiled and as a CUDA graph.
- `compile`: the embedded model eager vs `Engine(compile=True)` on this machine (`python -m benchmarks.compile`).

Counting rules are the engine's own (engine/stats.py); nothing here re-counts tokens or forwards.
"""
