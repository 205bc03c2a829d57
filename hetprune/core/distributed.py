"""Running under ``torchrun``: process group set-up and the few collective
operations the pipeline needs. Outside torchrun every helper is a no-op, so
the single-process path has no distributed code in its way.

Conventions: rank 0 alone writes files and prints progress; a decision made
on one rank (chosen sites, a fitted allocation) is broadcast from rank 0, and
so is every plan computed from measured costs (`on_main`), so noisy
timings cannot give the ranks different plans. So is every decision to reuse
stored state (a checkpoint, a MAP point, a compare row): ranks that see a
shared folder differently follow rank 0, and a rank that cannot (it does not
see the file rank 0 found) stops every rank with one error (`agree`) instead
of a wait until the collective timeout.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import os
from pathlib import Path
from typing import Any, Callable, Sequence, TypeVar

import torch
import torch.distributed as dist

from .errors import HetpruneError

T = TypeVar("T")


DEFAULT_TIMEOUT_MIN = 30.0   # the setting dist_timeout_min's default


def init_from_env(device: str | torch.device = "cpu", timeout_min: float | None = None) -> bool:
    """Join the process group torchrun describes (``WORLD_SIZE`` > 1): nccl on CUDA, gloo on CPU.

    ``device`` is the run's device (``hetprune.core.devices.resolve``): a rank on
    CUDA uses its ``LOCAL_RANK`` GPU. ``timeout_min`` (the setting
    ``dist_timeout_min``) is how long a collective waits for a rank that does
    not come before every rank fails: what turns a lost or stuck rank into an
    error instead of a hang. ``HETPRUNE_DIST_TIMEOUT_MIN`` in the environment
    overrides it (a test harness, a cluster wrapper). The group is destroyed
    when the process exits (`shutdown`), also after an error.
    """
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or dist.is_initialized():
        return dist.is_initialized()
    from .devices import resolve

    device = resolve(device)
    backend = "nccl" if device.type == "cuda" else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(device)
    minutes = float(os.environ.get("HETPRUNE_DIST_TIMEOUT_MIN") or (timeout_min or DEFAULT_TIMEOUT_MIN))
    dist.init_process_group(backend=backend, timeout=datetime.timedelta(minutes=minutes))
    atexit.register(shutdown)
    return True


def shutdown() -> None:
    """Destroy the process group if this process joined one (at exit, and at a command's end): torch
    warns about, and NCCL may leak, a group left standing. Never raises: it runs on the way out of errors."""
    with contextlib.suppress(Exception):   # the process is ending: an error here would hide the one that ends it
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()


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


def agree(problem: str | None, what: str) -> None:
    """Every rank says whether it can follow a decision rank 0 broadcast (``problem``: why not, or None).
    When any rank cannot, every rank raises the same one-line error naming the first such rank, at once,
    instead of the others waiting in their next collective until the timeout. Every rank must call it."""
    if not active():
        if problem:
            raise HetpruneError(f"{what}: {problem}")
        return
    found = [(r, p) for r, p in enumerate(all_gather(problem)) if p]
    if found:
        r, p = found[0]
        more = f" (and {len(found) - 1} other rank(s))" if len(found) > 1 else ""
        raise HetpruneError(f"{what}: rank {r} cannot follow rank 0's decision{more}: {p}; every rank must see "
                            "the work folder as rank 0 does (a file system all nodes share)")


def follow_main(decide: Callable[[], tuple[T, Any] | None], fetch: Callable[[Any], T], what: str) -> T | None:
    """Rank 0's decision to reuse stored state (a checkpoint), followed by every rank.

    ``decide()`` runs on rank 0 alone and returns None (start afresh: every
    rank does, whatever it sees) or ``(state, token)``: what it reuses and a
    small token naming it (the file, when it was saved). Every other rank gets
    the token and calls ``fetch(token)`` for its own copy, which raises when
    that rank cannot (it does not see the file, or sees another one); every
    rank then stops with one error (`agree`), not a wait until the timeout.
    Outside torchrun: ``decide()``'s state. Every rank must call it together.
    """
    if not active():
        found = decide()
        return None if found is None else found[0]
    kept: dict = {}

    def on_rank_0():
        found = decide()
        kept["state"] = None if found is None else found[0]
        return None if found is None else found[1]

    token = on_main(on_rank_0)
    if token is None:
        return None
    state, problem = kept.get("state"), None
    if not is_main():
        try:
            state = fetch(token)
        except Exception as exc:   # noqa: BLE001 - whatever stops this rank, every rank hears it
            problem = str(exc) if isinstance(exc, HetpruneError) else f"{type(exc).__name__}: {exc}"
    agree(problem, what)
    return state


def follow_saved(files: Sequence[Path], read: Callable[[Path], T | None], name: Callable[[T], Any], what: str, *,
                 reuse: Callable[[Path, T], bool] = lambda file, state: True, describe: Callable[[Any], str] = str,
                 continues: str = "", by_name: bool = False, distributed: bool = True) -> tuple[int, T] | None:
    """Rank 0 decides a resume, everyone follows: which saved state a run continues from, or None (afresh).

    ``files``: where a saved state may be, best first (each rank's own paths, in the same order). On rank 0
    the first that exists, reads (``read(file)``; None: no state there) and may be reused (``reuse(file,
    state)``, which says aloud why not) is the decision; its ``name(state)`` (small: a step, when it was
    saved) travels to the other ranks. Each reads its own copy, the file at the same place in ``files`` (with
    ``by_name``: rank 0's file by its name, for ranks whose own paths may differ), and checks the name; a
    rank that cannot (no file, another state) stops every rank with one error: ``what``, the rank, and
    ``it finds no FILE, which rank 0 continues{continues} from`` or ``its FILE (describe(name)) is not the
    one rank 0 continues{continues} from (...)`` (`follow_main`). Returns ``(index in files, state)``.
    ``distributed`` False: this process decides alone (a fine-tune run on one rank), as outside torchrun.
    Every rank calls it together when ``distributed``."""
    files = list(files)

    def decide():
        for index, file in enumerate(files):
            state = read(file) if file.is_file() else None
            if state is not None and reuse(file, state):
                return (index, state), (index, str(file), name(state))
        return None

    def fetch(token) -> tuple[int, T]:
        index, saved, theirs = token
        file = Path(saved) if by_name else files[index]
        state = read(file) if file.is_file() else None
        if state is None:
            raise HetpruneError(f"it finds no {file}, which rank 0 continues{continues} from")
        mine = name(state)
        if mine != theirs:
            raise HetpruneError(f"its {file} ({describe(mine)}) is not the one rank 0 continues{continues} from "
                                f"({describe(theirs)})")
        return index, state

    if not distributed:
        found = decide()
        return None if found is None else found[0]
    return follow_main(decide, fetch, what)


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
