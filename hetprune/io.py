"""Safe, atomic file I/O: JSON, safetensors weights, and folders that are
either complete or absent.

Nothing here unpickles: weights are safetensors, or ``.pth`` read with
``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from .errors import HetpruneError


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json_atomic(path: str | os.PathLike, data) -> None:
    write_text_atomic(path, json.dumps(data, indent=2, sort_keys=False) + "\n")


def read_json(path: str | os.PathLike, what: str = "JSON file"):
    path = Path(path)
    if not path.is_file():
        raise HetpruneError(f"{what} {path} does not exist")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise HetpruneError(f"{what} {path} is malformed or truncated: {exc}") from exc


def state_dict_for_saving(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A state dict safetensors accepts: contiguous tensors, shared storage cloned."""
    return {k: v.detach().contiguous().clone() for k, v in model.state_dict().items()}


def save_weights(path: str | os.PathLike, model_or_state, metadata: dict | None = None) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    state = model_or_state if isinstance(model_or_state, dict) else state_dict_for_saving(model_or_state)
    state = {k: v.detach().contiguous() for k, v in state.items()}
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        save_file(state, tmp, metadata={k: str(v) for k, v in (metadata or {}).items()})
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load_weights(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """Read a state dict from ``.safetensors`` or (safely) from ``.pth``/``.pt``."""
    path = Path(path)
    if not path.is_file():
        raise HetpruneError(f"weights file {path} does not exist")
    if path.suffix == ".safetensors":
        try:
            return load_file(str(path))
        except (SafetensorError, OSError, ValueError) as exc:
            raise HetpruneError(f"weights file {path} is malformed or truncated: {exc}") from exc
    try:
        obj = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as exc:  # torch's text runs to several paragraphs: one line here, all of it under --debug
        raise HetpruneError(
            f"checkpoint {path} cannot be read safely (it is loaded with weights_only=True; "
            f"convert it to .safetensors if it holds pickled objects): {_refusal(exc)}"
        ) from exc
    for key in ("state_dict", "model", "state_dict_ema", "model_ema"):
        if isinstance(obj, dict) and isinstance(obj.get(key), dict):
            obj = obj[key]
            break
    if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise HetpruneError(f"checkpoint {path} holds no state dict of tensors")
    return {k.removeprefix("module."): v for k, v in obj.items()}


def _refusal(exc: Exception) -> str:
    """The one line of a ``torch.load`` failure that says what was wrong (the pickled global it refused)."""
    text = str(exc)
    refused = re.search(r"unsupported GLOBAL [^\s]+|GLOBAL [^\s]+ was not an allowed global", text, re.IGNORECASE)
    if refused:
        return f"it holds a pickled object ({refused.group(0).rstrip('.')})"
    first = next((line.strip() for line in text.splitlines() if line.strip()), type(exc).__name__)
    return f"{type(exc).__name__}: {first.split('. ')[0].rstrip('.')}"


def check_writable(out: str | os.PathLike) -> None:
    """Refuse an output path that cannot be written, before any work is done for it."""
    out = Path(out)
    ancestor = out.parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise HetpruneError(f"cannot write output folder {out}: {ancestor} is a file, not a folder")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise HetpruneError(f"cannot write output folder {out}: {ancestor} is not writable")


@contextmanager
def atomic_folder(out: str | os.PathLike, overwrite: bool = False, same_result=None):
    """Write a folder under a temporary name and rename it into place at the end.

    An existing ``out`` is refused unless ``overwrite`` (or ``same_result(out)``
    says it holds the very same result). Interrupted writes leave only a
    hidden ``.out.partial-*`` folder, never a folder that looks complete.
    """
    out = Path(out)
    if out.exists():
        if not out.is_dir():
            raise HetpruneError(f"output path {out} exists and is not a folder")
        if any(out.iterdir()) and not overwrite and not (same_result and same_result(out)):
            raise HetpruneError(f"output folder {out} already holds a different result; pass --overwrite to replace it")
    check_writable(out)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    except OSError as exc:
        raise HetpruneError(f"cannot write output folder {out}: {exc.strerror or exc}") from None
    try:
        yield tmp
        if out.exists():
            old = out.with_name(f".{out.name}.old-{os.getpid()}")
            os.replace(out, old)
            os.replace(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


@contextmanager
def no_empty_folder_on_error(out):
    """Bad input found only after a folder was made (a budget the model cannot meet) leaves no folder
    behind: one made inside this context is removed if it fails while the folder holds no file. Finished
    work (any file) is kept, for --resume."""
    out = Path(out)
    existed = out.exists()
    try:
        yield
    except HetpruneError:
        if not existed and out.is_dir() and not any(p.is_file() for p in out.rglob("*")):
            shutil.rmtree(out, ignore_errors=True)
        raise
