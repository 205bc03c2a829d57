"""Safe, atomic file I/O: JSON, safetensors weights, and folders that are
either complete or absent.

Nothing here unpickles: weights are safetensors, or ``.pth`` read with
``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from .errors import HetpruneError, option, switch


_SAVED: list[str] = []   # resumable work this process has written (what an interrupted command can say)


def cache_dir() -> Path:
    """Where hetprune keeps what it can rebuild (trained base models, data): ``$HETPRUNE_CACHE``, else
    ``$XDG_CACHE_HOME/hetprune``, else ``~/.cache/hetprune``."""
    explicit = os.environ.get("HETPRUNE_CACHE")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "hetprune"


def note_saved(what: str) -> None:
    """Record that a piece of resumable work was just written (a checkpoint, a MAP point, a compare row), so
    an interrupted command can say truthfully whether anything is there to resume."""
    _SAVED.append(what)


def saved_work() -> list[str]:
    """What `note_saved` recorded in this process, oldest first."""
    return list(_SAVED)


def file_sha256(path: str | os.PathLike) -> str:
    """The SHA-256 of a file's bytes, read in 1 MiB blocks (shipped weights, --data-fingerprint content)."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def now() -> str:
    """The local time with its offset, to the second: when a stored result was made."""
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def made_when(records: list[dict], field: str = "measured_at") -> str:
    """When stored results were made, for a log line: ``measured 2026-12-02 07:31`` or ``measured
    2026-12-02 07:31 to 2026-12-03 09:02`` (``at a time not recorded`` for results stored before the time
    was)."""
    times = sorted(str(r[field]) for r in records if r.get(field))
    if not times:
        return "at a time not recorded"
    first, last = (t[:16].replace("T", " ") for t in (times[0], times[-1]))
    return first if first == last else f"{first} to {last}"


def umask() -> int:
    """The process's file-creation mask (read without changing it where Linux tells it)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0)
    os.umask(mask)
    return mask


def follow_umask(path: str | os.PathLike) -> None:
    """Give a file or folder made by ``tempfile`` (private: 0600 / 0700) the permissions the user's umask
    gives anything else they create, as ``open`` and ``mkdir`` would have."""
    path = Path(path)
    os.chmod(path, (0o777 if path.is_dir() else 0o666) & ~umask())


@contextmanager
def replacing(path: str | os.PathLike):
    """A temporary name beside ``path`` (``.NAME.*.tmp``, which a folder's cleaning knows as ours) to write in
    the block; moved over ``path`` when the block ends, removed if it fails: the file is whole or not at all."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        yield tmp
        follow_umask(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    with replacing(path) as tmp, open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())


def save_torch_atomic(path: str | os.PathLike, state) -> Path:
    """``torch.save(state)`` to ``path``, whole or not at all (`replacing`). Strings of a subclass (the keys of
    `hetprune.core.keys`) are saved as plain strings: ``torch.load(weights_only=True)`` loads no other class."""
    with replacing(path) as tmp:
        torch.save(plain_strings(state), tmp)
    return Path(path)


def plain_strings(obj):
    """``obj`` with every string of a subclass (a key) a plain string, in dicts, lists and tuples."""
    if isinstance(obj, str):
        return str(obj)
    if type(obj) is dict:   # (a state dict, an OrderedDict with metadata, holds plain names)
        return {plain_strings(k): plain_strings(v) for k, v in obj.items()}
    if type(obj) in (list, tuple):
        return type(obj)(plain_strings(v) for v in obj)
    return obj


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
    with replacing(path) as tmp:
        save_file(state, tmp, metadata={k: str(v) for k, v in (metadata or {}).items()})


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


def real_folder(out: str | os.PathLike, out_flag: str | None = None) -> Path:
    """The folder written for output path ``out``.

    An output folder that is a symbolic link (results kept on another disk) is written through: the result
    goes into the link's target and the link stays as it is; checkpoints go beside the target. A link that
    leads nowhere (on ``out`` or on a folder above it), or to something that is not a folder, is one error
    before any work."""
    out = Path(out)
    out_flag = out_flag or option("out")
    for p in [out, *out.parents]:
        if p.is_symlink() and not p.exists():
            where = "" if p == out else f": {p} on its way"
            raise HetpruneError(f"output path {out} leads through a symbolic link to {os.readlink(p)}, which does "
                                f"not exist{where}; create the link's target folder, or give another {out_flag}")
    if out.is_symlink():
        real = out.resolve()
        if not real.is_dir():
            raise HetpruneError(f"output path {out} is a symbolic link to {real}, which is not a folder; give a "
                                f"folder, or another {out_flag}")
        return real
    return out


def check_folder_slot(path: Path, what: str) -> None:
    """Refuse, before any work, a path where hetprune will need a folder (``OUT.work``, a compare's
    ``models/``) that holds a file, or a link to a file or to nothing."""
    if not (path.exists() or path.is_symlink()):
        return
    if path.is_dir():
        return
    found = (f"a symbolic link to {os.readlink(path)}, which does not exist" if path.is_symlink() and not path.exists()
             else "a file")
    raise HetpruneError(f"{path} is {found}, where hetprune keeps {what} (a folder); move it away or give another "
                        f"{option('out')}")


PLANNED = frozenset({"plan.json", "base.json"})   # what a --plan writes in a work folder before any result


@dataclass(frozen=True)
class ResultFolder:
    """One kind of output folder and the entries hetprune writes at its top level.

    ``--overwrite`` replaces such a result and nothing else: an entry of the
    folder that is not one of these (a user's ``notes.txt``, their code) is
    never deleted, and a folder holding any is refused with the entries named.
    """

    what: str                 # "pruned model", "compare", ...: said in messages
    entries: frozenset[str]
    resumable: bool = False   # an interrupted one is continued in place (compare, ablate: --resume)
    folders: frozenset[str] = frozenset()   # entries that are folders hetprune writes into while it works
    beside: str = ""          # the suffix of a folder kept beside this one while it is made (".work": checkpoints)

    def work(self, out: Path) -> Path:
        """The folder a result of this kind keeps its checkpoints and records in while it is made: beside it
        (``OUT.work``) or inside it (``OUT/work``)."""
        return out.with_name(out.name + self.beside) if self.beside else Path(out) / "work"

    def planned_only(self, out: Path) -> bool:
        """Whether ``out`` holds only what a ``--plan`` writes before any result (`PLANNED`, in its work
        folder): the run that follows the plan starts there without ``--resume`` or ``--overwrite``."""
        work = self.work(Path(out))
        if work.parent != Path(out) or not work.is_dir():
            return False
        return ({p.name for p in Path(out).iterdir()} == {work.name}
                and all(p.is_file() and p.name in PLANNED for p in work.iterdir()))

    def foreign(self, folder: Path) -> list[str]:
        """The entries of ``folder`` hetprune did not write as this kind of result (its own interrupted
        temporary files, ``.NAME.*.tmp`` and ``.NAME.partial-*`` of its entries, are not foreign)."""
        return sorted(p.name for p in Path(folder).iterdir() if not self.owns(p.name))

    def owns(self, name: str) -> bool:
        """Whether an entry of this name is one hetprune writes in such a folder."""
        if name in self.entries:
            return True
        temp = re.fullmatch(r"\.(.+?)\.(?:partial-.+|[^.]+\.tmp|old-\d+)", name)
        return bool(temp) and temp.group(1) in self.entries


def check_result_folder(out: str | os.PathLike, kind: ResultFolder, overwrite: bool, resume: bool = False,
                        flags: tuple[str, str] | None = None) -> Path:
    """Refuse an output folder before any work: one with no name of its own (``.``), a file, a link to
    nothing, one that cannot be written, one where a folder hetprune needs (``OUT.work``, ``models/``) is a
    file, one holding anything hetprune did not write (overwrite or not), and one holding an earlier result
    of this kind unless ``overwrite`` (or ``resume``: continue it). ``flags`` name the options in messages
    (the CLI's, or the Python arguments). Returns the folder to write (`real_folder`: a link's target)."""
    overwrite_flag, out_flag = flags or (switch("overwrite"), option("out"))
    if Path(out).name in ("", ".", ".."):
        raise HetpruneError(f"output folder {str(out)!r} has no name of its own (hetprune writes a folder, and "
                            f"its checkpoints beside it): give a new folder, e.g. {out_flag} runs/mine")
    out = real_folder(out, out_flag)
    if out.exists() and not out.is_dir():
        raise HetpruneError(f"output path {out} exists and is not a folder")
    check_writable(out)
    if kind.beside:
        check_folder_slot(out.with_name(out.name + kind.beside), f"the checkpoints of the {kind.what} it makes")
    for name in sorted(kind.folders):
        check_folder_slot(out / name, f"the {kind.what}'s {name}")
    if not out.is_dir() or not any(out.iterdir()):
        return out
    foreign = kind.foreign(out)
    if foreign:
        shown = ", ".join(foreign[:8]) + (f" and {len(foreign) - 8} more" if len(foreign) > 8 else "")
        raise HetpruneError(f"output folder {out} holds {len(foreign)} entr{'y' if len(foreign) == 1 else 'ies'} "
                            f"hetprune did not write ({shown}); hetprune never deletes or mixes with files it did "
                            f"not write, with {overwrite_flag} or without: give another {out_flag}, or move them")
    if not overwrite and not resume and not kind.planned_only(out):
        more = f", or {switch('resume')} to reuse what it finished" if kind.resumable else ""
        raise HetpruneError(f"output folder {out} already holds a {kind.what} result; pass {overwrite_flag} to "
                            f"replace it{more}")
    return out


def clear_result(out: str | os.PathLike, kind: ResultFolder) -> None:
    """Delete an earlier result of ``kind`` in ``out``: its own entries only, never anything else."""
    out = Path(out)
    for entry in sorted(out.iterdir()):
        if kind.owns(entry.name):
            shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()


def make_result_folder(out: Path, kind: ResultFolder, resume: bool, overwrite: bool) -> Path:
    """Make a checked output folder ready for a resumable result (compare, ablate): on ``overwrite``
    (without ``resume``) an earlier result's own entries go, never anything else; the folder is made."""
    if overwrite and not resume and out.is_dir():
        clear_result(out, kind)
    out.mkdir(parents=True, exist_ok=True)
    return out


@contextmanager
def atomic_folder(out: str | os.PathLike, overwrite: bool = False, same_result=None,
                  kind: ResultFolder | None = None):
    """Write a folder under a temporary name and rename it into place at the end.

    An existing ``out`` is refused unless ``overwrite`` (or ``same_result(out)``
    says it holds the very same result); with ``kind``, also when it holds
    anything hetprune did not write, and whatever reached the folder while the
    result was being written is moved into the new one, never deleted.
    Interrupted writes leave only a hidden ``.out.partial-*`` folder, never a
    folder that looks complete.
    """
    out = real_folder(out)   # a link to a folder is written through and stays a link
    if out.exists():
        if not out.is_dir():
            raise HetpruneError(f"output path {out} exists and is not a folder")
        if kind is not None and any(out.iterdir()):
            check_result_folder(out, kind, overwrite=True)   # foreign entries are refused, overwrite or not
        if any(out.iterdir()) and not overwrite and not (same_result and same_result(out)):
            raise HetpruneError(f"output folder {out} already holds a different result; pass {switch('overwrite')} to "
                                "replace it")
    check_writable(out)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
        follow_umask(tmp)
    except OSError as exc:
        raise HetpruneError(f"cannot write output folder {out}: {exc.strerror or exc}") from None
    try:
        yield tmp
        if out.exists():
            old = out.with_name(f".{out.name}.old-{os.getpid()}")
            os.replace(out, old)
            os.replace(tmp, out)
            for entry in old.iterdir():   # what hetprune did not write goes on living in the folder
                if kind is not None and not kind.owns(entry.name) and not (out / entry.name).exists():
                    os.replace(entry, out / entry.name)
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
