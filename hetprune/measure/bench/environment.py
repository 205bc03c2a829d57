"""What a timing ran on: the device, dtype and backend checks, the machine's CPU, threads and load
average, recorded beside every measurement so a reader can judge it.
"""

from __future__ import annotations

import datetime as _dt
import os
import platform

import torch

from ...core import devices
from ...core.errors import HetpruneError

DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}
DEVICES = ("auto", "cpu", "cuda")   # what --backend onnxruntime runs on (torch: any torch device)
BACKENDS = ("torch", "onnxruntime")


# -- environment ---------------------------------------------------------------
def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def cpu_flags() -> set[str] | None:
    """The CPU's feature flags as Linux lists them (``avx2``, ``avx512_vnni``, ...); None where they cannot be read."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return None


def load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (OSError, AttributeError):  # not on every platform
        return None


def resolve_device(device: str | torch.device) -> torch.device:
    """``auto``, ``cpu``, ``cuda`` or ``cuda:N``, checked as every command checks it."""
    return devices.resolve(device)


def check_dtype(dtype: str, device: torch.device) -> None:
    if dtype not in DTYPES:
        raise HetpruneError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if dtype == "fp16" and device.type == "cpu":
        raise HetpruneError("fp16 on CPU is not supported by this harness (few CPU kernels have an fp16 path); "
                            "use fp32, or bf16 (autocast CPU)")


def environment(device: torch.device, dtype: str, compile: bool) -> dict:
    """What a reader needs to judge a number: machine, library versions, threads."""
    env = {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "device": device.type,
        "cpu": cpu_name(),
        "cpu_count": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "dtype": dtype,
        "compile": bool(compile),
        "time": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }
    try:
        import timm

        env["timm"] = timm.__version__
    except ImportError:  # pragma: no cover - a declared dependency
        pass
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        env["gpu"] = torch.cuda.get_device_name(index)
        env["cuda"] = torch.version.cuda
        env["device_name"] = env["gpu"]
    else:
        env["device_name"] = env["cpu"]
    return env
