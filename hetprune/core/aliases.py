"""The import paths from before hetprune/ was one subpackage per layer (issue 41), kept working.

Every old path in `ALIASES` imports as the very module object of its new home, so ``import hetprune.task``
and ``monkeypatch.setattr("hetprune.task.X", ...)`` reach the module the code uses; a package's submodules
follow it. An old path says once that it moved (a `DeprecationWarning`).

Resume keys name modules and classes (`hetprune.resume.structure_key` hashes every module's
``type(m).__module__``; code keys name functions; a user-built model's spec names its class). `stable_name`
gives them the old names, so no checkpoint, MAP point or compare row saved before the move changes its key.
A module split out of another since (`SPLIT_FROM`) is named in keys as the module it came from.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings

# old dotted name -> its home now (one entry per module or moved package, bottom layer first)
ALIASES: dict[str, str] = {
    "hetprune.errors": "hetprune.core.errors",
    "hetprune.hookspecs": "hetprune.core.hookspecs",
    "hetprune.config": "hetprune.core.config",
    "hetprune.io": "hetprune.core.io",
    "hetprune.cache": "hetprune.core.fingerprint",
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

_OLD_NAMES = {new: old for old, new in ALIASES.items()}   # the other way round, for the keys


def _lookup(name: str, table: dict[str, str]) -> str | None:
    """``name`` with its longest dotted prefix that ``table`` holds replaced (None: no prefix is there)."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        head = ".".join(parts[:i])
        if head in table:
            return table[head] + name[len(head):]
    return None


def new_name(old: str) -> str | None:
    """Where the module once called ``old`` lives now (None: it did not move)."""
    return _lookup(old, ALIASES)


def stable_name(module: str | None) -> str | None:
    """The name resume keys use for a module: its name before the move when it moved (by the module it was
    split out of, if it was), else its own."""
    if module is None:
        return None
    module = SPLIT_FROM.get(module, module)
    return _lookup(module, _OLD_NAMES) or module


def qualified_name(obj) -> str:
    """``module.qualname`` of a class or function, by its module's `stable_name`."""
    return f"{stable_name(getattr(obj, '__module__', None))}.{getattr(obj, '__qualname__', type(obj).__name__)}"


class _OldPaths(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Answers an old path with the module at its new one (first on ``sys.meta_path``: the moved package's
    own folder must not load a second copy of a submodule under the old name)."""

    def __init__(self):
        self._specs: dict[str, object] = {}

    def find_spec(self, fullname, path=None, target=None):
        if not fullname.startswith("hetprune.") or new_name(fullname) is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec):
        new = new_name(spec.name)
        warnings.warn(f"{spec.name} is now {new}; the old path works as the same module, for now",
                      DeprecationWarning, stacklevel=2)
        module = importlib.import_module(new)
        self._specs[spec.name] = module.__spec__
        return module

    def exec_module(self, module):
        # the import system set the alias's spec on the module; it keeps its own
        old = getattr(module.__spec__, "name", None)
        if old in self._specs:
            module.__spec__ = self._specs.pop(old)


_FINDER = _OldPaths()


def install() -> None:
    """Put the old paths' finder first on ``sys.meta_path`` (once)."""
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
