"""hetprune: structured pruning of Vision Transformers, extensible with plugins.

For users: [`prune`][hetprune.harness.api.prune] (and [`compare`][hetprune.harness.compare.compare],
[`ablate`][hetprune.harness.ablate.ablate]) prune their own model for their own
[`Task`][hetprune.training.task.Task]; [`load`][hetprune.model.recipe.load] and
[`apply_recipe`][hetprune.model.recipe.apply_recipe] bring a pruned model back. The public API for users and
plugin authors is what this module exports, plus the modules ``hetprune.model.surgery`` (exact removal/merge
primitives), ``hetprune.pruning.pipeline`` (the shared strategy steps), ``hetprune.core.config``,
``hetprune.model.recipe``, ``hetprune.model.macs`` (MAC counting), ``hetprune.measure.bench``,
``hetprune.model.adapters`` (architecture adapters), ``hetprune.measure.latency_table`` (per-device latency
tables) and ``hetprune.pruning.point_store`` (stored accuracy points), and for plugin authors
``hetprune.plugin_api`` (everything a plugin may use, the component protocols among it; the built-in plugins
import nothing else), ``hetprune.harness.testing`` (the conformance kit) and ``hetprune.core.contract`` (the
rules every call into a component is checked against).

The code is one subpackage per layer, bottom to top: ``core``, ``model``, ``training``, ``pruning``,
``measure``, ``harness``, ``cli``; a module imports only from its layer and those below. This package sits
above them all: importing it registers the component kinds (`hetprune.harness.kinds`) with core's registry,
which names no module above core. The paths from
before that layout (``hetprune.task``, ``hetprune.pipeline``, ...) still import, as the same module objects
(`hetprune.aliases`).

Names are imported on first use (module ``__getattr__``), so ``import
hetprune`` and ``hetprune --help`` do not load torch.
"""

from __future__ import annotations

import importlib
import sys
import types

from . import aliases
from .harness import kinds as _kinds  # noqa: F401 - registers the component kinds with core's registry

aliases.install()   # the import paths from before one subpackage per layer

__version__ = "0.2.0"

# public name -> the module that defines it
_EXPORTS = {
    "Budget": "pruning.budget", "HetpruneError": "core.errors", "PluginError": "core.errors",
    "BudgetUnreachable": "core.errors", "hookimpl": "core.hookspecs", "hookspec": "core.hookspecs",
    "ModelSpec": "model.spec", "DepthStrategy": "pruning.depth", "FixedSplit": "pruning.depth",
    "PruneJob": "pruning.job", "PruneResult": "pruning.report", "ScoringContext": "pruning.job",
    "get_registry": "core.plugins", "register_plugin": "core.plugins", "unregister_plugin": "core.plugins",
    "Recipe": "model.recipe", "apply_recipe": "model.recipe", "load": "model.recipe", "save": "model.recipe",
    "Site": "model.sites", "sites": "model.sites", "prune": "harness.api", "compare": "harness.compare",
    "ablate": "harness.ablate", "Task": "training.task", "Schedule": "training.task",
    "BlockLayout": "model.block_modules",
}
_MODULES = {"config": "core.config", "costs": "model.macs", "macs": "model.macs", "recipe": "model.recipe",
            "surgery": "model.surgery", "adapters": "model.adapters", "bench": "measure.bench"}

__all__ = sorted([*_EXPORTS, *_MODULES, "__version__"])
_FUNCTION_MODULES = ("sites", "compare", "ablate")   # old module paths whose public name is a function of theirs


def __getattr__(name: str):
    if name in _MODULES:
        value = importlib.import_module(f".{_MODULES[name]}", __name__)
    elif name in _EXPORTS:
        value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    else:
        raise AttributeError(f"module 'hetprune' has no attribute {name!r}")
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


class _Package(types.ModuleType):
    def __setattr__(self, name, value):
        # importing the old path hetprune.sites (compare, ablate) binds that module here; the public name is its function
        if name in _FUNCTION_MODULES and isinstance(value, types.ModuleType):
            value = getattr(value, name)
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
