"""Running under ``torchrun``: process group set-up and the few collective
operations the pipeline needs. Outside torchrun every helper is a no-op, so
the single-process path has no distributed code in its way.

Conventions: rank 0 alone writes files and prints progress; a decision made
on one rank (chosen sites, a fitted allocation) is broadcast from rank 0, and
so is every plan computed from measured costs (`on_main`), so noisy
timings cannot give the ranks different plans.
"""

from __future__ import annotations

import datetime
import os
from typing import Any, Callable, TypeVar

import torch
import torch.distributed as dist

from .errors import HetpruneError

T = TypeVar("T")


def init_from_env(device: str | torch.device = "cpu") -> bool:
    """Join the process group torchrun describes (``WORLD_SIZE`` > 1): nccl on CUDA, gloo on CPU.

    ``device`` is the run's device (``hetprune.devices.resolve``): a rank on
    CUDA uses its ``LOCAL_RANK`` GPU.
    """
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or dist.is_initialized():
        return dist.is_initialized()
    from .devices import resolve

    device = resolve(device)
    backend = "nccl" if device.type == "cuda" else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(device)
    # rank 0 alone runs some long stages (site selection) while the others wait
    minutes = float(os.environ.get("HETPRUNE_DIST_TIMEOUT_MIN", "360"))
    dist.init_process_group(backend=backend, timeout=datetime.timedelta(minutes=minutes))
    return True


def active() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def rank() -> int:
    return dist.get_rank() if active() else 0


def world() -> int:
    return dist.get_world_size() if active() else 1


def is_main() -> bool:
    return rank() == 0


def barrier() -> None:
    if active():
        dist.barrier()


def broadcast(obj: Any) -> Any:
    """Rank 0's ``obj`` on every rank (picklable Python objects between our own processes)."""
    if not active():
        return obj
    box = [obj if is_main() else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def on_main(fn: Callable[[], T]) -> T:
    """``fn()`` computed on rank 0 alone and broadcast, so every rank plans from the same inputs.

    Every rank must call it at the same point. An error on rank 0 reaches the
    other ranks as one, instead of leaving them waiting in the broadcast.
    """
    if not active():
        return fn()
    outcome = None
    if is_main():
        try:
            outcome = (True, fn())
        except BaseException as exc:
            broadcast((False, f"{type(exc).__name__}: {exc}"))
            raise
    ok, value = broadcast(outcome)
    if not ok:
        raise HetpruneError(f"rank 0 failed while planning for every rank: {value}")
    return value


def broadcast_module(module: torch.nn.Module) -> None:
    """Make every rank's parameters and buffers equal to rank 0's."""
    if not active():
        return
    for tensor in list(module.state_dict().values()):
        dist.broadcast(tensor.data if hasattr(tensor, "data") else tensor, src=0)


def all_gather(obj: Any) -> list[Any]:
    if not active():
        return [obj]
    out: list[Any] = [None] * world()
    dist.all_gather_object(out, obj)
    return out


def sum_tensor(t: torch.Tensor) -> torch.Tensor:
    if active():
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t



def min_tensor(t: torch.Tensor) -> torch.Tensor:
    """The elementwise minimum of ``t`` over the ranks (``t`` itself outside torchrun)."""
    if active():
        dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return t
