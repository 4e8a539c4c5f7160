"""The runtime around the loop: static-shape forwards (torch.compile, CUDA graphs: `compiled`),
tensor and expert parallelism (`parallel`) and the worker processes that run it (`workers`).
It wraps the loop and imports it; the loop imports nothing from here (docs/algorithms.md §6)."""
