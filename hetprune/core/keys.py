"""What a stored result is found again by: its key, made in one place (issue 59).

Every cache and piece of resumable state (MAP points, checks, checkpoints, compare rows, latency tables, the data
sets' caches) is keyed by `fingerprint`: a short hash of the JSON of what shaped it. A rerun finds a result only
under the key the same inputs make, so a key must move when a result would differ and stay when nothing that
shapes it changed. Three rules make the second half hold, each declared beside what it concerns:

* **Names, not import paths.** A class or function named in a key (a model's modules, a user Task's loss) is
  named by `qualified_name`: hetprune's own by package and name, wherever the module is (key version 2,
  below); version 1 named a module that moved when hetprune/ became one subpackage per layer (issue 41) as it
  was before (`MOVED`) and one split out of another since (`SPLIT_FROM`) as the module it came from, tables
  only the reader of version 1's keys uses now. The import paths (`hetprune.aliases`) go on their own.
* **A setting says whether it shapes results.** ``setting(..., keyed=False, why=...)`` in its field: it is
  left out of every key made from whole settings (`keyed_settings`), and `unkeyed` lists it with its reason.
* **A setting added later says so.** ``setting(..., since="issue 42")``: while it holds its default it is left
  out of the settings (`drop_later_defaults`), so every key made before it existed stays what it was, wherever
  the field is placed in its class.

**Key version 2** (issue 59). Keys made since are salted with the version, and they name hetprune's own classes
and functions by their package and qualified name (``hetprune:MergedMlp``), not by a module path, so a module
that moves no longer moves a key and the `MOVED` table serves only the old keys. Every key is a `Key`: the
string this release uses, holding the key the same inputs made under version 1 (``key.before``), computed from the
same declaration (`then` reads a value as version 1 did). A store looks under both (`found`, `matches`), so a
result stored before the bump is found and reused, not made again.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import MISSING, fields
from pathlib import Path


KEY_VERSION = 2
_SALT = f"hetprune keys {KEY_VERSION}\n"   # version 1 had none


class Key(str):
    """A key: the string this release stores results under, and ``before``, the key the same inputs made
    under key version 1 (every earlier release), where a store also looks. Compares, hashes and prints as the
    string; written to JSON as the string. `hetprune.core.io.plain_strings` turns keys back into plain strings
    for a pickle (``torch.load(weights_only=True)`` loads no subclass; `save_torch_atomic` does it)."""

    before: str

    def __new__(cls, now: str, before: str):
        key = super().__new__(cls, now)
        key.before = before
        return key

    def __reduce__(self):
        return (type(self), (str(self), self.before))


class Name(Key):
    """A class's or function's name in keys (`qualified_name`), with the name key version 1 gave it."""


def before(value):
    """What key version 1 made where this release makes ``value`` (a `Key`'s ``before``; anything else is
    the same under both)."""
    return value.before if isinstance(value, Key) else value


def then(obj):
    """``obj`` (JSON-like data holding keys and names) as key version 1 saw it: every `Key` and `Name` its
    ``before``, typed settings as their ``as_settings()``."""
    if isinstance(obj, Key):
        return obj.before
    if isinstance(obj, dict):
        return {then(k): then(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [then(v) for v in obj]
    as_settings = getattr(obj, "as_settings", None)
    return then(as_settings()) if callable(as_settings) else obj


def digest(obj, default=None, versioned: bool = True) -> Key:
    """The short sha256 of ``obj``'s JSON (sorted keys; ``default`` for what JSON cannot hold), as a `Key`
    whose ``before`` is the hash version 1 made of it. ``versioned=False`` for a content hash that names a
    model's structure or configuration: it moves only where a name in it does."""
    default = default or _plain
    now = json.dumps(obj, sort_keys=True, default=default)
    old = json.dumps(then(obj), sort_keys=True, default=default)
    return Key(_sha((_SALT if versioned else "") + now), _sha(old))


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def fingerprint(obj) -> Key:
    """A short stable hash of JSON-able settings, used to key caches and resumable state. A typed settings
    object hashes as what a run's settings hold of it (its ``as_settings()``), so a key made from the object is
    the key made from the dict before it; anything else that JSON cannot hold, as its text."""
    return digest(obj)


def _plain(obj):
    as_settings = getattr(obj, "as_settings", None)
    return as_settings() if callable(as_settings) else str(obj)


# -- where stores look ------------------------------------------------------------------------------------------

def found(now, old):
    """Where a result is: at ``now`` (this release's key), or at ``old`` (the same result's path under key
    version 1) when only that exists, so finished work stored by an earlier release is reused in place."""
    now, old = Path(now), Path(old)
    return old if not now.exists() and old.exists() else now


def matches(stored, key) -> bool:
    """Whether ``stored`` (a key read from a file) is ``key``, under this release's keys or version 1's."""
    return stored is not None and (stored == key or stored == before(key))


# -- names in keys ----------------------------------------------------------------------------------------------

# old dotted name -> its home since issue 41 (one entry per module or moved package, bottom layer first); keys
# name a moved module by its old name, and `hetprune.aliases` lets the old import paths work for now
MOVED: dict[str, str] = {
    "hetprune.errors": "hetprune.core.errors",
    "hetprune.hookspecs": "hetprune.core.hookspecs",
    "hetprune.config": "hetprune.core.config",
    "hetprune.io": "hetprune.core.io",
    "hetprune.cache": "hetprune.core.keys",
    "hetprune.contract": "hetprune.core.contract",
    "hetprune.plugins": "hetprune.core.plugins",
    "hetprune.devices": "hetprune.core.devices",
    "hetprune.distributed": "hetprune.core.distributed",
    "hetprune.tensors": "hetprune.core.tensors",
    "hetprune.layers": "hetprune.model.block_modules",
    "hetprune.adapters": "hetprune.model.adapters",
    "hetprune.sites": "hetprune.model.sites",
    "hetprune.surgery": "hetprune.model.surgery",
    "hetprune.widths": "hetprune.model.widths",
    "hetprune.costs": "hetprune.model.macs",
    "hetprune.models": "hetprune.model.spec",
    "hetprune.recipe": "hetprune.model.recipe",
    "hetprune.model_checks": "hetprune.model.checks",
    "hetprune.data": "hetprune.training.data",
    "hetprune.mixing": "hetprune.training.mixing",
    "hetprune.train": "hetprune.training.train",
    "hetprune.resume": "hetprune.training.resume",
    "hetprune.task": "hetprune.training.task",
    "hetprune.embedded": "hetprune.training.embedded",
    "hetprune.budget": "hetprune.pruning.budget",
    "hetprune.cost_model": "hetprune.pruning.cost_choice",
    "hetprune.plan": "hetprune.pruning.plan",
    "hetprune.pipeline": "hetprune.pruning.pipeline",
    "hetprune.result_checks": "hetprune.pruning.result_checks",
    "hetprune.run_start": "hetprune.pruning.run_start",
    "hetprune.points": "hetprune.pruning.point_store",
    "hetprune.bench": "hetprune.measure.bench",
    "hetprune.latency": "hetprune.measure.latency_table",
    "hetprune.export": "hetprune.measure.export",
    "hetprune.api": "hetprune.harness.api",
    "hetprune.compare": "hetprune.harness.compare",
    "hetprune.ablate": "hetprune.harness.ablate",
    "hetprune.testing": "hetprune.harness.testing",
    "hetprune.commands": "hetprune.cli.commands",
}

# a module split out of another since the move -> the module it came from: keys name it by that module's name
# (issue 59: hetprune/training/data.py split by concern; its classes and functions key as hetprune.data.X)
SPLIT_FROM: dict[str, str] = {
    "hetprune.training.bundle": "hetprune.training.data",
    "hetprune.training.embedded_data": "hetprune.training.data",
    "hetprune.training.image_folders": "hetprune.training.data",
    "hetprune.training.loaders": "hetprune.training.data",
    "hetprune.training.samplers": "hetprune.training.data",
}

_OLD_NAMES = {new: old for old, new in MOVED.items()}


def replace_prefix(name: str, table: dict[str, str]) -> str | None:
    """``name`` with its longest dotted prefix that ``table`` holds replaced (None: no prefix is there)."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        head = ".".join(parts[:i])
        if head in table:
            return table[head] + name[len(head):]
    return None


def stable_name(module: str | None) -> str | None:
    """The name keys use for a module: its name before the move when it moved (by the module it was split out
    of, if it was), else its own."""
    if module is None:
        return None
    module = SPLIT_FROM.get(module, module)
    return replace_prefix(module, _OLD_NAMES) or module


OWN_PACKAGES = ("hetprune", "hetprune_")   # hetprune and its built-in plugins' packages (hetprune_hetdpt, ...)


def qualified_name(obj) -> Name:
    """The name keys give a class or function: ``package:qualname`` for hetprune's own (its top-level package:
    ``hetprune:MergedMLP``, ``hetprune_width:WidthOptions``), wherever in the package it lives; ``module.qualname``
    for anyone else's. Its ``before``: version 1's ``module.qualname`` by the module's `stable_name`."""
    module = getattr(obj, "__module__", None)
    qualname = getattr(obj, "__qualname__", type(obj).__name__)
    top = (module or "").split(".")[0]
    own = top == OWN_PACKAGES[0] or top.startswith(OWN_PACKAGES[1])
    return Name(f"{top}:{qualname}" if own else f"{module}.{qualname}", f"{stable_name(module)}.{qualname}")


# -- settings in keys ------------------------------------------------------------------------------------------

def key_metadata(help: str, keyed: bool = True, why: str = "", since: str | None = None) -> dict:
    """A settings field's metadata: its help line, and whether and since when it enters keys (see the module's
    docstring). An unkeyed field must say why: the reason is the contract a reviewer checks."""
    if not keyed and len(why.strip()) < 20:
        raise ValueError("a setting declared keyed=False says why no result depends on it (why=...)")
    return {"help": help, **({} if keyed else {"keyed": False, "why": why}), **({"since": since} if since else {})}


def _default(f):
    """A field's default as settings hold it (a typed schedule's as its ``as_settings()`` mapping)."""
    value = f.default_factory() if f.default_factory is not MISSING else f.default
    as_settings = getattr(value, "as_settings", None)
    return as_settings() if callable(as_settings) else value


def unkeyed(cls) -> dict[str, str]:
    """The fields of settings class ``cls`` that shape no result, each with why."""
    return {f.name: f.metadata["why"] for f in fields(cls) if f.metadata.get("keyed") is False}


def later_defaults(cls) -> dict:
    """The fields of ``cls`` added after keys were first made from it (``since``), each with its default: left
    out of the settings while they hold it."""
    return {f.name: _default(f) for f in fields(cls) if f.metadata.get("since")}


def keyed_settings(settings: dict, cls) -> dict:
    """``settings`` (a dict of ``cls``'s fields, and others) without the fields of ``cls`` that shape no result,
    for a key made from whole settings (a compare row's)."""
    skip = unkeyed(cls)
    return {k: v for k, v in settings.items() if k not in skip}


def drop_later_defaults(d: dict, cls) -> dict:
    """``d`` without the fields of ``cls`` added later that hold their default (a copy; ``d`` is unchanged)."""
    later = later_defaults(cls)
    return {k: v for k, v in d.items() if not (k in later and v == later[k])}


def __getattr__(name: str):
    if name == "cache_dir":   # hetprune.cache.cache_dir, from before the move (the module loads no torch)
        from .io import cache_dir

        return cache_dir
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
