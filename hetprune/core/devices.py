"""One device policy for every command.

``--device cpu|cuda|cuda:N|auto`` is resolved once, when a command starts, by
`canonical` (the rank-independent name stored in the run's settings) and
`resolve` (the ``torch.device`` this process uses: under torchrun a bare
``cuda`` is the rank's ``LOCAL_RANK`` GPU). Every model and batch of a run
reaches that device through `place`, the one door, so a test can watch
it. Mixed precision (``--amp``) is resolved here too.

CUDA is counted with ``torch.cuda.device_count()``, which does not create a
CUDA context, so resolving a device never initialises CUDA by itself.
"""

from __future__ import annotations

import contextlib
import copy
import os
import re
from collections.abc import Mapping, MutableMapping

import torch
from torch import nn

from .errors import HetpruneError

AMP_MODES = ("auto", "bf16", "fp16", "none")
_AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def cuda_count() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def available() -> list[str]:
    """The devices this machine offers, as ``--device`` names."""
    return ["cpu"] + [f"cuda:{i}" for i in range(cuda_count())]


def _torchrun_world() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def canonical(name: str | torch.device | None) -> str:
    """Check a device name and resolve ``auto``: ``cpu``, ``cuda`` or ``cuda:N``.

    The result is the same on every torchrun rank (it goes into settings, and
    so into the keys of resumable rows).
    """
    text = "cpu" if name is None else str(name).strip().lower()
    if text == "auto":
        return "cuda" if cuda_count() else "cpu"
    if text == "cpu":
        return text
    kind, _, index = text.partition(":")
    if kind != "cuda" or (index and not index.isdigit()):
        raise HetpruneError(f"--device {name}: not a device; allowed: auto, cpu, cuda, cuda:N "
                            f"(this machine has {', '.join(available())})")
    count = cuda_count()
    if count == 0:
        why = ("this torch build has no CUDA support" if not torch.backends.cuda.is_built()
               else "torch finds no CUDA device (no GPU or no NVIDIA driver)")
        raise HetpruneError(f"--device {name}: {why} (torch {torch.__version__}); available here: cpu; "
                            "use --device cpu or auto")
    if index and int(index) >= count:
        raise HetpruneError(f"--device {name}: this machine has {count} CUDA device{'s' if count > 1 else ''}; "
                            f"available here: {', '.join(available())}")
    if index and _torchrun_world() > 1:
        raise HetpruneError(f"--device {name}: under torchrun each rank uses its own GPU (LOCAL_RANK); "
                            "give --device cuda or auto")
    return text


def resolve(name: str | torch.device | None) -> torch.device:
    """The ``torch.device`` of this process: ``cuda`` is ``cuda:LOCAL_RANK`` under torchrun, else ``cuda:0``.

    A ``torch.device`` is taken as already resolved and returned unchanged.
    """
    if isinstance(name, torch.device):
        return name
    text = canonical(name)
    if text == "cuda":
        local = int(os.environ.get("LOCAL_RANK", "0")) if _torchrun_world() > 1 else 0
        if local >= cuda_count():
            raise HetpruneError(f"torchrun rank with LOCAL_RANK {local} needs GPU cuda:{local}, but this machine has "
                                f"{cuda_count()}; start at most that many processes per node")
        return torch.device("cuda", local)
    return torch.device(text)


def describe(device: torch.device, amp: str, world: int = 1) -> str:
    """The device a run resolved to, for its log: ``cuda:0 (NVIDIA H200), 8 ranks, amp bf16`` or ``cpu``."""
    what = str(device)
    if device.type == "cuda":
        what += f" ({torch.cuda.get_device_name(device)})"
    if world > 1:
        what += f", {world} ranks"
    return what + (f", amp {amp}" if amp != "none" else "") + (", fp32 matmuls in TF32" if fp32_matmuls(device) == "tf32"
                                                              else "")


def place(obj, device: torch.device):
    """Move a model (in place; returned) or a tensor, or tuples, lists, namedtuples and dicts of them (nested;
    each of its own type), to ``device``.

    The one way models and batches reach a run's device. Host-to-GPU copies
    are non-blocking (from pinned memory they overlap with compute).
    """
    if isinstance(obj, nn.Module):
        return obj.to(device)
    if isinstance(obj, torch.Tensor):
        return obj.to(device, non_blocking=device.type == "cuda")
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):   # a namedtuple: rebuilt field by field
        return type(obj)(*(place(o, device) for o in obj))
    if isinstance(obj, (tuple, list)):
        return type(obj)(place(o, device) for o in obj)
    if isinstance(obj, MutableMapping):   # a dict batch ({"pixel_values": ..., "labels": ...}), of its own type
        out = copy.copy(obj)
        for key, value in obj.items():
            out[key] = place(value, device)
        return out
    if isinstance(obj, Mapping):
        return {key: place(value, device) for key, value in obj.items()}
    return obj


def native_bf16(device: torch.device) -> bool:
    if device.type != "cuda":
        return False
    with torch.cuda.device(device):
        return torch.cuda.is_bf16_supported(including_emulation=False)


def resolve_amp(name: str | None, device: torch.device) -> str:
    """``auto`` -> ``bf16`` on a CUDA device with native bf16, else ``none``; refuse what cannot run."""
    amp = "auto" if name is None else str(name).strip().lower()
    if amp not in AMP_MODES:
        raise HetpruneError(f"--amp {name}: allowed: {', '.join(AMP_MODES)}")
    if amp == "auto":
        return "bf16" if native_bf16(device) else "none"
    if amp == "fp16" and device.type != "cuda":
        raise HetpruneError(f"--amp fp16 needs a CUDA device (this run is on {device}); use --amp bf16 or none")
    if amp == "bf16" and device.type == "cuda" and not native_bf16(device):
        raise HetpruneError(f"--amp bf16: {torch.cuda.get_device_name(device)} has no native bf16; "
                            "use --amp fp16 or none")
    return amp


def has_tf32(device: torch.device) -> bool:
    """Whether ``device`` has TF32 matmul units (NVIDIA Ampere and later)."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 8


def set_tf32(device: torch.device, on: bool = True) -> str:
    """Let fp32 matmuls on ``device`` run in TF32 (``on``, as timm's trainers and most others do: about 8x the
    fp32 rate on an H100/H200, with a 10-bit mantissa) or in full fp32. Returns what fp32 matmuls now run in:
    ``tf32``, ``fp32``, or ``fp32`` where the device has no TF32 (a CPU is left as it is)."""
    if not has_tf32(device):
        return "fp32"
    torch.set_float32_matmul_precision("high" if on else "highest")
    return "tf32" if on else "fp32"


@contextlib.contextmanager
def full_fp32():
    """fp32 matmuls in full fp32 inside (TF32 off), put back as they were after: an exactness check (a merge
    against the model it came from) compares at the precision it is stated in. Under TF32 the same DeiT
    forward differs by about 1e-4 relative from itself in fp32, so a merge that is exact failed its check on
    an H200."""
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)


def fp32_matmuls(device: torch.device) -> str:
    """What fp32 matmuls on ``device`` run in now (``tf32`` or ``fp32``), for a report."""
    return "tf32" if has_tf32(device) and torch.get_float32_matmul_precision() != "highest" else "fp32"


def autocast(device: torch.device, amp: str):
    """Autocast for ``amp`` (``bf16``/``fp16``), or nothing for ``none``."""
    if amp in (None, "none"):
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=_AMP_DTYPES[amp])


# Dense (no sparsity) peak rates of known GPUs in TFLOP/s, by precision, from NVIDIA's data sheets (SXM boards
# unless the name says PCIe or NVL): what a training step's achieved rate is a share of. Matched in order against
# torch's device name, so "H100 PCIe" comes before "H100".
GPU_PEAKS: tuple[tuple[str, str, dict[str, float]], ...] = (
    ("H100 PCIe", "NVIDIA H100 PCIe", {"bf16": 756.0, "fp16": 756.0, "tf32": 378.0, "fp32": 51.0}),
    ("H100 NVL", "NVIDIA H100 NVL", {"bf16": 835.0, "fp16": 835.0, "tf32": 417.5, "fp32": 60.0}),
    ("H200", "NVIDIA H200 SXM", {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9}),
    ("H100", "NVIDIA H100 SXM", {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9}),
    ("A100", "NVIDIA A100", {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5}),
    ("L40S", "NVIDIA L40S", {"bf16": 362.1, "fp16": 362.1, "tf32": 183.0, "fp32": 91.6}),
    ("L4", "NVIDIA L4", {"bf16": 121.0, "fp16": 121.0, "tf32": 60.0, "fp32": 30.3}),
    ("V100", "NVIDIA V100 SXM2", {"fp16": 125.0, "fp32": 15.7}),
)


def matmul_precision(amp: str, tf32: bool) -> str:
    """The precision a run's matmuls go at: its autocast dtype, else TF32 where it is on, else fp32."""
    return amp if amp in _AMP_DTYPES else ("tf32" if tf32 else "fp32")


def peak_tflops(device_name: str, precision: str) -> tuple[str, float] | None:
    """``(board, dense peak TFLOP/s)`` of a known GPU (`GPU_PEAKS`) at ``precision`` (bf16, fp16, tf32, fp32),
    None for a device the table does not know (a CPU, another GPU) or a precision it has no rate for."""
    for pattern, board, peaks in GPU_PEAKS:   # a whole model number: "L4" is not the start of "L40S"
        if re.search(rf"(?<![A-Za-z0-9]){re.escape(pattern)}(?![0-9A-Za-z])", device_name):
            return (board, peaks[precision]) if precision in peaks else None
    return None
