"""The import paths from before hetprune/ was one subpackage per layer (issue 41), kept working until
hetprune 1.0 (`REMOVED_IN`).

Every old path in `ALIASES` imports as the very module object of its new home, so ``import hetprune.task``
and ``monkeypatch.setattr("hetprune.task.X", ...)`` reach the module the code uses; a package's submodules
follow it. An old path says once that it moved and when it goes (a `DeprecationWarning`).

It sits at the package's top, above every layer, because it imports the new module of an old path, which may
be in any layer (core names nothing above it: tests/test_layers.py). Only imports need this module: the names keys give moved modules are `hetprune.core.keys`' own table, so
removing the old paths moves no stored result's key.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
import warnings

from .core.keys import MOVED, replace_prefix

REMOVED_IN = "1.0"   # the release that drops the old import paths (keys do not need them: `hetprune.core.keys`)

# old dotted import path -> the module it is now: the layout move of issue 41, and later moves
ALIASES: dict[str, str] = {
    **MOVED,
    "hetprune.core.fingerprint": "hetprune.core.keys",   # issue 59: the one identity layer
}


def new_name(old: str) -> str | None:
    """Where the module once called ``old`` lives now (None: it did not move)."""
    return replace_prefix(old, ALIASES)


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
        warnings.warn(f"{spec.name} is now {new}; the old path works as the same module until hetprune "
                      f"{REMOVED_IN}, which removes it", DeprecationWarning, stacklevel=2)
        module = importlib.import_module(new)
        self._specs[spec.name] = module.__spec__
        parent, _, child = spec.name.rpartition(".")
        held = getattr(sys.modules.get(parent), child, None)
        if (held is not None and held is not module and not isinstance(held, types.ModuleType)
                and type(sys.modules[parent]) is types.ModuleType):   # (hetprune itself has its own: _Package)
            sys.modules[parent].__class__ = _KeepsItsNames   # see the class: the import system rebinds next
        return module

    def exec_module(self, module):
        # the import system set the alias's spec on the module; it keeps its own
        old = getattr(module.__spec__, "name", None)
        if old in self._specs:
            module.__spec__ = self._specs.pop(old)


class _KeepsItsNames(types.ModuleType):
    """A package that names a function or class after one of its submodules (``hetprune.model.adapters.generic``,
    ``hetprune.measure.bench.environment``). An old-path import of that submodule would make the import system
    set the package's attribute to the submodule (the package is the same object under both paths), so that
    ``adapters.generic(...)`` stopped working for the whole process; such a package keeps the name it holds."""

    def __setattr__(self, name, value):
        held = self.__dict__.get(name)
        if (isinstance(value, types.ModuleType) and held is not None and not isinstance(held, types.ModuleType)
                and value.__name__ == f"{self.__name__}.{name}"):
            return
        super().__setattr__(name, value)


_FINDER = _OldPaths()


def install() -> None:
    """Put the old paths' finder first on ``sys.meta_path`` (once)."""
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
