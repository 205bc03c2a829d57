"""hetprune: structured pruning of Vision Transformers, extensible with plugins.

The public API for users and plugin authors is what this module exports, plus
the modules ``hetprune.surgery`` (exact removal/merge primitives),
``hetprune.pipeline`` (the shared strategy steps), ``hetprune.config``,
``hetprune.recipe``, ``hetprune.costs`` and ``hetprune.bench``, and for plugin
authors ``hetprune.testing`` (the conformance kit) and ``hetprune.contract``
(the rules every call into a component is checked against).
"""

__version__ = "0.1.0"

from . import config, costs, recipe, surgery
from .budget import Budget
from .errors import HetpruneError, PluginError
from .hookspecs import hookimpl, hookspec
from .models import ModelSpec
from .pipeline import DepthStrategy, FixedSplit, PruneJob, PruneResult, ScoringContext
from .plugins import get_registry, register_plugin, unregister_plugin
from .recipe import Recipe, apply_recipe, load, save
from .sites import Site, sites

__all__ = [
    "Budget", "DepthStrategy", "FixedSplit", "HetpruneError", "ModelSpec", "PluginError", "PruneJob", "PruneResult",
    "Recipe", "ScoringContext", "Site", "__version__", "apply_recipe", "config", "costs", "get_registry", "hookimpl",
    "hookspec", "load", "recipe", "register_plugin", "save", "sites", "surgery", "unregister_plugin",
]
