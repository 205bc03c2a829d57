"""hetprune: structured pruning of Vision Transformers, extensible with plugins.

For users: [`prune`][hetprune.harness.api.prune] (and [`compare`][hetprune.harness.compare.compare], [`ablate`][hetprune.harness.ablate.ablate]) prune their own
model for their own [`Task`][hetprune.training.task.Task]; [`load`][hetprune.model.recipe.load] and [`apply_recipe`][hetprune.model.recipe.apply_recipe] bring
a pruned model back. The public API for users and plugin authors is what this
module exports, plus
the modules ``hetprune.model.surgery`` (exact removal/merge primitives),
``hetprune.pruning.pipeline`` (the shared strategy steps), ``hetprune.core.config``,
``hetprune.model.recipe``, ``hetprune.model.macs``, ``hetprune.measure.bench``, ``hetprune.model.adapters``
(architecture adapters), ``hetprune.measure.latency_table`` (per-device latency tables) and
``hetprune.pruning.point_store`` (stored accuracy points), and for plugin authors ``hetprune.harness.testing`` (the
conformance kit) and ``hetprune.core.contract`` (the rules every call into a
component is checked against).

Names are imported on first use (module ``__getattr__``), so ``import
hetprune`` and ``hetprune --help`` do not load torch.
"""

from __future__ import annotations

import importlib
import sys
import types

from .core import aliases

aliases.install()   # the import paths from before one subpackage per layer

__version__ = "0.2.0"

# public name -> the submodule that defines it (None: the name is that submodule)
_EXPORTS = {
    "Budget": "budget", "HetpruneError": "errors", "PluginError": "errors", "BudgetUnreachable": "errors",
    "hookimpl": "hookspecs", "hookspec": "hookspecs",
    "ModelSpec": "models", "DepthStrategy": "pipeline", "FixedSplit": "pipeline", "PruneJob": "pipeline",
    "PruneResult": "pipeline", "ScoringContext": "pipeline", "get_registry": "plugins",
    "register_plugin": "plugins", "unregister_plugin": "plugins", "Recipe": "recipe", "apply_recipe": "recipe",
    "load": "recipe", "save": "recipe", "Site": "sites", "sites": "sites",
    "config": None, "costs": None, "recipe": None, "surgery": None, "adapters": None, "bench": None,
    "prune": "api", "compare": "compare", "ablate": "ablate", "Task": "task", "Schedule": "task",
    "BlockLayout": "layers",
}

__all__ = sorted([*_EXPORTS, "__version__"])
_FUNCTION_MODULES = ("sites", "compare", "ablate")   # submodules whose public name is a function of theirs


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'hetprune' has no attribute {name!r}")
    module = importlib.import_module(f".{_EXPORTS[name] or name}", __name__)
    value = module if _EXPORTS[name] is None else getattr(module, name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


class _Package(types.ModuleType):
    def __setattr__(self, name, value):
        # importing the submodule hetprune.model.sites (compare, ablate) binds it here; the public name is its function
        if name in _FUNCTION_MODULES and isinstance(value, types.ModuleType):
            value = getattr(value, name)
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
