"""Resume keys: what a piece of resumable state (a fine-tune or gate-phase
checkpoint) was computed from, so ``--resume`` reuses it only when everything
that shaped it is the same, and says what changed when it is not."""

from __future__ import annotations

import functools
import hashlib
import inspect
import re
from typing import Callable

import torch
from torch import nn

from ..core.keys import digest, qualified_name, then
from ..core.io import made_when, note_saved, now, saved_work  # noqa: F401 - public here too: what plugins that checkpoint call


def weights_key(model: nn.Module) -> str:
    """A content hash of every weight of the model, each at its own precision: what a stage starts from.

    The state dict alone does not say which sites are gone (a removed activation holds no weight): key the
    structure too, with `structure_key`."""
    from ..model.spec import model_hash

    return model_hash(model)


def structure_key(model: nn.Module, structure: dict | None = None) -> str:
    """A hash of what the model is built of: every module's name and type, every tensor's shape and dtype, and
    ``structure`` (JSON data the caller reads from the model, e.g. its recipe's removed sites, attention mode,
    merges and widths). Two models whose state dicts are equal but whose removed sites differ differ here."""
    modules = [[name, qualified_name(type(m))] for name, m in model.named_modules()]
    tensors = [[k, list(v.shape), str(v.dtype)] for k, v in model.state_dict().items()]
    return digest({"modules": modules, "tensors": tensors, "structure": structure}, default=str, versioned=False)


def differences(stored: dict | None, current: dict) -> list[str]:
    """The entries of ``current`` that ``stored`` does not have with the same value."""
    stored = stored or {}
    return sorted(k for k in set(stored) | set(current) if stored.get(k) != current.get(k))


def reusable(stored: dict | None, current: dict, what: str, log: Callable[[str], None]) -> bool:
    """True when ``stored`` matches ``current``; otherwise say what differs (the caller starts afresh)."""
    changed = differences(stored, current)
    if changed:   # stored under key version 1? compared as version 1 made it, it is the same start, or says less
        changed = min(changed, differences(stored, then(current)), key=len)
    if changed:
        log(f"resume: {what} was made with another {', '.join(changed)}; starting it afresh")
    return not changed


# -- what a base model is configured as, beyond its weights ------------------------------------------
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
_SIMPLE = (bool, int, float, str, type(None))


def _simple(value) -> bool:
    return isinstance(value, _SIMPLE) or (isinstance(value, (tuple, list)) and all(map(_simple, value)))


def config_key(model: nn.Module) -> str:
    """A hash of how the model is configured beyond its weights: every module's name and type and its plain
    settings (the numbers, flags and text it keeps as attributes: dropout and drop-path rates, the pooling,
    the number of heads, the image size). A model rebuilt with ``drop_path_rate=0.5`` has the same state dict
    as the plain one, and trains differently: it differs here."""
    modules = []
    for name, m in model.named_modules():
        plain = {k: v for k, v in sorted(vars(m).items()) if not k.startswith("_") and k != "training" and _simple(v)}
        modules.append([name, qualified_name(type(m)), plain])
    return digest(modules, default=repr, versioned=False)


def base_key(model: nn.Module, weights: str, spec=None) -> str:
    """What keys every stored result made from a base model: its weights' hash (``weights``), its
    configuration (`config_key`) and, where known, how it was built (``spec``: a timm name and kwargs)."""
    spec_ = spec.to_dict() if spec is not None and hasattr(spec, "to_dict") else spec
    return digest({"weights": weights, "config": config_key(model), "spec": spec_}, default=str, versioned=False)


# -- what a user's function is, for a key -------------------------------------------------------------
def code_key(fn) -> tuple[object, list[str]]:
    """What ``fn`` computes, as JSON data for a key, and the names of the parts of it whose source cannot be
    read (a function typed at an interactive prompt, a compiled function of the user's own).

    A function is its qualified name and source, the plain values it closes over, the plain module-level
    values it reads, and the source of the functions of its own module that it calls (one level down);
    ``functools.partial`` adds its bound arguments; a method, the class of its object; a callable object, its
    class's ``__call__`` and plain attributes; a torch module, its settings and tensors. A library's function without
    source (a torch builtin) is its module and name. A value read from elsewhere (another module's global,
    a file) is not seen: a user whose metric reads one gives the Task a ``fingerprint`` that changes with it."""
    unreadable: list[str] = []
    return _describe(fn, unreadable, depth=0, seen=set()), unreadable


def _describe(fn, unreadable: list[str], depth: int, seen: set):
    if fn is None:
        return None
    if isinstance(fn, functools.partial):
        return {"partial": _describe(fn.func, unreadable, depth, seen),
                "args": [_value(a, unreadable, depth, seen) for a in fn.args],
                "keywords": {k: _value(v, unreadable, depth, seen) for k, v in sorted(fn.keywords.items())}}
    if inspect.ismethod(fn):
        return {"method": _describe(fn.__func__, unreadable, depth, seen), "of": _qualname(type(fn.__self__)),
                "state": _value(fn.__self__, unreadable, depth + 1, seen) if isinstance(fn.__self__, nn.Module)
                else None}
    if isinstance(fn, nn.Module):   # a loss module: its settings (label smoothing, ...) and tensors (class weights)
        return {"module": _qualname(type(fn)), "config": config_key(fn), "state": weights_key(fn)}
    if inspect.isfunction(fn):
        return _function(fn, unreadable, depth, seen)
    if inspect.isbuiltin(fn) or inspect.isroutine(fn):
        return {"builtin": _qualname(fn)}
    if callable(fn):   # an object with __call__
        state = {k: _value(v, unreadable, depth + 1, seen) for k, v in sorted(vars(fn).items())} \
            if hasattr(fn, "__dict__") else None
        return {"object": _qualname(type(fn)), "call": _describe(type(fn).__call__, unreadable, depth, seen),
                "state": state}
    return _value(fn, unreadable, depth, seen)


def _function(fn, unreadable: list[str], depth: int, seen: set):
    name = _qualname(fn)
    if id(fn) in seen:
        return {"function": name}
    seen.add(id(fn))
    try:
        source = inspect.getsource(fn)
    except (OSError, TypeError):
        if fn.__module__ in (None, "__main__") or not getattr(fn, "__module__", None):
            unreadable.append(name)
        source = None
        if fn.__module__ not in (None, "__main__"):   # a library's function: its name is what it is
            return {"function": name}
    out = {"function": name, "source": source}
    code = fn.__code__
    if fn.__closure__:
        out["closure"] = {var: _value(cell.cell_contents, unreadable, depth + 1, seen)
                          for var, cell in zip(code.co_freevars, fn.__closure__) if _has_contents(cell)}
    if fn.__defaults__:
        out["defaults"] = [_value(v, unreadable, depth + 1, seen) for v in fn.__defaults__]
    if fn.__kwdefaults__:
        out["kwdefaults"] = {k: _value(v, unreadable, depth + 1, seen) for k, v in sorted(fn.__kwdefaults__.items())}
    globals_ = {}
    for g in sorted(set(code.co_names)):
        value = fn.__globals__.get(g, _MISSING)
        if value is _MISSING or inspect.ismodule(value):
            continue
        if _simple(value) or isinstance(value, torch.Tensor):
            globals_[g] = _value(value, unreadable, depth + 1, seen)
        elif inspect.isfunction(value) and value.__module__ == fn.__module__ and depth < 1:
            globals_[g] = _function(value, unreadable, depth + 1, seen)
    if globals_:
        out["globals"] = globals_
    return out


_MISSING = object()


def _has_contents(cell) -> bool:
    try:
        cell.cell_contents
    except ValueError:   # a free variable not yet bound
        return False
    return True


def _value(value, unreadable: list[str], depth: int, seen: set):
    """A value a function uses, as JSON data: plain values as they are, a tensor by a hash of its content, a
    function by `code_key`'s description (two levels down at most), anything else by its type."""
    if _simple(value):
        return value
    if isinstance(value, torch.Tensor):
        t = value.detach().cpu().contiguous()
        sha = hashlib.sha256((t.float() if t.dtype in (torch.float16, torch.bfloat16) else t).numpy().tobytes())
        return {"tensor": list(t.shape), "dtype": str(t.dtype), "sha256": sha.hexdigest()[:16]}
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {k: _value(v, unreadable, depth, seen) for k, v in sorted(value.items())}
    if isinstance(value, (tuple, list)):
        return [_value(v, unreadable, depth, seen) for v in value]
    if depth < 2 and callable(value):
        return _describe(value, unreadable, depth + 1, seen)
    return {"type": _qualname(type(value))}


def _qualname(obj) -> str:
    return qualified_name(obj)   # by the module names from before the layout moved (no key changed)
