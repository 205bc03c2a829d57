"""What every format shares: the checks of a request (dtype, output path), the seeded input a file is
verified on, the comparison with the PyTorch model, and writing under a temporary name renamed into place
only when every check passed.
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import logging
import os
import shlex
import tempfile
import warnings
from pathlib import Path

import torch
from torch import nn

from ...core.errors import HetpruneError, option, switch
from ...core.io import follow_umask

FORMATS = ("onnx", "pt2", "hub")


DTYPES = ("fp32", "fp16")


DEFAULT_OPSET = 18


# relative tolerance: max |runtime - torch| <= TOLERANCE * max |torch output| (torch output in fp32)
TOLERANCE = {"fp32": 1e-4, "fp16": 1e-2}


INPUT_NAME, OUTPUT_NAME = "pixel_values", "logits"


VERIFY_SEED = 0


def need(module: str, what: str):
    """Import an optional dependency, or say which extra brings it."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise HetpruneError(f"{what} needs the Python package {module!r}, which is not installed; "
                            "install the export extra: pip install 'hetprune[export]'") from None


def check_dtype(dtype: str) -> None:
    if dtype not in DTYPES:
        raise HetpruneError(f"{option('dtype', repr(dtype))} is not supported for export; allowed: "
                            f"{', '.join(DTYPES)}")


def check_batch(batch) -> int:
    """A batch size is a whole number >= 1: a file fixed at batch 0 would be "verified" on no image at all and
    then refused by the runtime at every real batch."""
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise HetpruneError(f"{option('batch', repr(batch))} is not a batch size; allowed: a whole number >= 1")
    return batch


def verify_input(model: nn.Module, batch: int) -> torch.Tensor:
    """The seeded batch every export is checked on."""
    from ...model.spec import input_shape_of

    gen = torch.Generator().manual_seed(VERIFY_SEED)
    return torch.randn(batch, *input_shape_of(model), generator=gen)


def flat_outputs(outputs) -> list:
    """A model's outputs in the order an exporter writes them (torch's pytree order: a tuple's, a dict's
    insertion order): one tensor, or every tensor of nested tuples, lists and dicts."""
    from torch.utils._pytree import tree_leaves

    return [t for t in tree_leaves(outputs) if isinstance(t, torch.Tensor)]


def output_names(model: nn.Module, example: torch.Tensor) -> list[str]:
    """``logits`` for a model with one output; ``output_0``, ``output_1``, ... for one with several."""
    with torch.inference_mode():
        n = len(flat_outputs(model(example)))
    return [OUTPUT_NAME] if n == 1 else [f"output_{i}" for i in range(n)]


def compare_outputs(got, reference, dtype: str, where: str) -> dict:
    """Max abs error of ``got`` against the fp32 torch ``reference``, output by output (a model may have
    several: ``got`` is then the runtime's list and ``reference`` the torch outputs, nested as the model
    returns them); raise above the tolerance. The figures are the worst output's."""
    from torch.utils._pytree import tree_leaves

    gots = [torch.as_tensor(g).float() for g in tree_leaves(got)]   # the runtime's arrays, or torch's nesting
    refs = flat_outputs(reference)
    if len(gots) != len(refs):
        raise HetpruneError(f"{where} has {len(gots)} outputs, torch gives {len(refs)}")
    result = None
    for i, (g, ref) in enumerate(zip(gots, refs)):
        which = f" {i}" if len(refs) > 1 else ""
        if tuple(g.shape) != tuple(ref.shape):
            raise HetpruneError(f"{where}{which} has shape {tuple(g.shape)}, torch gives {tuple(ref.shape)}")
        err = (g - ref.float()).abs().max().item() if ref.numel() else 0.0
        scale = max(ref.abs().max().item(), 1e-12) if ref.numel() else 1.0
        mine = {"max_abs_error": err, "relative_error": err / scale, "tolerance": TOLERANCE[dtype], "dtype": dtype}
        if not mine["relative_error"] <= TOLERANCE[dtype]:  # also catches NaN
            raise HetpruneError(f"{where}{which} does not match the PyTorch model: max abs error {err:.3g} is "
                                f"{mine['relative_error']:.3g} of the largest output, above the {dtype} tolerance "
                                f"{TOLERANCE[dtype]:g}; no file was written")
        if result is None or mine["relative_error"] > result["relative_error"]:
            result = mine
    if len(refs) > 1:
        result["outputs"] = len(refs)
    return result


@contextlib.contextmanager
def _quiet_exporter():
    """The exporter logs tracebacks and warnings for things it recovers from (or that we check ourselves)."""
    loggers = [logging.getLogger(n) for n in ("onnxscript", "torch.onnx", "torch.export", "torch._dynamo")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.CRITICAL)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def _prepared(model: nn.Module, dtype: str) -> nn.Module:
    """An eval-mode CPU copy of ``model`` in the export dtype (the caller's model is left alone)."""
    m = copy.deepcopy(model).eval().cpu()
    return m.half() if dtype == "fp16" else m.float()


def _dynamic_shapes(dynamic_batch: bool):
    return ({0: torch.export.Dim("batch", min=1, max=4096)},) if dynamic_batch else None


def _example(model: nn.Module, batch: int, dtype: str, dynamic_batch: bool) -> torch.Tensor:
    """The tracing input; a dynamic batch is traced at 2 or more (torch.export specialises a batch of 1)."""
    x = verify_input(model, max(batch, 2) if dynamic_batch else batch)
    return x.half() if dtype == "fp16" else x


def _verify_batch(batch: int, dynamic_batch: bool) -> int:
    """A dynamic batch is checked at a batch size other than the one traced."""
    return max(batch, 2) + 1 if dynamic_batch else batch


def _publish(tmp: Path, out: Path) -> None:
    """Give the temporary file ordinary permissions (mkstemp makes it private) and rename it into place."""
    follow_umask(tmp)
    os.replace(tmp, out)


def _temp_path(out: Path) -> Path:
    """A temporary file beside ``out`` (same file system, so the final rename is atomic)."""
    blocker = next((p for p in out.parents if p.exists()), None)
    if blocker is not None and not blocker.is_dir():
        raise HetpruneError(f"cannot write {out}: {blocker} is a file, not a folder")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.partial-", suffix=out.suffix, dir=out.parent)
    except OSError as exc:
        raise HetpruneError(f"cannot write {out}: {exc.strerror or exc}") from None
    os.close(fd)
    return Path(tmp)


def check_output(out: Path, overwrite: bool, folder: bool = False) -> None:
    """Refuse an output that exists (without overwrite) or cannot be written, before any work."""
    if out.exists():
        if folder != out.is_dir():
            raise HetpruneError(f"output {out} exists and is {'not ' if folder else ''}a folder")
        if not overwrite and (not folder or any(out.iterdir())):
            raise HetpruneError(f"output {out} already exists; pass {switch('overwrite')} to replace it")
    tmp = _temp_path(out)  # proves the folder is writable
    tmp.unlink()


# -- hub folder ---------------------------------------------------------------------------


def quote_command(argv: list[str]) -> str:
    return "hetprune " + shlex.join(argv)
