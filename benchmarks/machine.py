"""The machine a result was measured on, recorded next to every table."""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any

import torch


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (Linux), else what `platform` says."""
    info = Path("/proc/cpuinfo")
    if info.is_file():
        for line in info.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def describe(device: str | torch.device = "cpu") -> dict[str, Any]:
    device = torch.device(device)
    out: dict[str, Any] = {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "device": str(device),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        out.update(gpu=props.name, gpu_memory_gib=round(props.total_memory / 2**30, 1), cuda=torch.version.cuda)
    return out


def one_line(machine: dict[str, Any]) -> str:
    gpu = f", {machine['gpu']} (CUDA {machine['cuda']})" if "gpu" in machine else ""
    return (
        f"{machine['cpu']}, {machine['cores']} cores ({machine['torch_threads']} torch threads){gpu}; "
        f"torch {machine['torch']}, Python {machine['python']}"
    )
